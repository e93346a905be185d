"""Where GPU time went, from the log: the live counterpart of the simulator's ``SimRecord``.

``LogTimeline`` reads the same records as ``LogFold`` (HOSTS replayed first, then WORKLOADS
and USAGE, then both followed) and keeps, besides the fold, what the simulator's record
keeps: GPU segments per attempt, waiting stretches, preemption notices with their reasons,
healthy-capacity changes, plus one event list per workload (and per host) for the
dashboard's timeline. ``owed(now, window_s)`` builds a ``SimRecord`` of
``[now - window_s, now]`` and runs the simulator's own ``allot.sim.report.build_report`` on
it, so ``allot owed`` and the simulator's report compute owed vs delivered the same way.
No I/O, no clock.

What each record adds (only when the fold applied it: a record the fold ignores, such as a
stale-epoch placement or a duplicate, is ignored here too):

* ``WorkloadSubmitted``: a waiting stretch opens at ``at``; event ``submitted``.
* ``WorkloadPlaced``: the stretch closes (its length is one ``queue_waits`` value); a
  segment opens at ``at``; events ``placed`` (hosts) and, for allocated work,
  ``protected-until`` at ``at + min_runtime_s`` (a future time when it is recorded).
* ``WorkloadStarted``: event ``started`` (the fold answers "informational" for a valid one).
* ``PreemptionNotice``: a ``Preemption`` at ``at`` with its reason; event ``notice``.
* ``WorkloadPreempted/Completed/Failed/Cancelled``: the segment closes at ``at`` (never
  before its start: agents' clocks may lag the leader's); event of that kind, then
  ``requeued`` when the fold requeued the workload (a new stretch opens at ``at``), or
  ``cancelled`` when a cancel arrived under notice.
* ``CancelRequested``: pending work: the stretch closes, event ``cancelled``; running work:
  event ``cancel-requested`` (the agent's ``WorkloadCancelled`` ends it).
* Host records: a ``CapacityChange`` whenever the sum of GPUs of HEALTHY hosts changes;
  host events ``registered``, ``draining``, ``healthy``, ``drained``.

Allocated means what the core says (``Workload.allocated``: an allocation and
``min_runtime_s > 0``); only allocated segments and stretches count toward owed and
delivered, exactly as in the simulator.

Shares. The report takes one effective share per allocation for the whole window; live
budgets may change, and the window uses the tree current at query time (the simulator's
tree never changes, so the two agree there).

Memory. At most every ``horizon_s / 64`` of log time, the cutoff moves to ``newest applied
record time - horizon_s`` and what ended before it is dropped: closed segments and
stretches, notices, queue waits, capacity changes but the last one before the cutoff, old
events of pending and running workloads, and finished workloads whole (their events go
together, when their end passes the cutoff). The counters (notices by reason, GPU-seconds
lost to preemption, placements) are kept forever. Queries reject a window longer than the
horizon or starting before the last cutoff (``now`` well before the newest record).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from allot.core.errors import ValidationError
from allot.core.model import Workload
from allot.eventlog.logfold import TERMINAL, Applied, LogFold
from allot.proto import messages as m
from allot.sim.record import (
    CapacityChange,
    JobOutcome,
    Preemption,
    Segment,
    SimRecord,
    Waiting,
)
from allot.sim.report import bucket_amounts, build_report

POLICY = "live"
"""``SimRecord.policy`` of a record built from the log."""

PRUNE_FRACTION = 64
"""Prune at most every ``horizon_s / PRUNE_FRACTION`` seconds of log time (amortised O(1))."""

_INFORMATIONAL = "informational"
"""``Applied.why`` of a record the fold accepts without changing state (``WorkloadStarted``)."""


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """One step of a workload's life. ``kind``: submitted, placed, started, protected-until,
    notice, preempted, requeued, completed, failed, cancel-requested, cancelled (host
    events: registered, draining, healthy, drained). ``detail`` carries the numbers
    (attempt, hosts, reason, preemptor, grace_deadline, gpus...) as JSON values."""

    at: float
    kind: str
    attempt: int
    detail: dict[str, Any]


@dataclass(slots=True)
class _Life:
    """What the timeline keeps per workload besides the fold's record."""

    workload: Workload
    events: list[TimelineEvent] = field(default_factory=list)
    first_start: float | None = None
    ended_at: float | None = None
    preemptor: str | None = None  # of the current attempt's notice


