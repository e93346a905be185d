"""Idle stretches as the log records them: a fold of ``WorkloadFlaggedIdle`` and
``WorkloadIdleCleared`` (USAGE, ``allot.v1.usage.idle.<allocation>.<workload>``).

A stretch is one flagged idle run, keyed by (workload, attempt, ``idle_since``): opened by
its flag, closed by its clear (``until``). Its idle GPU-seconds are ``gpus x (end -
idle_since)``, ``end`` being ``until`` once cleared and the caller's ``now`` while open:
GPU time charged to the allocation while its GPUs sat below the idle threshold
(``allot.core.idle``). A clear whose flag the book never saw opens and closes its stretch
at once; a record seen twice changes nothing.

Memory: a closed stretch whose ``until`` is more than ``horizon_s`` older than the newest
record is dropped from ``stretches``; its GPU-seconds stay in ``closed_gpu_seconds`` (per
allocation, forever), so ``total_gpu_seconds`` never forgets. No I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from allot.proto import messages as m

Key = tuple[str, int, float]
"""(workload id, attempt, idle_since)."""


@dataclass(slots=True)
class Stretch:
    workload_id: str
    allocation: str
    attempt: int
    user: str | None
    gpus: int
    since: float
    flagged_at: float
    peak_pct: float = 0.0
    reason: str = ""
    until: float | None = None
    why: str = ""

    def gpu_seconds(self, start: float, end: float) -> float:
        """Idle GPU-seconds within ``[start, end]`` (an open stretch runs until ``end``)."""
        stop = end if self.until is None else min(self.until, end)
        return self.gpus * max(0.0, stop - max(self.since, start))


class IdleBook:
    """See the module docstring."""

    def __init__(self, horizon_s: float = 8 * 86400.0) -> None:
        self.horizon_s = horizon_s
        self.stretches: dict[Key, Stretch] = {}
        self.closed_gpu_seconds: dict[str, float] = {}
        """Per allocation: GPU-seconds of every closed stretch ever read (pruned or not)."""
        self.newest = 0.0
        self._pruned_at = 0.0

    def apply(self, record: msgspec.Struct) -> bool:
        """Fold one record; False when it changes nothing (not an idle record, a repeat)."""
        if isinstance(record, m.WorkloadFlaggedIdle):
            key = (record.workload_id, record.attempt, record.idle_since)
            if key in self.stretches:
                return False
            self.stretches[key] = Stretch(
                workload_id=record.workload_id,
                allocation=record.allocation,
                attempt=record.attempt,
                user=record.user,
                gpus=record.gpus,
                since=record.idle_since,
                flagged_at=record.at,
                peak_pct=record.peak_pct,
                reason=record.reason,
            )
        elif isinstance(record, m.WorkloadIdleCleared):
            key = (record.workload_id, record.attempt, record.idle_since)
            stretch = self.stretches.get(key)
            if stretch is None:
                stretch = self.stretches[key] = Stretch(
                    workload_id=record.workload_id,
                    allocation=record.allocation,
                    attempt=record.attempt,
                    user=None,
                    gpus=record.gpus,
                    since=record.idle_since,
                    flagged_at=record.idle_since,
                )
            elif stretch.until is not None:
                return False
            stretch.until = max(record.until, stretch.since)
            stretch.why = record.why
            total = self.closed_gpu_seconds.get(stretch.allocation, 0.0)
            self.closed_gpu_seconds[stretch.allocation] = total + stretch.gpu_seconds(
                stretch.since, stretch.until
            )
        else:
            return False
        at = record.at
        if at > self.newest:
            self.newest = at
            if at - self._pruned_at >= self.horizon_s / 64:  # amortised, as the timeline's
                self._prune(at - self.horizon_s)
                self._pruned_at = at
        return True

    def open_stretches(self, allocation: str | None = None) -> list[Stretch]:
        """Stretches not cleared (of ``allocation`` when given), oldest first."""
        found = [
            s
            for s in self.stretches.values()
            if s.until is None and (allocation is None or s.allocation == allocation)
        ]
        return sorted(found, key=lambda s: (s.since, s.workload_id))

    def gpu_seconds(self, start: float, end: float) -> dict[str, float]:
        """Per allocation: idle GPU-seconds within ``[start, end]`` (open stretches up to
        ``end``); allocations with none are absent."""
        out: dict[str, float] = {}
        for s in self.stretches.values():
            amount = s.gpu_seconds(start, end)
            if amount > 0:
                out[s.allocation] = out.get(s.allocation, 0.0) + amount
        return out

    def total_gpu_seconds(self, now: float) -> dict[str, float]:
        """Per allocation: every closed stretch's GPU-seconds, plus the open ones up to
        ``now``."""
        out = dict(self.closed_gpu_seconds)
        for s in self.stretches.values():
            if s.until is None:
                out[s.allocation] = out.get(s.allocation, 0.0) + s.gpu_seconds(s.since, now)
        return out

    def _prune(self, cutoff: float) -> None:
        old = [k for k, s in self.stretches.items() if s.until is not None and s.until < cutoff]
        for key in old:
            del self.stretches[key]


__all__ = ["IdleBook", "Stretch"]
