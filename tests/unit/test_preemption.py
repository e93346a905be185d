"""The preemption planner, through ``run_cycle`` (FAIRSHARE, entitlement tier on unless a
case says otherwise).

Conventions: the cycle runs at ``NOW``; running work started at 0 with the default
one-hour minimum runtime, so it is past its protection. Entitlement = effective share x
GPUs on healthy hosts; an allocation missing from ``shares`` is entitled to nothing, so any
allocated work it runs is over its entitlement.
"""

from __future__ import annotations

import pytest
from builders import (
    HOUR,
    On,
    cluster,
    decide,
    free_work,
    hosts,
    on,
    placed,
    preempted,
    span,
    workload,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from allot.core.cycle import Snapshot, run_cycle
from allot.core.decisions import Preemption, PreemptReason
from allot.core.fold import apply_result, end_workload
from allot.core.model import HostState, Workload
from allot.core.policy import Policy, make_policy
from allot.core.state import PendingQueue

NOW = 10_000.0
GRACE = 300
DISPLACED = PreemptReason.DISPLACED_UNALLOCATED
RECLAIMED = PreemptReason.RECLAIMED_FOR_ENTITLEMENT
BETTER = PreemptReason.BETTER_RANKED


def b(id: str, n: int, *hosts_: str, start: float = 0.0, preempt_at: float | None = None) -> On:
    """Allocated work of allocation "b" (over its entitlement unless shares say otherwise)."""
    return on(workload(id, n, "b"), *hosts_, start=start, preempt_at=preempt_at)


def u(id: str, n: int, *hosts_: str, start: float = 0.0) -> On:
    return on(free_work(id, n), *hosts_, start=start)


A_UNDER = {"a": 1.0}  # a is entitled to the whole cluster: always below its entitlement


# -- unallocated first ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("running",),
    [
        pytest.param((b("b1", 8, "h1"), u("u1", 8, "h2")), id="unallocated-on-the-later-host"),
        pytest.param((u("u1", 8, "h1"), b("b1", 8, "h2")), id="unallocated-on-the-first-host"),
        pytest.param(
            (b("b1", 8, "h1", start=NOW - HOUR), u("u1", 8, "h2", start=0.0)),
            id="even-when-the-unallocated-victim-loses-more-work",
        ),
    ],
)
def test_unallocated_victims_go_first(running: tuple[On, ...]) -> None:
    state = cluster(hosts(2), *running)
    result = decide(state, workload("a1", 8), shares=A_UNDER, now=NOW)
    assert result.preemptions == (
        Preemption(
            workload_id="u1",
            allocation=None,
            gpus=8,
            reason=DISPLACED,
            preempt_at=NOW + GRACE,
            requeue=True,
            preemptor="a1",
            victim_held_gpus=0,
            victim_entitlement_gpus=0.0,
        ),
    )
    assert result.waiting_on == (("a1", ("u1",)),)
    assert result.placements == ()


def test_a_requester_above_its_entitlement_still_displaces_unallocated_work() -> None:
    state = cluster(hosts(2), on(workload("a0", 8), "h1"), u("u1", 8, "h2"))
    # a holds 8 of an 8-GPU entitlement (tier 1), and ranks worst of all.
    result = decide(state, workload("a1", 4), shares={"a": 0.5}, order={"a": 9}, now=NOW)
    assert set(preempted(result)) == {"u1"}
    assert preempted(result)["u1"].reason is DISPLACED


# -- never protected, never for unallocated requests ---------------------------------------


