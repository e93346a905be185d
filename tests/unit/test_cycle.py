"""``run_cycle``: queue order, drains, wake-ups, earmarks, and the FIFO ordering.

Queue order is read from the order of ``placements`` on a cluster with room for everyone
(a cycle decides workload by workload in queue order, and records placements as it goes).
"""

from __future__ import annotations

from typing import Any

import pytest
from builders import (
    HOUR,
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

from allot.core import cycle
from allot.core.decisions import HostTransition, Preemption, PreemptReason
from allot.core.model import Assignment, HostState, Workload
from allot.core.placement import ClusterView
from allot.core.policy import FIFO
from allot.core.preemption import Plan, VictimRule
from allot.core.state import ClusterState

NOW = 10_000.0
GRACE = 300

# -- queue order (Fair Tree) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("tier", "expected"),
    [
        pytest.param(True, ["b1", "a1", "c1", "u1"], id="tier-on-under-entitlement-first"),
        pytest.param(False, ["a1", "b1", "c1", "u1"], id="tier-off-fair-tree-order-only"),
    ],
)
def test_entitlement_tier_comes_before_the_fair_tree_order(tier: bool, expected: list[str]) -> None:
    # 16 GPUs; a and b entitled to 4 each. a already holds 4 (tier 1) and ranks best;
    # b holds nothing (tier 0); c has no share and no rank; u1 is unallocated and oldest.
    state = cluster(hosts(2), on(workload("a0", 4, "a"), "h1"))
    result = decide(
        state,
        free_work("u1", submit=0.0),
        workload("a1", 1, "a", submit=1.0),
        workload("b1", 1, "b", submit=1.0),
        workload("c1", 1, "c", submit=1.0),
        shares={"a": 0.25, "b": 0.25},
        order={"a": 0, "b": 1},
        entitlement_tier=tier,
    )
    assert placed_order(result) == expected


@pytest.mark.parametrize(
    ("tier", "expected"),
    [
        pytest.param(True, ["a1", "b1", "a2"], id="tier-reread-after-each-placement"),
        pytest.param(False, ["b1", "a1", "a2"], id="tier-off"),
    ],
)
def test_an_allocation_reaching_its_entitlement_drops_to_tier_one_mid_cycle(
    tier: bool, expected: list[str]
) -> None:
    # a: 0.125 x 16 = 2 GPUs, holds none. a1 (2 GPUs) brings it to its entitlement, so a2
    # then queues behind b (no share: tier 1), which ranks better.
    result = decide(
        cluster(hosts(2)),
        workload("a1", 2, "a", submit=0.0),
        workload("a2", 1, "a", submit=1.0),
        workload("b1", 1, "b", submit=0.0),
        shares={"a": 0.125},
        order={"b": 0, "a": 1},
        entitlement_tier=tier,
    )
    assert placed_order(result) == expected


def test_entitlement_counts_healthy_gpus_only() -> None:
    # a: 0.25 of the 16 healthy GPUs = 4 (not 0.25 x 24 = 6); it holds 5: tier 1, so b's
    # better rank wins.
    state = cluster(
        [host("h1"), host("h2"), host("h3", 8, HostState.CORDONED)],
        on(workload("a0", 5, "a"), "h1"),
    )
    result = decide(
        state,
        workload("a1", 1, "a"),
        workload("b1", 1, "b"),
        shares={"a": 0.25},
        order={"b": 0, "a": 1},
    )
    assert placed_order(result) == ["b1", "a1"]


