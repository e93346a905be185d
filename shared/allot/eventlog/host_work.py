"""What each host must run, and what an agent's report of a part becomes in the log.

Pure (no I/O, no clock: times are arguments). The dispatch service
(``allot.services.dispatch``) folds the WORKLOADS log with ``LogFold``, calls
``DispatchBook`` after each record, and publishes what it returns; agents never read the
log, so an agent learns only its own hosts' work and can speak only for them.

Why level-triggered (the whole host's list every time, not deltas): a lost or reordered core
NATS message costs nothing but a delay. The next list, or the agent's own periodic
``HostSync``, says everything again, and a part that is no longer listed simply stops.

**Runs lost with their host** (Slurm: a node not responding is set DOWN and its jobs are
requeued or failed at once). An agent that dies (``kill -9``, a crashed host) reports
nothing, so the health service drains its host for missed heartbeats and nobody reports the
end. Placement notices a drained host's runs only when their minimum-runtime protection
ends (up to 8 h: the core's rule, right for a live host an operator drains), but a silent
host runs nothing anyone can protect. ``lost_run`` decides, from values only (no clock:
``now`` is an argument), when dispatch records such a run as lost in the agent's place,
running or noticed alike: its primary host (the reporting one) was drained for missed
heartbeats at T and has not been healthy since, T is ``LOST_AFTER_S`` ago, and dispatch
has heard nothing from that host (no report, no work-list sync) for ``LOST_AFTER_S``. The
record is the one the agent's own ``lost`` report would cause (``_terminal``): a
preemption (the notice's reason, or ``host-drain`` for a run not noticed yet), so
resumable work is requeued and the rest ends preempted, and the GPUs are free in the log.
It is dated when the run should have ended: the drain (T) for a running run, its notice's
deadline if earlier (the wait for a report is not charged). The host stays draining or
drained (nothing lands there) until an operator undrains it or its agent comes back; a
returning agent kills what its predecessor left (``LeftoverSweep``) before it takes work.
An agent that was only slow and reports after that is answered "already in the log": the
fold ignores an end of an attempt that no longer runs, and both use the msg id
``ended:<workload>:<attempt>``, so the stream keeps the first of the two.

**A gang's other parts.** The primary host reports the attempt's start and, normally, its
end. A secondary host may report only the end of its own part, which ends the whole
attempt (a gang with a part missing runs nothing useful and holds every GPU): ``lost``
(its agent restarted and killed what the old one left) is a preemption (``host-drain``),
so resumable work is requeued; an exit that failed (the agent does not report a
secondary's clean exit: the primary reports the end) fails the workload with the part's
exit code. The rule cannot be abused: an agent speaks only for its own host (the report's
subject), and only of an attempt it has a part of (its host in the assignment); a
secondary cannot report a start. The other parts, the primary's included, are then no
longer listed, so their agents stop them.

**Report times.** The terminal record charges the team ``gpus x (at - started_at)`` from
the agent's own times, so ``check_report_times`` holds them to the log and dispatch's clock
(``now`` is an argument): nothing after now, nothing before the placement, no end before
its start, no run longer than the time since its placement, each within ``CLOCK_SKEW_S``.
A host may report only an attempt it has a part of, ended or not: a host that never ran
it is refused naming ``host``, not told that its end is "already in the log".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from allot.core.errors import ValidationError
from allot.eventlog.logfold import LogFold, WorkloadRecord
from allot.eventlog.lost_work import lost_gpu_seconds
from allot.proto import codec
from allot.proto import messages as m
from allot.proto.messages import LIVE_STATES, PreemptReason
from allot.proto.subjects import check_host

RESTART_LOST = "agent restarted; the process was lost"
"""What the agent logs of a run lost in its restart (the run is recorded preempted)."""
MISSED_HEARTBEATS = "missed heartbeats"
"""Start of the reason of the health service's drain of a silent host (how a reader of the
log tells that the host's agent stopped answering from any other drain)."""
AGENT_STOPPING = "agent stopping"
"""The detail of the unhealthy ``HealthReport`` a stopping agent sends for each of its hosts
before it reports the runs it stopped, and so the reason of the health service's drain: the
requeued runs must not be placed straight back on a host that no agent serves. Like a drain
for missed heartbeats, the agent's next heartbeat (its return) ends it, and nothing heard
from the host for ``LOST_AFTER_S`` after it makes dispatch record what it left lost."""
LOST_AFTER_S = 30.0
"""How long after the drain of a host silent for missed heartbeats, and after the last word
from it, its runs are recorded lost: three of the health service's default 10 s heartbeat
timeouts. This leaves room for an agent that was paused or cut off for a while (its report
retries back off up to 5 s), and it is at least the agent's default 30 s ``--resync-s``,
so an agent still syncing its work list with dispatch is not declared dead. Waiting longer
only keeps the GPUs idle (held in the log, nothing runs there)."""
CLOCK_SKEW_S = 30.0
"""How far a report's times may run ahead of dispatch's clock or before the placement: hosts'
clocks differ (NTP keeps them well within a second), and a run gains at most this much."""
STOPPED_BEFORE_START = "stopped before start"
WORK_LIST_LIMIT = codec.MAX_RECORD_PAYLOAD - 64 * 1024
"""Largest encoded work list (``DispatchBook.encoded_work``): NATS's 1 MiB message, less
room for the subject and headers."""
HOST_SHUTDOWN: PreemptReason = "host-drain"
"""The reason of a preemption by the agent's own stop: a planned host shutdown is a drain."""
_ENDS = (m.WorkloadCompleted, m.WorkloadFailed, m.WorkloadPreempted, m.WorkloadCancelled)


