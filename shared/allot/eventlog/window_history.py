"""The log's history of one time window as the simulator's inputs (``allot export``,
``allot whatif``): a trace, a cluster and the budget tree.

Input: the log's records, in the order ``allot.bus.LogFollower`` replays them (HOSTS, the
budget tree, WORKLOADS), given one by one to ``WindowHistory.apply``, and the window
``[since, until]`` (seconds since the epoch). A record stamped after ``until`` is left out:
the window ends there. Records go through a ``LogTimeline`` (so the fold's rules hold:
stale epochs, duplicates and refused decisions are ignored) that keeps everything: work
pending at ``since`` may have been submitted long before.

Output (``WindowHistory.result()``, an ``ExportedHistory``); times count from ``since``,
the trace's 0, so a simulation starts at the window's start, in the state the log had
then:

* ``jobs``: one ``TraceJob`` per workload alive in the window: pending or running at
  ``since``, or submitted in ``(since, until]``.

  - ``submit_time``: ``max(submitted, since) - since``. Work pending or running at ``since``
    arrives at 0: its age is lost, and the core breaks the ties by id.
  - Work running at ``since`` is placed again by the simulation's first cycle (maybe on
    other hosts; the engine takes no running work as input) with ``min_runtime_s`` the
    protection it had left then (rounded up, at least 1 s so it stays allocated; 0 stays 0).
  - ``duration_s``, the running it needs from ``since`` on, in the engine's terms (a
    preempted resumable workload resumes where it stopped):

    1. ended by ``until`` (completed, failed, cancelled, or preempted for good): what it ran
       inside the window. One that ran nothing there (cancelled while pending) is left out
       (``left_out``): the trace cannot say "cancelled".
    2. not ended, with a declared ``duration_s`` ``d`` (fake agents' ``--duration``):
       ``max(d - ran before since, ran inside the window)``: the rest of ``d``, and at
       least what it did run.
    3. not ended, no duration declared (or rule 2 gives 0): unknown; what it ran inside
       the window plus the window's length, so no replay ends it inside the window.

  - User priority is not carried (the trace format has no column for it): 0 for all.

* ``cluster``: the mapping ``allot.sim.cluster.load_cluster`` reads: every host registered
  by ``until``, by name and in registration order (``hosts``), and ``health_events``: a
  host not healthy at ``since`` (draining or drained, or registered later) is
  ``unhealthy`` at 0; in the window ``HostDraining`` is ``unhealthy``, ``HostHealthy`` and
  a later registration ``repaired``. ``HostDrained`` adds nothing (the simulation drains).
* ``tree``: the budget tree the log holds at ``until`` (its last ``BudgetTreeSet``).
* ``prior_usage``: GPU-seconds of allocated runs before ``since`` per allocation and hour
  of the trace's clock (negative hours), charged as the simulator charges (``run_hours``):
  the simulation's ranking starts from the usage the live one had.

``result()`` refuses (``ValidationError("since")``) a window that starts before the log's
first record: its history is not all there. No I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec

from allot.core.budgets import BudgetTree
from allot.core.errors import ValidationError
from allot.core.model import Workload
from allot.core.usage import charged_allocation, run_hours
from allot.eventlog.timeline import LogTimeline, TimelineEvent
from allot.proto import messages as m
from allot.sim.trace import TraceJob

KEEP_EVERYTHING_S = 1e12
"""The timeline's horizon: about 30,000 years, so nothing is pruned (the lives of work
pending at the window's start may begin long before it)."""

RAN_NOTHING = "ended having run nothing in the window (cancelled while pending)"
"""``left_out``'s reason for work the trace cannot hold (rule 1)."""

_RUN_ENDS = frozenset({"preempted", "completed", "failed", "cancelled"})
_HOST_STATES = {"registered": "repaired", "healthy": "repaired", "draining": "unhealthy"}
"""Host events inside the window -> the cluster file's health events."""