# No shares: nobody is below an entitlement, so every allocation is in tier 1.
ORDER_CASES = [
    pytest.param(
        [workload(f"{team}1", 1, team) for team in ("a", "b", "c", "d")],
        {"b": 2, "a": 7, "c": 3},
        ["b1", "c1", "a1", "d1"],
        id="fair-tree-order-key-smaller-first-unranked-last",
    ),
    pytest.param(
        [
            workload("a-low", 1, "a", priority=0, submit=0.0),
            workload("a-high", 1, "a", priority=5, submit=9.0),
            workload("b-top", 1, "b", priority=100, submit=0.0),
        ],
        {"a": 0, "b": 1},
        ["a-high", "a-low", "b-top"],
        id="user-priority-orders-only-within-its-allocation",
    ),
    pytest.param(
        [
            workload("a-late", 1, "a", submit=9.0),
            workload("a-twin-2", 1, "a", submit=5.0),
            workload("a-early", 1, "a", submit=1.0),
            workload("a-twin-1", 1, "a", submit=5.0),
        ],
        {"a": 0},
        ["a-early", "a-twin-1", "a-twin-2", "a-late"],
        id="then-submit-time-then-id",
    ),
    pytest.param(
        [
            workload("a1", 1, "a", submit=5.0),
            workload("a2", 1, "a", submit=6.0),
            workload("b1", 1, "b", submit=1.0),
            workload("b2", 1, "b", submit=7.0),
        ],
        {"a": 3, "b": 3},
        ["b1", "a1", "a2", "b2"],
        id="allocations-tied-on-rank-interleave-by-submit-time",
    ),
    pytest.param(
        [
            free_work("u-early", submit=0.0),
            workload("z-mid", 1, "a", min_runtime_s=0, submit=1.0),
            workload("a-late", 1, "a", submit=100.0),
        ],
        {},
        ["a-late", "u-early", "z-mid"],
        id="unallocated-after-all-allocated-work-then-fifo",
    ),
    pytest.param(
        [
            free_work("u-early", submit=0.0),
            workload("z-urgent", 1, "z", min_runtime_s=0, priority=9, submit=10.0),
        ],
        {"z": 0},
        ["u-early", "z-urgent"],
        id="unallocated-work-is-fifo-whatever-its-user-priority",
    ),
]


@pytest.mark.parametrize(("queue", "order", "expected"), ORDER_CASES)
def test_queue_order(queue: list[Workload], order: dict[str, int], expected: list[str]) -> None:
    result = decide(cluster(hosts(2)), *queue, order=order)
    assert placed_order(result) == expected


# -- drains ---------------------------------------------------------------------------------

LONG = workload("long", 4, "a", min_runtime_s=HOUR)  # protected until 3600


@pytest.mark.parametrize(
    ("now", "notices", "wakeup"),
    [
        pytest.param(1000.0, [], 3600.0, id="before-its-protection-ends-wake-up-then"),
        pytest.param(3600.0, [3600.0 + GRACE], 3600.0 + GRACE, id="when-its-protection-ends"),
        pytest.param(5000.0, [5000.0 + GRACE], 5000.0 + GRACE, id="long-after"),
    ],
)
def test_a_draining_host_notices_its_work_as_protection_ends(
    now: float, notices: list[float], wakeup: float
) -> None:
    state = cluster([host("h1", 8, HostState.DRAINING)], on(LONG, "h1", start=0.0))
    result = decide(state, now=now)
    assert [(p.workload_id, p.reason, p.preempt_at) for p in result.preemptions] == [
        ("long", PreemptReason.HOST_DRAIN, t) for t in notices
    ]
    assert result.next_wakeup == wakeup
    assert result.transitions == ()


def test_a_drain_notices_everything_unprotected_at_once() -> None:
    state = cluster(
        [host("h1", 8, HostState.DRAINING)],
        on(LONG, "h1", start=0.0),
        on(workload("short", 2, "a", min_runtime_s=600), "h1", start=0.0),
        on(free_work("free", 2), "h1", start=500.0),
    )
    result = decide(state, now=1000.0)
    assert result.preemptions == (
        Preemption("free", None, 2, PreemptReason.HOST_DRAIN, 1300.0, True),
        Preemption(
            "short",
            "a",
            2,
            PreemptReason.HOST_DRAIN,
            1300.0,
            True,
            victim_held_gpus=6,
            victim_entitlement_gpus=0.0,
        ),
    )
    assert result.next_wakeup == 1300.0  # the grace ends before long's protection (3600)


def test_a_drain_ends_a_gang_whole_and_notices_nothing_twice() -> None:
    state = cluster(
        [host("h1", 8, HostState.DRAINING), host("h2"), host("h3", 8, HostState.DRAINING)],
        on(workload("gang", 12, "a", min_runtime_s=0), "h1", "h2"),
        on(free_work("gone", 8), "h3", preempt_at=NOW + 50),
    )
    result = decide(state, now=NOW)
    assert [(p.workload_id, p.gpus) for p in result.preemptions] == [("gang", 12)]
    assert result.transitions == ()  # h3 still holds noticed work: not empty yet


