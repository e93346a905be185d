"""The planner's indexes decide exactly as the scans they replace (hypothesis).

A cycle keeps, beside its view of the cluster, the hosts that could be cleared whole in
the order of what clearing them costs (``ClusterView.clear_order``), host sets that read
in ascending order (``OrderedIds``), and per allocation the hosts of its movable work.
Random clusters from ``test_core_properties`` are run through a whole cycle with the
indexes built first, so every notice, placement, reservation and earmark of the cycle
updates them; then each index must equal the one built from scratch, and the planners
that read them must return what the scans over every host return.
"""

from __future__ import annotations

from itertools import takewhile

from hypothesis import given, settings
from hypothesis import strategies as st
from test_core_properties import NOW, Scenario, scenarios

from allot.core.cycle import _Cycle
from allot.core.heap_order import OrderedIds
from allot.core.model import Host, Workload
from allot.core.placement import ClusterView
from allot.core.preemption import (
    _best_host,
    _cheap_option,
    _CheapRule,
    _clear_host,
    _clearable_candidates,
    _clearable_in_order,
    _clearable_scanned,
    _hosts_with_victims,
    _plan_cheap,
)
from allot.core.state import ClusterState
from allot.core.victims import FairShareRule, FairShareVictims

SETTINGS = settings(max_examples=200, deadline=None)


def cycled_view(scenario: Scenario, *, cheap_only: bool = False) -> tuple[_Cycle, ClusterView]:
    """The view after a whole cycle whose indexes were built before it began (the
    clearing order of cheap hosts only, with ``cheap_only``)."""
    *_, snapshot = scenario.build()
    cycle = _Cycle(snapshot, scenario.policy, NOW)
    for pool in cycle.st.pool_max_gpus:
        list(cycle.view.clear_order(pool, cheap_only=cheap_only))
        cycle.view.room_buckets(pool)
    cycle.run()
    return cycle, cycle.view


def rebuilt_order(view: ClusterView, pool: str) -> list[tuple[tuple[float, ...], str]]:
    st_ = view.st
    largest = st_.pool_max_gpus[pool]
    entries = []
    for host_id in st_.host_ids:
        host = st_.host(host_id)
        if st_.pool_of[host_id] != pool or host.gpus != largest or not host.schedulable:
            continue
        key = view.clear_cost(host_id)
        if key is not None:
            entries.append((key, host_id))
    return sorted(entries)


def fair_share_rules(cycle: _Cycle, *, ignoring: bool = False) -> list[FairShareRule]:
    """Every requester's rule, reclaiming or not (and earmarks' rules, which ignore
    protection, with ``ignoring``)."""
    victims = FairShareVictims(cycle.order, cycle.entitlement, True, NOW)
    return [
        victims.rule(requester, reclaiming, ignore_protection=ignore)
        for requester in ("a", "b", "c", "d")
        for reclaiming in (True, False)
        for ignore in ((False, True) if ignoring else (False,))
    ]


@SETTINGS
@given(scenarios(steps=False))
def test_the_clearing_order_kept_through_a_cycle_equals_one_built_afresh(
    scenario: Scenario,
) -> None:
    _, view = cycled_view(scenario)
    for pool in view.st.pool_max_gpus:
        assert list(view.clear_order(pool)) == rebuilt_order(view, pool)


@SETTINGS
@given(scenarios(steps=False))
def test_the_cheap_clearing_order_is_the_cheap_part_of_the_whole_one(scenario: Scenario) -> None:
    _, view = cycled_view(scenario, cheap_only=True)
    for pool in view.st.pool_max_gpus:
        cheap = [(key, host) for key, host in rebuilt_order(view, pool) if key[0] <= 1]
        read = list(takewhile(lambda e: e[0][0] <= 1, view.clear_order(pool, cheap_only=True)))
        assert read == cheap  # readers stop at allocated work (the cycle may have costed it)
        assert list(view.clear_order(pool)) == rebuilt_order(view, pool)  # costs the rest


@SETTINGS
@given(scenarios(steps=False))
def test_clearing_costs_are_the_planners_costs(scenario: Scenario) -> None:
    cycle, view = cycled_view(scenario)
    cheap = _CheapRule(NOW)
    for pool, largest in view.st.pool_max_gpus.items():
        for key, host in view.clear_order(pool):
            if key[0] <= 1:  # no allocated occupant: a cheap plan may clear it
                option = _clear_host(view, host, largest, cheap, view.victim_held)
                assert option is not None and option.cost == key
        for rule in fair_share_rules(cycle):
            ordered = list(_clearable_in_order(view, pool, largest, rule, view.victim_held))
            hosts = view.candidate_hosts(pool, True)
            scanned = _clearable_scanned(view, pool, largest, rule, view.victim_held, hosts=hosts)
            assert [(o.host, o.cost, o.victims) for o in ordered] == [
                (o.host, o.cost, o.victims) for o in scanned
            ]


