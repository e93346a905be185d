"""The cycle-duration histogram of ``allot.v1.query.placement_stats`` (``PlacementStats``):
how long the leader's cycles took since it became leader, and how much of that was
deciding and how much waiting for the cycle's appends."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

CYCLE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Upper bounds of the buckets (seconds); +Inf is implied."""


class CycleDurations:
    """A cumulative histogram of cycle durations, Prometheus style: ``counts[i]`` cycles
    took <= ``buckets_s[i]``; the last count (+Inf) is every cycle. Beside it, the sums
    of two parts of those durations: deciding, and waiting for the cycle's appends."""

    def __init__(self, buckets_s: Sequence[float] = CYCLE_BUCKETS_S) -> None:
        self.buckets_s = tuple(buckets_s)
        self._per_bucket = [0] * (len(self.buckets_s) + 1)  # not cumulative; last: +Inf
        self.sum_s = 0.0
        self.count = 0
        self.decide_s = 0.0
        self.append_wait_s = 0.0

    def observe(self, seconds: float, decide_s: float = 0.0, append_wait_s: float = 0.0) -> None:
        # bisect_left: a duration equal to a bound belongs to that bound's bucket (le).
        self._per_bucket[bisect_left(self.buckets_s, seconds)] += 1
        self.sum_s += seconds
        self.count += 1
        self.decide_s += decide_s
        self.append_wait_s += append_wait_s

    def counts(self) -> tuple[int, ...]:
        out: list[int] = []
        total = 0
        for n in self._per_bucket:
            total += n
            out.append(total)
        return tuple(out)
