"""The simulator's baselines (``allot.sim.baselines``) plugged into ``run_cycle``: the
legacy priority system (order, victims, drains, shields) and the partitioned pools.

The legacy shields are the baseline's own bookkeeping: ``LegacyPriority.shielded`` holds
the running work that opted out within its team's cap; ``started`` decides it for each
cycle's placements, as the engine calls it.
"""

from __future__ import annotations

from typing import Any

import pytest
from builders import (
    On,
    cluster,
    decide,
    free_work,
    host,
    hosts,
    on,
    placed,
    placed_order,
    preempted,
    span,
    workload,
)

from allot.core.budgets import parse_tree
from allot.core.decisions import CycleResult, PreemptReason
from allot.core.fold import apply_result
from allot.core.model import Assignment, HostState, Workload
from allot.core.policy import Fifo, Policy
from allot.core.state import ClusterState, PendingQueue
from allot.sim.baselines import (
    NO_BASELINE,
    POLICY_NAMES,
    LegacyPriority,
    Partitioned,
    StrictFifo,
    StrictPartitioned,
    baseline_of,
    named_policy,
)
from allot.sim.trace import TraceJob

NOW = 10_000.0
GRACE = 300


def legacy_cycle(
    state: ClusterState, *pending: Workload, legacy: LegacyPriority | None = None, **kw: Any
) -> CycleResult:
    legacy = legacy or LegacyPriority()
    return decide(state, *pending, ordering=legacy, victims=legacy, **kw)


# -- priority: the legacy baseline ----------------------------------------------------------


def test_priority_orders_by_class_then_submit_time_across_teams() -> None:
    result = legacy_cycle(
        cluster(hosts(1)),
        workload("low", 1, "x", priority=0, submit=0.0),
        workload("high", 1, "y", priority=2, submit=5.0),
        workload("normal", 1, "z", priority=1, submit=1.0),
        workload("high-early", 1, "z", priority=2, submit=2.0),
        free_work("free-high", priority=2, submit=3.0),
        # Fair-share inputs a PRIORITY cycle must ignore:
        shares={"x": 1.0},
        order={"x": 0, "y": 1, "z": 2},
    )
    assert placed_order(result) == ["high-early", "free-high", "high", "normal", "low"]


def test_priority_shields_opted_out_work_within_each_teams_cap() -> None:
    # Team t may hold 6 opted-out GPUs and already holds 2.
    state = cluster(hosts(4), on(workload("t0", 2, "t"), "h1"))
    legacy = LegacyPriority({"t": 6}, shielded={"t0"}, opted_out={"t0", "t1", "t2", "o1", "f1"})
    pending = (
        workload("t1", 4, "t", submit=1.0),  # 2 + 4 = 6: shielded
        workload("t2", 1, "t", submit=2.0),  # 7 > 6: runs unshielded
        workload("t3", 1, "t", submit=3.0),  # did not opt out
        workload("o1", 8, "o", submit=4.0),  # team without a cap
        free_work("f1", 1, submit=5.0),  # no team: nothing to shield it
    )
    result = legacy_cycle(state, *pending, legacy=legacy)
    apply_result(state, PendingQueue(pending), result, 0.0)
    legacy.started(result.placements, state)
    assert placed_order(result) == ["t1", "t2", "t3", "o1", "f1"]
    assert legacy.shielded == {"t0", "t1", "o1"}
    legacy.ended("t0")
    assert legacy.shielded == {"t1", "o1"}


