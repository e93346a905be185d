"""One request, one round of notices: work requeued by a notice for another request may
displace only unallocated work for ``Policy.requeue_hold_s`` after that notice's deadline,
so it does not reclaim from a third allocation in turn (a cascade)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from builders import cluster, free_work, host, hosts, on, workload
from hypothesis import given, settings
from hypothesis import strategies as st

from allot.core.cycle import Snapshot, run_cycle
from allot.core.decisions import Preemption, PreemptReason
from allot.core.fold import apply_result, end_workload
from allot.core.model import HostState, Workload
from allot.core.policy import Policy
from allot.core.state import ClusterState, PendingQueue


def play(  # noqa: PLR0917 (the services' loop, spelled out)
    state: ClusterState,
    queue: PendingQueue,
    shares: Mapping[str, float],
    order: Mapping[str, int],
    policy: Policy,
    now: float,
    rounds: int = 8,
) -> list[Preemption]:
    """Run cycles as the services do: apply each result, end noticed work at its deadline
    (requeued when resumable), cycle again then; every notice issued, in order."""
    notices: list[Preemption] = []
    for _ in range(rounds):
        result = run_cycle(Snapshot(state, queue, shares, order), policy, now)
        apply_result(state, queue, result, now)
        notices.extend(result.preemptions)
        later = leave_at_deadline(state, queue)
        if later is None:
            break
        now = later
    return notices


def leave_at_deadline(state: ClusterState, queue: PendingQueue) -> float | None:
    """The earliest notice deadline, with the work due then ended (requeued when
    resumable); None when nothing is under notice."""
    due = [r.preempt_at for r in state.running.values() if r.preempt_at is not None]
    if not due:
        return None
    now = min(due)
    for wid, run in sorted(state.running.items()):
        if run.preempt_at is not None and run.preempt_at <= now:
            end_workload(state, queue, wid, preempted=True)
    return now


# The demo's sequence (`make run`, 32 GPUs): nlp runs a 16-GPU gang, vision and search 8
# GPUs each, all past their protection; nlp's second run waits; speech, holding nothing,
# asks for 4. Shares: the embedded budget tree (nlp .3, vision .18, speech .12, search .2,
# ads .2); speech has used nothing and ranks first.
DEMO_SHARES = {"nlp": 0.3, "vision": 0.18, "speech": 0.12, "search": 0.2, "ads": 0.2}
DEMO_ORDER = {"speech": 0, "ads": 1, "vision": 2, "search": 3, "nlp": 4}


def demo(policy: Policy) -> list[Preemption]:
    state = cluster(
        hosts(4),
        on(workload("nlp-1", 16, "nlp", min_runtime_s=10), "h1", "h2"),
        on(workload("vision-1", 8, "vision", min_runtime_s=10), "h3"),
        on(workload("search-1", 8, "search", min_runtime_s=10), "h4"),
    )
    queue = PendingQueue(
        [
            workload("nlp-2", 8, "nlp", min_runtime_s=10, submit=5.0),
            workload("speech-1", 4, "speech", min_runtime_s=10, submit=20.0),
        ]
    )
    return play(state, queue, DEMO_SHARES, DEMO_ORDER, policy, now=20.0)


def test_the_demos_four_gpu_request_gives_one_round_of_notices() -> None:
    notices = demo(Policy(grace_s=3))
    assert [(p.workload_id, p.preemptor) for p in notices] == [("vision-1", "speech-1")]


def test_without_the_hold_the_demo_cascades() -> None:
    """The regression the hold fixes: vision's requeued run reclaims from search, whose
    requeued run reclaims from nlp (three notices for one 4-GPU request). nlp's 16-GPU
    gang is larger than its share, which a reclaim keeps by default (decision 0067): the
    cascade's last step needs the switch off."""
    notices = demo(Policy(grace_s=3, requeue_hold_s=0, keep_large_gangs=False))
    assert len(notices) >= 3
    assert notices[0].preemptor == "speech-1"
    assert {p.preemptor for p in notices[1:]} <= {"vision-1", "search-1", "nlp-1"}


