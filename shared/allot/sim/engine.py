"""The discrete-event engine: replays a trace through the core's one entry point.

The engine owns a virtual clock, an event heap and the bookkeeping a report needs; every
decision (placement, preemption, drain) comes from ``allot.core.cycle.run_cycle``, applied
with ``allot.core.fold`` exactly as the placement service applies it. A baseline's own
bookkeeping (pools, legacy fields, shields) goes through ``allot.sim.baselines.Baseline``.

Event loop (deterministic): a heap of ``(time, priority, seq, event)``. All events at one
instant are applied first (workload ends, then preemption deadlines, then health changes,
then arrivals), then ONE cycle runs at that instant. The clock jumps to the next event:
an arrival, a completion, a grace deadline, a health event, or the cycle's own
``next_wakeup`` (a protection or drain deadline). It never ticks.

Usage is charged by the core's rules (``allot.core.usage``, the accounting service's too;
decision 0007) into ``SimRecord.usage``: an allocation's allocated GPUs, constant between
two changes (a start or an end of its allocated work), are charged when they change and at
every ranking refresh (``rank_every_s``, default 300 s), as a run that ends then
(``run_hours``: ``end_charges`` with nothing charged ahead). Charging is linear in GPUs and
runs, so this is what charging each run gives, in O(1) per allocation; unlike the live
window, which lags a slot, the simulator's is exact up to now. Fair Tree is recomputed from
the window at each refresh.

A preempted resumable workload is requeued and resumes from what its attempt kept; a
non-resumable one ends as preempted. What an attempt keeps and loses, and how long a run
takes with its saves and restores, follow the kind's checkpointing
(``SimConfig.checkpointing``, ``allot.sim.checkpoints``). The default, a save on notice at
no cost, resumes where it stopped at the grace deadline; with ``checkpointing`` None the
run is the same and no attempt cost is recorded.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from allot.core.budgets import BudgetTree
from allot.core.cycle import Snapshot, run_cycle
from allot.core.fairshare import Ranking, rank
from allot.core.fold import apply_result, end_workload
from allot.core.model import HostState, Workload
from allot.core.policy import Policy
from allot.core.state import ClusterState, PendingQueue
from allot.core.usage import HOUR_S, SlidingWindow, charged_allocation, run_hours, window_usage
from allot.sim.baselines import baseline_of
from allot.sim.checkpoints import CheckpointPlan, attempt_end
from allot.sim.cluster import ClusterSpec, HealthEvent
from allot.sim.record import (
    AttemptCost,
    CapacityChange,
    JobOutcome,
    Preemption,
    Segment,
    SimRecord,
    Waiting,
)
from allot.sim.trace import TraceJob

MAX_CYCLES_AT_ONE_INSTANT = 10_000
"""A livelock guard: far above what any instant needs (each cycle there ends work)."""

# Event priorities at one instant: ends free GPUs before anything asks for them.
_END, _PREEMPT_END, _HEALTH, _ARRIVAL, _WAKE = range(5)


@dataclass(frozen=True, slots=True)
class SimConfig:
    policy_name: str
    policy: Policy
    seed: int = 0
    window_s: int = 7 * 86400
    half_life_s: float | None = None
    rank_every_s: float = 300.0
    checkpointing: CheckpointPlan | None = None  # None: the default, costs not recorded
    # GPU-seconds per allocation and hour charged before the trace starts (a replay of the
    # live log from a window's start: ``allot whatif``); the ranking reads them as usage.
    prior_usage: Mapping[str, Mapping[int, float]] | None = None


def simulate(
    cluster: ClusterSpec,
    tree: BudgetTree,
    jobs: Sequence[TraceJob],
    config: SimConfig,
    progress: Callable[[float], None] | None = None,
) -> SimRecord:
    return _Engine(cluster, tree, jobs, config, progress).run()


class _Engine:
    def __init__(
        self,
        cluster: ClusterSpec,
        tree: BudgetTree,
        jobs: Sequence[TraceJob],
        config: SimConfig,
        progress: Callable[[float], None] | None,
    ) -> None:
        self.config = config
        self.baseline, self.policy = baseline_of(config.policy).start(config.policy)
        self.tree = tree
        # The short lane is Fair Tree's (``Policy.short``); the baselines ignore it.
        lane = cluster.short_lane if self.policy.ordering is None else ()
        self.state = ClusterState(cluster.hosts, self.baseline.pools(cluster), short_lane=lane)
        self.queue = PendingQueue()
        self.shares: Mapping[str, float] = tree.effective_shares()
        self.order: dict[str, int] = {}
        self.progress = progress
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = itertools.count()
        self.jobs: dict[str, TraceJob] = {}
        for job in jobs:
            w = self.baseline.submitted(job)
            self.jobs[w.id] = replace(job, workload=w)
            self._push(w.submit_time, _ARRIVAL, w.id)
        for event in cluster.health_events:
            self._push(event.time, _HEALTH, event)
        submits = [j.workload.submit_time for j in jobs]
        self.first_submit = min(submits, default=0.0)
        self.last_submit = max(submits, default=0.0)
        self.remaining: dict[str, float] = {w: j.duration_s for w, j in self.jobs.items()}
        self.attempt: dict[str, int] = {}
        self.plan = config.checkpointing or CheckpointPlan()
        self.costs = config.checkpointing is not None
        self.restore: dict[str, float] = {}  # running workload -> its attempt's restore
        self.noticed_at: dict[str, float] = {}  # running workload -> when noticed
        self.checkpointed: set[str] = set()  # workloads with progress saved
        self.queued_since: dict[str, float] = {}
        self.first_start: dict[str, float] = {}
        self.ended: dict[str, tuple[float, str]] = {}
        # Accrual per allocation: GPUs its allocated work holds now, charged up to when.
        self.running_gpus: dict[str, int] = {}
        self.charged_until: dict[str, float] = {}
        self.wakeups: set[float] = set()
        self.reserved_idle = 0  # GPUs reservations hold free after the last cycle
        self.reserved_since = self.first_submit
        self.last_rank = -float("inf")
        self.record = SimRecord(
            policy=config.policy_name,
            seed=config.seed,
            first_submit=self.first_submit,
            last_submit=self.last_submit,
            end_time=self.first_submit,
            effective_shares=dict(self.shares),
            programs={leaf: tree.program(leaf) for leaf in tree.leaves()},
            checkpointing=self.plan.as_json() if self.costs else None,
            short_lane=tuple(sorted(lane)),
        )
        self.buckets = self.record.usage  # charged as the run goes
        for allocation, hours in (config.prior_usage or {}).items():
            self.buckets[allocation] = dict(hours)
        # The sliding window's interior sums, kept between rankings (told of every charge).
        self.window = SlidingWindow(config.window_s) if config.half_life_s is None else None

    def _push(self, t: float, priority: int, payload: object) -> None:
        heapq.heappush(self.heap, (t, priority, next(self.seq), payload))

    # ------------------------------------------------------------------- loop
    def run(self) -> SimRecord:
        heap = self.heap
        self.record.capacity.append(CapacityChange(self.first_submit, self.state.healthy_gpus))
        now = self.first_submit
        next_progress = 0.0
        same_instant = 0
        while heap:
            same_instant = same_instant + 1 if heap[0][0] == now else 0
            now = heap[0][0]
            if same_instant > MAX_CYCLES_AT_ONE_INSTANT:
                # With a zero grace period, notices end at the instant they are issued and
                # the clock does not move; decisions that undo each other would spin here.
                raise RuntimeError(f"simulation made no progress: {same_instant} cycles at t={now}")
            while heap and heap[0][0] == now:
                _, kind, _, payload = heapq.heappop(heap)
                self._apply_event(kind, payload, now)
            self._cycle(now)
            if self.progress is not None and now >= next_progress:
                span = max(self.last_submit - self.first_submit, 1.0)
                self.progress(min(1.0, (now - self.first_submit) / span))
                next_progress = now + span / 200
        self._finish(now)
        return self.record

    def _apply_event(self, kind: int, payload: object, now: float) -> None:
        if kind == _ARRIVAL:
            assert isinstance(payload, str)
            self.queue.add(self.jobs[payload].workload)
            self.queued_since[payload] = now
        elif kind == _END:
            assert isinstance(payload, tuple)
            wid, attempt = payload
            if self.attempt.get(wid) == attempt and wid in self.state.running:
                self._end(wid, now, preempted=False)
        elif kind == _PREEMPT_END:
            assert isinstance(payload, tuple)
            wid, attempt = payload
            if self.attempt.get(wid) == attempt and wid in self.state.running:
                self._end(wid, now, preempted=True)
        elif kind == _HEALTH:
            self._health(payload, now)
        else:
            self.wakeups.discard(now)

    def _health(self, event: object, now: float) -> None:
        assert isinstance(event, HealthEvent)
        host_id, what = event.host, event.event
        host = self.state.host(host_id)
        if what == "unhealthy" and host.state in (HostState.HEALTHY, HostState.CORDONED):
            self.state.set_host_state(host_id, HostState.DRAINING)
        elif what == "repaired" and host.state is not HostState.HEALTHY:
            self.state.set_host_state(host_id, HostState.HEALTHY)
        self.record.capacity.append(CapacityChange(now, self.state.healthy_gpus))

    def _end(self, wid: str, now: float, *, preempted: bool) -> None:
        run, requeued = end_workload(self.state, self.queue, wid, preempted=preempted, now=now)
        self.baseline.ended(wid)
        w = run.workload
        self._held_changed(w, now, -w.gpus)
        self.record.segments.append(
            Segment(wid, w.allocation, w.allocated, w.gpus, run.start_time, now)
        )
        wall = now - run.start_time
        restore = self.restore.pop(wid, 0.0)
        noticed = self.noticed_at.pop(wid, now)
        end = attempt_end(
            self.plan.of(w.kind),
            wall_s=wall,
            restore_s=restore,
            grace_s=now - noticed if preempted else None,
            resumable=w.resumable,
        )
        self.remaining[wid] -= end.kept_s
        if end.kept_s > 0:
            self.checkpointed.add(wid)
        if self.costs and (preempted or end.lost_s or end.saves_s):
            self.record.attempt_costs.append(
                AttemptCost(
                    wid,
                    w.allocation,
                    w.allocated,
                    w.kind,
                    w.gpus,
                    now,
                    preempted,
                    end.lost_s,
                    min(restore, wall),
                    end.saves_s,
                    end.notice,
                )
            )
        if requeued is not None:
            self.queued_since[wid] = now
            self.record.requeues += 1
        else:
            self.ended[wid] = (now, "preempted" if preempted else "completed")

    def _charge(self, allocation: str, now: float) -> None:
        """Charge the allocation's allocated GPUs held since its last charge, as a run that
        ends now: its clock is exact, so nothing was charged ahead and no bound cuts it. The
        slots are hours: no store dedupes here, and the hour totals are the same."""
        since = self.charged_until.get(allocation, now)
        gpus = self.running_gpus.get(allocation, 0)
        if gpus and now > since:
            buckets = self.buckets.setdefault(allocation, {})
            for hour, gpu_s in run_hours(since, now, gpus).items():
                buckets[hour] = buckets.get(hour, 0.0) + gpu_s
            if self.window is not None:
                self.window.charged(allocation, math.floor(since / HOUR_S))
        self.charged_until[allocation] = now

    def _held_changed(self, w: Workload, now: float, delta: int) -> None:
        allocation = charged_allocation(w.allocated, w.allocation, w.gpus)
        if allocation is not None:
            self._charge(allocation, now)
            self.running_gpus[allocation] = self.running_gpus.get(allocation, 0) + delta

    def _refresh_ranking(self, now: float) -> Ranking | None:
        """Charge what runs and rank again when due; the new ranking (None when not due)."""
        if not self.policy.fair_tree or now < self.last_rank + self.config.rank_every_s:
            return None
        self.last_rank = now
        for allocation in self.running_gpus:
            self._charge(allocation, now)
        if self.window is not None:
            usage = self.window.usage(self.buckets, now)
        else:
            usage = window_usage(self.buckets, now, self.config.window_s, self.config.half_life_s)
        ranking = rank(self.tree, usage)
        self.order = {leaf: ranking.order_key(leaf) for leaf in self.tree.leaves()}
        return ranking

    def _cycle(self, now: float) -> None:
        # The reservations' cost: GPUs they held free since the last cycle stayed idle.
        self.record.reservation_idle_gpu_s += self.reserved_idle * (now - self.reserved_since)
        self.reserved_idle, self.reserved_since = 0, now
        if not len(self.queue) and not self.state.draining:
            return
        self._refresh_ranking(now)
        result = run_cycle(
            Snapshot(self.state, self.queue, self.shares, self.order), self.policy, now
        )
        apply_result(self.state, self.queue, result, now)
        for reservation in result.reservations:
            self.record.reserved.add(reservation.workload_id)
            self.reserved_idle += sum(len(self.state.free[h]) for h in reservation.hosts)
        if result.placements:
            self.baseline.started(result.placements, self.state)
        for placement in result.placements:
            w = placement.workload
            wid = w.id
            attempt = self.attempt.get(wid, 0) + 1
            self.attempt[wid] = attempt
            self.record.waits.append(
                Waiting(wid, w.allocation, w.allocated, w.gpus, self.queued_since.pop(wid), now)
            )
            self.first_start.setdefault(wid, now)
            self._held_changed(w, now, w.gpus)
            cp = self.plan.of(w.kind)
            restore = cp.restore_s if wid in self.checkpointed else 0.0
            self.restore[wid] = restore
            run_s = restore + cp.wall_for(max(self.remaining[wid], 0.0))
            self._push(now + run_s, _END, (wid, attempt))
        for p in result.preemptions:
            self.noticed_at[p.workload_id] = now
            self._push(p.preempt_at, _PREEMPT_END, (p.workload_id, self.attempt[p.workload_id]))
            self.record.preemptions.append(
                Preemption(
                    now,
                    p.workload_id,
                    p.allocation,
                    p.gpus,
                    p.reason.value,
                    p.requeue,
                )
            )
        if result.transitions:
            self.record.capacity.append(CapacityChange(now, self.state.healthy_gpus))
        wake = result.next_wakeup
        if wake is not None and wake > now and wake not in self.wakeups:
            self.wakeups.add(wake)
            self._push(wake, _WAKE, None)

    def _finish(self, now: float) -> None:
        record = self.record
        record.end_time = now
        for wid, run in self.state.running.items():  # nothing runs forever, but be exact
            w = run.workload
            record.segments.append(
                Segment(wid, w.allocation, w.allocated, w.gpus, run.start_time, now)
            )
        for w in self.queue:
            record.waits.append(
                Waiting(w.id, w.allocation, w.allocated, w.gpus, self.queued_since[w.id], now)
            )
        for wid, job in self.jobs.items():
            w = job.workload
            end, state = self.ended.get(
                wid, (None, "running" if wid in self.state.running else "pending")
            )
            record.jobs.append(
                JobOutcome(
                    wid,
                    w.allocation,
                    w.kind,
                    w.gpus,
                    w.submit_time,
                    self.first_start.get(wid),
                    end,
                    state,
                )
            )
        if self.policy.fair_tree:
            self.last_rank = -float("inf")
            final = self._refresh_ranking(now)
            assert final is not None  # due: the last ranking was reset
            record.final_fairshare = dict(final.fairshare_of)
