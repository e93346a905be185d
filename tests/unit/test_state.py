"""ClusterState and PendingQueue: the fold of events a cycle reads.

Each case applies a few events and checks the indexes by hand: free GPU indices per host,
GPUs held per allocation (allocated work only, noticed work included), and the by-free
buckets that best-fit placement reads (HEALTHY hosts only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from builders import HOUR, cluster, free_work, host, hosts, on, workload
from hypothesis import given, settings
from hypothesis import strategies as st

from allot.core.errors import ValidationError
from allot.core.model import MAX_MIN_RUNTIME_S, Host, HostState, Workload
from allot.core.policy import Policy
from allot.core.running import Running
from allot.core.state import ClusterState, PendingQueue
from allot.sim.baselines import LegacyPriority

ALL8 = list(range(8))


def buckets(state: ClusterState, pool: str = "") -> dict[int, set[str]]:
    """by_free as {free count: host ids}, empty buckets left out."""
    return {n: {state.host_at[i] for i in idx} for n, idx in enumerate(state.by_free[pool]) if idx}


def in_key_order(state: ClusterState) -> list[str]:
    """Host ids by order key, checked against ``host_at``."""
    assert {k: h for h, k in state.host_index.items()} == state.host_at
    return sorted(state.host_index, key=state.host_index.__getitem__)


def charged(state: ClusterState) -> dict[str, int]:
    return {a: n for a, n in state.held.items() if n}


# -- construction ---------------------------------------------------------------------------


def test_a_new_cluster_sorts_hosts_and_frees_every_gpu() -> None:
    state = cluster([host("h2", 4), host("h3", 8, HostState.CORDONED), host("h1", 8)])
    assert state.host_ids == ["h1", "h2", "h3"]
    assert in_key_order(state) == ["h1", "h2", "h3"]
    assert state.free == {"h1": ALL8, "h2": [0, 1, 2, 3], "h3": ALL8}
    # The cordoned host is not schedulable: not counted, not in the buckets.
    assert state.healthy_gpus == 12
    assert buckets(state) == {8: {"h1"}, 4: {"h2"}}
    assert state.pool_max_gpus == {"": 8}
    assert state.running == {}
    assert charged(state) == {}


def test_pools_index_their_hosts_separately() -> None:
    state = cluster(
        [host("h1"), host("h2"), host("h3", 4), host("h4")],
        pools={"h1": "a", "h2": "a", "h3": "b"},
    )
    assert state.pool_of == {"h1": "a", "h2": "a", "h3": "b", "h4": ""}
    assert buckets(state, "a") == {8: {"h1", "h2"}}
    assert buckets(state, "b") == {4: {"h3"}}
    assert buckets(state, "") == {8: {"h4"}}
    assert state.pool_max_gpus == {"a": 8, "b": 4, "": 8}


# -- start / notice / finish ----------------------------------------------------------------

A3 = workload("a3", 3, "a")
B2 = workload("b2", 2, "b")
U2 = free_work("u2", 2)
Z2 = workload("z2", 2, "a", min_runtime_s=0)  # names an allocation, but unallocated
G12 = workload("g12", 12, "a")

Event = tuple[Any, ...]


def play(state: ClusterState, events: list[Event]) -> None:
    for kind, *args in events:
        if kind == "start":
            w, assignment = args
            state.start(w, assignment, 0.0)
        elif kind == "notice":
            state.notice(args[0], 500.0)
        else:
            state.finish(args[0])


BOOKKEEPING = [
    pytest.param(
        [("start", A3, (("h1", (0, 1, 2)),))],
        {"h1": [3, 4, 5, 6, 7], "h2": ALL8},
        {"a": 3},
        {5: {"h1"}, 8: {"h2"}},
        id="start-allocated-takes-its-gpus-and-charges-its-allocation",
    ),
    pytest.param(
        [("start", U2, (("h2", (0, 1)),))],
        {"h1": ALL8, "h2": [2, 3, 4, 5, 6, 7]},
        {},
        {8: {"h1"}, 6: {"h2"}},
        id="start-unallocated-takes-gpus-and-charges-nobody",
    ),
    pytest.param(
        [("start", Z2, (("h1", (6, 7)),))],
        {"h1": [0, 1, 2, 3, 4, 5], "h2": ALL8},
        {},
        {6: {"h1"}, 8: {"h2"}},
        id="zero-min-runtime-is-unallocated-even-with-an-allocation",
    ),
    pytest.param(
        [("start", A3, (("h1", (1, 4, 6)),))],
        {"h1": [0, 2, 3, 5, 7], "h2": ALL8},
        {"a": 3},
        {5: {"h1"}, 8: {"h2"}},
        id="start-on-scattered-indices-leaves-the-holes-free",
    ),
    pytest.param(
        [("start", G12, (("h1", tuple(range(8))), ("h2", (0, 1, 2, 3))))],
        {"h1": [], "h2": [4, 5, 6, 7]},
        {"a": 12},
        {0: {"h1"}, 4: {"h2"}},
        id="gang-across-two-hosts-charges-its-whole-size",
    ),
    pytest.param(
        [("start", A3, (("h1", (0, 1, 2)),)), ("notice", "a3")],
        {"h1": [3, 4, 5, 6, 7], "h2": ALL8},
        {"a": 3},
        {5: {"h1"}, 8: {"h2"}},
        id="notice-keeps-gpus-held-and-charged-until-the-end",
    ),
    pytest.param(
        [
            ("start", A3, (("h1", (0, 1, 2)),)),
            ("start", B2, (("h1", (3, 4)),)),
            ("finish", "a3"),
        ],
        {"h1": [0, 1, 2, 5, 6, 7], "h2": ALL8},
        {"b": 2},
        {6: {"h1"}, 8: {"h2"}},
        id="finish-returns-gpus-in-sorted-order-and-uncharges",
    ),
    pytest.param(
        [
            ("start", A3, (("h1", (0, 1, 2)),)),
            ("start", U2, (("h1", (3, 4)),)),
            ("notice", "a3"),
            ("finish", "u2"),
            ("finish", "a3"),
        ],
        {"h1": ALL8, "h2": ALL8},
        {},
        {8: {"h1", "h2"}},
        id="ending-everything-in-any-order-restores-the-empty-cluster",
    ),
]


@pytest.mark.parametrize(("events", "free", "held", "by_free"), BOOKKEEPING)
def test_bookkeeping_of_running_work(
    events: list[Event],
    free: dict[str, list[int]],
    held: dict[str, int],
    by_free: dict[int, set[str]],
) -> None:
    state = cluster(hosts(2))
    play(state, events)
    assert state.free == free
    assert charged(state) == held
    assert buckets(state) == by_free
    on_host: dict[str, dict[str, Running]] = {
        h: {wid: r for wid, r in state.running.items() if h in r.hosts} for h in ("h1", "h2")
    }
    assert state.on_host == on_host
    assert state.running_gpus == sum(r.workload.gpus for r in state.running.values())


def test_notice_records_the_preempt_time_and_nothing_else() -> None:
    state = cluster(hosts(1), on(A3, "h1", start=40.0))
    before = state.running["a3"]
    noticed = state.notice("a3", 700.0)
    assert noticed == Running(A3, 40.0, before.assignment, preempt_at=700.0)
    assert state.running["a3"] == noticed
    assert state.free["h1"] == [3, 4, 5, 6, 7]


def test_finish_returns_the_run_as_it_was() -> None:
    state = cluster(hosts(1), on(A3, "h1", start=40.0))
    state.notice("a3", 700.0)
    run = state.finish("a3")
    assert run == Running(A3, 40.0, (("h1", (0, 1, 2)),), 700.0)
    assert "a3" not in state.running


def test_a_rejected_start_changes_nothing() -> None:
    state = cluster(hosts(2), on(B2, "h2"))  # b2 holds h2 GPUs 0 and 1
    gang = workload("g", 4, "a")
    with pytest.raises(ValidationError) as err:
        state.start(gang, (("h1", (0, 1)), ("h2", (1, 2))), 0.0)
    assert err.value.field == "assignment"
    assert state.free == {"h1": ALL8, "h2": [2, 3, 4, 5, 6, 7]}
    assert charged(state) == {"b": 2}
    assert set(state.running) == {"b2"}


def test_an_assignment_naming_a_host_twice_is_refused() -> None:
    """One entry per host (the per-host indexes hold a run once on each of its hosts): two
    entries for h1 are refused naming the field, and nothing changes."""
    state = cluster(hosts(2))
    gang = workload("g", 2, "a")
    with pytest.raises(ValidationError) as err:
        state.start(gang, (("h1", (0,)), ("h1", (1,))), 0.0)
    assert err.value.field == "assignment"
    assert "more than once" in str(err.value)
    assert state.free == {"h1": ALL8, "h2": ALL8}
    assert not state.running and not state.on_host["h1"]


# -- host state -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state_", "healthy_gpus", "draining", "by_free"),
    [
        pytest.param(HostState.DRAINING, 8, {"h1"}, {8: {"h2"}}, id="draining-leaves-buckets"),
        pytest.param(HostState.DRAINED, 8, set(), {8: {"h2"}}, id="drained-leaves-buckets"),
        pytest.param(HostState.CORDONED, 8, set(), {8: {"h2"}}, id="cordoned-leaves-buckets"),
        pytest.param(HostState.HEALTHY, 16, set(), {5: {"h1"}, 8: {"h2"}}, id="healthy-no-op"),
    ],
)
def test_host_state_changes_move_the_host_out_of_placement(
    state_: HostState, healthy_gpus: int, draining: set[str], by_free: dict[int, set[str]]
) -> None:
    state = cluster(hosts(2), on(A3, "h1"))
    state.set_host_state("h1", state_)
    assert state.host("h1").state is state_
    assert state.healthy_gpus == healthy_gpus
    assert state.draining == draining
    assert buckets(state) == by_free
    # Running work stays where it is whatever the host's state.
    assert state.free["h1"] == [3, 4, 5, 6, 7]
    assert charged(state) == {"a": 3}


def test_a_host_back_to_healthy_is_bucketed_by_what_is_free_now() -> None:
    state = cluster(hosts(2))
    state.set_host_state("h1", HostState.DRAINING)
    state.start(A3, (("h1", (0, 1, 2)),), 0.0)  # work may still land there from outside
    state.start(B2, (("h2", (0, 1)),), 0.0)
    state.finish("a3")
    state.start(U2, (("h1", (5, 6)),), 0.0)
    state.set_host_state("h1", HostState.HEALTHY)
    assert buckets(state) == {6: {"h1", "h2"}}
    assert state.draining == set()
    assert state.healthy_gpus == 16


def test_add_host_takes_a_key_between_its_neighbours() -> None:
    state = cluster([host("h1"), host("h3")], on(A3, "h1"))
    before = dict(state.host_index)
    state.add_host(host("h2", 4))
    state.add_host(host("h0", 8, HostState.DRAINING))
    assert state.host_ids == ["h0", "h1", "h2", "h3"]
    assert in_key_order(state) == ["h0", "h1", "h2", "h3"]
    assert {h: state.host_index[h] for h in before} == before  # nothing else moved
    assert buckets(state) == {5: {"h1"}, 4: {"h2"}, 8: {"h3"}}
    assert state.draining == {"h0"}
    assert state.healthy_gpus == 20
    assert state.free["h2"] == [0, 1, 2, 3]


# -- protection ends ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "finished", "expected"),
    [
        pytest.param(0.0, (), 600.0, id="earliest-end-first"),
        pytest.param(599.5, (), 600.0, id="just-before-the-earliest"),
        pytest.param(600.0, (), 1100.0, id="strictly-after-now"),
        pytest.param(1100.0, (), None, id="all-ended"),
        pytest.param(0.0, ("a1",), 1100.0, id="finished-work-no-longer-counts"),
        pytest.param(0.0, ("a1", "b1"), None, id="unallocated-work-is-never-protected"),
    ],
)
def test_next_protection_end(now: float, finished: tuple[str, ...], expected: float | None) -> None:
    state = cluster(
        hosts(1),
        on(workload("a1", 1, "a", min_runtime_s=600), "h1", start=0.0),
        on(workload("b1", 1, "b", min_runtime_s=1000), "h1", start=100.0),
        on(free_work("u1", 1), "h1", start=0.0),
    )
    for wid in finished:
        state.finish(wid)
    assert state.next_protection_end(now) == expected


def test_a_restarted_workload_counts_its_new_window_only() -> None:
    a1 = workload("a1", 1, "a", min_runtime_s=600)
    state = cluster(hosts(1), on(a1, "h1", start=0.0))
    state.finish("a1")
    state.start(a1, (("h1", (0,)),), 2000.0)
    assert state.next_protection_end(0.0) == 2600.0


@pytest.mark.parametrize(
    ("w", "start", "until"),
    [
        pytest.param(workload("a", 1, "x", min_runtime_s=600), 100.0, 700.0, id="allocated"),
        pytest.param(free_work("u"), 100.0, 100.0, id="unallocated-never-protected"),
        pytest.param(workload("z", 1, "x", min_runtime_s=0), 100.0, 100.0, id="zero-min-runtime"),
    ],
)
def test_protected_window(w: Workload, start: float, until: float) -> None:
    run = Running(w, start, (("h1", (0,)),))
    assert run.protected_until == until
    assert run.protected(start) is (until > start)
    assert run.protected(until) is False


# -- errors name their field ----------------------------------------------------------------


def _busy() -> ClusterState:
    return cluster(hosts(1), on(A3, "h1"))


ERRORS: list[Any] = [
    pytest.param(lambda: workload(""), "id", id="workload-without-id"),
    pytest.param(lambda: workload("w", 0), "gpus", id="workload-of-zero-gpus"),
    pytest.param(lambda: workload("w", True), "gpus", id="workload-gpus-bool"),
    pytest.param(
        lambda: workload("w", 1.5),  # type: ignore[arg-type]
        "gpus",
        id="workload-gpus-float",
    ),
    pytest.param(lambda: workload("w", min_runtime_s=-1), "min_runtime_s", id="negative-runtime"),
    pytest.param(
        lambda: workload("w", min_runtime_s=MAX_MIN_RUNTIME_S + 1),
        "min_runtime_s",
        id="runtime-over-eight-hours",
    ),
    pytest.param(lambda: workload("w", alloc=""), "allocation", id="empty-allocation-name"),
    pytest.param(lambda: Host("", 8), "host.id", id="host-without-id"),
    pytest.param(lambda: Host("h9", 0), "host h9: gpus", id="host-of-zero-gpus"),
    pytest.param(lambda: Policy(grace_s=-1), "grace_s", id="negative-grace"),
    pytest.param(
        lambda: Policy(victims=LegacyPriority()), "victims", id="victims-without-an-ordering"
    ),
    pytest.param(
        lambda: LegacyPriority({"t": -1}), "protected_gpu_cap.t", id="negative-legacy-cap"
    ),
    pytest.param(lambda: ClusterState([host("h1"), host("h1")]), "hosts", id="duplicate-host"),
    pytest.param(lambda: ClusterState(hosts(1), {"h7": "a"}), "pools", id="pool-of-unknown-host"),
    pytest.param(lambda: _busy().add_host(host("h1")), "host", id="add-an-existing-host"),
    pytest.param(lambda: _busy().host("h7"), "host", id="read-an-unknown-host"),
    pytest.param(
        lambda: _busy().set_host_state("h7", HostState.DRAINING), "host", id="drain-unknown-host"
    ),
    pytest.param(
        lambda: _busy().start(A3, (("h1", (4, 5, 6)),), 0.0), "workload", id="start-twice"
    ),
    pytest.param(
        lambda: _busy().start(B2, (("h1", (2, 3)),), 0.0), "assignment", id="start-on-held-gpus"
    ),
    pytest.param(
        lambda: _busy().start(B2, (("h1", (3, 4, 5)),), 0.0),
        "assignment",
        id="start-with-the-wrong-gpu-count",
    ),
    pytest.param(
        lambda: _busy().start(B2, (("h7", (0, 1)),), 0.0), "host", id="start-on-unknown-host"
    ),
    pytest.param(lambda: _busy().notice("b2", 1.0), "workload", id="notice-what-is-not-running"),
    pytest.param(lambda: _busy().finish("b2"), "workload", id="finish-what-is-not-running"),
    pytest.param(lambda: PendingQueue([B2, B2]), "workload", id="queue-the-same-id-twice"),
    pytest.param(lambda: PendingQueue([B2]).remove("a3"), "workload", id="remove-what-is-absent"),
]


@pytest.mark.parametrize(("action", "field"), ERRORS)
def test_bad_input_names_its_field(action: Callable[[], object], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        action()
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


def test_the_eight_hour_ceiling_itself_is_allowed() -> None:
    assert workload("w", min_runtime_s=8 * HOUR).allocated


# -- the pending queue ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("w", "group"),
    [
        pytest.param(workload("w", 1, "a"), "a", id="allocated-by-its-allocation"),
        pytest.param(free_work("w"), None, id="no-allocation-is-unallocated"),
        pytest.param(workload("w", 1, "a", min_runtime_s=0), None, id="zero-runtime-unallocated"),
    ],
)
def test_queue_groups_by_paying_allocation(w: Workload, group: str | None) -> None:
    queue = PendingQueue([w])
    assert list(queue.groups) == [group]
    assert PendingQueue.group_of(w) == group


def test_queue_orders_each_group_by_priority_then_submit_time_then_id() -> None:
    queue = PendingQueue(
        [
            workload("a-old", 1, "a", submit=1.0),
            workload("b-1", 1, "b", submit=0.0),
            workload("a-urgent", 1, "a", priority=5, submit=9.0),
            free_work("u-1", submit=0.0),
            workload("a-new", 1, "a", submit=2.0),
            workload("a-twin-y", 1, "a", submit=2.0),
            workload("a-twin-x", 1, "a", submit=2.0),
        ]
    )
    assert [w.id for _, w in queue.groups["a"]] == [
        "a-urgent",
        "a-old",
        "a-new",
        "a-twin-x",
        "a-twin-y",
    ]
    # Iteration: groups by name, unallocated last.
    assert [w.id for w in queue] == [
        "a-urgent",
        "a-old",
        "a-new",
        "a-twin-x",
        "a-twin-y",
        "b-1",
        "u-1",
    ]
    assert len(queue) == 7
    assert "b-1" in queue
    assert "nobody" not in queue


def test_queue_remove_and_requeue_keep_the_order() -> None:
    a1, a2, a3 = (workload(f"a{i}", 1, "a", submit=float(i)) for i in (1, 2, 3))
    b1 = workload("b1", 1, "b")
    queue = PendingQueue([a3, b1, a1, a2])
    assert queue.remove("a2") is a2
    assert queue.remove("b1") is b1
    assert "b" not in queue.groups  # an emptied group disappears
    assert [w.id for w in queue] == ["a1", "a3"]
    queue.add(a2)  # requeued with its original submit time: back in its place
    assert [w.id for w in queue] == ["a1", "a2", "a3"]
    assert len(queue) == 3


def test_hosts_joining_between_the_same_two_neighbours_renumber_and_keep_the_index() -> None:
    state = cluster([host("a", 8), host("b", 4)], on(A3, "a"))
    # Each joins between the previous one and "b": the keys' gap halves every time.
    for i in range(40):
        state.add_host(host(f"a{i:03d}", 2 if i % 2 else 8))
    whole = cluster([host(h, state.host(h).gpus) for h in state.host_ids], on(A3, "a"))
    assert in_key_order(state) == state.host_ids == whole.host_ids
    assert buckets(state) == buckets(whole)
    assert state.pool_max_gpus == whole.pool_max_gpus == {"": 8}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 999),
            st.sampled_from([2, 4, 8]),
            st.sampled_from(list(HostState)),
            st.sampled_from(["", "p"]),
        ),
        min_size=1,
        max_size=40,
        unique_by=lambda t: t[0],
    ),
    st.integers(0, 40),
    st.randoms(use_true_random=False),
)
def test_hosts_joining_one_by_one_index_as_a_cluster_built_whole(
    specs: list[tuple[int, int, HostState, str]], at_start: int, rng: Any
) -> None:
    """Some hosts at construction, the rest joining in any order, then some change state:
    the same order and the same free index, pool units and counts as all at once."""
    made = [Host(f"h{n:03d}", gpus, state) for n, gpus, state, _ in specs]
    pools = {f"h{n:03d}": pool for n, _, _, pool in specs}
    rng.shuffle(made)
    first, rest = made[:at_start], made[at_start:]
    joined = ClusterState(first, {h.id: pools[h.id] for h in first})
    for h in rest:
        joined.pool_of[h.id] = pools[h.id]
        joined.add_host(h)
    whole = ClusterState(made, pools)
    for h in made[::3]:
        for state in (joined, whole):
            state.set_host_state(h.id, HostState.DRAINING)
    assert in_key_order(joined) == joined.host_ids == whole.host_ids
    for pool in whole.by_free:
        assert buckets(joined, pool) == buckets(whole, pool)
    assert set(joined.by_free) == set(whole.by_free)
    assert joined.pool_max_gpus == whole.pool_max_gpus
    assert joined.healthy_gpus == whole.healthy_gpus
    assert joined.draining == whole.draining


def test_order_keys_spread_their_low_bits_as_positions_do() -> None:
    """Sets and dicts of ints hash on the low bits first: keys sharing them (a gap of 2^32)
    made every lookup in the free index probe slot after slot."""
    state = cluster(hosts(1024))
    assert len({k & 1023 for k in state.host_index.values()}) == 1024
    for i in range(1, 101):
        state.add_host(host(f"h{i}x"))  # after every h{i}..., before h{i+1}
    assert state.host_ids.index("h7x") == state.host_ids.index("h8") - 1
    assert len({k & 2047 for k in state.host_index.values()}) >= 1024