@pytest.mark.parametrize(
    ("unallocated_host", "held_back", "noticed"),
    [
        pytest.param(False, False, {"x-1": "reclaimed-for-entitlement"}, id="free-to-reclaim"),
        pytest.param(False, True, {}, id="held-back-takes-no-allocated-work"),
        pytest.param(True, True, {"free": "displaced-unallocated"}, id="held-back-displaces"),
    ],
)
def test_held_back_work_displaces_only_unallocated_work(
    unallocated_host: bool, held_back: bool, noticed: dict[str, str]
) -> None:
    running = [on(workload("x-1", 8, "x", min_runtime_s=10), "h1")]
    if unallocated_host:
        running.append(on(free_work("free", 8), "h2"))
    state = cluster(hosts(len(running)), *running)
    queue = PendingQueue()
    queue.add(workload("y-1", 8, "y", min_runtime_s=10), ("z-1", 90.0) if held_back else None)
    result = run_cycle(
        Snapshot(state, queue, {"x": 0.1, "y": 0.5}, {"y": 0, "x": 1}), Policy(), 100.0
    )
    assert {p.workload_id: p.reason.value for p in result.preemptions} == noticed


def test_the_hold_lapses_after_requeue_hold_s() -> None:
    queue = PendingQueue()
    w = workload("v", 8, "v")
    queue.add(w, ("r", 100.0))
    assert queue.held_back("v", 100.0 + 59.0, 60.0)
    assert not queue.held_back("v", 100.0 + 60.0, 60.0)
    queue.remove("v")
    assert "v" not in queue.preempted_for  # it ran again: nothing is remembered


# -- property: over random clusters, a requeued victim never notices allocated work -------

ALLOCS = ("a", "b", "c", "d")


@st.composite
def scenes(draw: st.DrawFn) -> tuple[ClusterState, list[Workload], dict[str, float]]:
    n_hosts = draw(st.integers(2, 5))
    state = cluster(hosts(n_hosts))
    free = {f"h{i}": 8 for i in range(1, n_hosts + 1)}
    for k in range(draw(st.integers(1, 10))):
        host_id = draw(st.sampled_from(sorted(free)))
        if free[host_id] == 0:
            continue
        gpus = draw(st.integers(1, free[host_id]))
        alloc = draw(st.sampled_from((*ALLOCS, None)))
        w = (
            workload(f"r{k}", gpus, alloc, min_runtime_s=draw(st.integers(10, 100)))
            if alloc is not None
            else free_work(f"r{k}", gpus)
        )
        state.start(w, ((host_id, tuple(state.free[host_id][:gpus])),), 0.0)
        free[host_id] -= gpus
    # A running gang across two hosts (a whole one and 4 GPUs of another): its notice
    # leaves room on a host the request may not use.
    whole = [h for h, n in sorted(free.items()) if n == 8]
    part = [h for h, n in sorted(free.items()) if n >= 4 and h not in whole[:1]]
    if whole and part and draw(st.booleans()):
        alloc = draw(st.sampled_from(ALLOCS))
        w = workload("g", 12, alloc, min_runtime_s=draw(st.integers(10, 100)))
        state.start(
            w, ((whole[0], tuple(range(8))), (part[0], tuple(state.free[part[0]][:4]))), 0.0
        )
        free[whole[0]], free[part[0]] = 0, free[part[0]] - 4
    pending = [
        workload(
            f"p{k}",
            draw(st.sampled_from((1, 2, 4, 8, 12, 16, 24))),
            draw(st.sampled_from(ALLOCS)),
            min_runtime_s=draw(st.integers(10, 100)),
            submit=float(k),
        )
        for k in range(draw(st.integers(1, 6)))
    ]
    weights = [draw(st.integers(1, 10)) for _ in ALLOCS]
    shares = {a: w / sum(weights) for a, w in zip(ALLOCS, weights, strict=True)}
    return state, pending, shares


