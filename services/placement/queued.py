"""Queue positions for their owners: ``WorkloadQueued`` on core NATS
(``allot.v1.queued.<alloc>.<workload>``, not the log: positions are derived and move with
the queue) for the new pending work a cycle left pending, with its position, reason and
estimated start.

A batch goes at most once every ``QUEUED_EVERY_S``, and explaining the queue for it may
take at most ``QUEUED_COST_SHARE`` of the leader's time: the next batch waits
``cost / QUEUED_COST_SHARE`` when the last explanation took ``cost``
(docs/decisions/0006-queue-explanations-are-cached-and-paced.md).
"""

from __future__ import annotations

from allot.proto import messages as m

QUEUED_EVERY_S = 1.0
"""At most one batch of ``WorkloadQueued`` per second (positions are costly to compute)."""
QUEUED_COST_SHARE = 0.05
"""``WorkloadQueued`` batches take at most this share of the leader's time."""


class OwedPositions:
    """Which new pending work is owed a position (``new``: submitted or requeued while we
    lead, not yet placed or told), and when the next batch may go."""

    def __init__(self) -> None:
        self.new: set[str] = set()
        self.last_at = 0.0

    def take(
        self, now: float, considered: set[str], explain_cost_s: float
    ) -> tuple[set[str], float | None]:
        """After a cycle that decided on ``considered`` (the new work when it began): the
        workloads to send positions for now (forgotten here), or none and when the next
        batch is due (None: nothing is owed)."""
        every = max(QUEUED_EVERY_S, explain_cost_s / QUEUED_COST_SHARE)
        waiting = considered & self.new  # those it placed are gone
        if not waiting:
            return set(), None
        if now - self.last_at >= every:
            self.last_at = now
            self.new -= waiting
            return waiting, None
        return set(), self.last_at + every


def queued(row: m.QueueRow, at: float) -> m.WorkloadQueued:
    """The position notice of a queue row."""
    return m.WorkloadQueued(
        workload_id=row.workload_id,
        allocation=row.allocation,
        at=at,
        position=row.position,
        sort_metric=row.sort_metric,
        rank=row.rank,
        why=row.why,
        reason=row.reason,
        est_start=row.est_start,
    )
