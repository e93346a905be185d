"""A zero grace period: notices end at the instant they are issued and the clock stands
still while preempted work leaves and requeues; the run must still finish. (An earlier
earmark rule traded GPUs with unallocated fillers forever at one instant on a 5-day
Ai2-like month; that case took minutes to reach, so this test checks the general path and
the engine raises after MAX_CYCLES_AT_ONE_INSTANT cycles instead of spinning.)"""

from __future__ import annotations

from dataclasses import replace

from allot.core.budgets import parse_tree
from allot.sim.baselines import named_policy
from allot.sim.cluster import load_cluster
from allot.sim.engine import SimConfig, simulate
from allot.sim.report import build_report
from allot.sim.scenario import Ai2Knobs, generate_ai2


def test_zero_grace_runs_to_the_end_and_preempts() -> None:
    scenario = generate_ai2(1, replace(Ai2Knobs(), days=2, hosts=8))
    cluster = load_cluster(scenario.cluster)
    tree = parse_tree(scenario.budgets)
    policy = named_policy("fairshare", tree, cluster.total_gpus, 0)
    record = simulate(cluster, tree, scenario.jobs, SimConfig("fairshare", policy))
    report = build_report(record)
    assert report["workloads"] == len(scenario.jobs)
    assert report["preemptions"] > 0
    # with no grace, a noticed workload leaves at the very instant of its notice
    ends = {(s.workload_id, s.end) for s in record.segments}
    assert all((p.workload_id, p.time) in ends for p in record.preemptions)
