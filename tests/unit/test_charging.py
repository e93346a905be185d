"""The charging rules of ``allot.core.usage``: what a run is charged, slot by slot, while it
runs and when it ends. The accounting service and the simulator both call these; the
integration test ``test_charging_parity`` runs the two side by side.

Times are multiples of 0.25 s near 1.7e9 and GPU counts small, so every piece and every sum
is exact in binary floating point: amounts are compared with ``==``.
"""

from __future__ import annotations

import asyncio
import math
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allot.adapters.usage_store import KEY_TTL_S, MemoryUsageStore
from allot.core.errors import ValidationError
from allot.core.usage import (
    HOUR_S,
    EndCharges,
    Settle,
    Slot,
    accrued_slots,
    charged_allocation,
    charged_span,
    end_charges,
    oldest_charged,
    run_hours,
    settle_hours,
    split_into_hours,
)

T0 = 472_222 * HOUR_S  # 1_699_999_200: an hour boundary, so slot k of 60 s is T0 / 60 + k
K0 = T0 // 60
FAR = -1e12  # an ``earliest`` that bounds nothing


def at(seconds: float) -> float:
    return T0 + seconds


def slot(k: int, start: float, end: float) -> Slot:
    """Slot ``K0 + k`` of the 60 s grid, its times in seconds from ``T0``."""
    return Slot(K0 + k, at(start), at(end))


def settle(k: int, whole: tuple[float, float], final: tuple[float, float]) -> Settle:
    return Settle(K0 + k, (at(whole[0]), at(whole[1])), (at(final[0]), at(final[1])))


# -- what counts as allocated --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allocated", "allocation", "gpus", "charged_to"),
    [
        (True, "nlp", 4, "nlp"),
        (False, "nlp", 4, None),
        (False, None, 4, None),
        (True, None, 4, None),
        (True, "nlp", 0, None),
    ],
    ids=[
        "allocated-work-is-charged-to-its-allocation",
        "unallocated-work-naming-an-allocation-is-free",
        "work-with-no-allocation-is-free",
        "allocated-but-naming-no-allocation-cannot-be-charged",
        "allocated-but-holding-no-gpus-cannot-be-charged",
    ],
)
def test_what_counts_as_allocated(
    allocated: bool, allocation: str | None, gpus: int, charged_to: str | None
) -> None:
    assert charged_allocation(allocated, allocation, gpus) == charged_to


# -- the end of a run --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("started", "ended", "now", "accrued", "want"),
    [
        (0, 120, 120, None, EndCharges((slot(0, 0, 60), slot(1, 60, 120)), ())),
        (
            30,
            150,
            150,
            None,
            EndCharges((slot(0, 30, 60), slot(1, 60, 120)), (settle(2, (120, 180), (120, 150)),)),
        ),
        (
            30,
            150,
            400,
            K0 + 5,
            EndCharges(
                (slot(0, 30, 60), slot(1, 60, 120)),
                (
                    settle(2, (120, 180), (120, 150)),
                    settle(3, (180, 240), (180, 180)),
                    settle(4, (240, 300), (240, 240)),
                ),
            ),
        ),
        (
            30,
            150,
            400,
            None,
            EndCharges((slot(0, 30, 60), slot(1, 60, 120)), (settle(2, (120, 180), (120, 150)),)),
        ),
        (90, 90, 400, None, EndCharges((), ())),
        (
            90,
            90,
            400,
            K0 + 5,
            EndCharges(
                (),
                (
                    settle(1, (90, 120), (90, 90)),
                    settle(2, (120, 180), (120, 120)),
                    settle(3, (180, 240), (180, 180)),
                    settle(4, (240, 300), (240, 240)),
                ),
            ),
        ),
        (150, 30, 150, None, EndCharges((), ())),
        (0, 10**6, 100, None, EndCharges((slot(0, 0, 60),), (settle(1, (60, 120), (60, 100)),))),
    ],
    ids=[
        "an-end-on-the-grid-charges-whole-slots-only",
        "the-last-partial-slot-is-settled-to-its-piece",
        "read-late-after-the-live-window-the-slots-after-the-end-are-settled-to-nothing",
        "read-late-with-nothing-accrued-there-is-nothing-after-the-end-to-settle",
        "a-zero-length-run-charges-nothing",
        "a-zero-length-run-the-window-charged-is-settled-to-nothing",
        "an-end-before-the-start-charges-nothing",
        "an-end-after-now-is-cut-at-now",
    ],
)
def test_end_charges(
    started: float, ended: float, now: float, accrued: int | None, want: EndCharges
) -> None:
    got = end_charges(
        at(started), at(ended), now=at(now), earliest=FAR, slot_s=60.0, accrued=accrued
    )
    assert got == want


