"""The live state as a fold over the log: the same records, in the same order, give the same
state in every process that reads them (placement leader, standby, agents, a restart).

``LogFold.apply(record)`` takes one decoded record of the WORKLOADS, HOSTS or USAGE streams
and updates the core's ``ClusterState`` and ``PendingQueue`` with the same operations the
simulator uses (``allot.core.fold``). It never raises on a record that does not fit (a
duplicate, a stale decision, an event of an older attempt): it ignores it and says why, so a
replay after a crash, a redelivery or a paused old leader cannot corrupt the state.

Rules that make the log safe to replay and hard to corrupt:

* **Workload ids are derived from (allocation, client_id)**; a second ``WorkloadSubmitted``
  of a known id is a duplicate and changes nothing.
* **Fencing.** ``LeaderElected`` raises the epoch; ``WorkloadPlaced`` and
  ``PreemptionNotice`` apply only when they carry the current epoch. A paused old leader's
  decisions land after the new leader's ``LeaderElected`` and are ignored everywhere.
* **Attempts.** Each placement starts attempt ``n + 1``; agent reports (started, ended)
  apply only to the current attempt of a running workload.
* **No double booking.** A placement applies only when every GPU it names is free on a
  known host (``ClusterState.start`` checks) and the workload is pending.
* **Order across streams.** Every reader replays HOSTS to its end, then WORKLOADS, then
  follows both. Nothing in WORKLOADS depends on a host's *state*, only on it being
  registered (hosts are never removed), so that order gives every reader the same state.
  Live, a placement waits in the reader until HOSTS is read as far as its writer had read
  it (``allot.bus.HOSTS_SEQ_HEADER``), so its hosts are registered here too.

What an ended workload keeps (``allot status``, like ``sacct``): its last attempt's
placement time and assignment, its end time, exit code and reason, and who cancelled it.
The fold may hold hundreds of thousands of ended workloads, so this stays small: equal
assignments are one shared tuple (``_shared``: a host's usual GPU sets repeat), reasons are
cut to ``KEPT_REASON_LEN`` characters and interned (the same reason is stored once), and
nothing else of the end record is kept (bytes per ended workload: docs/decisions/0021).

Drains (``allot hosts``, like ``sinfo -R``): the last ``HostDraining`` of a host that is not
healthy again is kept in ``drains`` (its reason, operator and time), dropped by
``HostHealthy``.

Idle flags (USAGE, ``allot.v1.usage.idle.<a>.<w>``; docs/decisions/0055): a
``WorkloadFlaggedIdle`` asking for preemption (``preempt``) is kept per workload with its
attempt and ``idle_since`` until its ``WorkloadIdleCleared``, its attempt's end or a later
placement; ``idle_preempt()`` is the running workloads whose *current* attempt is so
flagged (what placement hands the core), so a flag of an earlier attempt never touches a
later one, whichever stream a reader reads first. A flag only (``preempt`` false) changes
nothing. A notice saying ``requeue`` false (idleness) is kept until the run ends: the run
is then not requeued, resumable or not.

No I/O, no clock: times come from the records.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from allot.core.budgets import BudgetTree
from allot.core.errors import ValidationError
from allot.core.fold import end_workload
from allot.core.model import Assignment, Host, HostState, Workload
from allot.core.state import ClusterState, PendingQueue
from allot.eventlog.budget_wire import tree_from_spec
from allot.eventlog.lost_work import CheckpointSpec
from allot.proto import messages as m

Status = Literal[
    "pending", "running", "noticed", "completed", "failed", "cancelled", "preempted", "unknown"
]


@dataclass(slots=True)
class WorkloadRecord:
    """What the log says about one workload (its spec and where it is in its life)."""

    workload: Workload
    client_id: str
    command: tuple[str, ...]
    duration_s: float | None
    env: dict[str, str] = field(default_factory=dict)
    status: Status = "pending"
    attempt: int = 0
    started_at: float | None = None  # the last attempt's placement time
    run_started_at: float | None = None
    """When the last attempt's primary host reported its run started (``WorkloadStarted``);
    None until then: placed is not yet running."""
    preempt_at: float | None = None
    assignment: Assignment = ()
    """The last attempt's hosts and GPUs: kept after it ends (what ``allot status`` shows of
    an ended workload); the GPUs are held only while ``status`` is running or noticed."""
    cancel_requested: bool = False
    ended_at: float | None = None
    exit_code: int | None = None
    """The end record's exit code: 0 for completed (a clean exit), a failure's own code."""
    end_reason: str = ""
    """Why it ended (a failure's reason, a cancel's reason, a preemption's code), cut to
    ``KEPT_REASON_LEN`` characters and interned."""
    ended_by: str | None = None
    """Who cancelled it."""
    requeued_at: float | None = None
    requeue_reason: str = ""
    """When and why (a preemption's code) its last attempt ended and sent it back to the
    queue; shown while it is pending again."""
    checkpoint: CheckpointSpec | None = None
    """Issue 40: the submission's checkpoint protocol (None: it asked for none)."""
    checkpoint_dir: str | None = None
    """Where the last started attempt's checkpoints go, as its agent reported it."""
    checkpoints: tuple[m.AttemptCheckpoint, ...] = ()
    """Each preempted attempt's checkpoint (``allot status``): kept only for work under
    the protocol, so other work keeps nothing more."""


@dataclass(frozen=True, slots=True)
class Drain:
    """The ``HostDraining`` record that drains a host: what ``allot hosts`` shows of it."""

    at: float
    reason: str
    by: str | None  # the operator; None when the health service drained it


@dataclass(frozen=True, slots=True)
class Applied:
    """What a record did: ``changed`` False means it was ignored, ``why`` says why."""

    changed: bool
    why: str = ""
    requeued: bool = False


_IGNORED_STALE = Applied(False, "stale epoch")
_INFO = Applied(False, "informational")

TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled", "preempted"})
CANCEL_LEAVES_S = 10.0
"""How long a cancelled run takes to leave at most: the agents' default ``kill_after_s``
(SIGTERM at the cancel, SIGKILL that long after)."""
KEPT_REASON_LEN = 200
"""Characters of an end reason an ended workload keeps (the log has the whole text)."""
SHARED_ASSIGNMENTS = 65_536
MAX_KEPT_CHECKPOINTS = 1024
"""Preempted attempts' checkpoints a workload keeps (``WorkloadStatus.checkpoints``)."""
"""Distinct assignments remembered for sharing; the table starts over when full."""


def _kept(text: str | None) -> str | None:
    """A short string worth sharing between records: cut and interned."""
    return None if text is None else sys.intern(text[:KEPT_REASON_LEN])


class LogFold:
    """State rebuilt from the log. Read ``state``, ``queue``, ``tree``, ``records``."""

    def __init__(self, short_lane: Iterable[str] = ()) -> None:
        """``short_lane``: the placement service's short-lane hosts (``ClusterState``)."""
        self.state = ClusterState([], short_lane=short_lane)
        self.queue = PendingQueue()
        self.tree: BudgetTree | None = None
        self.epoch = 0
        self.leader = ""
        self.records: dict[str, WorkloadRecord] = {}
        self.drains: dict[str, Drain] = {}
        """host -> the drain in force (draining or drained), until ``HostHealthy``."""
        self.idle_flags: dict[str, tuple[int, float]] = {}
        """workload -> (attempt, idle_since) of its open idle flag asking for preemption."""
        self._not_requeued: set[str] = set()
        """Runs under a notice that says they do not come back (``requeue`` false)."""
        self._assignments: dict[Assignment, Assignment] = {}
        self.applied = 0
        self.ignored = 0

    # ------------------------------------------------------------------ entry point
    def apply(self, record: msgspec.Struct) -> Applied:
        handler = _HANDLERS.get(type(record))
        result = _INFO if handler is None else handler(self, record)
        if result.changed:
            self.applied += 1
        elif result is not _INFO:
            self.ignored += 1
        return result

    # ------------------------------------------------------------------ queries
    def workload_on(self, host: str) -> set[str]:
        return set(self.state.on_host.get(host, ()))

    def shares(self) -> dict[str, float]:
        return self.tree.effective_shares() if self.tree is not None else {}

    def idle_preempt(self) -> frozenset[str]:
        """Running workloads whose current attempt is flagged idle with ``preempt``."""
        if not self.idle_flags:
            return frozenset()
        records = self.records
        return frozenset(
            wid
            for wid, (attempt, _) in self.idle_flags.items()
            if (rec := records.get(wid)) is not None
            and rec.attempt == attempt
            and rec.status == "running"
        )

    # ------------------------------------------------------------------ workloads
    def _submitted(self, r: m.WorkloadSubmitted) -> Applied:
        if r.workload_id in self.records:
            return Applied(False, "duplicate submission")
        w = Workload(
            id=r.workload_id,
            allocation=r.allocation,
            user=r.user,
            gpus=r.gpus,
            min_runtime_s=r.min_runtime_s,
            resumable=r.resumable,
            kind=r.kind,
            priority=r.priority,
            submit_time=r.at,
        )
        self.records[w.id] = WorkloadRecord(
            w, r.client_id, r.command, r.duration_s, r.env, checkpoint=CheckpointSpec.of(r)
        )
        self.queue.add(w)
        return Applied(True)

    def _cancel_requested(self, r: m.CancelRequested) -> Applied:
        rec = self.records.get(r.workload_id)
        if rec is None or rec.status in TERMINAL:
            return Applied(False, "nothing to cancel")
        if rec.workload.id in self.queue:
            self.queue.remove(rec.workload.id)
            rec.status = "cancelled"
            rec.ended_at = r.at
            rec.end_reason = _kept(r.reason) or ""
            rec.ended_by = _kept(r.by)
            return Applied(True)
        rec.cancel_requested = True  # running: its agent stops it and reports
        if rec.status == "running":
            # Its GPUs are leaving: shown to the core as under notice until the agent's
            # SIGKILL, so a request that needs them waits for them instead of preempting
            # other work (else, during a cancel's checkpoint, a third job was preempted
            # for GPUs freed seconds later).
            self.state.notice(rec.workload.id, r.at + CANCEL_LEAVES_S)
        return Applied(True)

    def _leader(self, r: m.LeaderElected) -> Applied:
        if r.epoch <= self.epoch:
            return Applied(False, f"epoch {r.epoch} is not newer than {self.epoch}")
        self.epoch = r.epoch
        self.leader = r.leader
        return Applied(True)

    def _placed(self, r: m.WorkloadPlaced) -> Applied:
        if r.epoch != self.epoch:
            return _IGNORED_STALE
        rec = self.records.get(r.workload_id)
        if rec is None or rec.workload.id not in self.queue:
            return Applied(False, "not pending")
        if r.attempt != rec.attempt + 1:
            return Applied(False, f"attempt {r.attempt} after {rec.attempt}")
        for hg in r.assignment:
            # Host *state* is not checked: the HOSTS stream is replayed before WORKLOADS, so
            # a replay sees final host states; the leader only places on healthy hosts.
            if hg.host not in self.state:
                return Applied(False, f"host {hg.host} is unknown")
        assignment = self._shared(tuple((hg.host, tuple(hg.gpus)) for hg in r.assignment))
        try:
            self.state.start(rec.workload, assignment, r.at)
        except ValidationError as e:
            return Applied(False, str(e))  # GPUs not free: a decision that would double-book
        self.queue.remove(rec.workload.id)
        self.state.prune_protection(r.at)  # as apply_result does: lapsed entries leave the heap
        flag = self.idle_flags.get(rec.workload.id)
        if flag is not None and flag[0] < r.attempt:
            del self.idle_flags[rec.workload.id]
        rec.status = "running"
        rec.attempt = r.attempt
        rec.started_at = r.at
        rec.run_started_at = None
        rec.preempt_at = None
        rec.assignment = assignment
        return Applied(True)

    def _shared(self, assignment: Assignment) -> Assignment:
        """One tuple for equal assignments: each ended workload keeps its last one, and a
        host's usual GPU sets repeat, so most cost a reference instead of ~200 bytes."""
        kept = self._assignments.get(assignment)
        if kept is not None:
            return kept
        if len(self._assignments) >= SHARED_ASSIGNMENTS:
            self._assignments.clear()  # bounded; the tuples kept by records stay shared
        self._assignments[assignment] = assignment
        return assignment

    def _notice(self, r: m.PreemptionNotice) -> Applied:
        if r.epoch != self.epoch:
            return _IGNORED_STALE
        rec = self._current(r.workload_id, r.attempt)
        if rec is None or rec.status != "running":
            return Applied(False, "not running")
        self.state.notice(rec.workload.id, r.grace_deadline, r.preemptor)
        if not r.requeue:
            self._not_requeued.add(rec.workload.id)
        rec.status = "noticed"
        rec.preempt_at = r.grace_deadline
        return Applied(True)

    def _ended(
        self,
        r: m.WorkloadPreempted | m.WorkloadCompleted | m.WorkloadFailed | m.WorkloadCancelled,
        status: Status,
    ) -> Applied:
        workload_id = r.workload_id
        rec = self._current(workload_id, r.attempt)
        if rec is None or rec.status not in ("running", "noticed"):
            return Applied(False, "not running")
        preempted = status == "preempted"
        comes_back = workload_id not in self._not_requeued
        self._not_requeued.discard(workload_id)
        flag = self.idle_flags.get(workload_id)
        if flag is not None and flag[0] <= r.attempt:
            del self.idle_flags[workload_id]
        _, requeued = end_workload(
            self.state, self.queue, workload_id, preempted=preempted, now=r.at, requeue=comes_back
        )
        rec.preempt_at = None  # the assignment stays: the last attempt's, for `allot status`
        if isinstance(r, m.WorkloadPreempted) and rec.checkpoint is not None:
            rec.checkpoints = (
                *rec.checkpoints[-(MAX_KEPT_CHECKPOINTS - 1) :],
                m.AttemptCheckpoint(
                    attempt=r.attempt,
                    outcome=r.checkpoint,
                    checkpointed_at=r.checkpointed_at,
                    lost_gpu_seconds=r.lost_gpu_seconds,
                ),
            )
        if requeued is not None and not rec.cancel_requested:
            rec.status = "pending"
            rec.requeued_at = r.at
            rec.requeue_reason = _kept(getattr(r, "reason", "")) or ""
            return Applied(True, requeued=True)
        if requeued is not None:  # cancelled while under notice: do not queue it again
            self.queue.remove(workload_id)
            status = "cancelled"
        rec.status = status
        rec.ended_at = r.at
        # A completion is a clean exit (the agent reports exit code 0 as completed).
        rec.exit_code = 0 if isinstance(r, m.WorkloadCompleted) else getattr(r, "exit_code", None)
        rec.end_reason = _kept(getattr(r, "reason", "")) or ""
        rec.ended_by = _kept(getattr(r, "by", None))
        return Applied(True)

    def _started(self, r: m.WorkloadStarted) -> Applied:
        rec = self._current(r.workload_id, r.attempt)
        if rec is None or rec.status == "pending":
            return Applied(False, "not running")
        if rec.run_started_at is not None:
            return Applied(False, "start known")  # the first report of an attempt stands
        # An ended attempt takes it too: its start may be read after its end (the
        # placement service reads starts only when asked, ``DECISION_INPUTS``).
        # What ``allot status`` shows; nothing the scheduler decides on changes (no cycle).
        rec.run_started_at = r.at
        if r.checkpoint_dir is not None:
            rec.checkpoint_dir = r.checkpoint_dir
        return _INFO

    def _current(self, workload_id: str, attempt: int) -> WorkloadRecord | None:
        rec = self.records.get(workload_id)
        if rec is None or rec.attempt != attempt:
            return None
        return rec

    # ------------------------------------------------------------------ hosts
    def _registered(self, r: m.HostRegistered) -> Applied:
        if r.host in self.state:
            return Applied(False, "already registered")
        self.state.add_host(Host(r.host, r.gpus))
        return Applied(True)

    def _draining(self, r: m.HostDraining) -> Applied:
        if r.host in self.state:
            # The latest drain is the one in force (a second one replaces its reason), as
            # for the health service, whatever the state change below says.
            self.drains[r.host] = Drain(r.at, _kept(r.reason) or "", _kept(r.by))
        return self._host_state(r.host, HostState.DRAINING)

    def _healthy(self, r: m.HostHealthy) -> Applied:
        if r.host in self.state:
            self.drains.pop(r.host, None)
        return self._host_state(r.host, HostState.HEALTHY)

    def _host_state(self, host: str, state: HostState) -> Applied:
        if host not in self.state:
            return Applied(False, "unknown host")
        if self.state.host(host).state is state:
            return Applied(False, "no change")
        self.state.set_host_state(host, state)
        return Applied(True)

    def _drained(self, r: m.HostDrained) -> Applied:
        # Not fenced: the epoch lives in the WORKLOADS stream and a replay reads HOSTS first.
        # A stale "drained" is harmless (it only asks an operator to look at the host).
        if r.host not in self.state or self.state.host(r.host).state is not HostState.DRAINING:
            return Applied(False, "not draining")
        return self._host_state(r.host, HostState.DRAINED)

    # ------------------------------------------------------------------ idle flags
    def _flagged_idle(self, r: m.WorkloadFlaggedIdle) -> Applied:
        if not r.preempt:
            return _INFO  # flag only: nothing the scheduler decides on
        wid = r.workload_id
        rec = self.records.get(wid)
        # A record not read yet (USAGE is replayed before WORKLOADS) is kept: the
        # attempt decides once it is.
        if rec is not None and (
            r.attempt < rec.attempt or (r.attempt == rec.attempt and rec.status in TERMINAL)
        ):
            return Applied(False, "the flagged attempt has ended")
        kept = self.idle_flags.get(wid)
        if kept is not None and kept[0] > r.attempt:
            return Applied(False, f"attempt {r.attempt} after {kept[0]}")
        if kept == (r.attempt, r.idle_since):
            return Applied(False, "already flagged")
        self.idle_flags[wid] = (r.attempt, r.idle_since)
        return Applied(True)

    def _idle_cleared(self, r: m.WorkloadIdleCleared) -> Applied:
        if self.idle_flags.get(r.workload_id) != (r.attempt, r.idle_since):
            return _INFO  # a flag only, or one already gone with its attempt
        del self.idle_flags[r.workload_id]
        return Applied(True)

    # ------------------------------------------------------------------ budgets
    def _tree(self, r: m.BudgetTreeSet) -> Applied:
        try:
            self.tree = tree_from_spec(r.tree)
        except ValidationError as e:
            return Applied(False, f"invalid tree: {e}")
        return Applied(True)


_Handler = Callable[[LogFold, Any], Applied]

_HANDLERS: dict[type, _Handler] = {
    m.WorkloadSubmitted: LogFold._submitted,
    m.CancelRequested: LogFold._cancel_requested,
    m.LeaderElected: LogFold._leader,
    m.WorkloadPlaced: LogFold._placed,
    m.PreemptionNotice: LogFold._notice,
    m.WorkloadStarted: LogFold._started,
    m.WorkloadPreempted: lambda s, r: s._ended(r, "preempted"),
    m.WorkloadCompleted: lambda s, r: s._ended(r, "completed"),
    m.WorkloadFailed: lambda s, r: s._ended(r, "failed"),
    m.WorkloadCancelled: lambda s, r: s._ended(r, "cancelled"),
    m.HostRegistered: LogFold._registered,
    m.HostDraining: LogFold._draining,
    m.HostHealthy: LogFold._healthy,
    m.HostDrained: LogFold._drained,
    m.BudgetTreeSet: LogFold._tree,
    m.WorkloadFlaggedIdle: LogFold._flagged_idle,
    m.WorkloadIdleCleared: LogFold._idle_cleared,
}
