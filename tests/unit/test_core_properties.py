"""Invariants of the scheduling core over random small clusters (hypothesis).

A scenario is 1-8 hosts of 4 or 8 GPUs in random states, random running work (some of it
under notice), a random queue, random shares and Fair Tree order keys, and a random policy
(Fair Tree, or FIFO, or one of the simulator's baselines plugged in). The cluster is then
run for a few steps exactly as the simulator does: ``run_cycle``, ``apply_result`` (and the
baseline's own bookkeeping), time advances, noticed work ends at its ``preempt_at``
(requeued), some work completes, new work arrives. Every cycle is checked against the state it read:

- no GPU is assigned twice and no host holds more than its GPUs;
- placements land on free GPUs of HEALTHY hosts only, cover exactly the workload's GPUs,
  and have the gang shape (one host when it fits on one, else g // G whole hosts + one);
- nothing protected is preempted (except by the legacy priority baseline, which has no
  contract), nothing shielded, nothing twice;
- Fair Tree: only allocated requests preempt, never their own allocation, and only for the
  documented reasons; FIFO and the partitioned baseline never preempt;
- ``run_cycle`` is deterministic and leaves the snapshot as it found it, and the queue
  order is total (insertion order of the queue and of the hosts does not matter).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from builders import fill
from hypothesis import given, settings
from hypothesis import strategies as st

from allot.core.cycle import Snapshot, _Cycle, run_cycle
from allot.core.decisions import CycleResult, PreemptReason
from allot.core.fold import apply_result, end_workload
from allot.core.model import Host, HostState, Workload
from allot.core.policy import FIFO, Policy
from allot.core.state import ClusterState, PendingQueue
from allot.core.victims import WORST_ORDER
from allot.sim.baselines import PARTITIONED, LegacyPriority, baseline_of

NOW = 10_000.0
ALLOCATIONS = ("a", "b", "c", "d")
SETTINGS = settings(max_examples=150, deadline=None)


# -- scenarios ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunningSpec:
    workload: Workload
    first_host: int  # where to put it: hosts tried from this one on, wrapping around
    start: float
    noticed: bool
    shielded: bool


@dataclass(frozen=True)
class Step:
    delta: float
    completions: tuple[int, ...]
    arrivals: tuple[Workload, ...]


@dataclass(frozen=True)
class Scenario:
    hosts: tuple[Host, ...]
    pools: dict[str, str] | None
    running: tuple[RunningSpec, ...]
    queue: tuple[Workload, ...]
    shares: dict[str, float]
    order: dict[str, int]
    kind: str  # fairshare, priority, fifo, partitioned
    policy: Policy
    steps: tuple[Step, ...] = field(default=())

    def build(
        self, *, shuffle: random.Random | None = None
    ) -> tuple[ClusterState, PendingQueue, Snapshot]:
        host_list = list(self.hosts)
        queue = list(self.queue)
        if shuffle is not None:
            shuffle.shuffle(host_list)
            shuffle.shuffle(queue)
        state = ClusterState(host_list, self.pools)
        ids = [h.id for h in self.hosts]
        for spec in self.running:
            w = spec.workload
            k = spec.first_host % len(ids)
            order = ids[k:] + ids[:k]
            if sum(len(state.free[h]) for h in order) < w.gpus:
                continue  # does not fit the random cluster: leave it out
            state.start(w, fill(state, w.gpus, order), spec.start)
            if spec.noticed:
                state.notice(w.id, NOW + 60)
        pending = PendingQueue(queue)
        return state, pending, Snapshot(state, pending, self.shares, self.order)


# Strategies are built once, at import: building them inside a draw costs more than the
# cycles under test.
KINDS = st.sampled_from(["fairshare"] * 3 + ["priority", "fifo", "partitioned"])
HOST_STATES = st.sampled_from(
    [HostState.HEALTHY] * 5 + [HostState.DRAINING, HostState.CORDONED, HostState.DRAINED]
)
# Mostly small clusters: random running work fills them, so cycles have to preempt.
HOSTS = st.sampled_from((1, 2, 2, 3, 3, 4, 6, 8)).flatmap(
    lambda n: st.lists(st.tuples(st.sampled_from((4, 8)), HOST_STATES), min_size=n, max_size=n)
)
SUBMITS = st.sampled_from((0.0, 100.0, 5000.0, 9000.0, NOW))
STARTS = st.sampled_from((0.0, 5000.0, NOW - 3600, NOW - 600, NOW - 1, NOW))
# (allocation, gpus, min_runtime_s, resumable, priority, submit_time, opt_out)
FIELDS = st.tuples(
    st.sampled_from((*ALLOCATIONS, None)),
    st.sampled_from((1, 1, 2, 2, 3, 4, 4, 6, 8, 8, 12, 16, 20)),
    st.sampled_from((0, 600, 3600, 3600)),
    st.booleans(),
    st.integers(0, 2),
    SUBMITS,
    st.booleans(),
)
# (fields, first host tried, start time, under notice when 0: one in four)
RUNNING = st.lists(st.tuples(FIELDS, st.integers(0, 7), STARTS, st.integers(0, 3)), max_size=16)
STEPS = st.lists(
    st.tuples(
        st.sampled_from((0.0, 100.0, 300.0, 1000.0, 4000.0)),
        st.lists(st.integers(0, 20), max_size=2),
        st.lists(FIELDS, max_size=3),
    ),
    min_size=1,
    max_size=4,
)
SHARES = st.dictionaries(st.sampled_from(ALLOCATIONS), st.sampled_from((0.0, 0.1, 0.25, 0.5, 1.0)))
ORDER = st.dictionaries(st.sampled_from(ALLOCATIONS), st.integers(0, 4))
CAPS = st.dictionaries(st.sampled_from(ALLOCATIONS), st.integers(0, 8))
POLICY = st.tuples(
    st.booleans(), st.sampled_from((True, True, True, False)), st.sampled_from((0, 300))
)


def make(id: str, fields: tuple[Any, ...], max_gpus: int = 20) -> Workload:
    alloc, gpus, min_runtime, resumable, priority, submit, _ = fields
    return Workload(
        id=id,
        allocation=alloc,
        user="u",
        gpus=min(gpus, max_gpus),
        min_runtime_s=min_runtime,
        resumable=resumable,
        priority=priority,
        submit_time=submit,
    )


@st.composite
def scenarios(draw: st.DrawFn, *, steps: bool = True) -> Scenario:
    kind = draw(KINDS)
    host_list = tuple(Host(f"h{i}", g, s) for i, (g, s) in enumerate(draw(HOSTS), start=1))
    pools = None
    if kind == "partitioned":
        k = draw(st.integers(0, 2))
        pools = {h.id: ("a", "b", "")[(i + k) % 3] for i, h in enumerate(host_list)}
    running: list[RunningSpec] = []
    opted_out: set[str] = set()  # the legacy baseline's opt-outs: the last field

    def make_opting(id: str, fields: tuple[Any, ...], max_gpus: int = 20) -> Workload:
        if fields[-1]:
            opted_out.add(id)
        return make(id, fields, max_gpus)

    for i, (fields, first, start, one_in_four) in enumerate(draw(RUNNING)):
        w = make_opting(f"r{i}", fields, max_gpus=16)
        shielded = kind == "priority" and fields[-1]
        running.append(RunningSpec(w, first, start, one_in_four == 0, shielded))
    queue_fields = draw(st.lists(FIELDS, max_size=8))
    queue = tuple(make_opting(f"q{i}", f) for i, f in enumerate(queue_fields))
    tier, preemption, grace = draw(POLICY)
    cap = draw(CAPS)
    step_list = tuple(
        Step(delta, tuple(done), tuple(make_opting(f"s{s}-{i}", f) for i, f in enumerate(new)))
        for s, (delta, done, new) in enumerate(draw(STEPS) if steps else [])
    )
    if kind == "priority":
        legacy = LegacyPriority(
            cap, shielded={r.workload.id for r in running if r.shielded}, opted_out=opted_out
        )
        policy = Policy(tier, preemption, grace, ordering=legacy, victims=legacy)
    elif kind == "fifo":
        policy = Policy(tier, preemption, grace, ordering=FIFO)
    elif kind == "partitioned":
        policy = Policy(tier, preemption, grace, ordering=PARTITIONED)
    else:
        policy = Policy(tier, preemption, grace)
    shares, order = draw(SHARES), draw(ORDER)
    return Scenario(host_list, pools, tuple(running), queue, shares, order, kind, policy, step_list)


# -- invariants -----------------------------------------------------------------------------


def check_capacity(state: ClusterState) -> None:
    """No GPU held twice, no host over its GPUs, and the free lists are the complement."""
    held: dict[str, list[int]] = {h.id: [] for h in state.hosts}
    for run in state.running.values():
        assert sum(len(g) for _, g in run.assignment) == run.workload.gpus
        for host_id, gpus in run.assignment:
            held[host_id].extend(gpus)
    for h in state.hosts:
        assert len(held[h.id]) == len(set(held[h.id])), f"a GPU of {h.id} is held twice"
        assert set(held[h.id]) <= set(range(h.gpus))
        assert sorted(held[h.id] + state.free[h.id]) == list(range(h.gpus))
    assert state.running_gpus == sum(len(g) for g in held.values())
    cheap: dict[str, int] = {}  # GPUs of unallocated work and of work under notice
    for run in state.running.values():
        if run.preempt_at is not None or not run.workload.allocated:
            for host_id, gpus in run.assignment:
                cheap[host_id] = cheap.get(host_id, 0) + len(gpus)
    assert state.cheap_gpus == cheap


def largest_healthy(state: ClusterState, pool: str) -> int:
    return max(
        (h.gpus for h in state.hosts if h.schedulable and state.pool_of[h.id] == pool), default=0
    )


def check_cycle(
    state: ClusterState,
    queue: PendingQueue,
    *,
    order: dict[str, int],
    kind: str,
    policy: Policy,
    now: float,
    result: CycleResult,
) -> None:
    shielded = policy.ordering.shielded if isinstance(policy.ordering, LegacyPriority) else set()
    pending = {w.id: w for w in queue}
    hosts = {h.id: h for h in state.hosts}
    taken: dict[str, set[int]] = {h: set() for h in hosts}

    for p in result.placements:
        w = p.workload
        assert pending.get(w.id) == w, "only pending work is placed"
        host_ids = [h for h, _ in p.assignment]
        assert host_ids == sorted(set(host_ids))
        assert sum(len(g) for _, g in p.assignment) == w.gpus, "all or nothing"
        for host_id, gpus in p.assignment:
            assert hosts[host_id].state is HostState.HEALTHY
            assert len(set(gpus)) == len(gpus)
            assert set(gpus) <= set(state.free[host_id]), "placed on GPUs that are not free"
            assert not set(gpus) & taken[host_id], "two placements share a GPU"
            taken[host_id] |= set(gpus)
        pools = {state.pool_of[h] for h in host_ids}
        assert len(pools) == 1
        (pool,) = pools
        if kind == "partitioned":
            own = w.allocation is not None and w.allocation in state.by_free
            assert pool == (w.allocation if own else "")
        else:
            assert pool == ""
        size = largest_healthy(state, pool)
        if w.gpus <= size:
            assert len(p.assignment) == 1, "a workload that fits one host is never split"
        else:
            whole = [h for h, g in p.assignment if len(g) == size == hosts[h].gpus]
            assert len(whole) >= w.gpus // size
            assert len(p.assignment) == w.gpus // size + (1 if w.gpus % size else 0)

    noticed: set[str] = set()
    # GPUs each requester takes, by better-ranked notices, from each victim allocation.
    better_taken: dict[tuple[str, str], int] = {}
    for notice in result.preemptions:
        assert notice.workload_id not in noticed, "noticed twice in one cycle"
        noticed.add(notice.workload_id)
        run = state.running[notice.workload_id]
        victim = run.workload
        assert run.preempt_at is None, "work already under notice gets no second notice"
        assert notice.preempt_at == now + policy.grace_s
        assert notice.gpus == victim.gpus
        assert notice.requeue is victim.resumable
        assert notice.workload_id not in shielded
        if kind != "priority":
            assert now >= run.protected_until, "a protected workload was preempted"
        if notice.preemptor is None:
            assert notice.reason is PreemptReason.HOST_DRAIN
            assert any(hosts[h].state is HostState.DRAINING for h in run.hosts)
            continue
        assert policy.preempts
        requester = pending[notice.preemptor]
        assert notice.preemptor not in {q.workload.id for q in result.placements}
        if kind == "priority":
            assert notice.reason is PreemptReason.HIGHER_CLASS
            assert victim.priority < requester.priority
            continue
        assert requester.allocated, "an unallocated request caused a preemption"
        if not victim.allocated:
            assert notice.reason is PreemptReason.DISPLACED_UNALLOCATED
            continue
        assert victim.allocation != requester.allocation, "preempted its own allocation"
        assert notice.reason in (
            PreemptReason.RECLAIMED_FOR_ENTITLEMENT,
            PreemptReason.BETTER_RANKED,
        )
        assert notice.victim_held_gpus == state.held[victim.allocation or ""]
        if policy.entitlement_tier:
            assert notice.victim_held_gpus > notice.victim_entitlement_gpus, "victim was not over"
        if notice.reason is PreemptReason.BETTER_RANKED:
            # The requester was not below its entitlement (or the tier is off): it may only
            # take from allocations the Fair Tree ranks worse.
            rank = order.get(requester.allocation or "", WORST_ORDER)
            assert order.get(victim.allocation or "", WORST_ORDER) > rank
            if policy.entitlement_tier:
                # ... and only what that allocation holds beyond its entitlement, all of
                # one plan's victims together (decision 0068).
                key = (requester.id, victim.allocation or "")
                better_taken[key] = better_taken.get(key, 0) + victim.gpus
                over = notice.victim_held_gpus - notice.victim_entitlement_gpus
                assert better_taken[key] <= over, "left the victim's team below its share"

    claimed: set[str] = set()
    for requester_id, victims in result.waiting_on:
        if kind == "fairshare":
            assert pending[requester_id].allocated
        assert not claimed & set(victims), "two requesters wait for the same GPUs"
        claimed |= set(victims)
        for wid in victims:
            assert state.running[wid].preempt_at is not None or wid in noticed

    for t in result.transitions:
        assert t.state is HostState.DRAINED
        assert hosts[t.host].state is HostState.DRAINING and not state.on_host[t.host]
    assert result.next_wakeup is None or result.next_wakeup > now


@SETTINGS
@given(scenarios())
def test_invariants_hold_over_several_cycles(scenario: Scenario) -> None:
    state, queue, _ = scenario.build()
    check_capacity(state)
    policy = scenario.policy
    baseline = baseline_of(policy)
    if isinstance(baseline, LegacyPriority):
        baseline.shielded.intersection_update(state.running)  # work that fit the cluster
    now = NOW

    def end(wid: str, *, preempted: bool) -> None:
        end_workload(state, queue, wid, preempted=preempted)
        baseline.ended(wid)

    for step in scenario.steps:
        snapshot = Snapshot(state, queue, scenario.shares, scenario.order)
        result = run_cycle(snapshot, policy, now)
        check_cycle(
            state,
            queue,
            order=scenario.order,
            kind=scenario.kind,
            policy=policy,
            now=now,
            result=result,
        )
        apply_result(state, queue, result, now)
        baseline.started(result.placements, state)
        check_capacity(state)
        now += step.delta
        for wid in sorted(state.running):
            at = state.running[wid].preempt_at
            if at is not None and at <= now:
                end(wid, preempted=True)
        for pick in step.completions:
            if state.running:
                end(sorted(state.running)[pick % len(state.running)], preempted=False)
        for w in step.arrivals:
            queue.add(w)
        check_capacity(state)


# -- purity and determinism -----------------------------------------------------------------


def structure(obj: Any) -> Any:
    """A deep, comparable dump: dicts by key, sets sorted, lists and tuples as lists."""
    if isinstance(obj, dict):
        return {k: structure(v) for k, v in obj.items()}
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    if isinstance(obj, list | tuple):
        return [structure(v) for v in obj]
    return obj  # hosts, workloads and runs are frozen values


def dump(state: ClusterState, queue: PendingQueue) -> Any:
    """Everything a reader of the state can see: the hosts and every public index.

    Private attributes are caches (the lazily pruned protection-end heap, per-group
    suffix minima): left out here. Whether pruning the heap changes an answer is
    test_cycle.py::test_a_cycle_reads_the_snapshot_without_changing_it."""

    def public(obj: object) -> dict[str, Any]:
        # A compiled class (tools/build_core.py) has no __dict__; mypyc lists its attributes.
        names = getattr(type(obj), "__mypyc_attrs__", None) or vars(obj)
        return {k: getattr(obj, k) for k in names if not k.startswith("_")}

    return structure({"hosts": state.hosts, **public(state)}), structure(public(queue))


@SETTINGS
@given(scenarios(steps=False))
def test_run_cycle_is_deterministic_and_leaves_the_snapshot_alone(scenario: Scenario) -> None:
    state, queue, snapshot = scenario.build()
    before = dump(state, queue)
    first = run_cycle(snapshot, scenario.policy, NOW)
    assert dump(state, queue) == before
    assert run_cycle(snapshot, scenario.policy, NOW) == first
    *_, rebuilt = scenario.build()
    assert run_cycle(rebuilt, scenario.policy, NOW) == first


@SETTINGS
@given(scenarios(steps=False), st.randoms(use_true_random=False))
def test_queue_order_is_total(scenario: Scenario, rnd: random.Random) -> None:
    """No two workloads tie: the insertion order of the queue and of the hosts is invisible."""
    *_, snapshot = scenario.build()
    *_, shuffled = scenario.build(shuffle=rnd)
    assert run_cycle(shuffled, scenario.policy, NOW) == run_cycle(snapshot, scenario.policy, NOW)


@st.composite
def roomy_queues(draw: st.DrawFn) -> tuple[list[Workload], dict[str, int]]:
    """Up to 8 single-host workloads and (below) as many empty 8-GPU hosts: all fit."""
    ranks = draw(st.permutations(range(len(ALLOCATIONS))))
    order = dict(zip(ALLOCATIONS, ranks, strict=True))
    del order[draw(st.sampled_from(ALLOCATIONS))]  # one allocation is unranked
    queue = [
        Workload(
            id=f"w{i}",
            allocation=draw(st.sampled_from((*ALLOCATIONS, None))),
            user="u",
            gpus=draw(st.integers(1, 8)),
            min_runtime_s=draw(st.sampled_from((0, 3600, 3600))),
            priority=draw(st.integers(0, 3)),
            submit_time=draw(st.sampled_from((0.0, 1.0, 2.0))),
        )
        for i in range(draw(st.integers(1, 8)))
    ]
    # Unallocated work is FIFO; priorities on it are test_cycle.py's business.
    queue = [w if w.allocated else replace(w, priority=0) for w in queue]
    return queue, order


@SETTINGS
@given(roomy_queues())
def test_placements_follow_the_documented_queue_order(
    case: tuple[list[Workload], dict[str, int]],
) -> None:
    """With room for everyone and the tier off, the placement order is: allocated work by
    the allocation's order key (unranked last), then user priority, submit time, id; then
    unallocated work by submit time, id."""
    queue, order = case
    state = ClusterState([Host(f"h{i}", 8) for i in range(len(queue))])
    snapshot = Snapshot(state, PendingQueue(queue), {}, order)
    result = run_cycle(snapshot, Policy(entitlement_tier=False), NOW)

    def key(w: Workload) -> tuple[object, ...]:
        if not w.allocated:
            return (1, 0, 0, w.submit_time, w.id)
        return (0, order.get(w.allocation or "", WORST_ORDER), -w.priority, w.submit_time, w.id)

    assert [p.workload.id for p in result.placements] == [w.id for w in sorted(queue, key=key)]


# -- deferred earmark plans -----------------------------------------------------------------


class _EagerEarmarks(_Cycle):
    """The cycle with each earmark planned the moment it is asked for (as before plans were
    deferred): the reference the deferred plans must match decision for decision."""

    def _earmark(self, w: Workload, pool: str) -> None:
        super()._earmark(w, pool)
        self._plan_due_earmarks()


OTHER_ALLOCATIONS = ("c", "d", None)
# Mostly unallocated occupants (victims of any plan) and more of ``a`` (whose plans come
# right after its earmark): the cases where a plan must see the earmark.
OCCUPANTS = st.sampled_from((*OTHER_ALLOCATIONS, None, None))
LATER = st.sampled_from(("a", "a", *OTHER_ALLOCATIONS))
MIN_RUNTIMES = st.sampled_from((0, 600, 3600))


@st.composite
def earmark_scenarios(draw: st.DrawFn) -> Scenario:
    """A reclaiming request of ``a`` blocked by ``b``'s protected work, which leaves free
    GPUs beside it, then requests that would use those GPUs or those victims: other
    allocations' work, unallocated work, more of ``a``. Random scenarios reach an earmark
    that changes a decision too rarely to test this."""
    hosts = tuple(Host(f"h{i}", 8) for i in range(draw(st.integers(2, 4))))
    running = [
        RunningSpec(
            Workload(f"b{i}", "b", "u", draw(st.integers(2, 8)), 3600), i, NOW - 600, False, False
        )
        for i in range(len(hosts))
    ]
    for i, (alloc, gpus, min_runtime, start) in enumerate(
        draw(st.lists(st.tuples(OCCUPANTS, st.integers(1, 4), MIN_RUNTIMES, STARTS), max_size=4))
    ):
        running.append(
            RunningSpec(Workload(f"o{i}", alloc, "u", gpus, min_runtime), i, start, False, False)
        )
    first = Workload("a-big", "a", "u", draw(st.integers(4, 16)), 3600, submit_time=0.0)
    later = tuple(
        Workload(f"q{i}", alloc, "u", gpus, min_runtime, submit_time=1.0)
        for i, (alloc, gpus, min_runtime) in enumerate(
            draw(
                st.lists(
                    st.tuples(LATER, st.integers(1, 8), MIN_RUNTIMES),
                    min_size=1,
                    max_size=5,
                )
            )
        )
    )
    shares = {"a": 0.5, "b": 0.05, "c": draw(st.sampled_from((0.0, 0.1, 0.4))), "d": 0.1}
    order = dict(zip(ALLOCATIONS, draw(st.permutations(range(len(ALLOCATIONS)))), strict=True))
    policy = Policy(True, True, draw(st.sampled_from((0, 300))))
    return Scenario(
        hosts, None, tuple(running), (first, *later), shares, order, "fairshare", policy
    )


@pytest.mark.source_core  # subclasses the cycle
@SETTINGS
@given(earmark_scenarios() | scenarios(steps=False))
def test_deferred_earmark_plans_decide_as_immediate_ones(scenario: Scenario) -> None:
    *_, snapshot = scenario.build()
    eager = _EagerEarmarks(snapshot, scenario.policy, NOW).run()
    assert run_cycle(snapshot, scenario.policy, NOW) == eager
