"""Small builders for the scheduling-core tests.

Defaults are the common case: 8-GPU healthy hosts, allocated 1-GPU work of allocation "a"
protected for an hour. Running work is placed on the lowest free GPUs of the named hosts,
in the order given, so a test says *where* work runs and never spells out GPU indices
unless they are the point.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from allot.core.cycle import Snapshot, run_cycle
from allot.core.decisions import CycleResult, Preemption
from allot.core.model import Assignment, Host, HostState, Workload
from allot.core.policy import Policy
from allot.core.state import ClusterState, PendingQueue

HOUR = 3600


def host(id: str, gpus: int = 8, state: HostState = HostState.HEALTHY) -> Host:
    return Host(id, gpus, state)


def hosts(n: int, gpus: int = 8) -> list[Host]:
    """``h1`` .. ``hn`` (n <= 9, so ids sort like numbers)."""
    return [host(f"h{i}", gpus) for i in range(1, n + 1)]


def workload(
    id: str,
    gpus: int = 1,
    alloc: str | None = "a",
    *,
    min_runtime_s: int = HOUR,
    priority: int = 0,
    submit: float = 0.0,
    resumable: bool = True,
    user: str = "u",
) -> Workload:
    return Workload(
        id=id,
        allocation=alloc,
        user=user,
        gpus=gpus,
        min_runtime_s=min_runtime_s,
        resumable=resumable,
        priority=priority,
        submit_time=submit,
    )


def free_work(id: str, gpus: int = 1, **kw: Any) -> Workload:
    """Unallocated work: charged to nobody, never protected."""
    return workload(id, gpus, None, min_runtime_s=0, **kw)


@dataclass(frozen=True)
class On:
    """Running work to seed a cluster with."""

    workload: Workload
    hosts: tuple[str, ...]
    start: float = 0.0
    preempt_at: float | None = None


def on(w: Workload, *host_ids: str, start: float = 0.0, preempt_at: float | None = None) -> On:
    return On(w, host_ids, start, preempt_at)


def fill(state: ClusterState, gpus: int, host_ids: Iterable[str]) -> Assignment:
    """The lowest free GPUs of each host in turn, until ``gpus`` are covered."""
    parts: list[tuple[str, tuple[int, ...]]] = []
    left = gpus
    for host_id in host_ids:
        take = tuple(state.free[host_id][:left])
        if take:
            parts.append((host_id, take))
            left -= len(take)
    assert left == 0, f"{gpus} GPUs do not fit on {tuple(host_ids)}"
    return tuple(sorted(parts))


def cluster(
    host_list: Iterable[Host],
    *running: On,
    pools: Mapping[str, str] | None = None,
    short_lane: Iterable[str] = (),
) -> ClusterState:
    state = ClusterState(host_list, pools, short_lane=short_lane)
    for r in running:
        assignment = fill(state, r.workload.gpus, r.hosts)
        state.start(r.workload, assignment, r.start)
        if r.preempt_at is not None:
            state.notice(r.workload.id, r.preempt_at)
    return state


def snapshot(
    state: ClusterState,
    *pending: Workload,
    shares: Mapping[str, float] | None = None,
    order: Mapping[str, int] | None = None,
    idle: Iterable[str] = (),
) -> Snapshot:
    return Snapshot(
        state, PendingQueue(pending), dict(shares or {}), dict(order or {}), frozenset(idle)
    )


def decide(
    state: ClusterState,
    *pending: Workload,
    shares: Mapping[str, float] | None = None,
    order: Mapping[str, int] | None = None,
    now: float = 0.0,
    idle: Iterable[str] = (),
    **policy: Any,
) -> CycleResult:
    """One cycle over ``state`` with ``pending`` queued, under ``Policy(**policy)``;
    ``idle``: the runs flagged idle for preemption (``Snapshot.idle``)."""
    snap = snapshot(state, *pending, shares=shares, order=order, idle=idle)
    return run_cycle(snap, Policy(**policy), now)


# -- reading results -----------------------------------------------------------------------


def placed(result: CycleResult) -> dict[str, Assignment]:
    return {p.workload.id: p.assignment for p in result.placements}


def placed_order(result: CycleResult) -> list[str]:
    return [p.workload.id for p in result.placements]


def preempted(result: CycleResult) -> dict[str, Preemption]:
    return {p.workload_id: p for p in result.preemptions}


def gpus(host_id: str, *indices: int) -> tuple[str, tuple[int, ...]]:
    """One part of an assignment: ``gpus("h1", 0, 1)``."""
    return (host_id, indices)


def span(host_id: str, first: int, last: int) -> tuple[str, tuple[int, ...]]:
    """GPUs ``first..last`` (inclusive) of one host."""
    return (host_id, tuple(range(first, last + 1)))