@settings(max_examples=200, deadline=None)
@given(scenes(), st.permutations(ALLOCS))
def test_no_requeued_victim_preempts_allocated_work_within_the_hold(
    scene: tuple[ClusterState, list[Workload], dict[str, float]], ranking: list[str]
) -> None:
    state, pending, shares = scene
    queue = PendingQueue(pending)
    order = {a: i for i, a in enumerate(ranking)}
    victims_of: dict[str, str] = {}  # requeued victim -> its notice's request
    now = 200.0  # past every protection
    policy = Policy(grace_s=5, requeue_hold_s=10_000)
    for _ in range(8):
        result = run_cycle(Snapshot(state, queue, shares, order), policy, now)
        for p in result.preemptions:
            if p.preemptor in victims_of and p.reason is not PreemptReason.DISPLACED_UNALLOCATED:
                raise AssertionError(
                    f"{p.preemptor}, requeued for {victims_of[p.preemptor]}, noticed "
                    f"{p.workload_id} ({p.reason})"
                )
            if p.preemptor is not None:
                victims_of[p.workload_id] = p.preemptor
        apply_result(state, queue, result, now)
        later = leave_at_deadline(state, queue)
        if later is None:
            break
        now = later


# -- the GPUs a victim leaves are its request's ----------------------------------------------

# The live ranking is Fair Tree's over the budget tree's branches: search's branch had used
# less than research's (nlp, vision, speech), so search ranked above speech, which had used
# nothing. The order the demo's 2-of-5 failure had (docs/decisions/0059).
BRANCH_ORDER = {"search": 0, "ads": 1, "speech": 2, "vision": 3, "nlp": 4}


def leave_now(state: ClusterState, queue: PendingQueue, now: float) -> bool:
    """Noticed work leaves at once (a fake part ends on its notice): True if any left."""
    left = [wid for wid, run in sorted(state.running.items()) if run.preempt_at is not None]
    for wid in left:
        end_workload(state, queue, wid, preempted=True, now=now)
    return bool(left)


def test_a_victims_requeued_run_does_not_take_back_the_gpus_it_left() -> None:
    """search's protection ended first, so speech's notice went to search; search left at
    once and, ranked above speech, its requeued run took its 8 GPUs back before speech's
    turn, and speech noticed vision too (the demo's failure). Now the GPUs search left are
    speech's until speech's turn."""
    state = cluster(
        hosts(4),
        on(workload("nlp-1", 16, "nlp", min_runtime_s=10), "h1", "h2"),
        on(workload("vision-1", 8, "vision", min_runtime_s=10), "h3", start=5.0),
        on(workload("search-1", 8, "search", min_runtime_s=10), "h4"),
    )
    queue = PendingQueue(
        [
            workload("nlp-2", 8, "nlp", min_runtime_s=10, submit=5.0),
            workload("speech-1", 4, "speech", min_runtime_s=10, submit=12.0),
        ]
    )
    notices: list[Preemption] = []
    placed: list[str] = []
    now = 12.0
    for _ in range(4):
        result = run_cycle(Snapshot(state, queue, DEMO_SHARES, BRANCH_ORDER), Policy(), now)
        apply_result(state, queue, result, now)
        notices.extend(result.preemptions)
        placed.extend(p.workload.id for p in result.placements)
        now += 0.1
        leave_now(state, queue, now)
    assert [(p.workload_id, p.preemptor) for p in notices] == [("search-1", "speech-1")]
    assert placed == ["speech-1"]
    assert "search-1" in queue  # requeued: it waits for GPUs nobody was promised


@settings(max_examples=300, deadline=None)
@given(scenes(), st.permutations(ALLOCS), st.lists(st.booleans(), min_size=8, max_size=8))
def test_every_request_gets_its_notices_in_one_round(
    scene: tuple[ClusterState, list[Workload], dict[str, float]],
    ranking: list[str],
    early: list[bool],
) -> None:
    """Over random clusters and rankings, with noticed work leaving at once or at its
    deadline: each request's notices all come from one cycle."""
    state, pending, shares = scene
    queue = PendingQueue(pending)
    order = {a: i for i, a in enumerate(ranking)}
    round_of: dict[str, int] = {}  # request -> the cycle of its notices
    now = 200.0  # past every protection
    policy = Policy(grace_s=5)
    for k, leave_early in enumerate(early):
        result = run_cycle(Snapshot(state, queue, shares, order), policy, now)
        for p in result.preemptions:
            if p.preemptor is not None and p.reason is not PreemptReason.DISPLACED_UNALLOCATED:
                first = round_of.setdefault(p.preemptor, k)
                assert first == k, f"{p.preemptor} noticed {p.workload_id} in cycles {first}, {k}"
        apply_result(state, queue, result, now)
        if leave_early:
            now += 0.5
            leave_now(state, queue, now)
        else:
            later = leave_at_deadline(state, queue)
            if later is None:
                break
            now = later