@dataclass(frozen=True, slots=True)
class _Open:
    """A running attempt: its segment from ``start`` until it ends."""

    attempt: int
    start: float


class LogTimeline:
    """A ``LogFold`` plus the history the visibility surfaces need."""

    fold: LogFold

    def __init__(self, horizon_s: float = 8 * 86400.0) -> None:
        """``horizon_s``: history older than this (relative to the newest record) may be
        dropped to bound memory; queries never look further back."""
        if not (isinstance(horizon_s, int | float) and math.isfinite(horizon_s) and horizon_s > 0):
            raise ValidationError("horizon_s", f"must be a positive number, got {horizon_s!r}")
        self.fold = LogFold()
        self.horizon_s = float(horizon_s)
        self.newest = -math.inf
        self.first = math.inf
        """Time of the earliest record applied: where the history starts (charts start there,
        not at a window's start)."""
        self._pruned_at = -math.inf
        self.cutoff = -math.inf
        """History that ended before this time may be gone; no window may start earlier."""
        self._segments: list[Segment] = []  # closed, in log order
        self._running: dict[str, _Open] = {}
        self._waits: list[Waiting] = []  # closed, in log order
        self._waiting: dict[str, float] = {}  # workload -> stretch start
        self._preemptions: list[Preemption] = []
        self._requeued_at: list[float] = []
        self._capacity: list[CapacityChange] = []
        self._lives: dict[str, _Life] = {}
        self._ended_order: deque[tuple[float, str]] = deque()  # (ended at, workload)
        self._host_events: dict[str, list[TimelineEvent]] = {}
        self._queue_waits: list[tuple[float, float]] = []  # (placed at, waited s)
        self._by_reason: Counter[str] = Counter()
        self._preempted_gpu_s = 0.0
        self._lost: list[tuple[float, str, float]] = []  # (at, allocation, GPU-s), log order
        self._lost_total: defaultdict[str, float] = defaultdict(float)
        """Issue 40: GPU-seconds lost to preemption per allocation, as the agents reported
        (``WorkloadPreempted.lost_gpu_seconds``; docs/decisions/0053)."""
        self.placements = 0
        """Placements applied so far (``queue_waits`` keeps those within the horizon)."""

    # ------------------------------------------------------------------ entry point
    def apply(self, record: msgspec.Struct) -> Applied:
        """Apply one record to the fold and to the history; returns the fold's answer."""
        healthy_before = self.fold.state.healthy_gpus
        applied = self.fold.apply(record)
        started = isinstance(record, m.WorkloadStarted) and applied.why == _INFORMATIONAL
        if not (applied.changed or started):
            return applied
        at = float(getattr(record, "at", self.newest))
        handler = _HANDLERS.get(type(record))
        if handler is not None:
            handler(self, record, applied)
        healthy = self.fold.state.healthy_gpus
        if healthy != healthy_before:
            self._capacity.append(CapacityChange(at, healthy))
        if at < self.first and math.isfinite(at):
            self.first = at
        if at > self.newest:
            self.newest = at
            if at - self._pruned_at >= self.horizon_s / PRUNE_FRACTION:
                self._prune(at - self.horizon_s)
                self._pruned_at = at
                self.cutoff = at - self.horizon_s
        return applied

    # ------------------------------------------------------------------ queries
    def events(self, workload_id: str) -> list[TimelineEvent]:
        """The workload's events in log order; [] when unknown."""
        life = self._lives.get(workload_id)
        return list(life.events) if life is not None else []

    def host_events(self, host: str) -> list[TimelineEvent]:
        """The host's state changes in log order (attempt 0); [] when unknown."""
        return list(self._host_events.get(host, ()))

    def sim_record(self, now: float, window_s: float) -> SimRecord:
        """The history of ``[now - window_s, now]`` as a ``SimRecord`` (running attempts end
        at ``now``; waiting stretches still open end at ``now``)."""
        since = self._window_start(now, window_s)
        tree = self.fold.tree
        record = SimRecord(
            policy=POLICY,
            seed=0,
            first_submit=since,
            last_submit=now,
            end_time=now,
            effective_shares=self.fold.shares(),
            programs={leaf: tree.program(leaf) for leaf in tree.leaves()} if tree else {},
        )
        for seg in self._segments:
            clipped = _clip(seg.start, seg.end, since, now)
            if clipped is not None:
                record.segments.append(
                    Segment(seg.workload_id, seg.allocation, seg.allocated, seg.gpus, *clipped)
                )
        for wid, run in self._running.items():
            w = self._lives[wid].workload
            clipped = _clip(run.start, now, since, now)
            if clipped is not None:
                record.segments.append(Segment(wid, w.allocation, w.allocated, w.gpus, *clipped))
        for wait in self._waits:
            clipped = _clip(wait.start, wait.end, since, now)
            if clipped is not None:
                record.waits.append(
                    Waiting(wait.workload_id, wait.allocation, wait.allocated, wait.gpus, *clipped)
                )
        for wid, start in self._waiting.items():
            w = self._lives[wid].workload
            clipped = _clip(start, now, since, now)
            if clipped is not None:
                record.waits.append(Waiting(wid, w.allocation, w.allocated, w.gpus, *clipped))
        record.preemptions = [p for p in self._preemptions if since <= p.time <= now]
        record.requeues = sum(1 for t in self._requeued_at if since < t <= now)
        record.capacity = self._capacity_in(since, now)
        record.jobs = self._jobs(since, now)
        return record

    def owed(self, now: float, window_s: float, bucket_s: int = 3600) -> dict[str, Any]:
        """``build_report(self.sim_record(now, window_s), bucket_s)["owed_delivered"]``."""
        owed: dict[str, Any] = build_report(self.sim_record(now, window_s), bucket_s)[
            "owed_delivered"
        ]
        return owed

    def held_series(
        self, now: float, window_s: float, bucket_s: int = 3600
    ) -> tuple[list[float], dict[str, list[float]], dict[str, list[float]]]:
        """(bucket start times, mean GPUs held per allocation per bucket, entitlement GPUs per
        allocation per bucket = effective share x mean healthy GPUs) over the window.

        Held counts allocated work only (``ClusterState.held``: charged work, including
        work under notice). Buckets are the report's, of width ``bucket_s`` from
        ``now - window_s`` or from the first record when the log starts later (a young log
        is not a week of empty buckets), the last partial; a mean is GPU-seconds / the
        bucket's length. Allocations: those of the tree plus any that held GPUs in the
        window."""
        record = self.sim_record(now, window_s)
        since = max(record.first_submit, min(self.first, now))
        edges = bucket_amounts([(since, now, 1.0)], since, now, bucket_s)  # bucket lengths
        starts = [since + i * bucket_s for i in range(len(edges))]
        pieces: dict[str, list[tuple[float, float, float]]] = {}
        for seg in record.segments:
            if seg.allocated and seg.allocation is not None:
                pieces.setdefault(seg.allocation, []).append((seg.start, seg.end, seg.gpus))
        healthy = bucket_amounts(_capacity_pieces(record.capacity, now), since, now, bucket_s)
        names = sorted(set(record.effective_shares) | set(pieces))
        held: dict[str, list[float]] = {}
        entitled: dict[str, list[float]] = {}
        for name in names:
            gpu_s = bucket_amounts(pieces.get(name, ()), since, now, bucket_s)
            held[name] = [_mean(x, length) for x, length in zip(gpu_s, edges, strict=True)]
            share = record.effective_shares.get(name, 0.0)
            entitled[name] = [
                share * _mean(cap, length) for cap, length in zip(healthy, edges, strict=True)
            ]
        return starts, held, entitled

    def preemptions_by_reason(self) -> dict[str, int]:
        """Notices applied so far, by reason (a Prometheus counter's value)."""
        return dict(sorted(self._by_reason.items()))

    def preempted_gpu_seconds(self) -> float:
        """GPU-seconds run by attempts that ended preempted (an upper bound of work lost)."""
        return self._preempted_gpu_s

    def lost_gpu_seconds(self, since: float, now: float) -> dict[str, float]:
        """GPU-seconds lost to preemptions that ended in ``[since, now]``, per allocation."""
        out: defaultdict[str, float] = defaultdict(float)
        for at, allocation, lost in self._lost:
            if since <= at <= now:
                out[allocation] += lost
        return dict(out)

    def lost_gpu_seconds_total(self) -> dict[str, float]:
        """GPU-seconds lost to preemption per allocation so far (a Prometheus counter)."""
        return dict(sorted(self._lost_total.items()))

    def queue_waits(self) -> list[float]:
        """Seconds each placement waited since its submission or requeue, in log order
        (placements within the horizon; ``placements`` counts all of them)."""
        return [wait for _, wait in self._queue_waits]

    def queue_waits_since(self, seen: int) -> list[float]:
        """The waits of placements after the first ``seen`` (a histogram fed incrementally:
        pass the ``placements`` of the previous call). Waits already pruned are skipped."""
        new = min(max(0, self.placements - max(0, seen)), len(self._queue_waits))
        return [wait for _, wait in self._queue_waits[len(self._queue_waits) - new :]]

    # ------------------------------------------------------------------ workloads
    def _life(self, workload_id: str) -> _Life:
        life = self._lives.get(workload_id)
        if life is None:  # pruned while still known to the fold: start a fresh list
            life = self._lives[workload_id] = _Life(self.fold.records[workload_id].workload)
        return life

    def _event(
        self, workload_id: str, at: float, kind: str, attempt: int, /, **detail: Any
    ) -> None:
        self._life(workload_id).events.append(TimelineEvent(at, kind, attempt, detail))

    def _submitted(self, r: m.WorkloadSubmitted, _: Applied) -> None:
        w = self.fold.records[r.workload_id].workload
        self._lives[w.id] = _Life(w)
        self._waiting[w.id] = r.at
        self._event(
            w.id,
            r.at,
            "submitted",
            0,
            allocation=w.allocation,
            user=w.user,
            gpus=w.gpus,
            min_runtime_s=w.min_runtime_s,
            allocated=w.allocated,
            kind=w.kind,
            priority=w.priority,
        )

    def _cancel_requested(self, r: m.CancelRequested, _: Applied) -> None:
        rec = self.fold.records[r.workload_id]
        if rec.status == "cancelled":  # it was pending: the fold took it off the queue
            self._close_wait(rec.workload, r.at)
            self._event(rec.workload.id, r.at, "cancelled", rec.attempt, by=r.by, reason=r.reason)
            self._finished(rec.workload.id, r.at)
            return
        self._event(
            rec.workload.id, r.at, "cancel-requested", rec.attempt, by=r.by, reason=r.reason
        )

    def _placed(self, r: m.WorkloadPlaced, _: Applied) -> None:
        w = self.fold.records[r.workload_id].workload
        life = self._life(w.id)
        waited = self._close_wait(w, r.at)
        if waited is not None:
            self._queue_waits.append((r.at, waited))
        self.placements += 1
        self._running[w.id] = _Open(r.attempt, r.at)
        if life.first_start is None:
            life.first_start = r.at
        life.preemptor = None
        self._event(
            w.id,
            r.at,
            "placed",
            r.attempt,
            hosts=[hg.host for hg in r.assignment],
            assignment=[{"host": hg.host, "gpus": list(hg.gpus)} for hg in r.assignment],
            gpus=w.gpus,
            epoch=r.epoch,
            waited_s=waited,
        )
        if w.allocated:
            self._event(
                w.id,
                r.at + w.min_runtime_s,
                "protected-until",
                r.attempt,
                min_runtime_s=w.min_runtime_s,
            )

    def _started(self, r: m.WorkloadStarted, _: Applied) -> None:
        self._event(r.workload_id, r.at, "started", r.attempt, host=r.host, pid=r.pid)

    def _notice(self, r: m.PreemptionNotice, _: Applied) -> None:
        w = self.fold.records[r.workload_id].workload
        life = self._life(w.id)
        life.preemptor = r.preemptor
        self._by_reason[r.reason] += 1
        # As the simulator records it: the allocation of allocated victims only.
        charged = w.allocation if w.allocated else None
        self._preemptions.append(Preemption(r.at, w.id, charged, w.gpus, r.reason, r.requeue))
        self._event(
            w.id,
            r.at,
            "notice",
            r.attempt,
            reason=r.reason,
            preemptor=r.preemptor,
            grace_deadline=r.grace_deadline,
            requeue=r.requeue,
            gpus=r.gpus,
            allocated=w.allocated,
            victim_held_gpus=r.victim_held_gpus,
            victim_entitlement_gpus=r.victim_entitlement_gpus,
            victim_window_gpu_s=r.victim_window_gpu_s,
            victim_rank=r.victim_rank,
            victim_fairshare=r.victim_fairshare,
            preemptor_allocation=r.preemptor_allocation,
            preemptor_window_gpu_s=r.preemptor_window_gpu_s,
            preemptor_rank=r.preemptor_rank,
            preemptor_fairshare=r.preemptor_fairshare,
        )

    def _ended(self, r: Any, applied: Applied) -> None:
        """An attempt ended (``WorkloadPreempted/Completed/Failed/Cancelled``)."""
        rec = self.fold.records[r.workload_id]
        w = rec.workload
        life = self._life(w.id)
        run = self._running.pop(w.id, None)
        gpu_s = 0.0
        if run is not None:
            end = max(r.at, run.start)
            self._segments.append(Segment(w.id, w.allocation, w.allocated, w.gpus, run.start, end))
            gpu_s = w.gpus * (end - run.start)
        kind = _END_KIND[type(r)]
        detail: dict[str, Any] = {"gpus": w.gpus, "gpu_seconds": gpu_s}
        if isinstance(r, m.WorkloadPreempted):
            self._preempted_gpu_s += gpu_s
            if w.allocation is not None and run is not None:
                # At most what the attempt ran here (a record's figure is the agent's).
                lost = min(r.lost_gpu_seconds, gpu_s)
                self._lost.append((r.at, w.allocation, lost))
                self._lost_total[w.allocation] += lost
            detail["reason"] = r.reason
            detail["preemptor"] = life.preemptor
        elif isinstance(r, m.WorkloadFailed):
            detail["exit_code"] = r.exit_code
            detail["reason"] = r.reason
        elif isinstance(r, m.WorkloadCancelled):
            detail["by"] = r.by
            detail["reason"] = r.reason
        self._event(w.id, r.at, kind, r.attempt, **detail)
        if applied.requeued:
            self._waiting[w.id] = r.at
            self._requeued_at.append(r.at)
            self._event(w.id, r.at, "requeued", r.attempt)
        elif rec.status in TERMINAL:
            if kind != rec.status:  # preempted under a cancel request: it stays cancelled
                self._event(w.id, r.at, rec.status, r.attempt)
            self._finished(w.id, r.at)

    def _finished(self, workload_id: str, at: float) -> None:
        self._life(workload_id).ended_at = at
        self._ended_order.append((at, workload_id))

    def _close_wait(self, w: Workload, at: float) -> float | None:
        start = self._waiting.pop(w.id, None)
        if start is None:
            return None
        end = max(at, start)
        self._waits.append(Waiting(w.id, w.allocation, w.allocated, w.gpus, start, end))
        return end - start

    # ------------------------------------------------------------------ hosts
    def _host(self, r: Any, _: Applied) -> None:
        host = r.host
        detail: dict[str, Any] = {}
        if isinstance(r, m.HostRegistered):
            detail["gpus"] = r.gpus
        elif isinstance(r, m.HostDraining):
            detail["reason"] = r.reason
            detail["by"] = r.by
        self._host_events.setdefault(host, []).append(
            TimelineEvent(r.at, _HOST_KIND[type(r)], 0, detail)
        )

    # ------------------------------------------------------------------ windows
    def _window_start(self, now: float, window_s: float) -> float:
        if not (isinstance(now, int | float) and math.isfinite(now)):
            raise ValidationError("now", f"must be a finite time, got {now!r}")
        if not (isinstance(window_s, int | float) and math.isfinite(window_s) and window_s > 0):
            raise ValidationError("window_s", f"must be a positive number, got {window_s!r}")
        if window_s > self.horizon_s:
            raise ValidationError(
                "window_s",
                f"{window_s:g} s is longer than the history kept ({self.horizon_s:g} s)",
            )
        since = float(now) - float(window_s)
        if since < self.cutoff:
            raise ValidationError(
                "window_s",
                f"starts at {since:.0f}, before the history kept (from {self.cutoff:.0f}: "
                f"{self.horizon_s:g} s before the newest record)",
            )
        return since

    def _capacity_in(self, since: float, now: float) -> list[CapacityChange]:
        """The healthy-GPU step function on ``[since, now]``: its value at ``since`` (0
        before any host), then each change inside."""
        changes = sorted(self._capacity, key=lambda c: c.time)  # stable: ties keep log order
        times = [c.time for c in changes]
        k = bisect_right(times, since)
        at_since = changes[k - 1].healthy_gpus if k else 0
        out = [CapacityChange(since, at_since)]
        out.extend(c for c in changes[k:] if c.time <= now)
        return out

    def _jobs(self, since: float, now: float) -> list[JobOutcome]:
        """Workloads submitted by ``now`` and not ended before ``since``, with their state
        at the end of the fold (``noticed`` shows as ``running``)."""
        jobs: list[JobOutcome] = []
        for wid, life in self._lives.items():
            w = life.workload
            if w.submit_time > now or (life.ended_at is not None and life.ended_at < since):
                continue
            rec = self.fold.records.get(wid)
            status = rec.status if rec is not None else "unknown"
            state = "running" if status == "noticed" else status
            jobs.append(
                JobOutcome(
                    wid,
                    w.allocation,
                    w.kind,
                    w.gpus,
                    w.submit_time,
                    life.first_start,
                    life.ended_at,
                    state,
                )
            )
        return jobs

    # ------------------------------------------------------------------ memory
    def _prune(self, cutoff: float) -> None:
        """Drop what ended before ``cutoff`` (see the module docstring). Lists are in log
        order, which is time order up to clock skew between writers, so each loses the
        prefix that ended before the cutoff: O(what is dropped), and an item out of order
        only stays a little longer (queries clip by time anyway)."""
        _drop_prefix(self._segments, lambda x: x.end, cutoff)
        _drop_prefix(self._waits, lambda x: x.end, cutoff)
        _drop_prefix(self._preemptions, lambda x: x.time, cutoff)
        _drop_prefix(self._lost, lambda x: x[0], cutoff)
        _drop_prefix(self._requeued_at, lambda x: x, cutoff)
        _drop_prefix(self._queue_waits, lambda x: x[0], cutoff)
        # Capacity: the last change at or before the cutoff still gives the value there.
        changes = sorted(self._capacity, key=lambda c: c.time)
        older = [c for c in changes if c.time <= cutoff]
        self._capacity = older[-1:] + [c for c in changes if c.time > cutoff]
        ended = self._ended_order
        while ended and ended[0][0] < cutoff:
            _, wid = ended.popleft()
            self._lives.pop(wid, None)
        # Workloads still pending or running: only their old events go.
        for wid in {*self._running, *self._waiting}:
            life = self._lives.get(wid)
            if life is not None:
                _drop_prefix(life.events, lambda e: e.at, cutoff)
        for events in self._host_events.values():
            _drop_prefix(events, lambda e: e.at, cutoff)