@dataclass(frozen=True, slots=True)
class ExportedHistory:
    """See the module docstring."""

    since: float
    until: float
    jobs: tuple[TraceJob, ...]
    cluster: dict[str, object]
    tree: BudgetTree | None
    pending_at_start: int
    running_at_start: int
    left_out: dict[str, int] = field(default_factory=dict)
    """Workloads of the window not in ``jobs``, by why."""
    prior_usage: dict[str, dict[int, float]] = field(default_factory=dict)
    """GPU-seconds allocated work ran before ``since``, per allocation and hour of the
    trace's clock (negative hours): the usage the ranking had at the window's start."""

    @property
    def window_s(self) -> float:
        return self.until - self.since


@dataclass(slots=True)
class _Life:
    """One workload's runs, split at ``since``."""

    ran_before: float = 0.0
    ran_inside: float = 0.0
    running_at_since: bool = False
    placed_at: float = 0.0  # of the run that holds ``since``


class WindowHistory:
    """Apply the log's records, then read ``result()`` (see the module docstring)."""

    def __init__(self, since: float, until: float) -> None:
        for name, value in (("since", since), ("until", until)):
            if not (isinstance(value, int | float) and math.isfinite(value)):
                raise ValidationError(name, f"must be a finite time, got {value!r}")
        if until <= since:
            raise ValidationError("since", f"must be before until ({since:g} >= {until:g})")
        self.since = float(since)
        self.until = float(until)
        self.timeline = LogTimeline(horizon_s=KEEP_EVERYTHING_S)
        self.hosts: dict[str, int] = {}
        """Host -> GPUs, in registration order (up to ``until``)."""
        self.after_until = 0
        """Records left out because they are stamped after ``until``."""

    def apply(self, record: msgspec.Struct) -> None:
        at = getattr(record, "at", None)
        if isinstance(at, int | float) and at > self.until:
            self.after_until += 1
            return
        applied = self.timeline.apply(record)
        if isinstance(record, m.HostRegistered) and applied.changed:
            self.hosts[record.host] = record.gpus

    def result(self) -> ExportedHistory:
        first = self.timeline.first
        if not math.isfinite(first):
            raise ValidationError("since", "the log holds no record up to the window's end")
        if self.since < first:
            raise ValidationError(
                "since",
                f"the window starts {first - self.since:.0f} s before the log's first record: "
                f"the log holds {self.until - first:.0f} s of history up to the window's end "
                f"(a window of {math.floor(self.until - first):.0f}s or less fits)",
            )
        if not self.hosts:
            raise ValidationError("hosts", "no host is registered in the log by the window's end")
        jobs: list[tuple[float, TraceJob]] = []
        left_out: dict[str, int] = {}
        prior: dict[str, dict[int, float]] = {}
        pending = running = 0
        for record in self.timeline.fold.records.values():
            w = record.workload
            self._charge_before(w, prior)
            if record.ended_at is not None and record.ended_at <= self.since:
                continue  # over before the window
            life = self._life(self.timeline.events(w.id))
            job = self._job(w, record.duration_s, record.ended_at is not None, life)
            if job is None:
                left_out[RAN_NOTHING] = left_out.get(RAN_NOTHING, 0) + 1
                continue
            if life.running_at_since:
                running += 1
            elif w.submit_time < self.since:
                pending += 1
            jobs.append((w.submit_time, job))
        # Trace order: by arrival, then by the original submission (the window's 0 holds
        # every workload alive at its start), then by id.
        jobs.sort(key=lambda item: (item[1].workload.submit_time, item[0], item[1].workload.id))
        return ExportedHistory(
            since=self.since,
            until=self.until,
            jobs=tuple(job for _, job in jobs),
            cluster=self._cluster(),
            tree=self.timeline.fold.tree,
            pending_at_start=pending,
            running_at_start=running,
            left_out=left_out,
            prior_usage=prior,
        )

    def _charge_before(self, w: Workload, prior: dict[str, dict[int, float]]) -> None:
        """Charge ``w``'s runs (placement to end, as ``_life`` reads them) up to ``since``
        as the simulator charges (``run_hours``), on the trace's clock: a replay's ranking
        then starts from the usage the live one had, not from zero."""
        allocation = charged_allocation(w.allocated, w.allocation, w.gpus)
        if allocation is None:
            return
        runs = _runs(self.timeline.events(w.id), self.since)  # open: charged up to since
        for began, ended in runs:
            until = min(ended, self.since)
            if until > began:
                hours = prior.setdefault(allocation, {})
                for hour, gpu_s in run_hours(
                    began - self.since, until - self.since, w.gpus
                ).items():
                    hours[hour] = hours.get(hour, 0.0) + gpu_s

    # ------------------------------------------------------------------ workloads
    def _life(self, events: list[TimelineEvent]) -> _Life:
        """Sum the workload's runs before and inside the window; a run still open ends at
        until."""
        life = _Life()
        for start, end in _runs(events, self.until):
            self._add_run(life, start, end)
        return life

    def _add_run(self, life: _Life, start: float, end: float) -> None:
        since = self.since
        life.ran_before += max(0.0, min(end, since) - start)
        life.ran_inside += max(0.0, min(end, self.until) - max(start, since))
        if start < since < end:
            life.running_at_since = True
            life.placed_at = start

    def _job(
        self, w: Workload, declared: float | None, ended: bool, life: _Life
    ) -> TraceJob | None:
        window = self.until - self.since
        if ended:  # rule 1
            if life.ran_inside <= 0:
                return None
            duration = life.ran_inside
        else:
            duration = 0.0
            if declared is not None:  # rule 2
                duration = max(declared - life.ran_before, life.ran_inside)
            if duration <= 0:  # rule 3
                duration = life.ran_inside + window
        min_runtime = w.min_runtime_s
        if life.running_at_since and min_runtime > 0:
            left = life.placed_at + min_runtime - self.since
            min_runtime = max(1, math.ceil(left))
        workload = Workload(
            id=w.id,
            allocation=w.allocation,
            user=w.user,
            gpus=w.gpus,
            min_runtime_s=min_runtime,
            resumable=w.resumable,
            kind=w.kind,
            submit_time=max(w.submit_time, self.since) - self.since,
        )
        return TraceJob(workload, duration)

    # ------------------------------------------------------------------ hosts
    def _cluster(self) -> dict[str, object]:
        events: list[dict[str, object]] = []
        for host in self.hosts:
            healthy = False  # before its registration
            for e in self.timeline.host_events(host):
                if e.at > self.since:
                    break
                healthy = e.kind in ("registered", "healthy")
            if not healthy:
                events.append({"host": host, "time": 0.0, "event": "unhealthy"})
            for e in self.timeline.host_events(host):
                if e.at <= self.since:
                    continue
                if e.kind in _HOST_STATES:
                    at = e.at - self.since
                    events.append({"host": host, "time": at, "event": _HOST_STATES[e.kind]})
        out: dict[str, object] = {
            "name": "allot export",
            "hosts": [{"id": host, "gpus": gpus} for host, gpus in self.hosts.items()],
        }
        if events:
            out["health_events"] = events
        return out


def _runs(events: list[TimelineEvent], open_until: float) -> list[tuple[float, float]]:
    """A workload's runs, placement to end (never before the start: the timeline's rule);
    a run still open ends at ``open_until``."""
    runs: list[tuple[float, float]] = []
    start: float | None = None
    for e in events:
        if e.kind == "placed":
            start = e.at
        elif e.kind in _RUN_ENDS and start is not None:
            runs.append((start, max(e.at, start)))
            start = None
    if start is not None:
        runs.append((start, max(open_until, start)))
    return runs