def test_a_gangs_remainder_leaves_the_free_gpus_beside_anothers_victims() -> None:
    """The case the property above found (2026-12-06): p2 (8 GPUs) noticed r1 (2 GPUs)
    and planned h4's 6 free GPUs beside it; p1, a 12-GPU gang ahead of p2, noticed only
    unallocated work, and in the next cycle its remainder (4 GPUs anywhere) best-fitted
    onto those 6 free GPUs, so p2 noticed r0 in a second round. A request's own room and
    the free GPUs beside its victims now come before any gang's remainder."""
    state = cluster(hosts(5))
    for w, host_id in (
        (workload("r0", 6, "b", min_runtime_s=10), "h1"),
        (workload("r1", 2, "b", min_runtime_s=10), "h4"),
        (workload("r2", 1, "a", min_runtime_s=10), "h2"),
        (free_work("r3", 1), "h3"),
    ):
        state.start(w, ((host_id, tuple(state.free[host_id][: w.gpus])),), 0.0)
    queue = PendingQueue(
        [
            workload(f"p{k}", gpus, "a", min_runtime_s=10, submit=float(k))
            for k, gpus in enumerate((8, 12, 8))
        ]
    )
    shares = {"a": 0.625, "b": 0.125, "c": 0.125, "d": 0.125}
    order = {"a": 0, "b": 1, "c": 2, "d": 3}
    notices = play(state, queue, shares, order, Policy(grace_s=5), 200.0)
    assert [(p.workload_id, p.preemptor) for p in notices] == [("r3", "p1"), ("r1", "p2")]
    assert {"p0", "p1", "p2"}.isdisjoint(queue)  # all three started


# -- how long, and where, the room is held ---------------------------------------------------


def room_scene() -> tuple[ClusterState, PendingQueue]:
    """``asker`` (4 GPUs, ranked last) noticed ``victim`` (8 GPUs on h1) at t=0 with a 3 s
    grace; the victim left at t=1; ``other`` (8 GPUs, ranked first) arrived meanwhile and
    would take h1 whole. h2 is full of protected work."""
    state = cluster(
        hosts(2),
        on(workload("victim", 8, "v", min_runtime_s=0), "h1"),
        on(workload("wall", 8, "w", min_runtime_s=10_000), "h2"),
    )
    queue = PendingQueue([workload("asker", 4, "a", min_runtime_s=10, submit=0.0)])
    state.notice("victim", 3.0, "asker")
    end_workload(state, queue, "victim", preempted=False, now=1.0)
    queue.add(workload("other", 8, "o", min_runtime_s=10, submit=0.5))
    return state, queue


ROOM_ORDER = {"o": 0, "w": 1, "a": 2, "v": 3}
ROOM_SHARES = {"o": 0.25, "w": 0.25, "a": 0.25, "v": 0.25}


@pytest.mark.parametrize(
    ("now", "placed"),
    [
        pytest.param(1.5, ["asker"], id="held-for-its-request"),
        pytest.param(5.9, ["asker"], id="held-until-grace-after-the-deadline"),
        pytest.param(6.0, ["other"], id="released-grace-after-the-deadline"),
    ],
)
def test_the_room_a_victim_left_is_held_for_a_while(now: float, placed: list[str]) -> None:
    state, queue = room_scene()
    result = run_cycle(Snapshot(state, queue, ROOM_SHARES, ROOM_ORDER), Policy(grace_s=3), now)
    assert [p.workload.id for p in result.placements] == placed