_Item = TypeVar("_Item")


def _drop_prefix(items: list[_Item], end: Callable[[_Item], float], cutoff: float) -> None:
    k = 0
    while k < len(items) and end(items[k]) < cutoff:
        k += 1
    del items[:k]


def _clip(start: float, end: float, since: float, now: float) -> tuple[float, float] | None:
    s = max(start, since)
    e = min(end, now)
    return (s, e) if e > s else None


def _capacity_pieces(
    capacity: list[CapacityChange], now: float
) -> list[tuple[float, float, float]]:
    """``(start, end, healthy GPUs)`` from a time-ordered step function up to ``now``."""
    return [
        (c.time, capacity[k + 1].time if k + 1 < len(capacity) else now, float(c.healthy_gpus))
        for k, c in enumerate(capacity)
    ]


def _mean(amount: float, length: float) -> float:
    return amount / length if length > 0 else 0.0


_END_KIND: dict[type, str] = {
    m.WorkloadPreempted: "preempted",
    m.WorkloadCompleted: "completed",
    m.WorkloadFailed: "failed",
    m.WorkloadCancelled: "cancelled",
}
_HOST_KIND: dict[type, str] = {
    m.HostRegistered: "registered",
    m.HostDraining: "draining",
    m.HostHealthy: "healthy",
    m.HostDrained: "drained",
}
_HANDLERS: dict[type, Any] = {
    m.WorkloadSubmitted: LogTimeline._submitted,
    m.CancelRequested: LogTimeline._cancel_requested,
    m.WorkloadPlaced: LogTimeline._placed,
    m.WorkloadStarted: LogTimeline._started,
    m.PreemptionNotice: LogTimeline._notice,
    **dict.fromkeys(_END_KIND, LogTimeline._ended),
    **dict.fromkeys(_HOST_KIND, LogTimeline._host),
}
