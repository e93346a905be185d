"""Usage: what running work is charged (charging) and how much it weighs (the window).

Usage is kept in hourly buckets: ``buckets[allocation][h]`` is the GPU-seconds charged to
``allocation`` during hour ``h``, i.e. during ``[3600 h, 3600 (h + 1))`` on the caller's
clock (``h = floor(t / 3600)``). The accounting service and the simulator both charge with
the functions below (decision 0007); ``window_usage`` folds the buckets into one number per
allocation, the input of Fair Tree ranking.

Charging
    *What is charged.* A run (one attempt of a workload holding ``gpus`` GPUs from
    ``start`` to ``end``) is charged to its allocation only when it is allocated: it says
    so, names an allocation and holds GPUs (``charged_allocation``; allocated means
    ``min_runtime_s > 0``, see ``allot.core.model``). Unallocated work is free.

    *How much.* Only the run's ``charged_span`` ``[lo, hi)`` is charged: nothing after
    ``now``, nothing before ``earliest`` (its logged start, the oldest time a store keeps).
    It costs ``gpus x (hi - lo)``, cut into slots of the grid ``slot_s`` (at most an hour):
    slot ``k`` is ``[max(lo, k slot_s), min(hi, (k + 1) slot_s))`` (``grid_slots``), and a
    slot's piece goes into hours by ``split_into_hours``. A store dedupes on the slot (one
    charge id per run and ``k``); the hour totals do not depend on ``slot_s``.

    *While it runs* (``accrued_slots``): the live window charges the slots complete by
    ``complete_until(now)``, one slot behind ``now``, from a cursor (the first slot it has
    not charged yet).

    *When it ends or is preempted* (``end_charges``): the slots that end on the grid are
    charged as the window charges them (same ``k``, same piece: a second charge adds
    nothing). The last, partial slot and, when the window has charged the run, every slot
    after the end that the window can have charged are *settled* (``Settle``): the slot
    must hold its true piece (empty after the end); a store that charged it whole adds the
    difference (``settle_hours``), one that did not adds the piece. So however late the end
    is read, the run costs exactly ``split_into_hours(lo, hi, gpus)``; a store that charged
    nothing ahead (the simulator) gets ``EndCharges.new_hours``.

Sliding window (``half_life_s=None``)
    usage = Σ_h amount(h) · coverage(h)

    where ``coverage(h)`` is the fraction of the bucket's *content interval* that lies inside
    the window ``(now - window_s, now]``. The content interval is the hour itself, cut at
    ``now`` for the current hour (nothing can have been charged after ``now``). So every
    bucket fully inside the window counts whole, the current partial hour counts whole, and
    the oldest bucket that straddles the window's start counts pro rata: usage is assumed
    spread evenly over its hour. Buckets entirely outside the window (or in the future,
    which only clock skew can produce) count 0. The result moves continuously with ``now``
    instead of dropping a whole hour at once.

Decayed (``half_life_s`` given), Slurm-like (``PriorityDecayHalfLife``)
    usage = Σ_h amount(h) · coverage(h) · 2^(-age(h) / half_life_s)

    with ``age(h) = now - midpoint of the counted part of bucket h`` (so the current partial
    hour is aged from the middle of what has elapsed, never negatively). The window still
    applies: it bounds what the store must keep and makes the two modes comparable; with a
    window several half-lives long the cut changes the result by less than
    ``2^(-window_s / half_life_s)`` of the old usage.

Ranges: times are finite seconds, ``gpus`` a positive integer, ``slot_s`` in ``(0, 3600]``
(``ValidationError`` names what is not); every bucket amount is a finite GPU-seconds >= 0;
the window's outputs are >= 0 and name every allocation in ``buckets`` (0.0 when nothing is
in the window).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from allot.core.errors import ValidationError

HOUR_S = 3600
DEFAULT_WINDOW_S = 7 * 86400


def window_usage(
    buckets: Mapping[str, Mapping[int, float]],
    now: float,
    window_s: int = DEFAULT_WINDOW_S,
    half_life_s: float | None = None,
) -> dict[str, float]:
    """GPU-seconds per allocation inside the window ending at ``now`` (see the module
    docstring for the pro-rata and decay rules)."""
    _check_time(now, "now")
    _check_window(window_s)
    if half_life_s is not None and (
        isinstance(half_life_s, bool)
        or not isinstance(half_life_s, int | float)
        or not math.isfinite(half_life_s)
        or half_life_s <= 0
    ):
        raise ValidationError("half_life_s", f"must be a positive number, got {half_life_s!r}")

    start, first_hour, last_hour, span = _window_hours(now, window_s)
    result: dict[str, float] = {}
    for allocation, hours in buckets.items():
        if half_life_s is None:
            # Interior hours count whole, the two edge hours through ``_weight``.
            interior = _interior_sum(allocation, hours, first_hour, span)
            result[allocation] = _with_edges(
                interior, allocation, hours, start=start, now=now, first_hour=first_hour, span=span
            )
            continue
        # A store keeps more history than the window: look up the window's hours rather
        # than scanning every bucket.
        if len(hours) > span:
            inside = [h for h in range(first_hour, last_hour + 1) if h in hours]
        else:
            inside = [h for h in hours if first_hour <= h <= last_hour]
        terms: list[float] = []
        for h in inside:
            amount = hours[h]
            _check_amount(amount, allocation, h)
            weight = _weight(h, start, now, half_life_s)
            if weight and amount:
                terms.append(amount * weight)
        # fsum: exact-then-rounded, so the total does not depend on the buckets' order.
        result[allocation] = math.fsum(terms)
    return result


def _window_hours(now: float, window_s: int) -> tuple[float, int, int, int]:
    """The window ``(now - window_s, now]``: its start, its first and last hour (the edge
    buckets, counted pro rata) and how many hours it touches."""
    start = now - window_s
    first_hour = math.floor(start / HOUR_S)
    last_hour = math.floor(now / HOUR_S)
    return start, first_hour, last_hour, last_hour - first_hour + 1


def _interior_sum(allocation: str, hours: Mapping[int, float], first_hour: int, span: int) -> float:
    """The hours strictly inside the window, which count whole. The simulator calls this
    every few virtual minutes over months of buckets, so the sum is taken in C (``map``
    over ``dict.get``) and validated in bulk; only a bad value pays for the per-bucket
    check that names it."""
    last_hour = first_hour + span - 1
    if len(hours) > span:
        interior: list[float] = list(
            map(hours.__getitem__, filter(hours.__contains__, range(first_hour + 1, last_hour)))
        )
    else:
        interior = [a for h, a in hours.items() if first_hour < h < last_hour]
    try:
        total = math.fsum(interior)  # exact-then-rounded: independent of bucket order
        valid = math.isfinite(total) and min(interior, default=0.0) >= 0
    except TypeError:
        valid = False
    if not valid:
        for h, amount in hours.items():
            _check_amount(amount, allocation, h)
    return total


def _with_edges(
    interior: float,
    allocation: str,
    hours: Mapping[int, float],
    *,
    start: float,
    now: float,
    first_hour: int,
    span: int,
) -> float:
    """``interior`` plus the two edge hours, each weighed by how much of it is inside."""
    terms = [interior]
    last_hour = first_hour + span - 1
    for h in (first_hour, last_hour) if span > 1 else (first_hour,):
        edge = hours.get(h)
        if edge:
            _check_amount(edge, allocation, h)
            terms.append(edge * _weight(h, start, now, None))
    return math.fsum(terms)


class SlidingWindow:
    """``window_usage`` without decay for a caller that keeps its own buckets and reports
    every hour it adds to (``charged``): the simulator, which ranks every few virtual
    minutes over months of buckets. Each allocation's interior sum (the hours strictly
    inside the window, counted whole) is kept until the window's hours move or a charge
    lands at or before its last hour, so a ranking re-adds only the two edge hours. The
    result is ``window_usage``'s to the bit: the same ``fsum`` of the same amounts."""

    def __init__(self, window_s: int = DEFAULT_WINDOW_S) -> None:
        _check_window(window_s)
        self.window_s = window_s
        self._interior: dict[str, tuple[int, int, float]] = {}
        """Allocation -> (first hour, last hour, sum of the hours strictly between)."""

    def charged(self, allocation: str, first_hour: int) -> None:
        """``allocation``'s buckets changed from hour ``first_hour`` on."""
        kept = self._interior.get(allocation)
        if kept is not None and first_hour < kept[1]:
            del self._interior[allocation]

    def usage(self, buckets: Mapping[str, Mapping[int, float]], now: float) -> dict[str, float]:
        """``window_usage(buckets, now, self.window_s)``; ``buckets`` must have changed
        only as ``charged`` was told."""
        _check_time(now, "now")
        start, first_hour, last_hour, span = _window_hours(now, self.window_s)
        kept_all = self._interior
        result: dict[str, float] = {}
        for allocation, hours in buckets.items():
            kept = kept_all.get(allocation)
            if kept is not None and kept[0] == first_hour and kept[1] == last_hour:
                interior = kept[2]
            else:
                interior = _interior_sum(allocation, hours, first_hour, span)
                kept_all[allocation] = (first_hour, last_hour, interior)
            result[allocation] = _with_edges(
                interior, allocation, hours, start=start, now=now, first_hour=first_hour, span=span
            )
        return result