def test_the_room_goes_with_its_request() -> None:
    """A request that leaves the queue (cancelled, or placed) leaves no room behind."""
    state, queue = room_scene()
    assert "asker" in queue.room_for
    queue.remove("asker")
    assert "asker" not in queue.room_for
    result = run_cycle(Snapshot(state, queue, ROOM_SHARES, ROOM_ORDER), Policy(grace_s=3), 1.5)
    assert [p.workload.id for p in result.placements] == ["other"]


# -- requests' rooms side by side (shapes a review found) -------------------------------------


def rounds_of(
    state: ClusterState,
    queue: PendingQueue,
    shares: Mapping[str, float],
    order: Mapping[str, int],
    cycles: int = 4,
) -> tuple[dict[str, set[int]], list[str]]:
    """Cycles one second apart, noticed work leaving at once after each: per request the
    cycles its notices came in, and every placement in order."""
    rounds: dict[str, set[int]] = {}
    placed: list[str] = []
    now = 100.0
    for k in range(cycles):
        result = run_cycle(Snapshot(state, queue, shares, order), Policy(grace_s=30), now)
        for p in result.preemptions:
            if p.preemptor is not None:
                rounds.setdefault(p.preemptor, set()).add(k)
        placed.extend(p.workload.id for p in result.placements)
        apply_result(state, queue, result, now)
        now += 1.0
        leave_now(state, queue, now)
    return rounds, placed


def test_a_gangs_top_up_does_not_take_another_requests_room() -> None:
    """r1 (a 12-GPU gang) tops up its room with free hosts; h1 is r9's room (its victim
    left), and r9 ranks first: r1's top-up must not take it."""
    state = cluster(
        [host("h1"), host("h2"), host("h3", 4), host("h4")],
        on(workload("va", 8, "x", min_runtime_s=10), "h1", start=90.0),
        on(workload("vb", 8, "y", min_runtime_s=10), "h2"),
        on(workload("z", 8, "x", min_runtime_s=10), "h4"),
    )
    queue = PendingQueue(
        [
            workload("r9", 8, "a", min_runtime_s=10),
            workload("r1", 12, "b", min_runtime_s=10),
        ]
    )
    rounds, placed = rounds_of(
        state, queue, {"a": 0.4, "b": 0.4, "x": 0.1, "y": 0.1}, {"a": 0, "b": 1, "x": 2, "y": 3}
    )
    assert rounds == {"r9": {0}, "r1": {0}}
    assert placed == ["r9", "r1"]


def test_a_gangs_remainder_on_a_partly_used_host_is_held_too() -> None:
    """r's 12 GPUs: h1 cleared (its victims v1, v2) and 4 free GPUs of h2; the victims'
    requeued runs rank above r and must not take those 4."""
    state = cluster(
        hosts(3),
        on(workload("v1", 4, "v", min_runtime_s=10), "h1"),
        on(workload("v2", 4, "v", min_runtime_s=10), "h1"),
        on(workload("w", 4, "w", min_runtime_s=10_000), "h2"),
        on(workload("x", 8, "w", min_runtime_s=10), "h3"),
    )
    queue = PendingQueue([workload("r", 12, "r", min_runtime_s=10)])
    rounds, placed = rounds_of(
        state, queue, {"v": 0.1, "w": 0.1, "r": 0.8}, {"v": 0, "r": 1, "w": 2}
    )
    assert rounds == {"r": {0}}
    assert placed[0] == "r"