@pytest.mark.parametrize(
    ("start", "victims"),
    [
        pytest.param(NOW - 60, set(), id="protected-for-another-59-minutes"),
        pytest.param(NOW - HOUR + 1, set(), id="protected-for-one-more-second"),
        pytest.param(NOW - HOUR, {"b1"}, id="protection-ends-now"),
    ],
)
def test_protected_work_is_never_preempted(start: float, victims: set[str]) -> None:
    state = cluster(hosts(1), b("b1", 8, "h1", start=start))
    result = decide(state, workload("a1", 8), shares=A_UNDER, now=NOW)
    assert set(preempted(result)) == victims
    assert result.placements == ()
    if not victims:
        # Blocked allocated work wakes the scheduler when the protection lapses.
        assert result.next_wakeup == start + HOUR


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(free_work("x", 4), id="no-allocation"),
        pytest.param(workload("x", 4, "a", min_runtime_s=0), id="allocation-but-no-min-runtime"),
    ],
)
def test_an_unallocated_request_never_preempts(request_: Workload) -> None:
    state = cluster(hosts(1), u("u1", 4, "h1"), b("b1", 4, "h1"))
    result = decide(state, request_, shares=A_UNDER, now=NOW)
    assert result.preemptions == ()
    assert result.placements == ()
    assert result.waiting_on == ()
    assert result.next_wakeup is None


# -- shape of the victim set ----------------------------------------------------------------


def test_a_gang_victim_is_freed_whole_and_its_gpus_serve_the_requester() -> None:
    state = cluster(hosts(2), b("bg", 16, "h1", "h2"))
    queue = PendingQueue([workload("a1", 4)])
    result = run_cycle(Snapshot(state, queue, A_UNDER, {}), Policy(), NOW)
    assert [(p.workload_id, p.gpus) for p in result.preemptions] == [("bg", 16)]
    assert result.waiting_on == (("a1", ("bg",)),)
    assert result.placements == ()

    apply_result(state, queue, result, NOW)
    later = NOW + GRACE
    end_workload(state, queue, "bg", preempted=True)  # requeued: pending again
    result = run_cycle(Snapshot(state, queue, A_UNDER, {}), Policy(), later)
    # a1 (tier 0) first: best fit on two empty hosts, first id. Then the requeued gang no
    # longer finds two whole hosts, and b (entitled to nothing, so tier 1) may only take from
    # worse-ranked allocations over their entitlement: there are none.
    assert placed(result) == {"a1": (span("h1", 0, 3),)}
    assert result.preemptions == ()


def test_a_gang_victim_counts_all_its_gpus_in_the_cost() -> None:
    # Clearing 8 GPUs on h1 would end the whole 16-GPU gang; h3's 8-GPU job costs half.
    state = cluster(hosts(3), b("bg", 16, "h1", "h2"), b("b3", 8, "h3"))
    result = decide(state, workload("a1", 8), shares=A_UNDER, now=NOW)
    assert set(preempted(result)) == {"b3"}


@pytest.mark.parametrize(
    ("n_hosts", "running", "size", "victims"),
    [
        pytest.param(
            # h1: b1 on 4 + 4 free; h2: b2 on 4 + 4 free. One victim and its host's free
            # GPUs make 8; b2 started later, so preempting it loses less work.
            2,
            (b("b1", 4, "h1"), b("b2", 4, "h2", start=5000.0)),
            8,
            {"b2"},
            id="one-victim-beside-free-gpus-not-one-per-host",
        ),
        pytest.param(
            # h1: b1 on 6, 2 free (needs b1: 6 GPUs). h2: b2 and b3 on 2 each, 4 free
            # (needs one 2-GPU victim).
            2,
            (b("b1", 6, "h1"), b("b2", 2, "h2"), b("b3", 2, "h2")),
            6,
            {"b2"},
            id="fewest-gpus-preempted-wins-among-hosts",
        ),
        pytest.param(
            # h1 full: b1 (1 GPU), b2 (6), b3 (1). Taken in order of least work lost
            # (b1, b3, then b2) until 6 fit, then the ones the fit does not need are dropped.
            1,
            (b("b1", 1, "h1"), b("b2", 6, "h1"), b("b3", 1, "h1")),
            6,
            {"b2"},
            id="victims-the-fit-does-not-need-are-dropped",
        ),
    ],
)
def test_victims_free_what_is_needed_on_one_host(
    n_hosts: int, running: tuple[On, ...], size: int, victims: set[str]
) -> None:
    state = cluster(hosts(n_hosts), *running)
    result = decide(state, workload("a1", size), shares=A_UNDER, now=NOW)
    assert set(preempted(result)) == victims
    assert result.waiting_on == (("a1", tuple(sorted(victims))),)
    assert result.placements == ()


