"""The usage window: hourly buckets in, one GPU-seconds figure per allocation out."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allot.core.errors import ValidationError
from allot.core.usage import (
    HOUR_S,
    SlidingWindow,
    charged_span,
    run_hours,
    split_into_hours,
    window_usage,
)

H = 3600  # one hour, in seconds


def at(hours: float) -> float:
    """A time on the caller's clock, in hours from the epoch."""
    return hours * H


# -- split_into_hours ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end", "gpus", "expected"),
    [
        (at(2) + 60, at(2) + 660, 1, {2: 600.0}),
        (at(2) + 60, at(2) + 660, 8, {2: 4800.0}),
        (at(2.5), at(3.25), 2, {2: 3600.0, 3: 1800.0}),
        (at(1), at(4), 1, {1: 3600.0, 2: 3600.0, 3: 3600.0}),  # ends on a boundary: no hour 4
        (at(1.75), at(4.5), 1, {1: 900.0, 2: 3600.0, 3: 3600.0, 4: 1800.0}),
        (at(3), at(3), 4, {}),
        (at(-0.5), at(0.5), 1, {-1: 1800.0, 0: 1800.0}),
    ],
    ids=[
        "inside-one-hour",
        "gpus-multiply",
        "straddles-a-boundary",
        "whole-hours-end-on-boundary",
        "partial-hours-at-both-ends",
        "empty-interval",
        "before-the-epoch-floors-down",
    ],
)
def test_split_into_hours(start: float, end: float, gpus: int, expected: dict[int, float]) -> None:
    assert split_into_hours(start, end, gpus) == pytest.approx(expected)


@given(
    start=st.floats(-1e7, 1e7, allow_nan=False),
    length=st.floats(0, 5e5, allow_nan=False),
    gpus=st.integers(1, 64),
)
def test_split_into_hours_conserves_gpu_seconds(start: float, length: float, gpus: int) -> None:
    pieces = split_into_hours(start, start + length, gpus)
    assert math.fsum(pieces.values()) == pytest.approx((start + length - start) * gpus, abs=1e-6)
    assert all(0 < v <= H * gpus + 1e-6 for v in pieces.values())
    assert sorted(pieces) == list(range(min(pieces), max(pieces) + 1)) if pieces else True


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((at(2), at(1), 1), "end"),
        ((at(1), at(2), 0), "gpus"),
        ((at(1), at(2), True), "gpus"),
        ((math.nan, at(2), 1), "start"),
        ((at(1), math.inf, 1), "end"),
    ],
    ids=["end-before-start", "zero-gpus", "bool-gpus", "nan-start", "infinite-end"],
)
def test_split_into_hours_rejects_bad_input(args: tuple[Any, Any, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        split_into_hours(*args)
    assert err.value.field == field


# -- charged_span ----------------------------------------------------------------------------

NOW = at(1000)
KEPT = at(1000 - 192)  # a store's oldest hour kept


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        pytest.param(at(999), at(999.5), (at(999), at(999.5)), id="a-run-in-the-past-whole"),
        pytest.param(
            at(999), NOW + 30 * 86_400, (at(999), NOW), id="an-end-30-days-ahead-cut-at-now"
        ),
        pytest.param(at(999), 1e11, (at(999), NOW), id="an-end-at-1e11-cut-at-now"),
        pytest.param(0.0, 1e11, (KEPT, NOW), id="a-span-of-1e11-is-at-most-now-minus-earliest"),
        pytest.param(at(500), at(999), (KEPT, at(999)), id="a-start-before-earliest-cut-there"),
        pytest.param(at(500), at(600), (KEPT, KEPT), id="a-run-all-before-earliest-is-empty"),
        pytest.param(NOW + 10, NOW + 20, (NOW + 10, NOW + 10), id="a-run-still-to-come-is-empty"),
        pytest.param(
            at(999.5), at(999), (at(999.5), at(999.5)), id="an-end-before-its-start-is-empty"
        ),
    ],
)
def test_charged_span_cuts_a_run_at_now_and_at_its_earliest(
    start: float, end: float, expected: tuple[float, float]
) -> None:
    assert charged_span(start, end, now=NOW, earliest=KEPT) == expected


@given(
    start=st.floats(0, 1e11),
    end=st.floats(0, 1e11),
    now=st.floats(1e9, 2e9),
    kept_s=st.floats(0, 1e6),
)
def test_a_charged_span_is_inside_the_run_and_never_longer_than_now_minus_earliest(
    start: float, end: float, now: float, kept_s: float
) -> None:
    earliest = now - kept_s
    lo, hi = charged_span(start, end, now=now, earliest=earliest)
    assert lo <= hi
    assert hi - lo <= max(0.0, end - start) and hi - lo <= now - earliest
    if hi > lo:
        assert start <= lo and hi <= end and hi <= now


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"start": math.nan}, "start"),
        ({"end": math.inf}, "end"),
        ({"now": math.nan}, "now"),
        ({"earliest": -math.inf}, "earliest"),
    ],
)
def test_charged_span_rejects_times_that_are_not_finite(
    kwargs: dict[str, float], field: str
) -> None:
    args = {"start": at(1), "end": at(2), "now": NOW, "earliest": KEPT} | kwargs
    with pytest.raises(ValidationError) as err:
        charged_span(args["start"], args["end"], now=args["now"], earliest=args["earliest"])
    assert err.value.field == field


