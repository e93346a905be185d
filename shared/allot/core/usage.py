"""The usage window: how much GPU time each allocation has consumed lately.

Accounting stores usage in hourly buckets: ``buckets[allocation][h]`` is the GPU-seconds
charged to ``allocation`` during hour ``h``, i.e. during ``[3600 h, 3600 (h + 1))`` on the
caller's clock (``h = floor(t / 3600)``). ``split_into_hours`` turns one interval of
allocated running time into such bucket amounts; ``window_usage`` folds the buckets into
one number per allocation, the input of Fair Tree ranking. ``charged_span`` cuts what a
run's record claims to what may be charged: nothing after now, nothing before the run's
other lower bounds (its logged start, the oldest hour kept).

Only *allocated* time is ever charged: callers pass the intervals during which a workload
was allocated (charged to an allocation with ``min_runtime_s > 0``, see
``allot.core.model``). Unallocated work is free and never reaches these functions.

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

Ranges: every input amount is a finite GPU-seconds >= 0; outputs are >= 0 and contain every
allocation named in ``buckets`` (0.0 when nothing is in the window).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

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
    if isinstance(window_s, bool) or not isinstance(window_s, int) or window_s <= 0:
        raise ValidationError("window_s", f"must be a positive integer, got {window_s!r}")
    if half_life_s is not None and (
        isinstance(half_life_s, bool)
        or not isinstance(half_life_s, int | float)
        or not math.isfinite(half_life_s)
        or half_life_s <= 0
    ):
        raise ValidationError("half_life_s", f"must be a positive number, got {half_life_s!r}")

    start = now - window_s
    first_hour = math.floor(start / HOUR_S)
    last_hour = math.floor(now / HOUR_S)
    span = last_hour - first_hour + 1
    result: dict[str, float] = {}
    for allocation, hours in buckets.items():
        if half_life_s is None:
            result[allocation] = _window_sum(
                allocation, hours, start=start, now=now, first_hour=first_hour, span=span
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


def _window_sum(
    allocation: str,
    hours: Mapping[int, float],
    *,
    start: float,
    now: float,
    first_hour: int,
    span: int,
) -> float:
    """The sliding window without decay: interior hours count whole, the two edge hours
    through ``_weight``. The simulator calls this every few virtual minutes over months of
    buckets, so the interior is summed in C (``map`` over ``dict.get``) and validated in
    bulk; only a bad value pays for the per-bucket check that names it."""
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
    terms = [total]
    for h in (first_hour, last_hour) if span > 1 else (first_hour,):
        edge = hours.get(h)
        if edge:
            _check_amount(edge, allocation, h)
            terms.append(edge * _weight(h, start, now, None))
    return math.fsum(terms)


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