def _with_checkpoint(task: m.HostTask, rec: WorkloadRecord) -> m.HostTask:
    """``task`` with the submission's checkpoint protocol (issue 40); work that asked for
    none goes as it is."""
    spec = rec.checkpoint
    if spec is None:
        return task
    return msgspec.structs.replace(
        task,
        checkpoint=True,
        checkpoint_signal=spec.signal,
        checkpoint_timeout_s=spec.timeout_s,
        checkpoint_dir=spec.directory,
        session=spec.session,
    )


def primary_host(rec: WorkloadRecord) -> str:
    """The host whose agent reports for the attempt: the first of the assignment, sorted."""
    return min(host for host, _ in rec.assignment)


def assignment_hosts(rec: WorkloadRecord) -> tuple[str, ...]:
    """The attempt's hosts, primary first, then the others in assignment order (what a
    gang's parts get as ``ALLOT_HOSTS``; a part's index in it is its ``ALLOT_HOST_RANK``)."""
    primary = primary_host(rec)
    return (primary, *(host for host, _ in rec.assignment if host != primary))


def lost_run(
    *,
    silent_since: float | None,
    now: float,
    last_heard: float | None,
    margin_s: float = LOST_AFTER_S,
) -> bool:
    """Whether a run nobody reports any more is lost with its host (see the module), under
    notice or not: a silent host's runs are not protected.

    ``silent_since``: when the health service drained the run's primary host for missed
    heartbeats (None: healthy since, or never missed). ``last_heard``: the last report or
    work-list sync dispatch had from that host (None: none since dispatch started). All on
    the wall clock, in seconds."""
    if silent_since is None or now < silent_since + margin_s:
        return False
    return last_heard is None or now - last_heard >= margin_s