def test_a_gangs_remainder_preempts_no_more_unallocated_work_than_it_needs() -> None:
    """12 GPUs on 8-GPU hosts: one host cleared whole (h3: the least work lost), then 4
    more. h1 and h2 both hold 8 GPUs of unallocated work, but on h1 it is one 8-GPU run
    and on h2 two 4-GPU runs: the remainder takes one run of h2 (12 GPUs preempted in
    all), not h1's run for its lower index (16; found by a user trial, 2026-12-03)."""
    state = cluster(
        hosts(3),
        u("u8", 8, "h1", start=NOW - 63),
        u("sp", 4, "h2", start=NOW - 160),
        u("z1", 4, "h2", start=NOW - 37),
        u("z2", 4, "h3", start=NOW - 37),
        u("z3", 4, "h3", start=NOW - 37),
    )
    result = decide(state, workload("a1", 12), shares=A_UNDER, now=NOW)
    assert set(preempted(result)) == {"z1", "z2", "z3"}
    assert sum(p.gpus for p in result.preemptions) == 12


def test_the_free_gpus_beside_the_victims_are_reserved_for_the_requester() -> None:
    # h1: b1 on 4, 4 free. h2: b2 on 2, 6 free. a1 (8) preempts b2, the cheaper victim, and
    # waits for h2's 6 free GPUs too. a2 (5) would fit on h2's free GPUs, but they are
    # reserved: it has to preempt b1 instead.
    state = cluster(hosts(2), b("b1", 4, "h1"), b("b2", 2, "h2"))
    result = decide(
        state,
        workload("a1", 8, submit=0.0),
        workload("a2", 5, submit=1.0),
        shares=A_UNDER,
        now=NOW,
    )
    assert result.placements == ()
    assert set(preempted(result)) == {"b1", "b2"}
    assert result.waiting_on == (("a1", ("b2",)), ("a2", ("b1",)))


# -- work already under notice --------------------------------------------------------------


@pytest.mark.parametrize(
    ("running", "queue", "new_notices", "waiting_on"),
    [
        pytest.param(
            (b("bn", 8, "h1", preempt_at=NOW + 100), b("b2", 8, "h2")),
            (workload("a1", 8),),
            set(),
            (("a1", ("bn",)),),
            id="noticed-work-is-claimed-instead-of-a-new-victim",
        ),
        pytest.param(
            (b("bn", 4, "h1", preempt_at=NOW + 100), b("b2", 8, "h2")),
            (workload("a1", 8),),
            set(),
            (("a1", ("bn",)),),
            id="noticed-work-plus-free-gpus-beside-it",
        ),
        pytest.param(
            (b("bn", 8, "h1", preempt_at=NOW + 100), b("b2", 8, "h2")),
            (workload("a1", 8, submit=0.0), workload("a2", 8, submit=1.0)),
            {"b2"},
            (("a1", ("bn",)), ("a2", ("b2",))),
            id="a-second-requester-cannot-claim-the-same-notice",
        ),
        pytest.param(
            # h1: bn (2 GPUs, noticed), b1 (2) and b2 (4), both past protection; h2 is
            # protected. a1 needs 4: bn's 2 and b1's 2, not b2's 4 and a notice too many.
            (
                b("bn", 2, "h1", preempt_at=NOW + 100),
                b("b1", 2, "h1"),
                b("b2", 4, "h1"),
                on(workload("c0", 8, "c"), "h2", start=NOW),
            ),
            (workload("a1", 4),),
            {"b1"},
            (("a1", ("b1", "bn")),),
            id="noticed-work-first-on-the-host-then-the-fewest-new-victims",
        ),
        pytest.param(
            (u("u1", 8, "h1"), b("bn", 8, "h2", preempt_at=NOW + 100)),
            (workload("a1", 8),),
            set(),
            (("a1", ("bn",)),),
            id="noticed-work-before-unallocated-work",
        ),
        pytest.param(
            # h1: 4 protected GPUs and a 4-GPU unallocated job; h2: 3 protected GPUs and a
            # 5-GPU job already under notice. a1's 4 GPUs fit in the noticed job's.
            (
                b("bp1", 4, "h1", start=NOW),
                u("u1", 4, "h1"),
                b("bp2", 3, "h2", start=NOW),
                b("bn", 5, "h2", preempt_at=NOW + 100),
            ),
            (workload("a1", 4),),
            set(),
            (("a1", ("bn",)),),
            id="noticed-work-before-a-tighter-fit-of-unallocated-work",
        ),
    ],
)
def test_work_under_notice_is_claimed_first_and_causes_no_new_notice(
    running: tuple[On, ...],
    queue: tuple[Workload, ...],
    new_notices: set[str],
    waiting_on: tuple[tuple[str, tuple[str, ...]], ...],
) -> None:
    state = cluster(hosts(2), *running)
    result = decide(state, *queue, shares=A_UNDER, now=NOW)
    assert set(preempted(result)) == new_notices
    assert result.waiting_on == waiting_on
    assert result.placements == ()


