"""Reservations (``allot.core.reservations``): a large request blocked by protected work is
planned on the hosts available soonest, those hosts are held from work that would outlast
the plan, and at its time the request preempts there."""

from __future__ import annotations

import pytest
from builders import cluster, decide, free_work, hosts, on, placed, preempted, snapshot, workload

from allot.core.cycle import run_cycle
from allot.core.decisions import Reservation
from allot.core.model import Workload
from allot.core.policy import Policy
from allot.core.reasons import PendingReason, estimated_start, explain_pending
from allot.core.state import ClusterState

NOW = 10_000.0
SHARES = {"a": 0.5, "b": 0.1, "c": 0.1}
ORDER = {"a": 0, "c": 1, "b": 2}
POLICY = {"reservation_min_gpus": 16}


def blocked() -> ClusterState:
    """Four hosts: b's protected runs end in 1,000 s (h1), 200 s (h2) and 300 s (h3); h4
    is free. a (half the cluster, nothing held) wants 16 GPUs: two whole hosts."""
    return cluster(
        hosts(4),
        on(workload("b1", 8, "b", min_runtime_s=1600), "h1", start=NOW - 600),
        on(workload("b2", 8, "b", min_runtime_s=800), "h2", start=NOW - 600),
        on(workload("b3", 8, "b", min_runtime_s=900), "h3", start=NOW - 600),
    )


GANG = workload("a-gang", 16, "a")


def test_a_blocked_gang_reserves_the_hosts_available_soonest() -> None:
    result = decide(blocked(), GANG, shares=SHARES, order=ORDER, now=NOW, **POLICY)
    assert result.reservations == (Reservation("a-gang", "a", NOW + 200, ("h2", "h4"), 16),)
    assert (result.placements, result.preemptions) == ((), ())


@pytest.mark.parametrize(
    ("later", "expected"),
    [
        pytest.param(
            workload("c-long", 8, "c", min_runtime_s=3600, submit=1.0),
            {},
            id="protected-past-the-reservation-stays-off-the-held-host",
        ),
        pytest.param(
            workload("c-short", 8, "c", min_runtime_s=200, submit=1.0),
            {"c-short": (("h4", tuple(range(8))),)},
            id="backfill-that-ends-by-the-reservation-may-use-it",
        ),
        pytest.param(
            free_work("u1", 8, submit=1.0),
            {"u1": (("h4", tuple(range(8))),)},
            id="unallocated-work-fills-the-held-host",
        ),
    ],
)
def test_held_hosts_take_only_work_that_leaves_in_time(
    later: Workload, expected: dict[str, object]
) -> None:
    result = decide(blocked(), GANG, later, shares=SHARES, order=ORDER, now=NOW, **POLICY)
    assert placed(result) == expected
    assert [r.workload_id for r in result.reservations] == ["a-gang"]


def test_at_its_time_the_gang_preempts_on_the_reserved_hosts() -> None:
    result = decide(blocked(), GANG, shares=SHARES, order=ORDER, now=NOW + 200, **POLICY)
    assert set(preempted(result)) == {"b2"}
    assert result.waiting_on == (("a-gang", ("b2",)),)


def test_the_reason_says_reserved_until_with_hosts_and_time() -> None:
    snap = snapshot(blocked(), GANG, workload("c-long", 8, "c"), shares=SHARES, order=ORDER)
    policy = Policy(reservation_min_gpus=16)
    result = run_cycle(snap, policy, NOW)
    why = explain_pending(snap, policy, NOW, result)
    assert why["a-gang"].code is PendingReason.RESERVED_UNTIL
    assert dict(why["a-gang"].numbers) == {
        "requested": 16,
        "until": NOW + 200,
        "in_s": 200.0,
        "hosts": "h2,h4",
        "host_count": 2,
    }
    assert estimated_start(why["a-gang"], NOW) == NOW + 200


@pytest.mark.parametrize(
    ("policy", "reserved"),
    [
        pytest.param({"reservations": False}, [], id="switched-off"),
        pytest.param({"reservation_min_gpus": 32}, [], id="smaller-than-the-minimum"),
        pytest.param({"max_reservations": 0}, [], id="no-reservation-allowed"),
        pytest.param({"reservation_max_share": 0.25}, [], id="more-than-the-share-held"),
        pytest.param({"reservation_max_share": 0.5}, ["a-gang"], id="within-the-share"),
    ],
)
def test_the_policy_bounds_reservations(policy: dict[str, object], reserved: list[str]) -> None:
    result = decide(blocked(), GANG, shares=SHARES, order=ORDER, now=NOW, **{**POLICY, **policy})
    assert [r.workload_id for r in result.reservations] == reserved


def test_over_entitlement_work_reserves_only_after_waiting() -> None:
    """b is far over its entitlement (tier 1): its gang reserves only once it has waited
    ``reservation_after_s``, and only on hosts of work it may take (worse-ranked, over)."""
    state = cluster(
        hosts(4),
        on(workload("b1", 8, "b", min_runtime_s=1600), "h1", start=NOW - 600),
        on(workload("c1", 8, "c", min_runtime_s=800), "h2", start=NOW - 600),
        on(workload("c2", 8, "c", min_runtime_s=800), "h3", start=NOW - 600),
        on(workload("c3", 8, "c", min_runtime_s=800), "h4", start=NOW - 600),
    )
    gang = workload("b-gang", 16, "b", submit=NOW - 100)
    order = {"b": 0, "c": 1}
    fresh = decide(state, gang, shares=SHARES, order=order, now=NOW, **POLICY)
    assert fresh.reservations == ()
    late = decide(
        state, gang, shares=SHARES, order=order, now=NOW, reservation_after_s=60, **POLICY
    )
    assert late.reservations == (Reservation("b-gang", "b", NOW + 200, ("h2", "h3"), 16),)


@pytest.mark.parametrize(
    ("min_runtime_s", "noticed"),
    [
        pytest.param(200, {"u1"}, id="ends-by-the-reservation-may-displace-held-free-work"),
        pytest.param(3600, set(), id="outlasting-it-may-not"),
    ],
)
def test_backfill_may_preempt_on_held_hosts_only_if_it_ends_in_time(
    min_runtime_s: int, noticed: set[str]
) -> None:
    state = cluster(
        hosts(4),
        on(workload("b1", 8, "b", min_runtime_s=1600), "h1", start=NOW - 600),
        on(workload("b2", 8, "b", min_runtime_s=800), "h2", start=NOW - 600),
        on(workload("b3", 8, "b", min_runtime_s=900), "h3", start=NOW - 600),
        on(free_work("u1", 8), "h4", start=NOW - 600),
    )
    later = workload("c1", 8, "c", min_runtime_s=min_runtime_s, submit=1.0)
    result = decide(state, GANG, later, shares=SHARES, order=ORDER, now=NOW, **POLICY)
    assert result.reservations == (Reservation("a-gang", "a", NOW + 200, ("h2", "h4"), 16),)
    assert set(preempted(result)) == noticed
