"""The health service's idle detection without a server (``allot.eventlog.idle_watch``):
reports checked against the clock and the log, attributed to the allocated runs holding
the GPUs, flags and clears; rebuilt after a restart from what it logged."""

from __future__ import annotations

import msgspec
import pytest

from allot.core.errors import ValidationError
from allot.core.idle import IdlePolicy
from allot.eventlog.idle_watch import IdleWatch, msg_id
from allot.proto import messages as m

T = 1_800_000_000.0
POLICY = IdlePolicy(threshold_pct=5.0, window_s=600.0, max_gap_s=120.0)


def log_records() -> list[msgspec.Struct]:
    """h1 (8 GPUs): nlp's w1 on GPUs 0-1 (allocated), free work u1 on GPU 2."""
    out: list[msgspec.Struct] = [
        m.HostRegistered(host="h1", gpus=8, at=T - 100),
        m.LeaderElected(epoch=1, leader="p", at=T - 100),
    ]
    for wid, alloc, gpus, mrt in (("w1", "nlp", (0, 1), 600), ("u1", None, (2,), 0)):
        out.append(
            m.WorkloadSubmitted(
                workload_id=wid,
                client_id=wid,
                user="alice",
                gpus=len(gpus),
                allocation=alloc,
                min_runtime_s=mrt,
                at=T - 50,
            )
        )
        out.append(
            m.WorkloadPlaced(
                workload_id=wid,
                allocation=alloc,
                at=T,
                gpus=len(gpus),
                assignment=(m.HostGpus(host="h1", gpus=gpus),),
                min_runtime_s=mrt,
                epoch=1,
            )
        )
    return out


def watch(records: list[msgspec.Struct] | None = None) -> IdleWatch:
    w = IdleWatch(POLICY)
    for r in records if records is not None else log_records():
        w.apply(r)
    return w


def report(since: float, until: float, util: tuple[float | None, ...]) -> m.HostUtilization:
    return m.HostUtilization(host="h1", since=since, sent_at=until, util=util)


IDLE = (1.0, 2.0, 90.0, 0.0, 0.0, 0.0, 0.0, 0.0)
"""w1's GPUs idle (highest 2%), the free run's busy."""


@pytest.mark.parametrize(
    ("host", "body", "field", "words"),
    [
        ("h9", report(T, T + 60, IDLE), "host", "not a registered host"),
        ("h1", report(T, T + 500, IDLE), "sent_at", "ahead of the clock"),
        ("h1", report(T - 700, T - 400, IDLE), "sent_at", "s old"),
        ("h1", report(T + 60, T + 60, IDLE), "since", "must be before sent_at"),
        ("h1", report(T - 4000, T + 60, IDLE), "since", "at most 3600 s"),
        ("h1", report(T, T + 60, (0.0,) * 9), "util", "reports 9 GPUs; h1 registered 8"),
    ],
    ids=[
        "an-unregistered-host",
        "a-time-ahead-of-the-clock",
        "a-stale-report",
        "an-empty-interval",
        "an-interval-over-an-hour",
        "more-gpus-than-registered",
    ],
)
def test_absurd_reports_are_refused_naming_the_field(
    host: str, body: m.HostUtilization, field: str, words: str
) -> None:
    w = watch()
    with pytest.raises(ValidationError) as e:
        w.judge(host, body, now=T + 60)
    assert e.value.field == field
    assert words in e.value.reason
    assert w.tracks == {}


def test_a_report_is_attributed_to_the_allocated_run_holding_the_gpus() -> None:
    w = watch()
    judged = w.judge("h1", report(T - 30, T + 60, IDLE), now=T + 60)
    assert judged.flags == ()
    assert judged.recorded is not None
    (part,) = judged.recorded.parts  # the free run is never judged
    assert (part.workload_id, part.gpus, part.util_pct) == ("w1", (0, 1), 2.0)
    # the interval is cut at the placement: the GPUs were someone else's before
    assert part.idle_since == T
    assert w.judge("h1", report(T + 60, T + 120, (None, 1.0)), now=T + 120).recorded is not None


def test_a_host_without_allocated_work_records_nothing() -> None:
    records = [r for r in log_records() if getattr(r, "workload_id", "u1") == "u1"]
    assert watch(records).judge("h1", report(T, T + 60, IDLE), now=T + 60).recorded is None


def feed(w: IdleWatch, start: float, n: int, util: tuple[float | None, ...] = IDLE) -> list:
    out: list[msgspec.Struct] = []
    for i in range(n):
        judged = w.judge(
            "h1", report(start + 60 * i, start + 60 * (i + 1), util), start + 60 * (i + 1)
        )
        out += ([judged.recorded] if judged.recorded else []) + list(judged.flags)
    return out


def test_idle_past_the_window_is_flagged_once_then_cleared_when_busy() -> None:
    w = watch()
    logged = feed(w, T, 11)
    flags = [r for r in logged if isinstance(r, m.WorkloadFlaggedIdle)]
    assert len(flags) == 1
    flag = flags[0]
    assert (flag.workload_id, flag.allocation, flag.user, flag.gpus) == ("w1", "nlp", "alice", 2)
    assert (flag.idle_since, flag.at) == (T, T + 600)
    assert flag.reason.startswith("every GPU below 5% for 10.0m")
    assert msg_id(flag) == f"idle:w1:1:{T!r}"
    logged = feed(w, T + 660, 1, util=(50.0,) * 8)
    (cleared,) = [r for r in logged if isinstance(r, m.WorkloadIdleCleared)]
    assert (cleared.why, cleared.idle_since, cleared.until) == ("busy", T, T + 660)
    assert cleared.idle_gpu_seconds == 2 * 660


def test_a_flagged_run_that_ends_is_cleared_and_forgotten() -> None:
    w = watch()
    feed(w, T, 11)
    assert w.ended(T + 700) == []  # still running
    w.apply(m.WorkloadCompleted(workload_id="w1", allocation="nlp", at=T + 700))
    (cleared,) = w.ended(T + 701)
    assert (cleared.why, cleared.until) == ("ended", T + 660)
    assert w.tracks == {}


def test_a_restart_rebuilt_from_the_log_goes_on_as_if_none_happened() -> None:
    """The last recorded report and the open flag give back the track: no second flag,
    and a busy sample clears the stretch the log holds open."""
    before = watch()
    logged = feed(before, T, 11)
    again = watch(
        [*log_records(), *[r for r in logged if not isinstance(r, m.HostUtilizationRecorded)]]
    )
    last = [r for r in logged if isinstance(r, m.HostUtilizationRecorded)][-1]
    again.seed(last)
    again.adopt_open_flags()
    assert again.tracks == before.tracks
    assert [
        r for r in feed(again, T + 660, 3) if not isinstance(r, m.HostUtilizationRecorded)
    ] == []
    (cleared,) = [
        r for r in feed(again, T + 840, 1, util=(50.0,) * 8) if isinstance(r, m.WorkloadIdleCleared)
    ]
    assert (cleared.idle_since, cleared.why) == (T, "busy")
    assert [s.workload_id for s in again.book.open_stretches()] == ["w1"]  # until it is read back


def test_the_snapshot_lists_open_flags_of_the_asked_allocation() -> None:
    w = watch()
    for r in feed(w, T, 11):
        w.apply(r)
    assert [r.workload_id for r in w.snapshot(None, T + 700).rows] == ["w1"]
    assert w.snapshot("vision", T + 700).rows == ()
    snap = w.snapshot("nlp", T + 700)
    assert (snap.threshold_pct, snap.window_s) == (5.0, 600.0)