# -- window_usage: sliding -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("hours", "now", "window_s", "expected"),
    [
        ({8: 100.0, 9: 200.0}, at(10), 2 * H, 300.0),
        ({7: 100.0, 9: 200.0}, at(10), 2 * H, 200.0),
        # window (8.5 h, 10.5 h]: half of hour 8, all of 9, and the current hour 10 whole.
        ({8: 100.0, 9: 200.0, 10: 40.0}, at(10.5), 2 * H, 50.0 + 200.0 + 40.0),
        ({10: 40.0}, at(10.25), 2 * H, 40.0),
        ({11: 500.0, 9: 1.0}, at(10.5), 2 * H, 1.0),
        ({9: 0.0}, at(10), 2 * H, 0.0),
        # window (10.25 h, 10.5 h] inside the current hour: a quarter of an hour out of the
        # half hour elapsed, so half of what was charged so far.
        ({10: 40.0}, at(10.5), H // 4, 20.0),
        # now exactly on an hour: that hour's bucket can only hold a charge made at now.
        ({10: 5.0, 8: 7.0}, at(10), 2 * H, 12.0),
    ],
    ids=[
        "buckets-inside-count-whole",
        "bucket-older-than-window-excluded",
        "oldest-straddling-bucket-pro-rata",
        "current-partial-hour-counts-whole",
        "future-bucket-ignored",
        "empty-bucket",
        "window-shorter-than-elapsed-hour",
        "now-on-an-hour-boundary",
    ],
)
def test_sliding_window(
    hours: dict[int, float], now: float, window_s: int, expected: float
) -> None:
    assert window_usage({"a": hours}, now, window_s) == {"a": pytest.approx(expected)}


def test_every_allocation_is_reported_even_with_nothing_in_the_window() -> None:
    got = window_usage({"old": {1: 50.0}, "new": {200: 5.0}, "none": {}}, now=at(200.5))
    assert got == {"old": 0.0, "new": 5.0, "none": 0.0}


def test_default_window_is_seven_days() -> None:
    now = at(24 * 10)
    inside = 24 * 3  # the bucket starting exactly 7 days ago counts whole
    got = window_usage({"a": {inside - 1: 1.0, inside: 2.0, 24 * 10 - 1: 4.0}}, now)
    assert got == {"a": 6.0}


@given(
    start_h=st.floats(0, 100, allow_nan=False),
    length_h=st.floats(0, 20, allow_nan=False),
    gpus=st.integers(1, 8),
)
def test_charges_fully_inside_the_window_come_back_whole(
    start_h: float, length_h: float, gpus: int
) -> None:
    start, end = at(start_h), at(start_h + length_h)
    buckets = {"a": split_into_hours(start, end, gpus)}
    # The window reaches back past the start of the first charged hour.
    got = window_usage(buckets, now=end, window_s=int(end - math.floor(start / H) * H) + H)
    assert got["a"] == pytest.approx((end - start) * gpus, rel=1e-9, abs=1e-6)


@given(
    hours=st.dictionaries(st.integers(0, 50), st.floats(0, 1e6), max_size=20),
    now_h=st.floats(0, 60, allow_nan=False),
    short=st.integers(1, 48 * H),
    extra=st.integers(0, 48 * H),
)
def test_a_longer_window_never_sees_less(
    hours: dict[int, float], now_h: float, short: int, extra: int
) -> None:
    a = window_usage({"a": hours}, at(now_h), short)["a"]
    b = window_usage({"a": hours}, at(now_h), short + extra)["a"]
    assert b >= a - 1e-6 * max(1.0, a)


# -- window_usage: decayed -----------------------------------------------------------------


def test_decay_weights_each_bucket_by_the_age_of_its_counted_midpoint() -> None:
    # now = 10.5 h. Hour 9's midpoint is 9.5 h: one hour old, weight 1/2 with a 1 h
    # half-life. Hour 10 is elapsed up to now: midpoint 10.25 h, a quarter hour old.
    got = window_usage({"a": {9: 100.0, 10: 40.0}}, at(10.5), 2 * H, half_life_s=H)
    assert got["a"] == pytest.approx(100.0 * 0.5 + 40.0 * 2 ** (-0.25))


def test_decay_still_applies_the_window_and_pro_rata_cut() -> None:
    # Window (8.5 h, 10.5 h]: hour 8 counts half, aged from the middle of its counted part
    # (8.75 h, 1.75 h old); hour 7 is outside.
    got = window_usage({"a": {7: 1000.0, 8: 100.0}}, at(10.5), 2 * H, half_life_s=H)
    assert got["a"] == pytest.approx(50.0 * 2 ** (-1.75))