def test_work_under_notice_for_a_pending_request_stays_its_own_from_cycle_to_cycle() -> None:
    """ads (12) and search (8) arrive together; 20 GPUs of unallocated work get notices,
    each for one of them. As the victims leave one by one, a cycle runs after each: no
    cycle may give one request's noticed GPUs to the other (ads, first in order, took
    search's 8-GPU host and search preempted one more run; found by a user trial)."""
    protected = [on(workload(f"n{h}", 8, "nlp"), h, start=NOW) for h in ("h2", "h3", "h4")]
    state = cluster(
        hosts(8),
        u("u8", 8, "h1", start=NOW - 63),
        *protected,
        u("sp", 4, "h5", start=NOW - 160),
        u("z1", 4, "h5", start=NOW - 37),
        on(workload("n6", 8, "nlp"), "h6", start=NOW),
        on(workload("n7", 8, "nlp"), "h7", start=NOW),
        u("z2", 4, "h8", start=NOW - 37),
        u("z3", 4, "h8", start=NOW - 37),
    )
    queue = PendingQueue()
    queue.add(workload("ads", 12, "ads", submit=NOW))
    queue.add(workload("search", 8, "search", submit=NOW))
    shares = {"nlp": 0.25, "ads": 0.25, "search": 0.25, "vision": 0.25}
    policy = Policy(grace_s=10)
    result = run_cycle(Snapshot(state, queue, shares, {}), policy, NOW)
    apply_result(state, queue, result, NOW)
    first = {p.workload_id: p.preemptor for p in result.preemptions}
    assert first == {"z1": "ads", "z2": "ads", "z3": "ads", "u8": "search"}
    notices, placed_ = dict(first), {}
    now = NOW
    for victim in ("z1", "z2", "z3", "u8"):  # search's victim leaves last
        now += 1
        end_workload(state, queue, victim, preempted=True)
        result = run_cycle(Snapshot(state, queue, shares, {}), policy, now)
        apply_result(state, queue, result, now)
        notices.update((p.workload_id, p.preemptor) for p in result.preemptions)
        placed_.update(placed(result))
    assert notices == first  # nobody else preempted
    assert set(placed_) == {"ads", "search"}
    assert sum(len(g) for _, g in placed_["ads"]) == 12


# -- who may reclaim from whom --------------------------------------------------------------