def check_report_times(
    report: m.PartReport,
    *,
    placed_at: float,
    logged_start: float | None,
    now: float,
    skew_s: float = CLOCK_SKEW_S,
) -> None:
    """Refuse (``ValidationError`` naming ``at`` or ``started_at``) a report whose times the
    log and the clock contradict; the record it causes is charged ``gpus x (at -
    started_at)``, so they must describe a run that fits since its placement.

    ``placed_at``: the attempt's ``WorkloadPlaced`` time; ``logged_start``: its
    ``WorkloadStarted`` time (None when not logged); ``now``: dispatch's clock. Compared
    with the log or the clock a report's time may be off by ``skew_s`` (another host's
    clock); ``at`` against the report's own ``started_at`` (one agent's clock) may not.
    In order, the first that fails is named:

    1. ``at`` or ``started_at`` more than ``skew_s`` after ``now`` (not happened yet);
    2. ``at`` or ``started_at`` more than ``skew_s`` before ``placed_at``;
    3. an end's ``at`` before its ``started_at``, or (none given) more than ``skew_s``
       before ``logged_start``;
    4. an end's duration (from ``started_at``, else ``logged_start``, else ``placed_at``)
       longer than ``now - placed_at`` plus ``skew_s``: ``started_at`` named if given."""
    at, started_at = report.at, report.started_at
    for name, value in (("at", at), ("started_at", started_at)):
        if value is not None and value > now + skew_s:
            raise ValidationError(
                name,
                f"{value!r} is {value - now:.0f} s ahead of dispatch's clock "
                f"(at most {skew_s:g} s of clock skew): it has not happened yet",
            )
    for name, value in (("at", at), ("started_at", started_at)):
        if value is not None and value < placed_at - skew_s:
            raise ValidationError(
                name,
                f"{value!r} is {placed_at - value:.0f} s before attempt "
                f"{report.attempt}'s placement at {placed_at!r}",
            )
    if report.event == "started":
        return
    ck = report.checkpointed_at
    if ck is not None and (ck > at or ck < placed_at - skew_s):
        # The lost work runs from it: a checkpoint after the end or before the placement
        # would hide work lost to the preemption (docs/decisions/0053).
        raise ValidationError(
            "checkpointed_at",
            f"{ck!r} is outside attempt {report.attempt}'s run ({placed_at!r} .. {at!r})",
        )
    if started_at is not None and at < started_at:
        raise ValidationError("at", f"the end {at!r} is before the start {started_at!r}")
    if started_at is None and logged_start is not None and at < logged_start - skew_s:
        raise ValidationError("at", f"the end {at!r} is before the logged start {logged_start!r}")
    start = placed_at if logged_start is None else logged_start
    if started_at is not None:
        start = started_at
    if at - start > now - placed_at + skew_s:
        raise ValidationError(
            "at" if started_at is None else "started_at",
            f"a run of {at - start:.0f} s is longer than the {now - placed_at:.0f} s since "
            f"attempt {report.attempt}'s placement",
        )


