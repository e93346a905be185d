"""The simulator builds the cluster's short lane (``short_lane`` in cluster.yaml,
``--short-lane``) for Fair Tree only: there, long allocated work waits for its own hosts
while short work starts at once; a baseline treats the lane's hosts as any other."""

from __future__ import annotations

import pytest

from allot.core.budgets import parse_tree
from allot.core.model import Workload
from allot.sim.baselines import named_policy
from allot.sim.cluster import load_cluster
from allot.sim.engine import SimConfig, simulate
from allot.sim.record import SimRecord
from allot.sim.report import build_report
from allot.sim.trace import TraceJob

TREE = parse_tree({"name": "root", "children": [{"name": "a", "shares": 1}]})


def job(id: str, gpus: int, submit: float, protection: int, hours: float) -> TraceJob:
    w = Workload(id, "a", "u", gpus, protection, submit_time=submit)
    return TraceJob(w, hours * 3600)


JOBS = [
    job("fill", 8, 0, 3600, 2),  # the one host outside the lane, for two hours
    job("long", 1, 10, 3600, 1),  # not short: protected an hour
    job("dbg", 1, 20, 600, 0.25),  # short: 1 GPU, protected 10 minutes
]


def run(policy: str, lane: int) -> SimRecord:
    data = {"host_groups": [{"prefix": "n-", "count": 2, "gpus": 8}], "short_lane": lane}
    cluster = load_cluster(data)
    config = SimConfig(policy, named_policy(policy, TREE, cluster.total_gpus, 300))
    return simulate(cluster, TREE, JOBS, config)


def first_starts(policy: str, lane: int) -> dict[str, float]:
    record = run(policy, lane)
    starts: dict[str, float] = {}
    for seg in sorted(record.segments, key=lambda s: s.start):
        starts.setdefault(seg.workload_id, seg.start)
    return starts


def test_fair_tree_keeps_long_work_out_of_the_lane_and_starts_short_work_there() -> None:
    starts = first_starts("fairshare", lane=1)
    assert starts["fill"] == 0
    assert starts["dbg"] == 20
    assert starts["long"] == 2 * 3600  # when "fill" leaves its host


def test_without_a_lane_long_work_takes_the_free_host() -> None:
    assert first_starts("fairshare", lane=0)["long"] == 10


@pytest.mark.parametrize("baseline", ["fifo", "priority"])
def test_the_baselines_ignore_the_lane(baseline: str) -> None:
    assert first_starts(baseline, lane=1)["long"] == 10


@pytest.mark.parametrize(
    ("policy", "lane", "hosts"),
    [("fairshare", 1, ["n-0001"]), ("fairshare", 0, None), ("fifo", 1, None)],
)
def test_the_report_names_the_lane_it_ran_with(policy: str, lane: int, hosts: object) -> None:
    assert build_report(run(policy, lane)).get("short_lane") == hosts