# Two 8-GPU hosts (16 GPUs); a1 asks for 4.
PROTECTED_C = (
    on(workload("c0", 4, "c"), "h1", start=NOW),
    on(workload("c1", 8, "c"), "h2", start=NOW),
)
TIERS = [
    pytest.param(
        # a 0.5 -> 8 GPUs, holds 0: under. b 0.5 -> 8, holds 16: over, and ranks better.
        {"a": 0.5, "b": 0.5},
        {"b": 0, "a": 1},
        (b("b1", 8, "h1"), b("b2", 8, "h2")),
        True,
        ("b1", RECLAIMED, 16, 8.0),
        id="under-entitlement-reclaims-from-a-better-ranked-allocation-over-its-entitlement",
    ),
    pytest.param(
        {"a": 0.5, "b": 0.5},
        {"b": 0, "a": 1},
        (b("b1", 8, "h1"), b("b2", 8, "h2")),
        False,
        None,
        id="tier-off-never-from-a-better-ranked-allocation",
    ),
    pytest.param(
        # b 0.25 -> 4, holds 4: at its entitlement, though worse-ranked. c (0.25 -> 4,
        # holds 12) is over but protected.
        {"a": 0.5, "b": 0.25, "c": 0.25},
        {"a": 0, "b": 5, "c": 6},
        (b("b1", 4, "h1"), *PROTECTED_C),
        True,
        None,
        id="under-entitlement-never-from-an-allocation-at-its-entitlement",
    ),
    pytest.param(
        {"a": 0.5, "b": 0.25, "c": 0.25},
        {"a": 0, "b": 5, "c": 6},
        (b("b1", 4, "h1"), *PROTECTED_C),
        False,
        ("b1", BETTER, 4, 4.0),
        id="tier-off-from-a-worse-ranked-allocation-even-within-its-entitlement",
    ),
    pytest.param(
        # a 0.25 -> 4, holds 4: tier 1. b 0.125 -> 2, holds 4 (h1); c 0.125 -> 2, holds 8
        # (h2, two runs of 4). Both over; only the worse-ranked one may lose work to a.
        {"a": 0.25, "b": 0.125, "c": 0.125},
        {"b": 0, "a": 1, "c": 2},
        (
            on(workload("a0", 4), "h1"),
            b("b1", 4, "h1"),
            on(workload("c1", 4, "c"), "h2"),
            on(workload("c2", 4, "c"), "h2"),
        ),
        True,
        ("c1", BETTER, 8, 2.0),
        id="above-entitlement-only-from-a-worse-ranked-allocation-over-its-entitlement",
    ),
    pytest.param(
        # The worse-ranked b holds 4 of 2 entitled: taking its 4-GPU run would leave b
        # below its entitlement, so b's own work would take the GPUs back first (thrash).
        {"a": 0.25, "b": 0.125, "c": 0.125},
        {"c": 0, "a": 1, "b": 2},
        (on(workload("a0", 4), "h1"), b("b1", 4, "h1"), on(workload("c1", 8, "c"), "h2")),
        True,
        None,
        id="above-entitlement-never-pushes-the-victim-below-its-entitlement",
    ),
    pytest.param(
        {"a": 0.25, "b": 0.125, "c": 0.125},
        {"b": 0, "a": 1, "c": 2},
        (on(workload("a0", 4), "h1"), b("b1", 4, "h1"), on(workload("c1", 8, "c"), "h2")),
        True,
        None,
        id="above-entitlement-not-even-from-the-worse-ranked-one-when-it-would-drop-below",
    ),
    pytest.param(
        {"a": 0.25, "b": 0.125, "c": 0.125},
        {"b": 0, "c": 0, "a": 1},
        (on(workload("a0", 4), "h1"), b("b1", 4, "h1"), on(workload("c1", 8, "c"), "h2")),
        True,
        None,
        id="above-entitlement-nothing-when-both-rank-better",
    ),
    pytest.param(
        # a 0.25 -> 4, holds 4: tier 1. b 0.25 -> 4 holds 4, c 0.5 -> 8 holds 8: both
        # worse-ranked, neither over.
        {"a": 0.25, "b": 0.25, "c": 0.5},
        {"a": 0, "b": 1, "c": 2},
        (on(workload("a0", 4), "h1"), b("b1", 4, "h1"), on(workload("c1", 8, "c"), "h2")),
        True,
        None,
        id="above-entitlement-never-from-worse-ranked-allocations-within-their-entitlement",
    ),
    pytest.param(
        {"a": 0.5, "b": 0.5},
        {"a": 0, "b": 1},
        (on(workload("a0", 8), "h1"), on(workload("a9", 8), "h2")),
        True,
        None,
        id="never-from-its-own-allocation",
    ),
    pytest.param(
        {},
        {},
        (on(workload("a0", 8), "h1"), on(workload("a9", 8), "h2")),
        False,
        None,
        id="never-from-its-own-allocation-tier-off",
    ),
]