@dataclass(slots=True)
class DispatchBook:
    """Remembers, beside a ``LogFold``, what the fold does not keep for agents: which
    attempts have started (and when), each notice's reason, each cancel, and which hosts
    each workload was last listed on (so a part that ends is removed from its hosts)."""

    fold: LogFold = field(default_factory=LogFold)
    started: dict[str, tuple[int, float]] = field(default_factory=dict)
    """workload -> (attempt, at) of the current attempt's ``WorkloadStarted``."""
    notice_reasons: dict[str, PreemptReason] = field(default_factory=dict)
    cancels: dict[str, m.CancelRequested] = field(default_factory=dict)
    listed_on: dict[str, frozenset[str]] = field(default_factory=dict)
    reported_by: dict[tuple[str, int], str] = field(default_factory=dict)
    """(workload, attempt) -> the host whose report ``record_for`` turned into the
    attempt's end, until that end is folded (its agent has stopped its part already; the
    others must be told). Absent (another dispatch instance judged it, or a lost run):
    the primary, as the end of listed work usually is."""
    silent_since: dict[str, float] = field(default_factory=dict)
    """host -> time of the health service's first drain for missed heartbeats (or for its
    agent's stop) since the host was last healthy (an operator's drain on top of it does not
    make it answer again)."""
    held_back: set[str] = field(default_factory=set)
    """Hosts whose last list held back parts that did not fit (``encoded_work``)."""
    sent: dict[str, frozenset[tuple[str, int]]] = field(default_factory=dict)
    """host -> the parts (workload, attempt) of the last list ``encoded_work`` made for it:
    only a part never listed there may be held back (the agent may have started one it
    was sent, and an unlisted part stops)."""

    def apply(self, record: msgspec.Struct) -> set[str]:
        """Fold ``record``; return the hosts whose list of work it changed."""
        result = self.fold.apply(record)
        if isinstance(record, m.HostDraining):
            missed = record.by is None and record.reason.startswith(
                (MISSED_HEARTBEATS, AGENT_STOPPING)
            )
            if missed and record.host in self.fold.state:
                self.silent_since.setdefault(record.host, record.at)
            return set()
        if isinstance(record, m.HostHealthy):
            self.silent_since.pop(record.host, None)
            return set()
        wid: str | None = getattr(record, "workload_id", None)
        if wid is None:
            return set()
        rec = self.fold.records.get(wid)
        if isinstance(record, m.WorkloadStarted):
            if rec is not None and rec.attempt == record.attempt and rec.status in LIVE_STATES:
                self.started[wid] = (record.attempt, record.at)
                # Nothing for the agent to do: it reported the start itself. The flag
                # matters only to an agent that restarts, and it asks for its lists then;
                # and to a host with parts held back (``encoded_work``): room was made.
                return {h for h, _ in rec.assignment if h in self.held_back}
            return set()
        if not result.changed:
            return set()
        if isinstance(record, m.PreemptionNotice):
            self.notice_reasons[wid] = record.reason
        elif isinstance(record, m.CancelRequested):
            self.cancels[wid] = record
        before = self.listed_on.get(wid, frozenset())
        now = (
            frozenset(h for h, _ in rec.assignment)
            if rec is not None and rec.status in LIVE_STATES
            else frozenset()
        )
        if now:
            self.listed_on[wid] = now
        else:
            self.listed_on.pop(wid, None)
            self.started.pop(wid, None)
            self.notice_reasons.pop(wid, None)
            self.cancels.pop(wid, None)
            if isinstance(record, _ENDS):
                reporter = self.reported_by.pop((wid, record.attempt), None)
                if before:
                    # An end of listed work is the record of one host's own report
                    # (``record_for``), the primary's unless we know better: that agent
                    # has stopped its part and remembers it, so a list would change
                    # nothing there. A gang's other hosts must stop theirs.
                    return set(before) - {reporter or min(before)}
        return set(before | now)

    def tasks(self, host: str) -> tuple[m.HostTask, ...]:
        """Every part ``host`` must run or stop now, in workload order."""
        out: list[m.HostTask] = []
        for wid in sorted(self.fold.workload_on(host)):
            rec = self.fold.records.get(wid)
            if rec is None or rec.status not in LIVE_STATES:
                continue
            gpus = next((g for h, g in rec.assignment if h == host), None)
            if not gpus:
                continue
            stop: m.PartStop | None = None
            kill_at: float | None = None
            if rec.cancel_requested:
                stop = "cancel"
            elif rec.status == "noticed":
                stop, kill_at = "notice", rec.preempt_at
            started = self.started.get(wid)
            has_started = started is not None and started[0] == rec.attempt
            # A started or stopping part is never started from its list (the agent runs
            # it, stops it, or knows it lost), so it goes without what only a start reads:
            # a host's list stays small however large its runs' commands and env are.
            bare = has_started or stop is not None
            task = m.HostTask(
                workload_id=wid,
                allocation=rec.workload.allocation,
                attempt=rec.attempt,
                gpus=tuple(gpus),
                primary=primary_host(rec) == host,
                hosts=() if bare else assignment_hosts(rec),
                command=() if bare else rec.command,
                env={} if bare else rec.env,
                user=None if bare else rec.workload.user,
                duration_s=rec.duration_s,
                started=has_started,
                stop=stop,
                kill_at=kill_at,
            )
            out.append(_with_checkpoint(task, rec))
        return tuple(out[: m.MAX_HOST_TASKS])

    def encoded_work(self, host: str, seq: int, at: float, limit: int = WORK_LIST_LIMIT) -> bytes:
        """``work`` as sent, within ``limit`` bytes (a message over NATS's 1 MiB is refused,
        and the agent would get no list at all). Only parts still to start carry a command
        and env (``tasks``); should those not fit, the last of them that this host was never
        sent are held back, and sent once its earlier parts have started (``apply`` names
        the host again then; the agent's periodic sync asks anyway). Never held back: a part
        sent before (the agent may have started it, its start not read yet, and an unlisted
        part stops) or a gang's other part (listed after its primary's start, it would count
        as lost)."""
        work = self.work(host, seq, at)
        data = codec.encode(work)
        before = self.sent.get(host, frozenset())
        if len(data) > limit:
            # Only parts this host was never sent: one it was sent may be running already
            # (its start not folded yet), and listed once, a part stays listed. What was
            # sent fitted before, so the parts that stay fit again.
            tasks: list[m.HostTask | None] = list(work.tasks)
            excess = len(data) - limit
            for i in reversed(range(len(tasks))):
                task = tasks[i]
                if excess <= 0:
                    break
                if (
                    task is not None
                    and task.primary
                    and task.command
                    and (task.workload_id, task.attempt) not in before
                ):
                    excess -= len(codec.encode(task)) + 1  # and its comma
                    tasks[i] = None
            work = msgspec.structs.replace(work, tasks=tuple(t for t in tasks if t is not None))
            data = codec.encode(work)
            self.held_back.add(host)
        else:
            self.held_back.discard(host)
        self.sent[host] = frozenset((t.workload_id, t.attempt) for t in work.tasks)
        return data

    def work(self, host: str, seq: int, at: float) -> m.HostWork:
        return m.HostWork(host=host, seq=seq, at=at, tasks=self.tasks(host))

    def lost(
        self, now: float, last_heard: Mapping[str, float], margin_s: float = LOST_AFTER_S
    ) -> list[msgspec.Struct]:
        """The end records of runs lost with their silent hosts at ``now`` (``lost_run``),
        each what its agent's ``lost`` report would have caused, dated at the host's drain
        or its notice's deadline if earlier (the run should have ended then: the wait for a
        report is not charged). ``last_heard``: host -> the last report or sync dispatch
        had from it."""
        out: list[msgspec.Struct] = []
        for host, since in sorted(self.silent_since.items()):
            if not lost_run(
                silent_since=since, now=now, last_heard=last_heard.get(host), margin_s=margin_s
            ):
                continue
            for wid in sorted(self.fold.workload_on(host)):
                rec = self.fold.records.get(wid)
                if rec is None or rec.status not in LIVE_STATES or primary_host(rec) != host:
                    continue
                ended = since if rec.preempt_at is None else min(since, rec.preempt_at)
                report = m.PartReport(
                    host=host,
                    workload_id=wid,
                    attempt=rec.attempt,
                    event="lost",
                    at=min(ended, now),
                    detail=f"{MISSED_HEARTBEATS} of {host}: lost with its host",
                )
                out.append(self._terminal(rec, report, self.started.get(wid)))
        return out

    def record_for(
        self, subject_host: str, report: m.PartReport, *, now: float
    ) -> msgspec.Struct | None:
        """The log record ``report`` causes, or None when the log already ended that attempt
        (a retried report, or one overtaken by events: nothing more to record).

        Raises ``ValidationError`` naming the field when the report is not this host's to
        make: another host in the payload, an unknown workload or attempt, a host that has
        no part of the attempt (ended or not: the last attempt's hosts are kept), a start
        reported by a host that is not the primary one (a secondary host may report only
        the end of its own part: see the module), or times that the log and ``now``
        contradict (``check_report_times``)."""
        check_host(report.host, subject_host)
        rec = self.fold.records.get(report.workload_id)
        if rec is None:
            raise ValidationError("workload_id", f"unknown workload {report.workload_id!r}")
        if report.attempt > rec.attempt:
            raise ValidationError(
                "attempt", f"{report.workload_id} has no attempt {report.attempt} yet"
            )
        # An older attempt's hosts are not kept: its late reports are answered as stored.
        if report.attempt == rec.attempt and all(
            host != subject_host for host, _ in rec.assignment
        ):
            raise ValidationError(
                "host",
                f"{subject_host!r} has no part of {report.workload_id} attempt {report.attempt}",
            )
        if report.attempt < rec.attempt or rec.status not in LIVE_STATES:
            return None
        primary = primary_host(rec)
        if subject_host != primary:
            if report.event == "started":
                raise ValidationError(
                    "host",
                    f"{subject_host!r} is not the primary host of {report.workload_id} "
                    f"attempt {report.attempt} (its start comes from {primary!r})",
                )
            if report.event == "exited" and report.exit_code == 0 and not report.stopping:
                # A part that finished is not the workload finishing: only the primary
                # reports a completion (else any one part could complete the gang).
                raise ValidationError(
                    "host",
                    f"{subject_host!r} is not the primary host of {report.workload_id} "
                    f"attempt {report.attempt}: a clean exit of its part ends nothing "
                    f"(the end comes from {primary!r})",
                )
        started = self.started.get(report.workload_id)
        if started is not None and started[0] != report.attempt:
            started = None
        if report.event == "started" and started is not None:
            return None  # already in the log (a retry)
        assert rec.started_at is not None  # a running attempt's placement time
        check_report_times(
            report,
            placed_at=rec.started_at,
            logged_start=started[1] if started is not None else None,
            now=now,
        )
        w = rec.workload
        if report.event == "started":
            return m.WorkloadStarted(
                workload_id=w.id,
                allocation=w.allocation,
                at=report.at,
                host=subject_host,
                pid=report.pid,
                attempt=report.attempt,
                gpus=w.gpus,
                allocated=w.allocated,
                checkpoint_dir=report.checkpoint_dir if rec.checkpoint is not None else None,
            )
        end = self._terminal(rec, report, started)
        if subject_host != primary:
            self.reported_by[(w.id, report.attempt)] = subject_host
        return end

    def _terminal(
        self, rec: WorkloadRecord, report: m.PartReport, started: tuple[int, float] | None
    ) -> msgspec.Struct:
        """Chosen from the log's view now: cancel requested -> cancelled, under notice,
        ended by its agent's stop or lost (its agent died) -> preempted, a clean exit ->
        completed, anything else -> failed."""
        w = rec.workload
        at = report.at
        # The charge runs from the agent's own start report, the same start accounting
        # charges from; a part lost in a restart runs from the logged start.
        if report.started_at is not None:
            started_at = report.started_at
        elif started is not None and started[0] == report.attempt:
            started_at = started[1]
        else:
            started_at = rec.started_at if rec.started_at is not None else at
        started_at = min(started_at, at)
        gpu_seconds = w.gpus * (at - started_at)
        if rec.cancel_requested:
            cancel = self.cancels.get(w.id)
            return m.WorkloadCancelled(
                workload_id=w.id,
                allocation=w.allocation,
                at=at,
                by=cancel.by if cancel is not None else None,
                reason=cancel.reason if cancel is not None and cancel.reason else "cancelled",
                gpu_seconds=gpu_seconds,
                attempt=report.attempt,
                gpus=w.gpus,
                started_at=started_at,
                allocated=w.allocated,
            )
        # A part its agent's own stop ended (a planned host shutdown, ``stopping``) is
        # preempted as a drain would have it, so resumable work is requeued; one that had
        # exited on its own is reported without ``stopping`` and keeps its outcome.
        # A part lost with its agent (killed, or its host crashed) is a node failure, which
        # Slurm requeues when the job may be requeued: preempted as a drain, like a stop.
        shutdown = (report.stopping and report.event == "exited") or report.event == "lost"
        if rec.status == "noticed" or shutdown:
            return m.WorkloadPreempted(
                workload_id=w.id,
                allocation=w.allocation,
                at=at,
                reason=self.notice_reasons.get(w.id, "better-ranked")
                if rec.status == "noticed"
                else HOST_SHUTDOWN,
                gpu_seconds=gpu_seconds,
                attempt=report.attempt,
                gpus=w.gpus,
                started_at=started_at,
                allocated=w.allocated,
                checkpoint=report.checkpoint if rec.checkpoint is not None else None,
                checkpointed_at=report.checkpointed_at,
                lost_gpu_seconds=lost_gpu_seconds(w.gpus, started_at, at, report.checkpointed_at),
            )
        if report.event == "exited" and report.exit_code == 0:
            return m.WorkloadCompleted(
                workload_id=w.id,
                allocation=w.allocation,
                at=at,
                gpu_seconds=gpu_seconds,
                attempt=report.attempt,
                gpus=w.gpus,
                started_at=started_at,
                allocated=w.allocated,
            )
        reason = report.detail or ("failed" if report.event == "exited" else report.event)
        return m.WorkloadFailed(
            workload_id=w.id,
            allocation=w.allocation,
            at=at,
            exit_code=report.exit_code,
            reason=reason[: m.MAX_TEXT_LEN],
            gpu_seconds=gpu_seconds,
            attempt=report.attempt,
            gpus=w.gpus,
            started_at=started_at,
            allocated=w.allocated,
        )