@given(
    hours=st.dictionaries(st.integers(0, 50), st.floats(0, 1e6), max_size=20),
    now_h=st.floats(0, 60, allow_nan=False),
    half_life=st.floats(60, 1e6),
)
def test_decay_never_exceeds_the_plain_window(
    hours: dict[int, float], now_h: float, half_life: float
) -> None:
    plain = window_usage({"a": hours}, at(now_h), 24 * H)["a"]
    decayed = window_usage({"a": hours}, at(now_h), 24 * H, half_life_s=half_life)["a"]
    assert 0 <= decayed <= plain * (1 + 1e-12)


def test_the_result_does_not_depend_on_bucket_order() -> None:
    values = {h: 0.1 * (h + 1) for h in range(40)}
    forward = window_usage({"a": values}, at(40), 48 * H)
    backward = window_usage({"a": dict(reversed(values.items()))}, at(40), 48 * H)
    assert forward == backward


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"window_s": 0}, "window_s"),
        ({"window_s": 1.5}, "window_s"),
        ({"half_life_s": 0}, "half_life_s"),
        ({"half_life_s": math.inf}, "half_life_s"),
        ({"now": math.nan}, "now"),
        ({"buckets": {"a": {1: -5.0}}}, "buckets['a'][1]"),
        ({"buckets": {"a": {1: math.nan}}}, "buckets['a'][1]"),
    ],
    ids=[
        "zero-window",
        "fractional-window",
        "zero-half-life",
        "infinite-half-life",
        "nan-now",
        "negative-amount",
        "nan-amount",
    ],
)
def test_window_usage_rejects_bad_input(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"buckets": {"a": {1: 1.0}}, "now": at(2), **kwargs}
    with pytest.raises(ValidationError) as err:
        window_usage(**args)
    assert err.value.field == field


# -- SlidingWindow: the simulator's window, kept between rankings ---------------------------

# A run of charges as the simulator makes them: (allocation, seconds since the previous
# step, seconds charged back from now, GPUs), with a ranking after some of them.
_charges = st.lists(
    st.tuples(
        st.sampled_from(("a", "b", "c")),
        st.floats(0, 3 * H, allow_nan=False),
        st.floats(0, 12 * H, allow_nan=False),
        st.integers(1, 64),
        st.booleans(),
    ),
    max_size=60,
)


@given(_charges, st.sampled_from((H, 5 * H, 48 * H, 7 * 24 * H)))
def test_the_sliding_window_ranks_to_the_bit_as_window_usage_does(
    steps: list[tuple[str, float, float, int, bool]], window_s: int
) -> None:
    """Charges land in the current hour, in hours the window holds whole and in hours it
    has left; after each ranking the kept sums give ``window_usage``'s figures exactly."""
    window = SlidingWindow(window_s)
    buckets: dict[str, dict[int, float]] = {}
    now = at(1000)
    rankings = 0
    for allocation, step, back, gpus, rank in steps:
        now += step
        since = now - back
        hours = buckets.setdefault(allocation, {})
        for hour, gpu_s in run_hours(since, now, gpus).items():
            hours[hour] = hours.get(hour, 0.0) + gpu_s
        window.charged(allocation, math.floor(since / HOUR_S))
        if rank:
            rankings += 1
            assert window.usage(buckets, now) == window_usage(buckets, now, window_s)
    assert window.usage(buckets, now) == window_usage(buckets, now, window_s)


def test_a_charge_inside_the_window_is_counted_at_the_next_ranking() -> None:
    """Kept interior sums are dropped when a charge lands in them: an hour the window holds
    whole, charged after a ranking, counts at the next one (it would not if the kept sum
    were reused), while a charge in the current hour alone keeps them."""
    window = SlidingWindow(48 * H)
    buckets = {"a": dict.fromkeys(range(950, 1000), 100.0)}
    now = at(999.5)
    first = window.usage(buckets, now)
    buckets["a"][990] += 3600.0
    window.charged("a", 990)
    second = window.usage(buckets, now)
    assert second["a"] == first["a"] + 3600.0 == window_usage(buckets, now, 48 * H)["a"]
    buckets["a"][999] += 50.0
    kept = window._interior["a"]
    window.charged("a", 999)  # the current hour: an edge, always read again
    assert window._interior["a"] is kept
    assert window.usage(buckets, now)["a"] == second["a"] + 50.0


def test_the_sliding_window_refuses_what_window_usage_refuses() -> None:
    with pytest.raises(ValidationError) as err:
        SlidingWindow(0)
    assert err.value.field == "window_s"
    with pytest.raises(ValidationError) as err:
        SlidingWindow(H).usage({"a": {1: 1.0}}, math.nan)
    assert err.value.field == "now"
    with pytest.raises(ValidationError) as err:
        SlidingWindow(48 * H).usage({"a": {1: -5.0, 2: 1.0, 3: 1.0}}, at(3.5))
    assert err.value.field == "buckets['a'][1]"
