"""When a workload's story is over, as seen by ``Client.watch`` (pure, no I/O).

Completed, failed and cancelled are final. A preemption is final only when the workload
is not coming back: the ``PreemptionNotice`` says ``requeue`` (placement decides it from
``resumable``; never for a run preempted for idleness), and placement may log
``WorkloadRequeued`` before or after the agent's ``WorkloadPreempted``, so both orders are
handled. Without a notice (not expected), the submission's ``resumable`` decides, and a
workload submitted before the watch began is taken as resumable (the wire default).
"""

from __future__ import annotations

import msgspec

from allot.proto import messages as m

FINAL = (m.WorkloadCompleted, m.WorkloadFailed, m.WorkloadCancelled)


class Ending:
    """Feed every record of one workload in log order; ``ends`` says when to stop."""

    def __init__(self) -> None:
        self._resumable = True
        self._requeue: bool | None = None
        """The latest notice's ``requeue``; None before any notice."""
        self._requeued_since_notice = False

    def ends(self, record: msgspec.Struct) -> bool:
        if isinstance(record, FINAL):
            return True
        if isinstance(record, m.WorkloadSubmitted):
            self._resumable = record.resumable
        elif isinstance(record, m.PreemptionNotice):
            self._requeue = record.requeue
            self._requeued_since_notice = False
        elif isinstance(record, m.WorkloadRequeued):
            self._requeued_since_notice = True
        elif isinstance(record, m.WorkloadPreempted):
            if self._requeued_since_notice:
                return False
            return not (self._resumable if self._requeue is None else self._requeue)
        return False
