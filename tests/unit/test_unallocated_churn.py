"""Unallocated churn, simulated: a steady stream of small allocated work on 64 GPUs with
unallocated work waiting to fill whatever is idle. GPUs that came free wait
``unallocated_settle_s`` before unallocated work may take them, so the next allocated
arrival finds them instead of preempting a filler that just started."""

from __future__ import annotations

import random

import pytest

from allot.core.budgets import parse_tree
from allot.core.model import Host, Workload
from allot.core.policy import make_policy
from allot.sim.cluster import ClusterSpec
from allot.sim.engine import SimConfig, simulate
from allot.sim.report import build_report
from allot.sim.trace import TraceJob

TREE = parse_tree({"name": "root", "children": [{"name": "team", "shares": 1}]})


def steady_load(seed: int = 3) -> list[TraceJob]:
    """30 minutes of allocated 1-2 GPU runs (one a second on average, 20-60 s each: about
    53 of 64 GPUs busy, more or less as arrivals bunch) and 150 unallocated 1-4 GPU runs of
    an hour, all submitted at the start."""
    rng = random.Random(seed)
    jobs: list[TraceJob] = []
    t = 0.0
    k = 0
    while t < 1800.0:
        t += rng.expovariate(1.0)
        w = Workload(f"a{k}", "team", "u", rng.choice((1, 1, 2)), 60, False, submit_time=t)
        jobs.append(TraceJob(w, rng.uniform(20.0, 60.0)))
        k += 1
    for i in range(150):
        w = Workload(f"f{i}", None, "batch", rng.choice((1, 2, 4)), 0, True, submit_time=0.0)
        jobs.append(TraceJob(w, 3600.0))
    return sorted(jobs, key=lambda j: (j.workload.submit_time, j.workload.id))


def churn(settle_s: float) -> dict[str, float]:
    policy = make_policy("fairshare", 300, unallocated_settle_s=settle_s)
    hosts = ClusterSpec(tuple(Host(f"h{i}", 8) for i in range(8)))
    record = simulate(hosts, TREE, steady_load(), SimConfig("fairshare", policy))
    goodput: dict[str, float] = build_report(record)["unallocated_goodput"]
    return goodput


@pytest.fixture(scope="module")
def settled() -> dict[str, float]:
    return churn(60.0)


def test_no_unallocated_workload_is_preempted_more_than_once_a_minute(
    settled: dict[str, float],
) -> None:
    assert settled["workloads"] > 50  # unallocated work did run beside the stream
    assert settled["preemptions_per_minute_max"] <= 1.0  # every one of them, on its life


def test_most_unallocated_gpu_seconds_are_in_attempts_longer_than_a_minute(
    settled: dict[str, float],
) -> None:
    assert settled["goodput_fraction"] > 0.95


def test_without_settling_the_same_load_churns(settled: dict[str, float]) -> None:
    """The regression it fixes: every idle GPU is filled at once and taken back by the next
    arrival."""
    unsettled = churn(0.0)
    assert unsettled["short_attempts"] > 4 * settled["short_attempts"]
    assert unsettled["preemptions_per_minute_mean"] > settled["preemptions_per_minute_mean"]