def test_only_the_legacy_baseline_reads_the_legacy_columns() -> None:
    tree = parse_tree({"name": "root", "children": [{"name": "t", "shares": 1}]})
    job = TraceJob(workload("j", 4, "t"), 60.0, legacy_class="HIGH", legacy_protected=True)
    for name in POLICY_NAMES:
        policy = named_policy(name, tree, 16, GRACE)
        baseline, run_policy = baseline_of(policy).start(policy)
        submitted = baseline.submitted(job)
        if name == "priority":
            assert isinstance(baseline, LegacyPriority)
            assert submitted.priority == 2 and baseline.opted_out == {"j"}
            assert run_policy.ordering is baseline and run_policy.victims is baseline
        else:
            assert submitted == job.workload
            assert run_policy == policy
        if name in ("fairshare", "fairshare-window", "fifo"):
            assert baseline is NO_BASELINE


def test_each_simulation_starts_the_legacy_shields_afresh() -> None:
    legacy = LegacyPriority({"t": 6}, shielded={"old"}, opted_out={"old"})
    fresh, run_policy = legacy.start(Policy(ordering=legacy, victims=legacy))
    assert isinstance(fresh, LegacyPriority) and fresh is not legacy
    assert (fresh.protected_gpu_cap, fresh.shielded, fresh.opted_out) == ({"t": 6}, set(), set())
    assert run_policy.ordering is fresh and run_policy.victims is fresh


@pytest.mark.parametrize(
    ("victim_class", "requester_class", "shielded", "preempts"),
    [
        pytest.param(0, 2, False, True, id="high-preempts-low"),
        pytest.param(1, 2, False, True, id="high-preempts-normal"),
        pytest.param(0, 1, False, True, id="normal-preempts-low"),
        pytest.param(1, 1, False, False, id="same-class-never"),
        pytest.param(2, 1, False, False, id="lower-class-never"),
        pytest.param(0, 2, True, False, id="shielded-work-never"),
    ],
)
def test_priority_preempts_unshielded_work_of_a_strictly_lower_class(
    victim_class: int, requester_class: int, shielded: bool, preempts: bool
) -> None:
    # The victim started 10 s ago: the legacy system has no minimum-runtime contract.
    victim = workload("v", 8, "x", priority=victim_class)
    state = cluster(hosts(1), on(victim, "h1", start=NOW - 10))
    legacy = LegacyPriority(shielded={"v"} if shielded else set())
    result = legacy_cycle(
        state, workload("r", 8, "y", priority=requester_class), legacy=legacy, now=NOW
    )
    if preempts:
        assert [(p.workload_id, p.reason, p.preemptor) for p in result.preemptions] == [
            ("v", PreemptReason.HIGHER_CLASS, "r")
        ]
        assert result.preemptions[0].preempt_at == NOW + GRACE
    else:
        assert result.preemptions == ()


@pytest.mark.parametrize(
    ("layout",),
    [
        pytest.param(("normal", "low"), id="low-class-on-the-second-host"),
        pytest.param(("low", "normal"), id="low-class-on-the-first-host"),
    ],
)
def test_priority_takes_the_lowest_class_victim(layout: tuple[str, str]) -> None:
    classes = {"low": 0, "normal": 1}
    running = [
        on(workload(name, 8, "x", priority=classes[name]), f"h{i}", start=0.0)
        for i, name in enumerate(layout, start=1)
    ]
    state = cluster(hosts(2), *running)
    result = legacy_cycle(state, workload("r", 8, "y", priority=2), now=NOW)
    assert set(preempted(result)) == {"low"}


def test_priority_drain_leaves_shielded_work_alone() -> None:
    state = cluster(
        [host("h1", 8, HostState.DRAINING)],
        on(workload("shielded", 4, "t"), "h1", start=NOW - 10),
        on(workload("plain", 4, "t"), "h1", start=NOW - 10),  # protected by the contract
    )
    result = legacy_cycle(state, legacy=LegacyPriority(shielded={"shielded"}), now=NOW)
    assert [(p.workload_id, p.reason, p.preempt_at) for p in result.preemptions] == [
        ("plain", PreemptReason.HOST_DRAIN, NOW + GRACE)
    ]
    assert result.transitions == ()
    # The same host under the contract: both wait for their protection to end.
    assert decide(state, now=NOW).preemptions == ()