def test_a_start_before_earliest_is_charged_from_earliest() -> None:
    """A forged or too-old start: only the time from ``earliest`` on is charged."""
    got = end_charges(at(-(10**9)), at(90), now=at(90), earliest=at(30), slot_s=60.0, accrued=None)
    assert got == EndCharges((slot(0, 30, 60),), (settle(1, (60, 120), (60, 90)),))


def test_end_charges_name_a_bad_field() -> None:
    with pytest.raises(ValidationError) as info:
        end_charges(at(0), math.inf, now=at(0), earliest=FAR, slot_s=60.0, accrued=None)
    assert info.value.field == "end"
    with pytest.raises(ValidationError) as info:
        end_charges(at(0), at(1), now=at(1), earliest=FAR, slot_s=0.0, accrued=None)
    assert info.value.field == "slot_s"


def test_the_live_window_charges_complete_slots_a_slot_behind_now_from_its_cursor() -> None:
    # At +185 s the slots complete by +120 s (a slot of lag) are charged...
    first = accrued_slots(at(30), now=at(185), earliest=FAR, slot_s=60.0, accrued=None)
    assert first == [slot(0, 30, 60), slot(1, 60, 120)]
    # ... and the next time, only those after the cursor.
    again = accrued_slots(at(30), now=at(300), earliest=FAR, slot_s=60.0, accrued=K0 + 2)
    assert again == [slot(2, 120, 180), slot(3, 180, 240)]


