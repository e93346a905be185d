"""Placement: best fit on HEALTHY hosts, gangs on whole hosts, all or nothing, deterministic.

Each case is one cycle with preemption off, so whatever is placed was placed on free GPUs.
Expected assignments are worked out from the rules in ``allot.core.placement``:
fewest free GPUs that still fit, ties to the first host id, lowest free indices; a gang of
g > G takes g // G whole free hosts (sorted ids) plus the remainder by best fit.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from builders import (
    On,
    cluster,
    decide,
    free_work,
    gpus,
    host,
    hosts,
    on,
    placed,
    placed_order,
    span,
    workload,
)

from allot.core.decisions import CycleResult
from allot.core.model import Assignment, Host, HostState
from allot.core.placement import ClusterView
from allot.core.state import ClusterState


def used(host_id: str, n: int) -> On:
    """``n`` GPUs of ``host_id`` busy with protected work of another allocation."""
    return on(workload(f"busy-{host_id}", n, "other"), host_id)


def three_hosts_partly_used() -> ClusterState:
    # h1: 8 free, h2: 3 free, h3: 5 free
    return cluster(hosts(3), used("h2", 5), used("h3", 3))


SINGLE_HOST = [
    pytest.param(three_hosts_partly_used, 3, (span("h2", 5, 7),), id="fewest-free-host-that-fits"),
    pytest.param(three_hosts_partly_used, 4, (span("h3", 3, 6),), id="skips-hosts-too-full"),
    pytest.param(three_hosts_partly_used, 6, (span("h1", 0, 5),), id="only-the-empty-host-fits"),
    pytest.param(
        three_hosts_partly_used, 7, (span("h1", 0, 6),), id="seven-only-on-the-empty-host"
    ),
    pytest.param(
        lambda: cluster([host("b"), host("a")]), 2, (span("a", 0, 1),), id="tie-to-first-host-id"
    ),
    pytest.param(
        lambda: cluster(hosts(3), used("h3", 4), used("h2", 4)),
        4,
        (span("h2", 4, 7),),
        id="tie-between-partly-used-hosts-to-first-id",
    ),
    pytest.param(
        lambda: cluster([host("big", 8), host("small", 4)]),
        4,
        (span("small", 0, 3),),
        id="small-host-fits-exactly-so-the-big-one-stays-whole",
    ),
    pytest.param(
        lambda: cluster([host("big", 8), host("small", 4)]),
        5,
        (span("big", 0, 4),),
        id="too-big-for-the-small-host",
    ),
    pytest.param(
        lambda: cluster(hosts(2), used("h1", 6), used("h2", 7)),
        3,
        None,
        id="enough-free-in-total-but-not-on-one-host",
    ),
]


@pytest.mark.parametrize(("build", "size", "expected"), SINGLE_HOST)
def test_best_fit(
    build: Callable[[], ClusterState], size: int, expected: Assignment | None
) -> None:
    state = build()
    result = decide(state, workload("w", size), preemption=False)
    assert placed(result) == ({} if expected is None else {"w": expected})
    assert result.preemptions == ()


def test_takes_the_lowest_free_indices_even_with_holes() -> None:
    state = cluster(hosts(1))
    state.start(workload("x", 3, "other"), (("h1", (0, 2, 4)),), 0.0)
    result = decide(state, workload("w", 3), preemption=False)
    assert placed(result) == {"w": (gpus("h1", 1, 3, 5),)}


@pytest.mark.parametrize(
    "bad", [HostState.DRAINING, HostState.DRAINED, HostState.CORDONED], ids=lambda s: f"{s}-host"
)
@pytest.mark.parametrize(
    ("size", "expected"),
    [
        pytest.param(2, (span("h2", 6, 7),), id="fits-on-the-healthy-host"),
        pytest.param(3, None, id="only-the-unhealthy-host-has-room"),
        pytest.param(16, None, id="gang-cannot-use-it-as-a-whole-host"),
    ],
)
def test_never_on_a_host_that_is_not_healthy(
    bad: HostState, size: int, expected: Assignment | None
) -> None:
    state = cluster([host("h1", 8, bad), host("h2"), host("h3")], used("h2", 6), used("h3", 8))
    result = decide(state, workload("w", size), free_work("u", size, submit=1.0), preemption=False)
    expected_placed = {} if expected is None else {"w": expected}
    assert placed(result) == expected_placed


GANGS = [
    pytest.param(
        lambda: cluster(hosts(3)),
        16,
        (span("h1", 0, 7), span("h2", 0, 7)),
        id="two-whole-hosts-in-id-order",
    ),
    pytest.param(
        lambda: cluster([host("h3"), host("h1"), host("h2")]),
        16,
        (span("h1", 0, 7), span("h2", 0, 7)),
        id="whole-hosts-by-id-not-by-input-order",
    ),
    pytest.param(
        # h1 8 free, h2 3 free, h3 8 free, h4 4 free: one whole host, 3 more by best fit
        lambda: cluster(hosts(4), used("h2", 5), used("h4", 4)),
        11,
        (span("h1", 0, 7), span("h2", 5, 7)),
        id="remainder-by-best-fit-not-on-the-next-free-host",
    ),
    pytest.param(
        three_hosts_partly_used,  # h1 8 free, h2 3, h3 5
        9,
        (span("h1", 0, 7), span("h2", 5, 5)),
        id="nine-on-eight-gpu-hosts-is-a-gang-of-one-whole-host-and-one-more",
    ),
    pytest.param(
        lambda: cluster(hosts(3), used("h3", 6)),
        12,
        (span("h1", 0, 7), span("h2", 0, 3)),
        id="remainder-on-a-whole-host-when-nothing-smaller-fits",
    ),
    pytest.param(
        lambda: cluster(hosts(3), used("h1", 1)),
        16,
        (span("h2", 0, 7), span("h3", 0, 7)),
        id="a-partly-used-host-is-not-whole",
    ),
    pytest.param(
        lambda: cluster([host("big1"), host("big2"), host("small", 4)]),
        12,
        (span("big1", 0, 7), span("small", 0, 3)),
        id="mixed-pool-gang-uses-the-largest-host-size",
    ),
    pytest.param(
        lambda: cluster(hosts(3, gpus=4)),
        8,
        (span("h1", 0, 3), span("h2", 0, 3)),
        id="gang-of-small-hosts",
    ),
    pytest.param(
        lambda: cluster([host("h1"), host("h2", 8, HostState.CORDONED), host("h3")]),
        16,
        (span("h1", 0, 7), span("h3", 0, 7)),
        id="whole-hosts-skip-a-cordoned-one",
    ),
    pytest.param(
        lambda: cluster(hosts(3), used("h2", 2), used("h3", 2)),
        16,
        None,
        id="enough-gpus-in-total-but-one-whole-host",
    ),
    pytest.param(
        lambda: cluster(hosts(3), used("h3", 7)),
        18,
        None,
        id="whole-hosts-free-but-the-remainder-does-not-fit",
    ),
]


@pytest.mark.parametrize(("build", "size", "expected"), GANGS)
def test_gangs(build: Callable[[], ClusterState], size: int, expected: Assignment | None) -> None:
    state = build()
    result = decide(state, workload("g", size), preemption=False)
    assert placed(result) == ({} if expected is None else {"g": expected})


def test_all_or_nothing_and_a_gang_that_does_not_fit_blocks_nobody() -> None:
    # h1 empty, h2 and h3 with 6 free each: 20 free GPUs but only one whole host.
    state = cluster(hosts(3), used("h2", 2), used("h3", 2))
    result = decide(
        state,
        workload("gang", 16, submit=0.0),
        workload("small", 3, submit=1.0),
        preemption=False,
    )
    assert placed(result) == {"small": (span("h2", 2, 4),)}
    assert result.preemptions == ()


def test_each_placement_sees_the_ones_before_it() -> None:
    state = cluster(hosts(2))
    result = decide(
        state,
        workload("first", 5, submit=0.0),
        workload("second", 5, submit=1.0),
        workload("third", 3, submit=2.0),
        preemption=False,
    )
    assert placed_order(result) == ["first", "second", "third"]
    assert placed(result) == {
        "first": (span("h1", 0, 4),),
        "second": (span("h2", 0, 4),),  # h1 has 3 left
        "third": (span("h1", 5, 7),),  # h1 and h2 both have 3 left: first id
    }


def test_find_fit_does_not_touch_the_state() -> None:
    state = cluster(hosts(2), used("h1", 2))
    view = ClusterView(state, 0.0)
    fit = view.find_fit("", 6)
    assert fit == (span("h1", 2, 7),)
    view.take(fit)
    assert view.find_fit("", 6) == (span("h2", 0, 5),)
    assert state.free == {"h1": [2, 3, 4, 5, 6, 7], "h2": list(range(8))}
    assert state.by_free[""][6] == {0}
    assert view.find_fit("", 9) is None
    assert ClusterView(state, 0.0).find_fit("nowhere", 1) is None


def _scenario(host_list: list[Host], reverse_queue: bool) -> CycleResult:
    state = cluster(
        host_list,
        on(workload("r1", 3, "b"), "h2"),
        on(workload("r2", 6, "b"), "h4"),
    )
    queue = [
        workload("g", 12, "a", submit=0.0),
        workload("s1", 2, "a", submit=1.0),
        workload("s2", 2, "c", submit=1.0),
        free_work("u1", 3, submit=0.5),
    ]
    if reverse_queue:
        queue.reverse()
    return decide(state, *queue, order={"a": 1, "c": 0}, preemption=False)


@pytest.mark.parametrize(
    ("host_list", "reverse_queue"),
    [
        pytest.param(hosts(4), True, id="queue-given-in-reverse"),
        pytest.param(list(reversed(hosts(4))), False, id="hosts-given-in-reverse"),
        pytest.param(hosts(4)[2:] + hosts(4)[:2], True, id="both-shuffled"),
    ],
)
def test_placement_is_deterministic(host_list: list[Host], reverse_queue: bool) -> None:
    reference = _scenario(hosts(4), False)
    assert _scenario(hosts(4), False) == reference
    assert _scenario(host_list, reverse_queue) == reference
    # And the reference is what the rules say. Free before the cycle: h1 8, h2 5, h3 8, h4 2.
    # c ranks better (order 0): s2 best-fits the 2 free GPUs of h4. Then a: the gang takes
    # whole h1 and its 4 remaining GPUs by best fit on h2 (5 free, not h3's 8); s1 then
    # best-fits h3 (h2 has 1 left); the unallocated u1 comes last, next to s1 on h3.
    assert placed_order(reference) == ["s2", "g", "s1", "u1"]
    assert placed(reference) == {
        "s2": (span("h4", 6, 7),),
        "g": (span("h1", 0, 7), span("h2", 3, 6)),
        "s1": (span("h3", 0, 1),),
        "u1": (span("h3", 2, 4),),
    }


def test_the_same_cluster_gets_the_same_gang_whatever_its_history() -> None:
    """One 8-GPU host cordoned, two 4-GPU hosts healthy: the cluster a placement service
    rebuilt from events must decide like one built in that state from the start."""

    def build(cordon_later: bool) -> ClusterState:
        first = HostState.HEALTHY if cordon_later else HostState.CORDONED
        state = cluster([host("big", 8, first), host("s1", 4), host("s2", 4)])
        if cordon_later:
            state.set_host_state("big", HostState.CORDONED)
        return state

    built_cordoned = decide(build(False), workload("g", 8), preemption=False)
    cordoned_later = decide(build(True), workload("g", 8), preemption=False)
    assert placed(cordoned_later) == placed(built_cordoned)
