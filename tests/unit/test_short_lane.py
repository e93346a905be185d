"""The short lane (``Policy.short``, decision 0066): on the lane's hosts Fair Tree starts
unallocated work and allocated work of at most ``short_lane_max_gpus`` GPUs protected for
at most ``short_lane_max_protection_s``, nothing else; short work takes the lane's free
GPUs, or cheap victims, before any allocated victim's grace."""

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
    workload,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from allot.core.cycle import Snapshot, run_cycle
from allot.core.errors import ValidationError
from allot.core.model import Workload
from allot.core.policy import Policy
from allot.core.state import DEFAULT_POOL, SHORT_LANE_POOL, ClusterState, PendingQueue

SHARES = {"a": 0.5, "b": 0.5}
LANE = ("h3",)


def short(id: str, gpus: int = 1, alloc: str = "a", protection: int = 600) -> Workload:
    return workload(id, gpus, alloc, min_runtime_s=protection)


def past(id: str, gpus: int = 8, alloc: str = "b") -> Workload:
    """Allocated work of ``b`` that will be past its protection at now = 2 h."""
    return workload(id, gpus, alloc, min_runtime_s=HOUR)


NOW = 2 * HOUR


def test_the_lane_is_a_pool_of_its_own_for_hosts_present_or_joining() -> None:
    state = ClusterState(hosts(2), short_lane=("h2", "h9"))
    assert state.pool_of == {"h1": DEFAULT_POOL, "h2": SHORT_LANE_POOL}
    from builders import host

    state.add_host(host("h9"))
    assert state.pool_of["h9"] == SHORT_LANE_POOL
    assert state.pool_max_gpus == {DEFAULT_POOL: 8, SHORT_LANE_POOL: 8}
    assert state.healthy_gpus == 24  # the lane's GPUs count in everyone's entitlement


def test_a_lane_of_every_host_known_is_told_as_hosts_join() -> None:
    from builders import host

    state = ClusterState([], short_lane=("h1", "h2", "h3"))
    assert not state.lane_holds_every_host  # no host yet: nothing to say
    state.add_host(host("h1"))
    assert state.lane_holds_every_host
    state.add_host(host("h2"))
    assert state.lane_holds_every_host
    state.add_host(host("h4"))  # outside the lane: long work has somewhere to start
    assert not state.lane_holds_every_host
    assert not ClusterState(hosts(2)).lane_holds_every_host  # no lane at all


def test_a_lane_beside_partitions_is_refused() -> None:
    with pytest.raises(ValidationError) as err:
        ClusterState(hosts(2), {"h1": "x"}, short_lane=("h2",))
    assert err.value.field == "short_lane"


@pytest.mark.parametrize(
    ("w", "is_short"),
    [
        (workload("one", 1, min_runtime_s=600), True),
        (workload("two", 2, min_runtime_s=900), True),  # both limits included
        (workload("three", 3, min_runtime_s=600), False),  # too many GPUs
        (workload("long", 1, min_runtime_s=901), False),  # protected too long
        (free_work("free"), False),  # unallocated work is not short work: free anyway
    ],
)
def test_what_is_short(w: Workload, is_short: bool) -> None:
    assert Policy().short(w) is is_short


@pytest.mark.parametrize(
    ("field", "kw"),
    [
        ("short_lane_max_gpus", {"short_lane_max_gpus": -1}),
        ("short_lane_max_protection_s", {"short_lane_max_protection_s": -1}),
        ("short_lane_max_protection_s", {"short_lane_max_protection_s": 8 * HOUR + 1}),
    ],
)
def test_bad_lane_limits_name_their_field(field: str, kw: dict[str, int]) -> None:
    with pytest.raises(ValidationError) as err:
        Policy(**kw)
    assert err.value.field == field


