"""Folding decisions and their consequences into the state, the same way for every caller.

The simulator applies a cycle's result at once; the placement service applies it as the
events come back from the log. Both use these two functions, so the state they hand the
next cycle is built by the same code.
"""

from __future__ import annotations

from allot.core.decisions import CycleResult
from allot.core.model import Workload
from allot.core.running import Running
from allot.core.state import ClusterState, PendingQueue


def apply_result(state: ClusterState, queue: PendingQueue, result: CycleResult, now: float) -> None:
    """Start the placements, record the notices, move hosts. Nothing ends here: a noticed
    workload keeps its GPUs until the caller reports it gone (``end_workload``)."""
    for transition in result.transitions:
        state.set_host_state(transition.host, transition.state)
    for preemption in result.preemptions:
        state.notice(preemption.workload_id, preemption.preempt_at, preemption.preemptor)
    for placement in result.placements:
        queue.remove(placement.workload.id)
        state.start(placement.workload, placement.assignment, now)
    state.prune_protection(now)


def end_workload(
    state: ClusterState,
    queue: PendingQueue,
    workload_id: str,
    *,
    preempted: bool,
    now: float | None = None,
    requeue: bool = True,
) -> tuple[Running, Workload | None]:
    """The workload left its GPUs. A preempted resumable workload is requeued with its
    original submit time (a preemption does not send it to the back of its allocation's
    queue), remembering the request it made room for, if any, and the GPUs it left for
    that request (``PendingQueue.keep_room``); returns the ended run and the
    requeued workload, if any. ``now``: when it left (the hosts' GPUs settle from then
    before unallocated work may take them). ``requeue`` False: its notice said it does not
    come back (``Preemption.requeue``: a run preempted for idleness)."""
    for_id = state.noticed_for.get(workload_id)
    run = state.finish(workload_id, now)
    if for_id is not None and run.preempt_at is not None:
        queue.keep_room(for_id, run.assignment, run.preempt_at)
    if preempted and requeue and run.workload.resumable:
        since = run.preempt_at if run.preempt_at is not None else run.start_time
        queue.add(run.workload, None if for_id is None else (for_id, since))
        return run, run.workload
    return run, None