def split_into_hours(start: float, end: float, gpus: int) -> dict[int, float]:
    """GPU-seconds of ``gpus`` GPUs held during ``[start, end)``, per hour index.

    The pieces sum to ``(end - start) * gpus``. An empty interval gives ``{}``. Pass only
    allocated time: unallocated work is never charged.
    """
    _check_time(start, "start")
    _check_time(end, "end")
    if end < start:
        raise ValidationError("end", f"must not be before start ({end!r} < {start!r})")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
        raise ValidationError("gpus", f"must be a positive integer, got {gpus!r}")
    pieces: dict[int, float] = {}
    h = math.floor(start / HOUR_S)
    while h * HOUR_S < end:
        lo = max(start, h * HOUR_S)
        hi = min(end, (h + 1) * HOUR_S)
        if hi > lo:
            pieces[h] = (hi - lo) * gpus
        h += 1
    return pieces


def charged_span(start: float, end: float, *, now: float, earliest: float) -> tuple[float, float]:
    """The part ``[lo, hi)`` of a run ``[start, end)`` that may be charged at ``now``:

        lo = max(start, earliest)        hi = max(lo, min(end, now))

    so ``hi - lo <= now - earliest`` and ``hi - lo <= end - start``, and ``lo == hi`` (an
    empty span) when nothing is left. A run's record can say anything (a skewed or forged
    clock): nothing is charged for time after ``now``, which has not happened, nor before
    ``earliest``, the latest of what else bounds the run from below (its logged start, the
    oldest hour a usage store keeps). So a charge is at most ``gpus x (now - earliest)``
    and the pieces a caller cuts the span into are bounded by that, not by the record.
    All four are finite seconds; ``end < start`` gives an empty span."""
    for name, value in (("start", start), ("end", end), ("now", now), ("earliest", earliest)):
        _check_time(value, name)
    lo = max(start, earliest)
    return lo, max(lo, min(end, now))