def full_of_protected(*more: object) -> ClusterState:
    """h1, h2 full of b's protected work; the lane h3 as the test says."""
    runs = [on(workload("b1", 8, "b", min_runtime_s=8 * HOUR), "h1", start=NOW - 60)]
    runs.append(on(workload("b2", 8, "b", min_runtime_s=8 * HOUR), "h2", start=NOW - 60))
    return cluster(hosts(3), *runs, *more, short_lane=LANE)  # type: ignore[arg-type]


def test_short_work_starts_on_the_lanes_free_gpus() -> None:
    state = full_of_protected()
    result = decide(state, short("dbg"), shares=SHARES, now=NOW)
    assert placed(result) == {"dbg": (("h3", (0,)),)}


def test_work_that_is_not_short_never_starts_in_the_lane() -> None:
    state = full_of_protected()
    result = decide(
        state,
        workload("big", 3, "a", min_runtime_s=600),
        workload("long", 1, "a", min_runtime_s=HOUR),
        shares=SHARES,
        now=NOW,
    )
    assert placed(result) == {}
    assert preempted(result) == {}


def test_without_a_lane_the_same_short_work_waits() -> None:
    runs = [on(workload(f"b{i}", 8, "b", min_runtime_s=8 * HOUR), f"h{i}") for i in (1, 2, 3)]
    state = cluster(hosts(3), *runs)
    assert placed(decide(state, short("dbg"), shares=SHARES, now=60)) == {}


def test_unallocated_work_fills_the_lane() -> None:
    state = full_of_protected()
    result = decide(state, free_work("f1", 8), shares=SHARES, now=NOW)
    assert placed(result) == {"f1": (("h3", tuple(range(8))),)}


def crowded(lane: tuple[str, ...]) -> ClusterState:
    """h1: b's work past its protection (a 300 s grace); h2: b's protected work; h3 (the
    lane, when given): unallocated work (a 30 s grace)."""
    return cluster(
        hosts(3),
        on(past("b1"), "h1"),
        on(workload("b2", 8, "b", min_runtime_s=8 * HOUR), "h2", start=NOW - 60),
        on(free_work("f1", 8), "h3"),
        short_lane=lane,
    )


@pytest.mark.parametrize(
    ("request_", "lane", "victim"),
    [
        (short("dbg"), LANE, "f1"),  # short: the lane's unallocated work
        (short("dbg"), (), "f1"),  # as without a lane
        (workload("long", 1, "a", min_runtime_s=HOUR), LANE, "b1"),  # not short: not the lane's
        (workload("long", 1, "a", min_runtime_s=HOUR), (), "f1"),  # without a lane: cheapest
    ],
)
def test_who_is_noticed_with_and_without_the_lane(
    request_: Workload, lane: tuple[str, ...], victim: str
) -> None:
    result = decide(
        crowded(lane), request_, shares={"a": 0.9, "b": 0.1}, now=NOW, unallocated_grace_s=30
    )
    notices = preempted(result)
    assert set(notices) == {victim}
    assert notices[victim].preempt_at == NOW + (30 if victim == "f1" else 300)


def test_a_plugged_in_ordering_walks_the_default_pool_only() -> None:
    # A plugged-in ordering (FIFO) walks the default pool: a lane is Fair Tree's alone,
    # and the simulator builds none for the baselines (tests/unit/test_cli_simulate.py).
    from allot.core.policy import FIFO

    state = full_of_protected()
    result = decide(state, short("dbg"), shares=SHARES, now=NOW, ordering=FIFO, preemption=False)
    assert placed(result) == {}


# -- property: the lane holds only what may be there ----------------------------------------

SIZES = st.sampled_from([1, 1, 2, 3, 4, 8, 16])
PROTECTION = st.sampled_from([0, 300, 900, 1800, HOUR])