# -- partitioned ----------------------------------------------------------------------------

POOLS = {"h1": "a", "h2": "a", "h3": "b"}  # h4 belongs to no team


def partitioned(*running: On) -> ClusterState:
    return cluster(hosts(4), *running, pools=POOLS)


@pytest.mark.parametrize(
    ("running", "pending", "expected"),
    [
        pytest.param(
            # h1 2 free, h2 8 free (team a), h4 6 free: a1 stays in a's pool.
            (on(workload("a0", 6, "a"), "h1"), on(free_work("f0", 2), "h4")),
            workload("a1", 6, "a"),
            (span("h2", 0, 5),),
            id="team-work-on-its-own-hosts-even-when-another-fits-better",
        ),
        pytest.param(
            (on(free_work("f0", 8), "h3", start=0.0),),
            workload("b1", 4, "b"),
            None,
            id="a-full-pool-waits-and-never-preempts",
        ),
        pytest.param((), workload("c1", 4, "c"), (span("h4", 0, 3),), id="team-without-hosts"),
        pytest.param((), free_work("f1", 4), (span("h4", 0, 3),), id="unallocated-on-unowned"),
        pytest.param(
            (), workload("a1", 16, "a"), (span("h1", 0, 7), span("h2", 0, 7)), id="gang-in-pool"
        ),
        pytest.param((), workload("b1", 12, "b"), None, id="gang-larger-than-its-pool"),
    ],
)
def test_partitioned_pools(
    running: tuple[On, ...], pending: Workload, expected: Assignment | None
) -> None:
    state = partitioned(*running)
    result = decide(state, pending, shares={"b": 1.0}, now=NOW, ordering=Partitioned())
    assert placed(result) == ({} if expected is None else {pending.id: expected})
    assert result.preemptions == ()


def test_partitioned_backfills_within_a_pool() -> None:
    state = partitioned(on(workload("b0", 5, "b"), "h3"))
    result = decide(
        state,
        workload("b-big", 4, "b", submit=0.0),
        workload("b-small", 3, "b", submit=1.0),
        ordering=Partitioned(),
    )
    assert placed(result) == {"b-small": (span("h3", 5, 7),)}


# -- strict (head-of-line) baselines ------------------------------------------------------------


def test_strict_partitioned_holds_a_pools_queue_behind_its_head_and_no_other() -> None:
    """As per-VC FIFO in published simulators: b's head does not fit, so b's smaller work
    behind it waits (Partitioned backfills it, the test above); a's pool is not held."""
    state = partitioned(on(workload("b0", 5, "b"), "h3"))
    result = decide(
        state,
        workload("b-big", 4, "b", submit=0.0),
        workload("b-small", 3, "b", submit=1.0),
        workload("a-late", 2, "a", submit=2.0),
        ordering=StrictPartitioned(),
    )
    assert placed_order(result) == ["a-late"]


@pytest.mark.parametrize(
    ("ordering", "expected"),
    [(Fifo(), ["small"]), (StrictFifo(), [])],
    ids=["fifo-backfills", "strict-waits-behind-its-head"],
)
def test_strict_fifo_starts_nothing_behind_a_head_that_does_not_fit(
    ordering: Fifo, expected: list[str]
) -> None:
    state = cluster(hosts(2), on(workload("r", 8), "h1"))
    result = decide(
        state,
        workload("head", 16, submit=0.0),
        workload("small", 1, submit=1.0),
        ordering=ordering,
        preemption=False,
    )
    assert placed_order(result) == expected


def test_strict_fifo_starts_in_order_while_work_fits() -> None:
    result = decide(
        cluster(hosts(2)),
        *(workload(f"w{i}", 4, submit=float(i)) for i in range(5)),
        ordering=StrictFifo(),
        preemption=False,
    )
    assert placed_order(result) == ["w0", "w1", "w2", "w3"]  # w4 does not fit: the end