# -- charging ----------------------------------------------------------------------------------


def charged_allocation(allocated: bool, allocation: str | None, gpus: int) -> str | None:
    """The allocation a run is charged to: ``allocation`` when the run is allocated, names
    one and holds GPUs; None when the run is free (unallocated) or cannot be charged."""
    if not allocated or allocation is None or gpus <= 0:
        return None
    return allocation


class Slot(NamedTuple):
    """Slot ``k`` of the grid cut to a run: ``[start, end)``, inside ``[k, k + 1) x slot_s``."""

    k: int
    start: float
    end: float


class Settle(NamedTuple):
    """Slot ``k`` must hold ``final`` (``[start, end)``, maybe empty); the live window may
    have charged it as ``whole`` (the slot from ``final``'s start to the grid)."""

    k: int
    whole: tuple[float, float]
    final: tuple[float, float]


@dataclass(frozen=True, slots=True)
class EndCharges:
    """What a run's end charges: ``slots`` (each once per run and ``k``) and ``settles``."""

    slots: tuple[Slot, ...]
    settles: tuple[Settle, ...]

    def new_hours(self, gpus: int) -> dict[int, float]:
        """GPU-seconds per hour these add to a store that holds none of their slots: each
        slot's piece and each settle's final piece (the hours of the charged span)."""
        pieces: dict[int, float] = {}
        spans = [(sl.start, sl.end) for sl in self.slots] + [st.final for st in self.settles]
        for start, end in spans:
            for h, amount in split_into_hours(start, end, gpus).items():
                pieces[h] = pieces.get(h, 0.0) + amount
        return pieces


