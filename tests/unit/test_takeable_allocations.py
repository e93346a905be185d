"""``FairShareRule.may_take_allocated`` through the cycle's ``TakeableAllocations`` (the
worst-ranked allocation that qualifies) answers as the scan over every allocation does,
while the held GPUs fall as a cycle's notices charge them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from allot.core.victims import FairShareRule, FairShareVictims, TakeableAllocations

ALLOCS = [f"a{i}" for i in range(6)]


@st.composite
def cycles(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, int], dict[str, float], bool]:
    held = {a: draw(st.integers(-4, 40)) for a in ALLOCS if draw(st.booleans())}
    # Ties and allocations missing from the ranking (served last) included.
    order = {a: draw(st.integers(0, 3)) for a in ALLOCS if draw(st.booleans())}
    entitlement = {
        a: draw(st.floats(0, 40, allow_nan=False)) for a in ALLOCS if draw(st.booleans())
    }
    return held, order, entitlement, draw(st.booleans())


def rules(victims: FairShareVictims) -> list[FairShareRule]:
    return [
        victims.rule(requester, reclaiming, allocated_victims=allocated)
        for requester in [*ALLOCS, "elsewhere"]
        for reclaiming in (False, True)
        for allocated in (False, True)
    ]


@settings(max_examples=300, deadline=None)
@given(cycles(), st.lists(st.tuples(st.sampled_from(ALLOCS), st.integers(1, 16)), max_size=12))
def test_the_index_answers_as_the_scan_while_held_falls(
    cycle: tuple[dict[str, int], dict[str, int], dict[str, float], bool],
    notices: list[tuple[str, int]],
) -> None:
    held, order, entitlement, tier = cycle
    indexed = FairShareVictims(
        order,
        entitlement,
        tier,
        0.0,
        takeable=TakeableAllocations(held, order, entitlement, tier),
    )
    scanned = FairShareVictims(order, entitlement, tier, 0.0)
    for alloc, gpus in [("", 0), *notices]:
        if alloc:
            held[alloc] = held.get(alloc, 0) - gpus  # as ``ClusterView.notice`` charges
        for fast, slow in zip(rules(indexed), rules(scanned), strict=True):
            assert fast.may_take_allocated(held) == slow.may_take_allocated(held), (
                fast.requester,
                fast.under_entitlement,
                fast.allocated_victims,
                dict(held),
            )


def test_another_mapping_is_scanned() -> None:
    """The index is of one mapping: asked about another, the rule scans that one."""
    held = {"a": 10, "b": 10}
    order = {"a": 0, "b": 1}
    entitlement = {"a": 4.0, "b": 4.0}
    victims = FairShareVictims(
        order, entitlement, True, 0.0, takeable=TakeableAllocations(held, order, entitlement, True)
    )
    rule = victims.rule("a", False)
    assert rule.may_take_allocated(held)  # b is worse ranked and over its share
    assert not rule.may_take_allocated({"a": 10, "b": 3})  # b below its share elsewhere


def test_the_worst_ranked_decides_for_a_ranked_request() -> None:
    held = {"a": 10, "b": 10, "c": 10}
    order = {"a": 0, "b": 1, "c": 2}
    entitlement = dict.fromkeys(held, 4.0)
    takeable = TakeableAllocations(held, order, entitlement, True)
    victims = FairShareVictims(order, entitlement, True, 0.0, takeable=takeable)
    assert takeable.worst_besides("b") == "c"
    assert takeable.worst_besides("c") == "b"
    assert victims.rule("b", False).may_take_allocated(held)  # c is worse
    assert not victims.rule("c", False).may_take_allocated(held)  # nothing worse than c
    assert victims.rule("c", True).may_take_allocated(held)  # a reclaim takes a or b
    held["c"] = 4  # c's notices brought it to its share: it no longer qualifies
    assert takeable.worst_besides("a") == "b"
    assert not victims.rule("b", False).may_take_allocated(held)
