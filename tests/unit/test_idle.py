"""Idle allocated GPUs (``allot.core.idle``): samples in, one flag per idle stretch out,
cleared when the GPUs work again, when the run ends or when the evidence stops."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allot.core.errors import ValidationError
from allot.core.idle import (
    IdleCleared,
    IdleFlag,
    IdlePolicy,
    IdleTrack,
    PartSample,
    RunEnded,
    step,
)

MIN = 60.0
POLICY = IdlePolicy(threshold_pct=5.0, window_s=30 * MIN, max_gap_s=2 * MIN)


def samples(host: str, utils: Sequence[float | None], every: float = MIN, start: float = 0.0):
    """One sample per ``every`` seconds from ``start``, of the given utilizations."""
    return [
        PartSample(host, start + i * every, start + (i + 1) * every, u) for i, u in enumerate(utils)
    ]


def run(
    seen: Sequence[PartSample | RunEnded],
    hosts: tuple[str, ...] = ("h1",),
    policy: IdlePolicy = POLICY,
) -> tuple[IdleTrack, list[IdleFlag | IdleCleared]]:
    track = IdleTrack(hosts=hosts)
    verdicts: list[IdleFlag | IdleCleared] = []
    for s in seen:
        result = step(track, s, policy)
        track = result.track
        if result.verdict is not None:
            verdicts.append(result.verdict)
    return track, verdicts


# -- table: what each history leads to -----------------------------------------------------


@pytest.mark.parametrize(
    ("seen", "hosts", "expected"),
    [
        pytest.param(samples("h1", [1.0] * 29), ("h1",), [], id="idle-29-minutes-is-not-flagged"),
        pytest.param(
            samples("h1", [1.0] * 30),
            ("h1",),
            [("flag", 0.0, 30 * MIN)],
            id="idle-30-minutes-is-flagged-at-the-sample-that-proves-it",
        ),
        pytest.param(
            samples("h1", [1.0] * 40),
            ("h1",),
            [("flag", 0.0, 30 * MIN)],
            id="a-stretch-is-flagged-once",
        ),
        pytest.param(
            samples("h1", [1.0] * 20 + [50.0] + [1.0] * 20),
            ("h1",),
            [],
            id="one-busy-minute-starts-the-evidence-again",
        ),
        pytest.param(
            samples("h1", [1.0] * 30 + [80.0]),
            ("h1",),
            [("flag", 0.0, 30 * MIN), ("busy", 0.0, 30 * MIN)],
            id="working-again-clears-the-flag-at-the-last-idle-evidence",
        ),
        pytest.param(
            samples("h1", [4.9] * 30),
            ("h1",),
            [("flag", 0.0, 30 * MIN)],
            id="just-below-the-threshold-is-idle",
        ),
        pytest.param(samples("h1", [5.0] * 40), ("h1",), [], id="at-the-threshold-is-busy"),
        pytest.param(
            samples("h1", [1.0] * 20) + samples("h1", [1.0] * 20, start=25 * MIN),
            ("h1",),
            [],
            id="a-silence-longer-than-the-gap-breaks-the-evidence",
        ),
        pytest.param(
            samples("h1", [1.0] * 15) + samples("h1", [1.0] * 16, start=16 * MIN),
            ("h1",),
            [("flag", 0.0, 30 * MIN)],
            id="a-silence-within-the-gap-does-not",
        ),
        pytest.param(
            samples("h1", [1.0] * 10 + [None] * 25),
            ("h1",),
            [],
            id="unread-gpus-are-no-evidence",
        ),
        pytest.param(
            [*samples("h1", [1.0] * 30), RunEnded(45 * MIN)],
            ("h1",),
            [("flag", 0.0, 30 * MIN), ("ended", 0.0, 30 * MIN)],
            id="the-runs-end-clears-at-its-last-evidence",
        ),
        pytest.param(
            samples("h1", [1.0] * 30) + samples("h2", [1.0] * 30),
            ("h1", "h2"),
            [("flag", 0.0, 30 * MIN)],
            id="a-gang-is-flagged-when-every-host-is-idle",
        ),
        pytest.param(
            samples("h1", [1.0] * 40) + samples("h2", [90.0] * 40),
            ("h1", "h2"),
            [],
            id="one-busy-host-keeps-a-gang-busy",
        ),
        pytest.param(
            samples("h1", [1.0] * 30) + samples("h3", [1.0] * 30),
            ("h1",),
            [("flag", 0.0, 30 * MIN)],
            id="another-hosts-samples-are-ignored",
        ),
    ],
)
def test_history(
    seen: list[PartSample | RunEnded],
    hosts: tuple[str, ...],
    expected: list[tuple[str, float, float]],
) -> None:
    _, verdicts = run(seen, hosts)
    got = [
        ("flag", v.since, v.at) if isinstance(v, IdleFlag) else (v.why, v.since, v.until)
        for v in verdicts
    ]
    assert got == expected


def test_the_flag_says_why_with_its_numbers_and_never_asks_to_preempt_by_default() -> None:
    _, verdicts = run(samples("h1", [1.0, 3.5] * 15))
    (flag,) = verdicts
    assert isinstance(flag, IdleFlag)
    assert flag.reason == "every GPU below 5% for 30.0m (threshold 30.0m; highest 3.5%)"
    assert flag.peak_pct == 3.5
    assert flag.preempt is False
    _, again = run(samples("h1", [1.0] * 30), policy=IdlePolicy(window_s=30 * MIN, preempt=True))
    assert isinstance(again[0], IdleFlag) and again[0].preempt is True


def test_a_replayed_sample_changes_nothing() -> None:
    seen = samples("h1", [1.0] * 10)
    track, _ = run(seen)
    assert step(track, seen[3], POLICY).track == track
    assert step(track, seen[-1], POLICY).track == track


def test_a_flagged_gang_whose_host_falls_silent_is_cleared() -> None:
    seen = samples("h1", [1.0] * 30) + samples("h2", [1.0] * 30)
    seen += samples("h1", [1.0] * 5, start=30 * MIN)  # h2 silent from 30 min on
    _, verdicts = run(seen, ("h1", "h2"))
    assert [type(v).__name__ for v in verdicts] == ["IdleFlag", "IdleCleared"]
    assert isinstance(verdicts[1], IdleCleared) and verdicts[1].why == "no-samples"


def test_an_ended_track_takes_nothing_more() -> None:
    track, _ = run([*samples("h1", [1.0] * 3), RunEnded(3 * MIN)])
    assert track.ended
    assert (
        run(
            [
                *samples("h1", [1.0] * 3),
                RunEnded(3 * MIN),
                *samples("h1", [1.0] * 40, start=3 * MIN),
            ]
        )[1]
        == []
    )


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"threshold_pct": 0.0}, "threshold_pct"),
        ({"threshold_pct": 101.0}, "threshold_pct"),
        ({"window_s": 0.0}, "window_s"),
        ({"window_s": 8 * 86400.0}, "window_s"),
        ({"max_gap_s": -1.0}, "max_gap_s"),
    ],
)
def test_a_bad_policy_names_its_field(kw: dict[str, float], field: str) -> None:
    with pytest.raises(ValidationError) as e:
        IdlePolicy(**kw)
    assert e.value.field == field


# -- properties -----------------------------------------------------------------------------

utils = st.lists(st.one_of(st.none(), st.floats(0.0, 100.0)), min_size=1, max_size=80)
gaps = st.lists(st.floats(0.0, 5 * MIN), min_size=80, max_size=80)


def _history(values: list[float | None], pauses: list[float]) -> list[PartSample]:
    out, t = [], 0.0
    for value, pause in zip(values, pauses, strict=False):
        t += pause
        out.append(PartSample("h1", t, t + MIN, value))
        t += MIN
    return out


@given(values=utils, pauses=gaps)
def test_busy_samples_alone_are_never_flagged(
    values: list[float | None], pauses: list[float]
) -> None:
    busy = [None if v is None else max(v, POLICY.threshold_pct) for v in values]
    assert run(_history(busy, pauses))[1] == []


@given(values=utils, pauses=gaps)
def test_every_flag_is_proven_by_idle_samples_and_cleared_after_it(
    values: list[float | None], pauses: list[float]
) -> None:
    seen = _history(values, pauses)
    _, verdicts = run([*seen, RunEnded(seen[-1].end + 1)])
    flags = [v for v in verdicts if isinstance(v, IdleFlag)]
    clears = [v for v in verdicts if isinstance(v, IdleCleared)]
    # Flags and clears alternate, every flag is cleared (the run ends), in time order.
    assert [type(v) for v in verdicts] == [IdleFlag, IdleCleared] * len(flags)
    for flag, clear in zip(flags, clears, strict=True):
        assert flag.at - flag.since >= POLICY.window_s
        assert clear.since == flag.since and clear.until >= flag.at
        inside = [s for s in seen if s.end > flag.since and s.start < flag.at]
        # Soundness: every sample within the flagged span was read and below the threshold,
        # and no silence in it was longer than the allowed gap.
        assert inside and all(s.util_pct is not None and s.util_pct < 5.0 for s in inside)
        for a, b in itertools.pairwise(inside):
            assert b.start - a.end <= POLICY.max_gap_s


@given(n=st.integers(30, 120), every=st.floats(10.0, 120.0))
def test_continuous_idle_is_flagged_within_the_window_plus_one_sample(n: int, every: float) -> None:
    seen = samples("h1", [0.0] * n, every=every)
    _, verdicts = run(seen)
    if n * every < POLICY.window_s:
        assert verdicts == []
        return
    (flag,) = verdicts
    assert isinstance(flag, IdleFlag)
    assert POLICY.window_s <= flag.at <= POLICY.window_s + every