def check_slot_s(slot_s: object) -> float:
    """``slot_s`` as a float, or ``ValidationError("slot_s")``."""
    if (
        isinstance(slot_s, bool)
        or not isinstance(slot_s, int | float)
        or not math.isfinite(slot_s)
        or not 0 < slot_s <= HOUR_S
    ):
        raise ValidationError("slot_s", f"must be a number of seconds in (0, 3600], got {slot_s!r}")
    return float(slot_s)


def grid_slots(start: float, end: float, slot_s: float, first_k: int | None = None) -> list[Slot]:
    """The non-empty pieces of ``[start, end)`` cut at multiples of ``slot_s``, in order;
    ``first_k`` skips the slots before it. ``[]`` when ``end <= start``."""
    slot_s = check_slot_s(slot_s)
    _check_time(start, "start")
    _check_time(end, "end")
    k = math.floor(start / slot_s)
    if first_k is not None:
        k = max(k, first_k)
    out: list[Slot] = []
    while k * slot_s < end:
        lo = max(start, k * slot_s)
        hi = min(end, (k + 1) * slot_s)
        if hi > lo:
            out.append(Slot(k, lo, hi))
        k += 1
    return out


def complete_until(now: float, slot_s: float) -> float:
    """The end of the last slot the live window charges at ``now``: slots ending at or
    before ``now - slot_s``. The lag of a slot lets an end read a little late find its last
    slot uncharged."""
    return math.floor((now - slot_s) / slot_s) * slot_s


def oldest_charged(now: float, slot_s: float, kept_s: float) -> float:
    """The start of the oldest slot charged at ``now`` by a store that keeps ``kept_s``:
    older time is never charged, whatever a record says, so a run's slots are at most
    ``kept_s / slot_s`` however far back it claims to start."""
    return math.floor((now - kept_s) / slot_s) * slot_s


def accrued_slots(
    started_at: float, *, now: float, earliest: float, slot_s: float, accrued: int | None
) -> list[Slot]:
    """The live window's charges at ``now`` for a run running since ``started_at``: its
    complete slots (``complete_until``) inside ``charged_span``, from slot ``accrued`` on
    (None: none charged yet)."""
    start, end = charged_span(started_at, complete_until(now, slot_s), now=now, earliest=earliest)
    return grid_slots(start, end, slot_s, accrued)


