"""The last ranking as placement (and ``allot twin``, replaying it) uses it: the ranking
service's ``RankingUpdated`` (on ``allot.v1.ranking``, the last one read from USAGE at
start) turned into the cycle's order of allocations, each leaf's rank and Fair Tree factor
for the answers, and the numbers behind a preemption notice."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from allot.core.cycle import Snapshot
from allot.eventlog.logfold import LogFold
from allot.proto import messages as m


@dataclass(frozen=True, slots=True)
class LastRanking:
    """Per ranked leaf: ``rank_of`` (the best of n leaves has rank n), ``order`` (the cycle's
    order key, ``n - rank``: smaller is served first, as ``core.fairshare.Ranking.order_key``),
    ``fairshare`` (the Fair Tree factor), ``window_gpu_s`` (usage in the window).
    ``version`` counts the rankings read: a cached queue answer keys on it."""

    rank_of: Mapping[str, int] = field(default_factory=dict)
    order: Mapping[str, int] = field(default_factory=dict)
    fairshare: Mapping[str, float] = field(default_factory=dict)
    window_gpu_s: Mapping[str, float] = field(default_factory=dict)
    version: int = 0

    @classmethod
    def of(cls, update: m.RankingUpdated, version: int) -> LastRanking:
        """The ranked leaves of ``update``; a leaf without a rank is left out."""
        leaves = [row for row in update.nodes if row.leaf and row.rank is not None]
        n = len(leaves)
        rank_of = {row.name: row.rank for row in leaves if row.rank is not None}
        return cls(
            rank_of=rank_of,
            order={name: n - r for name, r in rank_of.items()},
            fairshare={row.name: row.fairshare or 0.0 for row in leaves},
            window_gpu_s={row.name: max(0.0, row.raw_usage) for row in leaves},
            version=version,
        )

    def snapshot(self, fold: LogFold) -> Snapshot:
        """What a cycle reads: the fold's cluster, queue and shares, in this order, and the
        runs flagged idle for preemption."""
        return Snapshot(fold.state, fold.queue, fold.shares(), self.order, idle=fold.idle_preempt())

    def notice_numbers(self, victim: str | None, preemptor: str | None) -> dict[str, Any]:
        """The Fair Tree numbers behind a notice: window usage, rank and fairshare factor of
        the ``victim`` and ``preemptor`` allocations (absent when the allocation is None,
        None when it is not ranked)."""
        out: dict[str, Any] = {}
        if victim is not None:
            out["victim_window_gpu_s"] = self.window_gpu_s.get(victim)
            out["victim_rank"] = self.rank_of.get(victim)
            out["victim_fairshare"] = self.fairshare.get(victim)
        if preemptor is not None:
            out["preemptor_allocation"] = preemptor
            out["preemptor_window_gpu_s"] = self.window_gpu_s.get(preemptor)
            out["preemptor_rank"] = self.rank_of.get(preemptor)
            out["preemptor_fairshare"] = self.fairshare.get(preemptor)
        return out