def test_a_settle_in_hours_is_its_piece_and_its_correction() -> None:
    final, correction = settle_hours((at(3590), at(3650)), (at(3590), at(3610)), 2)
    assert final == {T0 // HOUR_S: 20.0, T0 // HOUR_S + 1: 20.0}
    assert correction == {T0 // HOUR_S: 0.0, T0 // HOUR_S + 1: -80.0}


# -- invariants ----------------------------------------------------------------------------------

quarters = st.integers(min_value=-(10**6), max_value=10**6)
slots_s = st.sampled_from([0.5, 1.0, 7.0, 60.0, 90.0, 3600.0])


@given(
    start_q=quarters,
    length=st.floats(min_value=0.0, max_value=1.0),
    slot_s=slots_s,
    gpus=st.integers(min_value=1, max_value=64),
)
def test_a_run_charged_at_its_end_costs_its_span_times_its_gpus_hour_by_hour(
    start_q: int, length: float, slot_s: float, gpus: int
) -> None:
    start = T0 + start_q / 4
    # Up to 5 hours or 2,000 slots (the loop is per slot), in quarter seconds.
    end = start + math.floor(length * 4 * min(5 * HOUR_S, 2000 * slot_s)) / 4
    charges = end_charges(start, end, now=end, earliest=FAR, slot_s=slot_s, accrued=None)
    hours = charges.new_hours(gpus)
    assert hours == split_into_hours(start, end, gpus)
    assert math.fsum(hours.values()) == (end - start) * gpus
    # Every slot is charged at most once, in order, inside the run.
    ks = [s.k for s in charges.slots] + [s.k for s in charges.settles]
    assert ks == sorted(set(ks))


@given(
    start=st.floats(min_value=-1e10, max_value=1e10, allow_nan=False),
    length=st.floats(min_value=0.0, max_value=1e6),
    gpus=st.integers(min_value=1, max_value=64),
)
def test_on_the_hour_grid_a_span_is_split_into_hours_to_the_bit(
    start: float, length: float, gpus: int
) -> None:
    """The simulator charges on the hour grid: its buckets are what ``split_into_hours``
    gave before the rule moved to the core, to the last bit (its golden reports stay)."""
    end = start + length
    charges = end_charges(start, end, now=end, earliest=start, slot_s=HOUR_S, accrued=None)
    got = charges.new_hours(gpus)
    want = run_hours(start, end, gpus)  # what the simulator charges with
    assert list(got) == list(want)
    assert all(got[h].hex() == float(want[h]).hex() for h in want)


class LiveRun(NamedTuple):
    """A run ``[start, end)`` whose end is read at ``read``, the live window having run at
    ``accruals`` (all at or before ``read``)."""

    start: float
    end: float
    read: float
    accruals: list[float]
    slot_s: float
    gpus: int


@st.composite
def live_runs(draw: st.DrawFn) -> LiveRun:
    slot_s = draw(slots_s)
    # At most a few hundred slots (the memory store prunes on every write) and 3 hours.
    span_q = 4 * int(min(300 * slot_s, 3 * HOUR_S))
    start = T0 + draw(quarters) / 4
    end = start + draw(st.integers(min_value=0, max_value=span_q)) / 4
    read = end + draw(st.integers(min_value=0, max_value=span_q // 3)) / 4
    offsets = draw(st.lists(st.integers(min_value=0, max_value=2 * span_q), max_size=6))
    accruals = sorted(t for t in (start + q / 4 for q in offsets) if t <= read)
    return LiveRun(start, end, read, accruals, slot_s, draw(st.integers(1, 16)))


async def _live_then_end(run: LiveRun) -> dict[int, float]:
    """What a store holds once the live window ran at ``run.accruals`` and the end was read
    at ``run.read``, each step as the accounting service takes it (charge ids ``r:<k>``)."""
    store = MemoryUsageStore()
    start, slot_s, gpus = run.start, run.slot_s, run.gpus
    cursor: int | None = None
    for t in run.accruals:
        earliest = oldest_charged(t, slot_s, KEY_TTL_S)
        for s in accrued_slots(start, now=t, earliest=earliest, slot_s=slot_s, accrued=cursor):
            await store.charge(f"r:{s.k}", "a", s.start, s.end, gpus)
            cursor = s.k + 1
    earliest = oldest_charged(run.read, slot_s, KEY_TTL_S)
    charges = end_charges(
        start, run.end, now=run.read, earliest=earliest, slot_s=slot_s, accrued=cursor
    )
    for s in charges.slots:
        await store.charge(f"r:{s.k}", "a", s.start, s.end, gpus)
    for st_ in charges.settles:
        await store.settle(f"r:{st_.k}", "a", st_.whole, st_.final, gpus)
    held = (await store.buckets(["a"], run.read, KEY_TTL_S))["a"]
    return {h: v for h, v in held.items() if v != 0.0}


@settings(deadline=None)  # a few hundred slots through the memory store: slow on a busy CI
@given(run=live_runs())
def test_whatever_the_live_window_charged_the_end_leaves_exactly_the_run(run: LiveRun) -> None:
    """The live window charges at any moments before the end is read (so maybe after the
    run ended), then the end is read, maybe late: the store holds exactly the run."""
    held = asyncio.run(_live_then_end(run))
    earliest = oldest_charged(run.read, run.slot_s, KEY_TTL_S)
    lo, hi = charged_span(run.start, run.end, now=run.read, earliest=earliest)
    assert held == split_into_hours(lo, hi, run.gpus)