def test_empty_draining_hosts_become_drained() -> None:
    state = cluster(
        [
            host("h3", 8, HostState.DRAINING),
            host("h1", 8, HostState.DRAINING),
            host("h2", 8, HostState.DRAINING),
            host("h4", 8, HostState.DRAINED),
            host("h5", 8, HostState.CORDONED),
        ],
        on(free_work("busy", 1), "h2"),
    )
    result = decide(state, now=NOW)
    assert result.transitions == (
        HostTransition("h1", HostState.DRAINED),
        HostTransition("h3", HostState.DRAINED),
    )
    assert set(preempted(result)) == {"busy"}


def test_a_cordoned_host_keeps_its_running_work() -> None:
    state = cluster(
        [host("h1", 8, HostState.CORDONED), host("h2")],
        on(free_work("free", 4), "h1"),
        on(workload("old", 4, "b"), "h1"),  # allocated, long past its protection
        on(workload("busy", 8, "b"), "h2", start=NOW),  # protected
    )
    result = decide(state, workload("a1", 4), shares={"a": 1.0}, now=NOW)
    assert result.preemptions == ()
    assert result.transitions == ()
    assert result.placements == ()


# -- next wake-up ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pending", "policy", "wakeup"),
    [
        pytest.param(workload("a1", 8), {}, NOW + 400, id="blocked-allocated-work"),
        pytest.param(free_work("u1", 8), {}, None, id="blocked-unallocated-work-cannot-preempt"),
        pytest.param(workload("a1", 8), {"preemption": False}, None, id="preemption-off"),
        pytest.param(workload("a1", 8, "b"), {}, NOW + 400, id="even-own-allocation-ends-first"),
        pytest.param(None, {}, None, id="nothing-pending"),
    ],
)
def test_next_wakeup_is_the_earliest_protection_end_when_allocated_work_is_blocked(
    pending: Workload | None, policy: dict[str, Any], wakeup: float | None
) -> None:
    state = cluster(
        hosts(2),
        on(workload("b1", 8, "b"), "h1", start=NOW - HOUR + 900),
        on(workload("b2", 8, "b"), "h2", start=NOW - HOUR + 400),
    )
    queue = () if pending is None else (pending,)
    result = decide(state, *queue, shares={"a": 1.0}, now=NOW, **policy)
    assert result.preemptions == ()
    assert result.placements == ()
    assert result.next_wakeup == wakeup


def test_a_cycle_reads_the_snapshot_without_changing_it() -> None:
    """run_cycle is a function of (snapshot, policy, now): asking about a later moment first
    must not change the answer for an earlier one."""

    def build() -> ClusterState:
        return cluster(hosts(1), on(workload("b1", 8, "b", min_runtime_s=1000), "h1", start=0.0))

    fresh = decide(build(), workload("a1", 8), now=500.0)
    assert fresh.next_wakeup == 1000.0  # blocked until b1's protection ends
    reused = build()
    decide(reused, workload("a1", 8), now=2000.0)
    assert decide(reused, workload("a1", 8), now=500.0) == fresh


# -- earmarks (Fair Tree) -------------------------------------------------------------------
# ``a`` (half the cluster owed, nothing held) asks for more than it can get now: ``b``'s
# protected work is in the way. Its earmark holds the room it will get when that
# protection ends. The plan is deferred until something reads the cluster view; each case
# is a read that must see it (test_core_properties.py checks the deferral in general).

EARMARK_SHARES = {"a": 0.5, "b": 0.05, "c": 0.05}
EARMARK_ORDER = {"a": 0, "b": 1, "c": 2}
PROTECTED = NOW - 600  # b's work started 10 minutes ago, protected for an hour