def test_a_gangs_top_up_keeps_the_hosts_its_plan_takes_whole() -> None:
    """p1 (12 GPUs on 8-GPU hosts) planned h2 whole (r1 noticed, 7 free) and 4 on h1 (r3
    noticed, 1 free). Topping its room up host by host in id order held h1's 3 free GPUs
    and 5 of h2's, so r1's requeued run (d ranks first) took one of h2's last two: h2 was no
    longer whole and p1 noticed r4 in a second round (found by the property above)."""
    state = cluster(
        hosts(3),
        on(workload("r0", 3, "b", min_runtime_s=10), "h3"),
        on(workload("r1", 1, "d", min_runtime_s=10), "h2"),
        on(workload("r2", 2, "a", min_runtime_s=10), "h3"),
        on(workload("r3", 3, "d", min_runtime_s=10), "h1"),
        on(workload("r4", 2, "b", min_runtime_s=10), "h1"),
    )
    queue = PendingQueue(
        [
            workload("p0", 1, "b", min_runtime_s=10, submit=0.0),
            workload("p1", 12, "c", min_runtime_s=10, submit=1.0),
            workload("p2", 1, "a", min_runtime_s=10, submit=2.0),
            workload("p3", 1, "a", min_runtime_s=10, submit=3.0),
        ]
    )
    shares = {"a": 1 / 9, "b": 2 / 9, "c": 5 / 9, "d": 1 / 9}
    order = {"d": 0, "c": 1, "b": 2, "a": 3}
    notices: list[tuple[int, str, str | None]] = []
    placed: list[str] = []
    now: float | None = 200.0
    for k in range(4):
        assert now is not None
        result = run_cycle(Snapshot(state, queue, shares, order), Policy(grace_s=5), now)
        notices.extend((k, p.workload_id, p.preemptor) for p in result.preemptions)
        placed.extend(p.workload.id for p in result.placements)
        apply_result(state, queue, result, now)
        now = leave_at_deadline(state, queue)
        if now is None:
            break
    assert [(k, v) for k, v, by in notices if by == "p1"] == [(0, "r1"), (0, "r3")]
    assert "p1" in placed


def test_a_gangs_room_counts_a_host_it_cannot_have_whole_only_for_the_rest() -> None:
    """p1 (16 GPUs) planned h2 and the free h4 whole, noticing g (12 GPUs: all of h2, 4
    of h1). What g left on h1 cannot make h1 whole (r0 stays), so p1 still lacks a whole
    host: h4 is held whole. Counting h1's 4 as room held only 4 of h4, p2 (ranked above
    p1) took one of the others, and p1 noticed r0 in a second round (found by the property
    once its scenes had gangs across hosts). g is larger than d's share: a reclaim may
    take it only with ``keep_large_gangs`` off (decision 0067)."""
    state = cluster(
        hosts(4),
        on(workload("g", 12, "d", min_runtime_s=10), "h2", "h1"),
        on(workload("r0", 4, "a", min_runtime_s=10), "h1"),
        on(workload("wall", 8, "x", min_runtime_s=10_000), "h3", start=150.0),
    )
    queue = PendingQueue([workload("p1", 16, "c", min_runtime_s=10, submit=100.0)])
    shares = {"a": 0.1, "c": 0.5, "d": 0.25, "x": 0.15}
    order = {"d": 0, "c": 1, "a": 2, "x": 3}
    policy = Policy(grace_s=5, keep_large_gangs=False)
    first = run_cycle(Snapshot(state, queue, shares, order), policy, 200.0)
    assert [(p.workload_id, p.preemptor) for p in first.preemptions] == [("g", "p1")]
    apply_result(state, queue, first, 200.0)
    queue.add(workload("p2", 1, "d", min_runtime_s=10, submit=200.2))
    leave_now(state, queue, 200.5)
    second = run_cycle(Snapshot(state, queue, shares, order), policy, 200.5)
    assert "p1" in [p.workload.id for p in second.placements]
    assert [p.workload_id for p in second.preemptions if p.preemptor == "p1"] == []


