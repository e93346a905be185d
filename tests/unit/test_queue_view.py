"""``queue_order``: the order a cycle considers pending work, for people."""

from __future__ import annotations

from allot.core.cycle import Snapshot
from allot.core.model import Host, Workload
from allot.core.policy import FIFO, Policy
from allot.core.queue_view import OVER, UNALLOCATED, UNDER, queue_order
from allot.core.state import ClusterState, PendingQueue


def w(wid: str, alloc: str | None, t: float, gpus: int = 1, prio: int = 0) -> Workload:
    return Workload(wid, alloc, "u", gpus, 600 if alloc else 0, priority=prio, submit_time=t)


def test_tiers_then_fair_tree_then_priority_then_fifo_unallocated_last() -> None:
    st = ClusterState([Host("h1", 8)])
    st.start(w("run-a", "a", 0.0, gpus=6), (("h1", tuple(range(6))),), 0.0)  # a over
    queue = PendingQueue(
        [
            w("free-1", None, 1.0),
            w("a-1", "a", 2.0),
            w("b-1", "b", 5.0),
            w("b-2", "b", 4.0, prio=5),
            w("c-1", "c", 3.0),
            w("free-0", None, 0.5),
        ]
    )
    shares = {"a": 0.25, "b": 0.25, "c": 0.5}
    order = {"c": 0, "b": 1, "a": 2}
    entries = queue_order(Snapshot(st, queue, shares, order), Policy())
    assert [e.workload.id for e in entries] == ["c-1", "b-2", "b-1", "a-1", "free-0", "free-1"]
    assert [e.tier for e in entries] == [UNDER, UNDER, UNDER, OVER, UNALLOCATED, UNALLOCATED]
    assert [e.position for e in entries] == [1, 2, 3, 4, 5, 6]


def test_without_the_tier_and_under_fifo() -> None:
    st = ClusterState([Host("h1", 8)])
    queue = PendingQueue([w("a-1", "a", 2.0), w("b-1", "b", 1.0), w("f", None, 0.0)])
    snap = Snapshot(st, queue, {"a": 0.5, "b": 0.5}, {"a": 0, "b": 1})
    no_tier = queue_order(snap, Policy(entitlement_tier=False))
    assert [e.workload.id for e in no_tier] == ["a-1", "b-1", "f"]
    fifo = queue_order(snap, Policy(preemption=False, ordering=FIFO))
    assert [e.workload.id for e in fifo] == ["f", "b-1", "a-1"]