@pytest.mark.parametrize(("shares", "order", "running", "tier", "expected"), TIERS)
def test_who_may_reclaim_from_whom(
    shares: dict[str, float],
    order: dict[str, int],
    running: tuple[On, ...],
    tier: bool,
    expected: tuple[str, PreemptReason, int, float] | None,
) -> None:
    state = cluster(hosts(2), *running)
    result = decide(
        state, workload("a1", 4), shares=shares, order=order, now=NOW, entitlement_tier=tier
    )
    if expected is None:
        assert result.preemptions == ()
        assert result.waiting_on == ()
        return
    victim, reason, held, entitled = expected
    victim_run = state.running[victim]
    assert result.preemptions == (
        Preemption(
            workload_id=victim,
            allocation=victim_run.workload.allocation,
            gpus=victim_run.workload.gpus,
            reason=reason,
            preempt_at=NOW + GRACE,
            requeue=True,
            preemptor="a1",
            victim_held_gpus=held,
            victim_entitlement_gpus=entitled,
        ),
    )


def test_several_victims_of_one_allocation_stop_once_it_is_no_longer_over() -> None:
    # 16 GPUs; b 0.25 -> 4, holds 8 in four 2-GPU jobs on h1 (h2 is c's protected work).
    # a (0.75 -> 12, holds nothing) is far below its entitlement. Two victims bring b down
    # to its entitlement, so a third is not fair: 6 GPUs cannot be reclaimed, 4 can.
    state = cluster(
        hosts(2),
        *(b(f"b{i}", 2, "h1") for i in range(1, 5)),
        on(workload("c0", 8, "c"), "h2", start=NOW),
    )
    result = decide(state, workload("a1", 6), shares={"a": 0.75, "b": 0.25}, now=NOW)
    assert result.preemptions == ()
    result = decide(state, workload("a1", 4), shares={"a": 0.75, "b": 0.25}, now=NOW)
    assert set(preempted(result)) == {"b1", "b2"}
    assert {p.reason for p in result.preemptions} == {RECLAIMED}


# -- grace and the numbers on each notice ---------------------------------------------------


@pytest.mark.parametrize(
    ("grace", "wakeup"),
    [
        pytest.param(0, None, id="no-grace-gpus-free-at-once"),
        pytest.param(300, NOW + 300, id="default-five-minutes"),
        pytest.param(1234, NOW + 1234, id="custom-grace"),
    ],
)
def test_preempt_at_is_now_plus_grace(grace: int, wakeup: float | None) -> None:
    state = cluster(hosts(1), b("b1", 8, "h1"))
    result = decide(state, workload("a1", 8), shares=A_UNDER, now=NOW, grace_s=grace)
    assert [p.preempt_at for p in result.preemptions] == [NOW + grace]
    assert result.next_wakeup == wakeup


@pytest.mark.parametrize(
    ("resumable", "requeue"),
    [pytest.param(True, True, id="resumable-is-requeued"), pytest.param(False, False, id="not")],
)
def test_a_notice_says_whether_the_victim_is_requeued(resumable: bool, requeue: bool) -> None:
    state = cluster(hosts(1), on(workload("b1", 8, "b", resumable=resumable), "h1"))
    result = decide(state, workload("a1", 8), shares=A_UNDER, now=NOW)
    assert [p.requeue for p in result.preemptions] == [requeue]