@st.composite
def scenes(draw: st.DrawFn) -> tuple[ClusterState, PendingQueue, float]:
    n_hosts = draw(st.integers(3, 6))
    lane = tuple(f"h{i}" for i in range(n_hosts - draw(st.integers(1, 2)) + 1, n_hosts + 1))
    state = ClusterState(hosts(n_hosts), short_lane=lane)
    now = 4 * HOUR
    for i in range(draw(st.integers(0, 14))):
        gpus = draw(SIZES)
        alloc = draw(st.sampled_from(["a", "b", "c", None]))
        protection = draw(PROTECTION)
        w = workload(f"r{i}", gpus, alloc, min_runtime_s=protection if alloc else 0)
        pool = SHORT_LANE_POOL if (not w.allocated or Policy().short(w)) else DEFAULT_POOL
        choices = [h for h in state.host_ids if state.pool_of[h] in (pool, DEFAULT_POOL)]
        fit = [h for h in choices if len(state.free[h]) >= gpus]
        if gpus <= 8 and fit:
            h = draw(st.sampled_from(fit))
            state.start(
                w, ((h, tuple(state.free[h][:gpus])),), now - draw(st.sampled_from([60, 2 * HOUR]))
            )
    queue = PendingQueue()
    for i in range(draw(st.integers(1, 12))):
        alloc = draw(st.sampled_from(["a", "b", "c", None]))
        protection = draw(PROTECTION)
        queue.add(
            workload(
                f"p{i}", draw(SIZES), alloc, min_runtime_s=protection if alloc else 0, submit=i
            )
        )
    return state, queue, now


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_only_short_and_unallocated_work_lands_or_preempts_in_the_lane(
    scene: tuple[ClusterState, PendingQueue, float],
) -> None:
    state, queue, now = scene
    policy = Policy(unallocated_grace_s=30)
    shares = {"a": 0.5, "b": 0.3, "c": 0.2}
    result = run_cycle(Snapshot(state, queue, shares, {"a": 0, "b": 1, "c": 2}), policy, now)
    for p in result.placements:
        if any(state.pool_of[h] == SHORT_LANE_POOL for h, _ in p.assignment):
            assert not p.workload.allocated or policy.short(p.workload), p
    lane_hosts = {h for h in state.host_ids if state.pool_of[h] == SHORT_LANE_POOL}
    for n in result.preemptions:
        run = state.running[n.workload_id]
        if n.preemptor is None or not {h for h, _ in run.assignment} & lane_hosts:
            continue
        requester = queue.workload(n.preemptor)
        assert policy.short(requester), (n, requester)
        assert not run.workload.allocated or policy.short(run.workload), (n, run)


# -- a short request's own victims in the lane (found by a review) ------------------------


def lane_victim_scene(first_host: On) -> ClusterState:
    """h2: b's protected work; h3 (the lane): unallocated ``u`` under notice for ``s``,
    leaving in 10 s; h1 as given."""
    state = cluster(
        hosts(3),
        first_host,
        on(workload("b2", 8, "b", min_runtime_s=8 * HOUR), "h2", start=NOW - 60),
        on(free_work("u", 8), "h3"),
        short_lane=LANE,
    )
    state.notice("u", NOW + 10, for_id="s")
    return state


def test_a_short_request_waits_for_its_own_victim_in_the_lane_rather_than_notice_again() -> None:
    # h1 also holds unallocated work a new notice would free in 30 s: later than s's own.
    state = lane_victim_scene(on(free_work("u2", 8), "h1"))
    result = decide(state, short("s"), shares=SHARES, now=NOW, unallocated_grace_s=30)
    assert preempted(result) == {}
    assert result.waiting_on == (("s", ("u",)),)


def test_a_lane_bound_set_before_its_turn_does_not_strand_its_own_victim() -> None:
    # e (better ranked, short) finds no cheap room in the lane: u is s's. Then s's turn
    # gives u back to it; it waits for u instead of noticing b1 (300 s).
    state = lane_victim_scene(on(past("b1"), "h1"))
    queue = PendingQueue([short("e", alloc="c"), short("s")])
    shares = {"a": 0.45, "b": 0.1, "c": 0.45}
    snap = Snapshot(state, queue, shares, {"c": 0, "a": 1, "b": 2})
    result = run_cycle(snap, Policy(unallocated_grace_s=30), NOW)
    assert {k: p.preemptor for k, p in preempted(result).items()} == {"b1": "e"}
    assert ("s", ("u",)) in result.waiting_on


