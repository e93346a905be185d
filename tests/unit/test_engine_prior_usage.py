"""Usage charged before a trace starts (``SimConfig.prior_usage``, what ``allot whatif``
hands over from the live log) ranks the first cycle as the live ranking would: of two
equal requests for the only GPU, the allocation that used less before goes first."""

from __future__ import annotations

from allot.core.budgets import parse_tree
from allot.core.model import Workload
from allot.sim.baselines import named_policy
from allot.sim.cluster import load_cluster
from allot.sim.engine import SimConfig, simulate
from allot.sim.trace import TraceJob

TREE = {"name": "root", "children": [{"name": "a", "shares": 1}, {"name": "b", "shares": 1}]}


def first_started(prior: dict[str, dict[int, float]] | None) -> str:
    cluster = load_cluster({"name": "one", "host_groups": [{"prefix": "h", "count": 1, "gpus": 1}]})
    tree = parse_tree(TREE)
    jobs = [
        TraceJob(Workload(f"w-{alloc}", alloc, "u", 1, 600, submit_time=0.0), 3600.0)
        for alloc in ("a", "b")
    ]
    policy = named_policy("fairshare", tree, cluster.total_gpus, 300)
    record = simulate(cluster, tree, jobs, SimConfig("fairshare", policy, prior_usage=prior))
    first = min(record.segments, key=lambda s: (s.start, s.workload_id))
    return first.workload_id


def test_the_allocation_that_used_less_before_goes_first() -> None:
    assert first_started(None) == "w-a"  # no history: a tie, broken by name
    assert first_started({"a": {-2: 7200.0}}) == "w-b"  # a ran 2 GPU-hours before
    assert first_started({"b": {-2: 7200.0}}) == "w-a"