@SETTINGS
@given(scenarios(steps=False))
def test_after_a_failed_cheap_plan_only_hosts_with_fair_victims_can_serve(
    scenario: Scenario,
) -> None:
    cycle, view = cycled_view(scenario)
    for pool, largest in view.st.pool_max_gpus.items():
        for rule in fair_share_rules(cycle, ignoring=True):
            respect = not rule.ignores_protection
            for gpus in range(1, largest + 1):
                if _plan_cheap(view, pool, gpus, largest) is not None:
                    continue
                held = dict(view.victim_held)
                some = _hosts_with_victims(view, pool, rule.may_take_from, held, respect=respect)
                every = view.candidate_hosts(pool, respect)
                assert set(some) <= set(every)
                narrow = _best_host(view, some, gpus, rule, dict(held), exclude=set())
                wide = _best_host(view, every, gpus, rule, dict(held), exclude=set())
                assert (narrow and (narrow.host, narrow.cost, narrow.victims)) == (
                    wide and (wide.host, wide.cost, wide.victims)
                )


@SETTINGS
@given(scenarios(steps=False))
def test_clearing_reads_only_hosts_a_rule_could_clear(scenario: Scenario) -> None:
    """A gang's plan costs the hosts of cheap room = size plus those of the allocations
    its rule may take from, and finds what costing every candidate finds (protection
    respected or, for earmarks, ignored; the order built cheap-only, as a cycle does)."""
    cycle, view = cycled_view(scenario, cheap_only=True)
    held = view.victim_held
    for pool, largest in view.st.pool_max_gpus.items():
        for rule in fair_share_rules(cycle, ignoring=True):
            respect = not rule.ignores_protection
            some = _clearable_candidates(
                view, pool, largest, rule.may_take_from, held, respect=respect
            )
            every = view.candidate_hosts(pool, respect)
            assert set(some) <= set(every)
            wide = [
                (o.host, o.cost, o.victims)
                for o in _clearable_scanned(view, pool, largest, rule, held, hosts=every)
            ]
            narrow = _clearable_scanned(view, pool, largest, rule, held, hosts=some)
            assert [(o.host, o.cost, o.victims) for o in narrow] == wide
            if respect:
                ordered = _clearable_in_order(view, pool, largest, rule, held)
                assert [(o.host, o.cost, o.victims) for o in ordered] == wide


def counted_room(view: ClusterView, host_id: str) -> int:
    """Cheap room from scratch: free GPUs plus those of occupants no request has claimed
    or earmarked that are unallocated or under notice."""
    room = len(view.free_of(host_id))
    for wid in view.st.on_host[host_id]:
        run = view.st.running[wid]
        if wid in view.earmarked or (view.terminating(run) and wid in view.claimed):
            continue
        if view.terminating(run) or not run.workload.allocated:
            room += sum(len(g) for h, g in run.assignment if h == host_id)
    return room


@SETTINGS
@given(scenarios(steps=False), st.booleans())
def test_cheap_room_built_before_or_during_a_cycle_is_counted_room(
    scenario: Scenario, early: bool
) -> None:
    """Built from the state's cheap GPUs (a host the cycle has not changed) or by counting
    occupants (one it has), before the cycle or when its first plan reads it, cheap room
    ends the cycle equal to a count from scratch."""
    *_, snapshot = scenario.build()
    cycle = _Cycle(snapshot, scenario.policy, NOW)
    if early:
        for pool in cycle.st.pool_max_gpus:
            cycle.view.room_buckets(pool)
    cycle.run()
    view = cycle.view
    for pool, buckets in view._room_buckets.items():
        for value, bucket in enumerate(buckets):
            for idx in bucket:
                host_id = view.st.host_at[idx]
                assert view.st.pool_of[host_id] == pool and view.st.host(host_id).schedulable
                assert view.cheap_room(host_id) == value == counted_room(view, host_id)
    for host_id in view.st.host_ids:
        if view.st.host(host_id).schedulable and view._room is not None:
            assert view.cheap_room(host_id) == counted_room(view, host_id)


OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=80)


@given(st.sets(st.integers(0, 30)), OPS, st.sets(st.integers(0, 30)))
def test_ordered_ids_give_their_smallest_members_through_adds_and_discards(
    start: set[int], ops: list[tuple[bool, int]], exclude: set[int]
) -> None:
    ids = OrderedIds(start)
    model = set(start)
    for i, (add, idx) in enumerate(ops):
        if add:
            ids.add(idx)
            model.add(idx)
        else:
            ids.discard(idx)
            model.discard(idx)
        if i % 7 == 0:  # read now and then, so the heap is kept between changes
            assert ids.smallest(i % 5 + 1) == sorted(model)[: i % 5 + 1]
    assert ids.smallest(len(model) + 1) == sorted(model)
    rest = model - exclude
    assert ids.smallest(3, exclude) == sorted(rest)[:3]
    assert ids.first(exclude) == (min(rest) if rest else None)


class _Unbounded:
    """``rule`` without ``costs_by_kind``: ``_best_host`` then costs every host it is given
    (no bound from cheap room), as before the bound."""

    def __init__(self, rule: FairShareRule) -> None:
        self.rule = rule
        self.key = rule.key
        self.keeps_eligible = rule.keeps_eligible
        self.may_take_allocated = rule.may_take_allocated


@SETTINGS
@given(scenarios(steps=False))
def test_the_cheap_room_bound_finds_the_host_costing_every_host_finds(
    scenario: Scenario,
) -> None:
    """``_best_host`` stops at the first host whose cheap room falls short of the request
    by more GPUs than the best cost so far takes: it returns what costing every candidate
    returns, for every requester's rule (earmarks' too), every size, any held GPUs."""
    cycle, view = cycled_view(scenario)
    for pool, largest in view.st.pool_max_gpus.items():
        for rule in fair_share_rules(cycle, ignoring=True):
            every = view.candidate_hosts(pool, not rule.ignores_protection)
            for gpus in range(1, largest + 1):
                held = dict(view.victim_held)
                bounded = _best_host(view, every, gpus, rule, dict(held), exclude=set())
                costed = _best_host(view, every, gpus, _Unbounded(rule), dict(held), exclude=set())
                assert (bounded and (bounded.host, bounded.cost, bounded.victims)) == (
                    costed and (costed.host, costed.cost, costed.victims)
                )


def test_a_host_tied_with_the_best_on_its_bound_is_still_costed() -> None:
    """Two hosts full of one over-share allocation's past-protection 1-GPU runs, each short
    of a 1-GPU request by one GPU: both bound at (2, 1), the best cost's first two items.
    The host read second loses less work, so it must still be costed (a bound that stops
    on a tie would keep the first)."""
    state = ClusterState([Host("x", 8), Host("y", 8)])
    for host, started in (("x", NOW - 20_000), ("y", NOW - 5_000)):
        for g in range(8):
            w = Workload(f"{host}{g}", "b", "u", 1, 3600, submit_time=started - 1)
            state.start(w, ((host, (g,)),), started)
    view = ClusterView(state, NOW)
    rule = FairShareVictims({"a": 0, "b": 1}, {"a": 8.0, "b": 0.0}, True, NOW).rule("a", True)
    held = dict(view.victim_held)
    best = _best_host(view, ["x", "y"], 1, rule, dict(held), exclude=set())
    assert best is not None and best.cost[:2] == (2, 1)
    assert best.host == "y"  # less work lost than on x, read first
    costed = _best_host(view, ["x", "y"], 1, _Unbounded(rule), dict(held), exclude=set())
    assert costed is not None and (costed.host, costed.cost) == (best.host, best.cost)


def test_a_cycles_cheap_plans_share_each_hosts_memo() -> None:
    """Every cheap plan makes its own ``_CheapRule``; a host's plan for a size, computed
    for one request, is the next one's too (the memo keys on the rule, equal by ``now``)."""
    state = ClusterState([Host("a", 8), Host("b", 8)])
    state.start(Workload("u1", None, "u", 4, 0), (("a", (0, 1, 2, 3)),), NOW - 60)
    view = ClusterView(state, NOW)
    first, _ = _cheap_option(view, "a", 6, _CheapRule(NOW), view.victim_held)
    again, _ = _cheap_option(view, "a", 6, _CheapRule(NOW), view.victim_held)
    assert first is not None and again is first
    later, _ = _cheap_option(view, "a", 6, _CheapRule(NOW + 1), view.victim_held)
    assert later is not first