def end_charges(
    started_at: float,
    ended_at: float,
    *,
    now: float,
    earliest: float,
    slot_s: float,
    accrued: int | None,
) -> EndCharges:
    """What makes the run ``[started_at, ended_at)``, read at ``now``, charged exactly its
    ``charged_span``, whatever the live window charged before (``accrued``: its cursor,
    None when it has charged nothing of this run). See the module docstring."""
    slot_s = check_slot_s(slot_s)
    start, end = charged_span(started_at, ended_at, now=now, earliest=earliest)
    slots = grid_slots(start, end, slot_s)
    next_k = slots[-1].k + 1 if slots else math.floor(start / slot_s)
    settles: list[Settle] = []
    if slots and slots[-1].end < (slots[-1].k + 1) * slot_s:  # only the last can be partial
        last = slots.pop()
        settles.append(Settle(last.k, (last.start, (last.k + 1) * slot_s), (last.start, last.end)))
    if accrued is not None:
        # Slots after the end, up to the last the window can have charged whole by now.
        last_k = math.floor(complete_until(now, slot_s) / slot_s) - 1
        for k in range(next_k, last_k + 1):
            lo = max(start, k * slot_s)
            settles.append(Settle(k, (lo, (k + 1) * slot_s), (lo, lo)))
    return EndCharges(tuple(slots), tuple(settles))


def run_hours(started_at: float, ended_at: float, gpus: int) -> dict[int, float]:
    """What the run ``[started_at, ended_at)``, read at its end with nothing charged before,
    costs per hour: ``end_charges(..., now=ended_at, earliest=started_at, accrued=None)
    .new_hours(gpus)`` on any slot grid (its slots tile the span and nothing is settled
    ahead; ``tests/unit/test_charging.py`` proves the two equal to the bit), in one pass
    instead of one per slot. The simulator, whose clock is exact, charges with it."""
    return split_into_hours(started_at, ended_at, gpus)


def settle_hours(
    whole: tuple[float, float], final: tuple[float, float], gpus: int
) -> tuple[dict[int, float], dict[int, float]]:
    """A settle in hours: ``final``'s pieces (added when the slot was not charged), and
    ``final`` minus ``whole`` per hour (added when it was charged whole)."""
    whole_pieces = split_into_hours(whole[0], whole[1], gpus)
    final_pieces = split_into_hours(final[0], final[1], gpus)
    correction = {
        h: final_pieces.get(h, 0.0) - whole_pieces.get(h, 0.0)
        for h in sorted(whole_pieces.keys() | final_pieces.keys())
    }
    return final_pieces, correction


def _weight(h: int, start: float, now: float, half_life_s: float | None) -> float:
    """coverage(h), times the decay factor when a half-life is given."""
    lo = h * HOUR_S
    content_hi = min(lo + HOUR_S, now)  # nothing is charged after now
    counted_lo = max(lo, start)
    counted_hi = content_hi
    if content_hi <= lo:
        # now sits exactly on the hour's start: the bucket can only hold a charge made at
        # now itself, which is inside the window; count it whole.
        coverage = 1.0
        midpoint = now
    elif counted_hi <= counted_lo:
        return 0.0
    else:
        coverage = (counted_hi - counted_lo) / (content_hi - lo)
        midpoint = (counted_lo + counted_hi) / 2
    if half_life_s is None:
        return coverage
    age = now - midpoint
    decay: float = 2.0 ** (-age / half_life_s)
    return coverage * decay


def _check_window(window_s: int) -> None:
    if isinstance(window_s, bool) or not isinstance(window_s, int) or window_s <= 0:
        raise ValidationError("window_s", f"must be a positive integer, got {window_s!r}")


def _check_time(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(name, f"must be a finite number of seconds, got {value!r}")


def _check_amount(amount: object, allocation: str, h: int) -> None:
    if (
        isinstance(amount, bool)
        or not isinstance(amount, int | float)
        or not math.isfinite(amount)
        or amount < 0
    ):
        raise ValidationError(
            f"buckets[{allocation!r}][{h}]",
            f"must be a finite number of GPU-seconds >= 0, got {amount!r}",
        )
