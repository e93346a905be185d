"""What the leader publishes, as values: no I/O, no clock, no state of its own.

``cycle_records`` maps one core ``CycleResult`` to the records that carry it out:

* ``PreemptionNotice`` on ``allot.v1.preempt.<alloc>.<workload>`` (owners and agents; the
  agent sends SIGTERM, and SIGKILL at ``grace_deadline``), with the Fair Tree numbers
  behind it (``LastRanking.notice_numbers``);
* ``WorkloadPlaced`` on ``allot.v1.events.<alloc>.<workload>.placed`` (agents start the
  work), attempt = the workload's last attempt + 1;
* ``HostDrained`` on ``allot.v1.host.<host>.state`` for each host the cycle drained.

``requeued`` and ``cancelled`` are the informational records the leader adds when it reads
a record that causes them. Every record carries the leader's epoch where its type has one
(folds ignore decisions of older epochs) and goes out with a deduplication id
(``Nats-Msg-Id``) built from what makes it unique.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import msgspec

from allot.bus import event_subject
from allot.core.decisions import CycleResult
from allot.core.model import HostState
from allot.eventlog.last_ranking import LastRanking
from allot.eventlog.logfold import WorkloadRecord
from allot.proto import messages as m
from allot.proto import subjects as s

R = TypeVar("R", bound=msgspec.Struct)


@dataclass(frozen=True, slots=True)
class Outgoing(Generic[R]):
    """One record to publish: its subject, the record, its deduplication id."""

    subject: str
    record: R
    msg_id: str


@dataclass(frozen=True, slots=True)
class CycleRecords:
    """A cycle's records, each kind in the order of the ``CycleResult``."""

    notices: tuple[Outgoing[m.PreemptionNotice], ...] = ()
    placements: tuple[Outgoing[m.WorkloadPlaced], ...] = ()
    drains: tuple[Outgoing[m.HostDrained], ...] = ()

    def __len__(self) -> int:
        return len(self.notices) + len(self.placements) + len(self.drains)


def cycle_records(
    result: CycleResult,
    records: Mapping[str, WorkloadRecord],
    ranking: LastRanking,
    *,
    now: float,
    epoch: int,
    cycle: int,
) -> CycleRecords:
    """The records that carry out ``result``, decided at ``now`` by the leader of ``epoch``
    in its ``cycle``-th cycle. ``records``: the fold's workloads (each noticed or placed
    workload is one of them)."""
    notices = []
    for p in result.preemptions:
        rec = records[p.workload_id]
        # Filed, like every other event of the workload, under the allocation it was
        # submitted to, also when it runs unallocated (``min_runtime_s`` 0: charged to
        # nobody, ``p.allocation`` None): its team's subscribers and `allot watch` read
        # there (docs/decisions/0005-placement-on-the-workloads-stream.md).
        filed = rec.workload.allocation
        by = records.get(p.preemptor) if p.preemptor is not None else None
        notice = m.PreemptionNotice(
            workload_id=p.workload_id,
            allocation=filed,
            at=now,
            reason=p.reason.value,
            grace_deadline=p.preempt_at,
            requeue=p.requeue,
            gpus=p.gpus,
            preemptor=p.preemptor,
            victim_held_gpus=p.victim_held_gpus,
            victim_entitlement_gpus=max(0.0, p.victim_entitlement_gpus),
            attempt=rec.attempt,
            epoch=epoch,
            **ranking.notice_numbers(
                p.allocation, by.workload.allocation if by is not None else None
            ),
        )
        notices.append(
            Outgoing(
                s.preempt(filed, p.workload_id),
                notice,
                f"notice:{p.workload_id}:{rec.attempt}:{epoch}",
            )
        )
    placements = []
    for placement in result.placements:
        w = placement.workload
        attempt = records[w.id].attempt + 1
        placed = m.WorkloadPlaced(
            workload_id=w.id,
            allocation=w.allocation,
            at=now,
            gpus=w.gpus,
            assignment=tuple(m.HostGpus(host=h, gpus=g) for h, g in placement.assignment),
            min_runtime_s=w.min_runtime_s,
            attempt=attempt,
            epoch=epoch,
        )
        placements.append(
            Outgoing(event_subject(w.allocation, placed), placed, f"placed:{w.id}:{attempt}")
        )
    drains = [
        Outgoing(
            s.host_state(t.host),
            m.HostDrained(host=t.host, at=now, epoch=epoch),
            f"drained:{t.host}:{epoch}:{cycle}",
        )
        for t in result.transitions
        if t.state is HostState.DRAINED
    ]
    return CycleRecords(tuple(notices), tuple(placements), tuple(drains))


def requeued(rec: WorkloadRecord, at: float, epoch: int) -> Outgoing[m.WorkloadRequeued]:
    """``rec``'s preemption (at ``at``) sent it back to the queue: its owner learns it here."""
    w = rec.workload
    record = m.WorkloadRequeued(
        workload_id=w.id, allocation=w.allocation, at=at, attempt=rec.attempt, epoch=epoch
    )
    return Outgoing(event_subject(w.allocation, record), record, f"requeued:{w.id}:{rec.attempt}")


def cancelled(rec: WorkloadRecord, request: m.CancelRequested) -> Outgoing[m.WorkloadCancelled]:
    """``request`` cancelled ``rec`` while it was pending: nobody else will say it ended."""
    w = rec.workload
    record = m.WorkloadCancelled(
        workload_id=w.id,
        allocation=w.allocation,
        at=request.at,
        by=request.by,
        reason=request.reason,
        attempt=max(1, rec.attempt),
    )
    return Outgoing(event_subject(w.allocation, record), record, f"cancelled:{w.id}")
