"""Parity: the simulator decides exactly what ``run_cycle`` decides on the same snapshot.

Armada's simulator rebuilt its own scheduling context and silently lost features; ours must
not. Nothing of the policy is re-implemented here: each snapshot is built by hand from the
same few events the engine saw (arrivals, the core's own ``apply_result`` / ``end_workload``
fold, usage written out as GPU-seconds), ``run_cycle`` is called directly, and its
decisions are compared with what the engine recorded in its ``SimRecord`` at that instant.

The run, on two 8-GPU hosts shared by ``alpha`` and ``beta`` (entitled to 8 GPUs each):

* t=0, empty cluster, five arrivals (26 GPUs for 16): the cycle places some, passes over
  others (queue order, best fit, skip-over all matter).
* t=600, ``alpha-two`` arrives while every GPU is busy and beta's work is protected until
  t=1800: the cycle decides nothing and asks to be woken at t=1800.
* t=1800, protection ends: alpha (below its entitlement) reclaims from beta (above it):
  the cycle picks the smallest sufficient victim.
* t=2100, the notice expires: the victim is requeued and ``alpha-two`` is placed.

A last test replays a generated scenario with ``run_cycle`` wrapped (observed, not
changed) and checks that every start and every notice in the record is a decision some
``run_cycle`` call returned, and nothing else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import pytest

from allot.core.budgets import parse_tree
from allot.core.cycle import Snapshot, run_cycle
from allot.core.decisions import CycleResult
from allot.core.fairshare import rank
from allot.core.fold import apply_result, end_workload
from allot.core.model import Host, Workload
from allot.core.policy import Policy
from allot.core.state import ClusterState, PendingQueue
from allot.sim import engine
from allot.sim.baselines import named_policy
from allot.sim.cluster import ClusterSpec, load_cluster
from allot.sim.engine import SimConfig, simulate
from allot.sim.record import SimRecord
from allot.sim.scenario import Ai2Knobs, generate_ai2
from allot.sim.trace import TraceJob

GRACE = 300
HOSTS = (Host("node-0000", 8), Host("node-0001", 8))
TREE = parse_tree(
    {"name": "root", "children": [{"name": "alpha", "shares": 1}, {"name": "beta", "shares": 1}]}
)
SHARES = TREE.effective_shares()
POLICY = named_policy("fairshare", TREE, 16, GRACE)


def job(
    wid: str, allocation: str, gpus: int, submit: float, *, min_runtime_s: int = 1800
) -> TraceJob:
    """A long job (nothing ends during the instants under test)."""
    w = Workload(wid, allocation, "u", gpus, min_runtime_s, submit_time=submit)
    return TraceJob(w, duration_s=20_000.0)


AT_ZERO = (
    job("alpha-six", "alpha", 6, 0.0),
    job("beta-big", "beta", 8, 0.0),
    job("beta-mid", "beta", 4, 0.0),
    job("beta-small", "beta", 2, 0.0),
    job("filler", "alpha", 4, 0.0, min_runtime_s=0),  # unallocated: never preempts
)
LATE = job("alpha-two", "alpha", 2, 600.0)


def order(usage: Mapping[str, float]) -> dict[str, int]:
    """The Fair Tree order keys the engine derives from ``usage`` (GPU-seconds)."""
    ranking = rank(TREE, usage)
    return {leaf: ranking.order_key(leaf) for leaf in TREE.leaves()}


def cycle(
    state: ClusterState, queue: PendingQueue, usage: Mapping[str, float], now: float
) -> CycleResult:
    return run_cycle(Snapshot(state, queue, SHARES, order(usage)), POLICY, now)


def started_at(record: SimRecord, t: float) -> set[str]:
    return {s.workload_id for s in record.segments if s.start == t}


def noticed_at(record: SimRecord, t: float) -> list[tuple[str, int, str, bool]]:
    return sorted(
        (p.workload_id, p.gpus, p.reason, p.requeued) for p in record.preemptions if p.time == t
    )


def decided_notices(result: CycleResult) -> list[tuple[str, int, str, bool]]:
    return sorted((p.workload_id, p.gpus, p.reason.value, p.requeue) for p in result.preemptions)


def placed(result: CycleResult) -> set[str]:
    return {p.workload.id for p in result.placements}


@pytest.fixture(scope="module")
def record() -> SimRecord:
    return simulate(ClusterSpec(HOSTS), TREE, (*AT_ZERO, LATE), SimConfig("fairshare", POLICY))


def test_engine_decides_what_run_cycle_decides_at_each_instant(record: SimRecord) -> None:
    state = ClusterState(HOSTS)
    queue = PendingQueue(j.workload for j in AT_ZERO)

    # t=0: empty cluster, nothing used yet.
    at_0 = cycle(state, queue, {}, 0.0)
    assert placed(at_0) == {"alpha-six", "beta-big", "beta-small"}  # the run is not trivial:
    assert {"beta-mid", "filler"}.isdisjoint(placed(at_0))  # two arrivals are passed over
    assert started_at(record, 0.0) == placed(at_0)
    assert noticed_at(record, 0.0) == decided_notices(at_0) == []
    apply_result(state, queue, at_0, 0.0)

    # t=600: alpha-two arrives; all of beta is protected until 1800: nothing to decide.
    queue.add(LATE.workload)
    at_600 = cycle(state, queue, {"alpha": 6 * 600, "beta": 10 * 600}, 600.0)
    assert placed(at_600) == set() and decided_notices(at_600) == []
    assert at_600.next_wakeup == 1800.0
    # ... and the engine, woken when run_cycle asked, decided nothing in between.
    assert all(s.start == 0.0 or s.start >= 1800.0 for s in record.segments)
    assert all(p.time >= 1800.0 for p in record.preemptions)

    # t=1800: protection over; alpha (6 of 8 GPUs) reclaims from beta (10 of 8).
    at_1800 = cycle(state, queue, {"alpha": 6 * 1800, "beta": 10 * 1800}, 1800.0)
    assert decided_notices(at_1800) == [("beta-small", 2, "reclaimed-for-entitlement", True)]
    assert [p.preempt_at for p in at_1800.preemptions] == [1800.0 + GRACE]
    assert noticed_at(record, 1800.0) == decided_notices(at_1800)
    assert started_at(record, 1800.0) == placed(at_1800) == set()
    apply_result(state, queue, at_1800, 1800.0)

    # t=2100: the victim leaves (requeued, resumable); the cycle places alpha-two.
    for notice in at_1800.preemptions:
        end_workload(state, queue, notice.workload_id, preempted=True)
    usage = {"alpha": 6 * 2100, "beta": 10 * 2100}
    at_2100 = cycle(state, queue, usage, 2100.0)
    assert placed(at_2100) == {"alpha-two"}
    assert started_at(record, 2100.0) == placed(at_2100)
    assert noticed_at(record, 2100.0) == decided_notices(at_2100) == []
    assert record.requeues >= 1


def engine_decisions(
    record: SimRecord,
) -> tuple[Counter[tuple[str, float]], list[tuple[str, float, str]]]:
    starts = Counter((s.workload_id, s.start) for s in record.segments)
    notices = sorted((p.workload_id, p.time, p.reason) for p in record.preemptions)
    return starts, notices


def cycle_decisions(
    calls: Iterable[tuple[float, CycleResult]],
) -> tuple[Counter[tuple[str, float]], list[tuple[str, float, str]]]:
    starts = Counter((p.workload.id, now) for now, result in calls for p in result.placements)
    notices = sorted(
        (p.workload_id, now, p.reason.value) for now, result in calls for p in result.preemptions
    )
    return starts, notices


@pytest.mark.parametrize("policy_name", ["fairshare", "priority"])
def test_every_recorded_decision_is_a_run_cycle_decision(
    policy_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[float, CycleResult]] = []

    def observed(snapshot: Snapshot, policy: Policy, now: float) -> CycleResult:
        result = run_cycle(snapshot, policy, now)
        calls.append((now, result))
        return result

    # The engine's own name for the entry point (raises if the engine stops using it).
    monkeypatch.setattr(engine, "run_cycle", observed)
    scenario = generate_ai2(5, Ai2Knobs(days=1, hosts=6, demand_factor=1.5))
    cluster = load_cluster(scenario.cluster)
    tree = parse_tree(scenario.budgets)
    policy = named_policy(policy_name, tree, cluster.total_gpus, GRACE)
    record = simulate(cluster, tree, scenario.jobs, SimConfig(policy_name, policy))

    starts, notices = engine_decisions(record)
    assert len(calls) > 50 and record.preemptions, "the scenario must exercise the engine"
    assert (starts, notices) == cycle_decisions(calls)