def test_entitlement_on_a_notice_counts_healthy_gpus_only() -> None:
    # Three hosts, one cordoned: 16 healthy GPUs. b 0.25 -> 4.0 (not 0.25 x 24 = 6.0),
    # holds 8: over. a (0.75 -> 12) holds nothing; h2 is c's protected work.
    state = cluster(hosts(3), b("b1", 8, "h1"), on(workload("c0", 8, "c"), "h2", start=NOW))
    state.set_host_state("h3", HostState.CORDONED)
    result = decide(state, workload("a1", 8), shares={"a": 0.75, "b": 0.25}, now=NOW)
    (notice,) = result.preemptions
    assert (notice.workload_id, notice.reason) == ("b1", RECLAIMED)
    assert (notice.victim_held_gpus, notice.victim_entitlement_gpus) == (8, 4.0)


# -- keeping gangs: a reclaim may leave a gang's team below its share -----------------------

# Four 8-GPU hosts. b runs a 16-GPU gang on h1-h2 past its protection; a (b's share's rest,
# holds nothing) reclaims 4 GPUs; h3-h4 hold c's protected work (c has no share: always
# over) unless a row puts b's work there. The keep rule: "reclaim" (``keep_large_gangs``
# off: every gang a victim, as before decision 0067), "large" (the default: not a gang
# larger than its team's share when taking it leaves the team below its share), "every"
# (``keep_gangs_at_entitlement``: not any gang so, decision 0065).
GANG = on(workload("g", 16, "b"), "h1", "h2")
B8 = on(workload("b8", 8, "b"), "h3", start=NOW)  # protected
KEEP_GANGS = [
    # b's share 0.25 -> 8 GPUs: the 16-GPU gang is larger than it; b holds 16, 8 over.
    pytest.param(
        (GANG,), "reclaim", 0.25, "g", id="reclaim-takes-a-gang-leaving-its-team-below-share"
    ),
    pytest.param((GANG,), "large", 0.25, None, id="large-keeps-a-gang-larger-than-its-teams-share"),
    pytest.param((GANG,), "every", 0.25, None, id="every-keeps-it-too"),
    # b holds 24: 16 over, the gang's 16 GPUs are all beyond its share.
    pytest.param((GANG, B8), "large", 0.25, "g", id="large-a-gang-wholly-beyond-its-teams-share"),
    # b's share 0.5 -> 16: the gang is no larger than it; b holds 24 (8 over), so taking
    # the gang leaves b below its share.
    pytest.param(
        (GANG, B8), "large", 0.5, "g", id="large-a-gang-within-its-teams-share-is-a-victim"
    ),
    pytest.param((GANG, B8), "every", 0.5, None, id="every-keeps-a-gang-within-its-share-too"),
    # Two single-host runs of 8: one leaves b below its share, still a fair victim.
    pytest.param(
        (on(workload("s1", 8, "b"), "h1"), on(workload("s2", 8, "b"), "h2")),
        "every",
        0.25,
        "s1",
        id="every-single-host-runs-as-before",
    ),
]
KEEP_RULES = {
    "reclaim": {"keep_large_gangs": False},
    "large": {},
    "every": {"keep_gangs_at_entitlement": True},
}


@pytest.mark.parametrize(("running", "keep", "b_share", "victim"), KEEP_GANGS)
def test_keep_gangs(running: tuple[On, ...], keep: str, b_share: float, victim: str | None) -> None:
    protected_c = [
        on(workload(f"c{h}", 8, "c"), h, start=NOW)
        for h in ("h3", "h4")
        if h not in {host for r in running for host in r.hosts}
    ]
    state = cluster(hosts(4), *running, *protected_c)
    result = decide(
        state,
        workload("a1", 4),
        shares={"a": 1 - b_share, "b": b_share},
        order={"a": 0, "b": 1, "c": 2},
        now=NOW,
        **KEEP_RULES[keep],
    )
    if victim is None:
        assert result.preemptions == ()
        assert result.placements == ()
    else:
        assert set(preempted(result)) == {victim}
        assert preempted(result)[victim].reason is RECLAIMED