def test_a_gang_takes_nothing_on_a_host_its_victim_merely_spans() -> None:
    """p1 (24 GPUs) cleared h1 and h3 and took the free h4; its victim g spans h2 too.
    p0 (4 GPUs) planned r5 and h2's 3 free GPUs. The gang's top-up must leave those 3 to
    p0: holding every free GPU on the gang's victims' hosts took them, the victims'
    requeued runs (ranked above p0) had them once p1 started, and p0 noticed r6 in a
    second round (found by the property). After r0-r3, g (larger than a's share) would
    leave a below its share: taken only with ``keep_large_gangs`` off (decision 0067)."""
    state = cluster(
        hosts(5),
        on(workload("g", 12, "a", min_runtime_s=10), "h3", "h2"),
        *(
            on(workload(f"r{i}", n, "a", min_runtime_s=10), "h1")
            for i, n in enumerate((1, 2, 2, 3))
        ),
        on(workload("r5", 1, "b", min_runtime_s=10), "h2"),
        on(workload("r6", 4, "b", min_runtime_s=10), "h5"),
        on(workload("r7", 1, "c", min_runtime_s=10), "h5"),
    )
    queue = PendingQueue(
        [
            workload("p0", 4, "d", min_runtime_s=10, submit=0.0),
            workload("p1", 24, "c", min_runtime_s=10, submit=1.0),
        ]
    )
    shares = {"a": 2 / 11, "b": 1 / 11, "c": 4 / 11, "d": 4 / 11}
    order = {"b": 0, "c": 1, "a": 2, "d": 3}
    policy = Policy(grace_s=5, keep_large_gangs=False)
    first = run_cycle(Snapshot(state, queue, shares, order), policy, 200.0)
    assert sorted((p.workload_id, p.preemptor) for p in first.preemptions) == [
        ("g", "p1"),
        *((f"r{i}", "p1") for i in range(4)),
        ("r5", "p0"),
    ]
    apply_result(state, queue, first, 200.0)
    now = leave_at_deadline(state, queue)
    assert now is not None
    second = run_cycle(Snapshot(state, queue, shares, order), policy, now)
    assert {"p0", "p1"} <= {p.workload.id for p in second.placements}
    assert [p.workload_id for p in second.preemptions if p.preemptor] == []


def test_a_gangs_room_in_a_pool_with_no_schedulable_host_left() -> None:
    """Every host of the gang's victims drains while they are under notice: its pool has
    no schedulable host (no gang unit), and the cycle holds nothing, without failing."""
    state = cluster(
        hosts(2),
        on(workload("v1", 8, "v", min_runtime_s=10), "h1"),
        on(workload("v2", 8, "v", min_runtime_s=10), "h2"),
    )
    queue = PendingQueue([workload("gang", 16, "a", min_runtime_s=10)])
    shares = {"a": 0.9, "v": 0.1}
    first = run_cycle(Snapshot(state, queue, shares, {"a": 0, "v": 1}), Policy(grace_s=5), 200.0)
    assert sorted(p.workload_id for p in first.preemptions) == ["v1", "v2"]
    apply_result(state, queue, first, 200.0)
    for host_id in ("h1", "h2"):
        state.set_host_state(host_id, HostState.DRAINING)
    result = run_cycle(Snapshot(state, queue, shares, {"a": 0, "v": 1}), Policy(grace_s=5), 201.0)
    assert result.placements == () and result.rooms == ()


def test_a_one_host_request_holds_no_free_host_elsewhere() -> None:
    """r (8 GPUs) planned with x (under a cancel's notice, for nobody) and a new victim v on
    h1; h2 then comes free and q, ranked first, arrives: q takes h2, nothing is noticed."""
    state = cluster(
        hosts(3),
        on(workload("x", 4, "x", min_runtime_s=10), "h1"),
        on(workload("v", 4, "x", min_runtime_s=10), "h1"),
        on(workload("done", 8, "x", min_runtime_s=10_000), "h2"),
        on(workload("w", 8, "x", min_runtime_s=10), "h3"),
    )
    state.notice("x", 130.0)  # cancelled by its owner: leaves within its grace, for nobody
    queue = PendingQueue([workload("r", 8, "r", min_runtime_s=10)])
    shares, order = {"q": 0.4, "r": 0.4, "x": 0.2}, {"q": 0, "r": 1, "x": 2}
    first = run_cycle(Snapshot(state, queue, shares, order), Policy(grace_s=30), 100.0)
    assert [(p.workload_id, p.preemptor) for p in first.preemptions] == [("v", "r")]
    apply_result(state, queue, first, 100.0)
    end_workload(state, queue, "done", preempted=False, now=101.0)
    queue.add(workload("q", 8, "q", min_runtime_s=10, submit=101.0))
    result = run_cycle(Snapshot(state, queue, shares, order), Policy(grace_s=30), 101.0)
    assert [p.workload.id for p in result.placements] == ["q"]
    assert result.preemptions == ()