@pytest.mark.parametrize(
    ("running", "pending", "placements", "noticed"),
    [
        pytest.param(
            [on(workload("b1", 6, "b"), "h1", start=PROTECTED)],
            [workload("a-big", 4), workload("c1", 1, "c", submit=1.0)],
            {},
            set(),
            id="a-later-fit-does-not-take-the-held-free-gpus",
        ),
        pytest.param(
            [
                on(workload("b1", 6, "b"), "h1", start=PROTECTED),
                on(free_work("u1", 2), "h1", start=PROTECTED),
                on(workload("b2", 8, "b"), "h2", start=PROTECTED),
            ],
            [workload("a-big", 10), workload("a2", 2, submit=1.0)],
            {},
            set(),
            id="a-later-plan-does-not-take-the-earmarked-victims",
        ),
        pytest.param(
            [
                on(workload("b1", 6, "b"), "h1", start=PROTECTED),
                on(free_work("u1", 2), "h1", start=PROTECTED),
                on(free_work("u2", 8), "h2", start=PROTECTED),
                on(workload("b3", 8, "b"), "h3", start=PROTECTED),
            ],
            # a1's failed fit rules out fits for the rest of the cycle, so c-big goes
            # straight to a plan, which must not take u2: a-big's earmark holds it.
            [workload("a1", 1), workload("a-big", 18, submit=1.0), workload("c-big", 8, "c")],
            {},
            {"u1"},
            id="a-later-plan-without-a-fit-does-not-take-the-earmarked-victims",
        ),
        pytest.param(
            [on(workload("b1", 6, "b"), "h1", start=PROTECTED)],
            [workload("a-big", 4), free_work("u2", 2, submit=1.0)],
            {"u2": (("h1", (6, 7)),)},
            set(),
            id="unallocated-work-fills-the-held-gpus-after-allocated-work",
        ),
    ],
)
def test_an_earmark_holds_its_room_against_later_requests(
    running: list[On],
    pending: list[Workload],
    placements: dict[str, Assignment],
    noticed: set[str],
) -> None:
    state = cluster(hosts(len({h for r in running for h in r.hosts})), *running)
    result = decide(state, *pending, shares=EARMARK_SHARES, order=EARMARK_ORDER, now=NOW)
    assert placed(result) == placements
    assert set(preempted(result)) == noticed


@pytest.mark.source_core  # patches the cycle's own call of plan_preemption
def test_an_earmark_that_nothing_reads_is_never_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full cluster and an owed request blocked by protected work (the usual state under
    load): the earmark plan, a scan of every host as if unprotected, is not computed when no
    later request can fit or plan."""
    kinds: list[bool] = []
    real = cycle.plan_preemption

    def counting(view: ClusterView, pool: str, gpus: int, rule: VictimRule) -> Plan | None:
        kinds.append(getattr(rule, "ignores_protection", False))
        return real(view, pool, gpus, rule)

    monkeypatch.setattr(cycle, "plan_preemption", counting)
    state = cluster(hosts(1), on(workload("b1", 8, "b"), "h1", start=PROTECTED))
    pending = (workload("a-big", 4), workload("a2", 4, submit=1.0))
    result = decide(state, *pending, shares=EARMARK_SHARES, order=EARMARK_ORDER, now=NOW)
    assert (result.placements, result.preemptions) == ((), ())
    assert kinds == [False]  # a-big's plan within protection; no earmark plan


# -- FIFO -----------------------------------------------------------------------------------


def test_fifo_backfills_past_what_does_not_fit_and_never_preempts() -> None:
    state = cluster(hosts(1), on(free_work("free", 6), "h1", start=0.0))
    result = decide(
        state,
        workload("big", 4, "a", submit=0.0),
        workload("small", 2, "a", submit=1.0),
        shares={"a": 1.0},
        now=NOW,
        ordering=FIFO,
    )
    assert placed(result) == {"small": (span("h1", 6, 7),)}
    assert result.preemptions == ()
    assert result.next_wakeup is None


@pytest.mark.parametrize(
    ("queue", "expected"),
    [
        pytest.param(
            [
                workload("b1", 1, "b", submit=3.0),
                workload("a1", 1, "a", submit=1.0),
                free_work("u1", submit=2.0),
                workload("a0", 1, "a", submit=0.0),
            ],
            ["a0", "a1", "u1", "b1"],
            id="one-global-queue-by-submit-time",
        ),
        pytest.param(
            [
                workload("a-early", 1, "a", submit=0.0),
                workload("b-mid", 1, "b", submit=5.0),
                workload("a-late", 1, "a", priority=9, submit=10.0),
            ],
            ["a-early", "b-mid", "a-late"],
            id="user-priority-does-not-reorder-fifo",
        ),
    ],
)
def test_fifo_order(queue: list[Workload], expected: list[str]) -> None:
    # Fair-share inputs a FIFO cycle must ignore.
    result = decide(
        cluster(hosts(1)), *queue, shares={"b": 1.0}, order={"b": 0, "a": 1}, ordering=FIFO
    )
    assert placed_order(result) == expected