def test_one_plan_takes_no_kept_gang_the_victims_before_it_would_push_below_share() -> None:
    """Eight 8-GPU hosts. x (share 10 GPUs) holds 40: two 16-GPU gangs past protection
    (h1-h2, h3-h4) and 8 protected on h5; c's protected work fills h6-h8. a (share 32,
    holds nothing) reclaims 32 GPUs: only the two gangs could make room. Each alone leaves
    x over its share, but after the first x holds 24 and the second (larger than x's
    share) would leave it at 8: kept, so no plan exists (one plan took both before)."""
    state = cluster(
        hosts(8),
        on(workload("g1", 16, "x"), "h1", "h2"),
        on(workload("g2", 16, "x"), "h3", "h4"),
        on(workload("x8", 8, "x"), "h5", start=NOW),
        *(on(workload(f"c{h}", 8, "c"), h, start=NOW) for h in ("h6", "h7", "h8")),
    )
    shares = {"a": 0.5, "x": 10 / 64}
    order = {"a": 0, "x": 1, "c": 2}
    kept = decide(state, workload("a1", 32), shares=shares, order=order, now=NOW)
    assert kept.preemptions == () and kept.placements == ()
    taken = decide(
        state,
        workload("a1", 32),
        shares=shares,
        order=order,
        now=NOW,
        keep_large_gangs=False,
    )
    assert set(preempted(taken)) == {"g1", "g2"}


def test_the_keep_gangs_policies_are_fair_share_with_their_switches() -> None:
    assert make_policy("fairshare-keep-gangs", 300).keep_gangs_at_entitlement
    assert not make_policy("fairshare", 300).keep_gangs_at_entitlement
    assert make_policy("fairshare-keep-gangs", 300).reservations
    assert make_policy("fairshare", 300).keep_large_gangs
    assert not make_policy("fairshare-reclaim-gangs", 300).keep_large_gangs
    assert make_policy("fairshare-reclaim-gangs", 300).reservations


@pytest.mark.parametrize(
    ("gpus", "victims"),
    [
        pytest.param(8, {"x1"}, id="one-victim-leaves-x-over-its-share"),
        pytest.param(16, set(), id="two-would-leave-x-below-it-so-none"),
    ],
)
def test_a_better_ranked_request_leaves_its_victims_team_its_share(
    gpus: int, victims: set[str]
) -> None:
    """a is at its share (8 of 32 GPUs, protected on h3), so it takes only what a
    worse-ranked team holds beyond its share. x (share 4) holds 16 past protection on h1
    and h2: one run leaves it at 8, both at 0. Each alone passes ``key``; the plan checks
    the second after the first (one plan took both before)."""
    state = cluster(
        hosts(4),
        on(workload("x1", 8, "x"), "h1"),
        on(workload("x2", 8, "x"), "h2"),
        on(workload("a8", 8, "a"), "h3", start=NOW),
        on(workload("c8", 8, "c"), "h4", start=NOW),
    )
    result = decide(
        state,
        workload("a1", gpus),
        shares={"a": 0.25, "x": 0.125, "c": 0.625},
        order={"a": 0, "x": 1, "c": 2},
        now=NOW,
    )
    assert set(preempted(result)) == victims
    assert all(p.reason is BETTER for p in result.preemptions)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=5),
    st.floats(0.0, 0.5),
    st.integers(1, 24),
)
def test_a_better_ranked_request_never_leaves_a_team_below_its_share(
    x_runs: list[int], x_share: float, gpus: int
) -> None:
    """Property over one worse-ranked team x with runs of any size past protection (one
    per host) and a requester a at its share: whatever a asks, all its victims of x
    together leave x at or above its share."""
    n = len(x_runs)
    state = cluster(
        hosts(n + 1),
        *(on(workload(f"x{i}", g, "x"), f"h{i + 1}") for i, g in enumerate(x_runs)),
        on(workload("a8", 8, "a"), f"h{n + 1}", start=NOW),
    )
    total = 8 * (n + 1)
    shares = {"a": 8 / total, "x": x_share}
    result = decide(state, workload("a1", gpus), shares=shares, order={"a": 0, "x": 1}, now=NOW)
    taken = sum(p.gpus for p in result.preemptions if p.allocation == "x")
    assert taken <= max(0.0, sum(x_runs) - x_share * total)