def test_short_work_past_its_protection_in_the_lane_is_short_works_victim() -> None:
    # The lane holds b's 2-GPU runs protected 15 min, running for 10 h: the lane turns over.
    now = 10 * HOUR
    runs = [on(workload("b1", 8, "b", min_runtime_s=8 * HOUR), "h1", start=now - 60)]
    runs = [*runs, on(workload("b2", 8, "b", min_runtime_s=8 * HOUR), "h2", start=now - 60)]
    runs += [on(workload(f"l{i}", 2, "b", min_runtime_s=900), "h3") for i in range(4)]
    state = cluster(hosts(3), *runs, short_lane=LANE)
    result = decide(state, short("dbg"), shares={"a": 0.9, "b": 0.1}, now=now)
    notices = preempted(result)
    assert len(notices) == 1 and next(iter(notices)).startswith("l")
    assert next(iter(notices.values())).preempt_at == now + 300


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 16),
    st.sampled_from(["a", None]),
    st.integers(0, 8 * HOUR),
    st.integers(0, 4),
    st.integers(0, 2 * HOUR),
)
def test_the_walk_reads_short_work_as_the_policy_does(
    gpus: int, alloc: str | None, protection: int, max_gpus: int, max_protection: int
) -> None:
    from allot.core.cycle import _Cycle

    policy = Policy(short_lane_max_gpus=max_gpus, short_lane_max_protection_s=max_protection)
    cycle = _Cycle(Snapshot(ClusterState(hosts(1)), PendingQueue(), {}, {}), policy, 0.0)
    w = workload("w", gpus, alloc, min_runtime_s=protection)
    assert cycle._short(w) is policy.short(w)
    assert cycle._lane_may(w) is (not w.allocated or policy.short(w))


@pytest.mark.parametrize(
    ("lane", "placed_now"),
    [
        pytest.param((), ["asker"], id="no-lane-the-room-is-the-askers"),
        pytest.param(("h1",), ["dbg"], id="lane-the-room-is-not-held-for-long-work"),
    ],
)
def test_room_on_a_lane_host_is_not_held_for_work_that_may_not_start_there(
    lane: tuple[str, ...], placed_now: list[str]
) -> None:
    """``asker`` (8 GPUs, not short) noticed ``victim`` on h1, which left; then placement
    restarted with h1 in the short lane (the log's notices and room replay as before). The
    room stays the asker's while it may start there, though ``dbg`` ranks first; in the lane
    the asker may not, so the short ``dbg`` takes a GPU of h1 at once instead of waiting out
    a hold that serves nobody. h2 is full of protected work."""
    from allot.core.fold import end_workload

    state = cluster(
        hosts(2),
        on(workload("victim", 8, "v", min_runtime_s=0), "h1"),
        on(workload("wall", 8, "w", min_runtime_s=10_000), "h2"),
        short_lane=lane,
    )
    queue = PendingQueue([workload("asker", 8, "a", min_runtime_s=3600, submit=0.0)])
    state.notice("victim", 3.0, "asker")
    end_workload(state, queue, "victim", preempted=False, now=1.0)
    queue.add(workload("dbg", 1, "o", min_runtime_s=600, submit=0.5))
    shares = {"o": 0.25, "w": 0.25, "a": 0.25, "v": 0.25}
    order = {"o": 0, "a": 1, "w": 2, "v": 3}  # dbg's turn first: the asker's room is not its
    result = run_cycle(Snapshot(state, queue, shares, order), Policy(grace_s=3), 1.5)
    assert [p.workload.id for p in result.placements] == placed_now
