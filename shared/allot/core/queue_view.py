"""The pending queue in service order, for people: what ``allot queue`` and the placement
service's ``WorkloadQueued`` events show.

The order is ``run_cycle``'s (see ``allot.core.cycle``) as of the snapshot, before the cycle
places anything: Fair Tree serves allocated work first, tier 0 (allocation holding fewer GPUs
than its entitlement) before tier 1, then by the allocation's Fair Tree order, then user
priority, submit time and id inside the allocation; unallocated work last, FIFO. A cycle
re-reads tiers as it places work, so an allocation that reaches its entitlement mid-cycle
drops to tier 1 there; this view does not replay that, and work that does not fit is passed
over (the queue does not block), so position is an order of consideration, not a promise.
A plugged-in ordering (``Policy.ordering``) shows its own ``key`` order.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from allot.core.cycle import Snapshot
from allot.core.model import Workload
from allot.core.policy import Policy
from allot.core.running import is_allocated
from allot.core.victims import WORST_ORDER

UNDER, OVER, UNALLOCATED = 0, 1, 2
"""Tiers: under entitlement, at or over entitlement, unallocated."""

TIER_NAMES = {UNDER: "under-entitlement", OVER: "over-entitlement", UNALLOCATED: "unallocated"}


@dataclass(frozen=True, slots=True)
class QueueEntry:
    position: int  # 1-based
    workload: Workload
    tier: int
    order_key: int | None  # Fair Tree order of the allocation (smaller first); None: unallocated


def queue_order(snapshot: Snapshot, policy: Policy) -> list[QueueEntry]:
    """Every pending workload once, in the order a cycle considers them: each allocation's
    queue is already sorted (``PendingQueue``); groups are merged by their current head the
    way ``run_cycle`` merges them."""
    st, queue = snapshot.cluster, snapshot.queue
    if policy.ordering is not None:
        ordered = sorted(queue, key=policy.ordering.key)
        return [
            QueueEntry(i + 1, w, UNALLOCATED if not is_allocated(w) else UNDER, None)
            for i, w in enumerate(ordered)
        ]
    capacity = st.healthy_gpus
    tiered = policy.entitlement_tier
    meta: dict[str | None, tuple[int, int | None]] = {}
    heads: list[tuple[tuple[object, ...], int, str | None]] = []
    group: str | None  # mypyc infers a loop variable's type from its first use
    for seq, group in enumerate(sorted(queue.groups, key=lambda g: (g is None, g or ""))):
        if group is None:
            meta[group] = (UNALLOCATED, None)
        else:
            entitlement = snapshot.shares.get(group, 0.0) * capacity
            below = st.held.get(group, 0) < entitlement
            meta[group] = (
                UNDER if (below or not tiered) else OVER,
                snapshot.order.get(group, WORST_ORDER),
            )
        heads.append((_head(queue.groups[group][0][1], group, meta[group]), seq, group))
    heapq.heapify(heads)
    cursor = dict.fromkeys(queue.groups, 0)
    out: list[QueueEntry] = []
    while heads:
        _, seq, group = heapq.heappop(heads)
        items = queue.groups[group]
        pos = cursor[group]
        tier, order = meta[group]
        out.append(QueueEntry(len(out) + 1, items[pos][1], tier, order))
        cursor[group] = pos + 1
        if pos + 1 < len(items):
            heapq.heappush(heads, (_head(items[pos + 1][1], group, meta[group]), seq, group))
    return out


def _head(w: Workload, group: str | None, meta: tuple[int, int | None]) -> tuple[object, ...]:
    """``run_cycle``'s head key (``_Cycle._head_key``) with the snapshot's tiers."""
    tier, order = meta
    if group is None:
        return (1, 0, 0, w.submit_time, "")
    return (0, tier, order, w.submit_time, group)
