"""Reason codes: every pending reason reachable on a crafted snapshot, with its numbers
(the ones docs/reasons.md lists) and its estimated start; every pending workload gets
exactly one reason, the same one an unmemoised explanation gives (hypothesis); ``allot
prio`` rows follow the queue order; preemption lines carry the preemptor and the numbers."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from builders import HOUR, cluster, free_work, host, hosts, on, snapshot, workload
from hypothesis import given
from test_core_properties import NOW, SETTINGS, Scenario, dump, scenarios

from allot.core.cycle import Snapshot, run_cycle
from allot.core.decisions import PreemptReason
from allot.core.fold import end_workload
from allot.core.model import HostState
from allot.core.policy import FIFO, Policy
from allot.core.queue_view import queue_order
from allot.core.reasons import (
    PendingReason,
    Why,
    _Explainer,
    estimated_start,
    explain_pending,
    explain_preemption,
    priority_breakdown,
)
from allot.sim.baselines import PARTITIONED, LegacyPriority

T = 10 * HOUR  # "now" in the crafted snapshots: work started at 0 is past its protection
DOCS = Path(__file__).resolve().parents[2] / "docs" / "reasons.md"


def why(snap: Snapshot, wid: str, policy: Policy | None = None, now: float = T) -> Why:
    policy = policy or Policy()
    result = run_cycle(snap, policy, now)
    reasons = explain_pending(snap, policy, now, result)
    assert wid not in {p.workload.id for p in result.placements}
    return reasons[wid]


def dry_why(snap: Snapshot, wid: str, policy: Policy | None = None, now: float = T) -> Why:
    """As the placement service asks between cycles: a dry run, placed work included."""
    policy = policy or Policy()
    return explain_pending(snap, policy, now, run_cycle(snap, policy, now), dry_run=True)[wid]


# -- the crafted snapshots, one per code (the tests below read their numbers) ---------------


def starts_next_cycle() -> Snapshot:
    # A 12-GPU gang on two free hosts: the cycle about to run places it.
    return snapshot(cluster(hosts(2)), workload("a1", 12, "a"), shares={"a": 1.0})


def waiting_for_notice() -> Snapshot:
    st = cluster(hosts(1), on(workload("b1", 8, "b"), "h1"))
    return snapshot(st, workload("a1", 8, "a"), shares={"a": 1.0})


def protected_until() -> Snapshot:
    st = cluster(hosts(1), on(workload("b1", 8, "b"), "h1", start=T - 600))
    return snapshot(st, workload("a1", 8, "a"), shares={"a": 1.0})


def better_ranked_first() -> Snapshot:
    return snapshot(
        cluster(hosts(1)),
        workload("a1", 8, "a"),
        workload("b1", 8, "b"),
        shares={"a": 0.5, "b": 0.5},
        order={"a": 0, "b": 1},
    )


def over_entitlement() -> Snapshot:
    st = cluster(hosts(1), on(workload("a1", 8, "a"), "h1"))
    return snapshot(st, workload("a2", 1, "a"), shares={"a": 0.5, "b": 0.5})


def no_host_large_enough() -> Snapshot:
    # b is within its entitlement: an owed request of a may not take it.
    st = cluster(hosts(1), on(workload("b1", 8, "b"), "h1"))
    return snapshot(st, workload("a1", 4, "a"), shares={"a": 0.5, "b": 1.0})


def reserved_until() -> Snapshot:
    # A 64-GPU gang of a on 16 hosts, 15 held by b's protected work (ending at T + 3,000 s,
    # one a second later; b far over its entitlement): h16 and seven of b's hosts are
    # held for it (a reservation holds at most half of the cluster).
    running = [
        on(workload(f"b{i}", 8, "b", min_runtime_s=HOUR + (i > 7)), f"h{i:02d}", start=T - 600)
        for i in range(1, 16)
    ]
    st = cluster([host(f"h{i:02d}") for i in range(1, 17)], *running)
    return snapshot(st, workload("a1", 64, "a"), shares={"a": 0.9, "b": 0.1})


def after_preemption() -> Snapshot:
    # a1 was preempted for x1 ten seconds ago: it may not reclaim b's run for an hour.
    snap = snapshot(
        cluster(hosts(1), on(workload("b1", 8, "b"), "h1")), shares={"a": 0.5, "b": 0.1}
    )
    snap.queue.add(workload("a1", 8, "a"), ("x1", T - 10))
    return snap


def room_held(*, victims_left: bool = True) -> Snapshot:
    # ``asker`` (4 GPUs, ranked last) noticed ``victim`` (8 GPUs on h1) with a 300 s grace;
    # ``other`` (8 GPUs, ranked first) arrived since and would take h1 whole, but what the
    # victim leaves, or the victim itself under notice, is asker's until its turn. h2 is
    # full of protected work.
    st = cluster(
        hosts(2),
        on(workload("victim", 8, "v", min_runtime_s=0), "h1"),
        on(workload("wall", 8, "w", min_runtime_s=8 * HOUR), "h2", start=T - 60),
    )
    snap = snapshot(
        st,
        workload("asker", 4, "a", min_runtime_s=60, submit=T - 100),
        workload("other", 8, "o", min_runtime_s=60, submit=T - 50),
        shares={"o": 0.25, "w": 0.25, "a": 0.25, "v": 0.25},
        order={"o": 0, "w": 1, "a": 2, "v": 3},
    )
    st.notice("victim", T - 10 + 300, "asker")
    if victims_left:
        end_workload(st, snap.queue, "victim", preempted=False, now=T - 5)
    return snap


CASES: dict[PendingReason, tuple[Callable[[], Snapshot], str]] = {
    PendingReason.ROOM_HELD: (room_held, "other"),
    PendingReason.RESERVED_UNTIL: (reserved_until, "a1"),
    PendingReason.AFTER_PREEMPTION: (after_preemption, "a1"),
    PendingReason.STARTS_NEXT_CYCLE: (starts_next_cycle, "a1"),
    PendingReason.WAITING_FOR_NOTICE: (waiting_for_notice, "a1"),
    PendingReason.TOO_LARGE: (lambda: snapshot(cluster(hosts(2)), workload("a1", 24)), "a1"),
    PendingReason.HOSTS_DRAINING: (
        lambda: snapshot(
            cluster([host("h1"), host("h2", state=HostState.DRAINING)]), workload("a1", 16)
        ),
        "a1",
    ),
    PendingReason.UNALLOCATED_IDLE_ONLY: (
        lambda: snapshot(
            cluster(hosts(1), on(workload("a1", 6), "h1")), free_work("f1", 4), shares={"a": 1.0}
        ),
        "f1",
    ),
    PendingReason.BETTER_RANKED_FIRST: (better_ranked_first, "b1"),
    PendingReason.PROTECTED_UNTIL: (protected_until, "a1"),
    PendingReason.OVER_ENTITLEMENT: (over_entitlement, "a2"),
    PendingReason.NO_HOST_LARGE_ENOUGH: (no_host_large_enough, "a1"),
}


def documented_numbers() -> dict[str, set[str]]:
    """Code -> the number names the table of docs/reasons.md lists (backquoted names in the
    Numbers column, outside parentheses)."""
    out: dict[str, set[str]] = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) == 6 and cells[1].startswith("`") and cells[1].endswith("`"):
            out[cells[1].strip("`")] = set(
                re.findall(r"`([a-z_]+)`", re.sub(r"\([^)]*\)", "", cells[3]))
            )
    return out


@pytest.mark.parametrize("code", list(PendingReason), ids=str)
def test_every_code_is_reachable_with_the_documented_numbers(code: PendingReason) -> None:
    build, wid = CASES[code]
    r = dry_why(build(), wid)
    assert r.code is code
    assert set(r.numbers) == documented_numbers()[code.value]
    assert r.text and len(r.numbers) <= 16  # QueueRow.reason_numbers holds at most 16
    assert all(isinstance(v, int | float | str) for v in r.numbers.values())


@pytest.mark.parametrize("code", list(PendingReason), ids=str)
def test_the_estimated_start_is_the_time_the_reason_names(code: PendingReason) -> None:
    build, wid = CASES[code]
    r = dry_why(build(), wid)
    expected = {
        PendingReason.STARTS_NEXT_CYCLE: T,
        PendingReason.WAITING_FOR_NOTICE: T + 300,  # the grace deadline
        PendingReason.PROTECTED_UNTIL: T - 600 + HOUR,  # b1's protection end
        PendingReason.RESERVED_UNTIL: T - 600 + HOUR,  # the held hosts' protection end
    }.get(code)
    assert estimated_start(r, T) == expected


def test_the_docs_list_every_code_and_no_other() -> None:
    assert set(documented_numbers()) == {c.value for c in PendingReason}


# -- each code, with its numbers ----------------------------------------------------------


def test_a_reclaim_blocked_only_by_kept_gangs_says_so() -> None:
    # b (share 0.25 -> 4 of 16 GPUs) runs a 16-GPU gang past its protection on both hosts;
    # a (0.75, holds nothing) reclaims 4. Taking the gang would leave b below its share and
    # it is larger than that share: the default keeps it (decision 0067), and the reason
    # names the GPUs kept; with the rule off the gang is noticed.
    snap = snapshot(
        cluster(hosts(2), on(workload("g", 16, "b"), "h1", "h2")),
        workload("a1", 4, "a"),
        shares={"a": 0.75, "b": 0.25},
        order={"a": 0, "b": 1},
    )
    kept = dry_why(snap, "a1")
    assert kept.code is PendingReason.NO_HOST_LARGE_ENOUGH
    assert kept.numbers["kept_gang_gpus"] == 16
    assert "16 GPUs run in gangs a reclaim may not take" in kept.text
    taken = dry_why(snap, "a1", Policy(keep_large_gangs=False))
    assert taken.code is PendingReason.WAITING_FOR_NOTICE
    # Not a reclaim (a already at its share): no mention of kept gangs.
    snap_over = snapshot(
        cluster(hosts(3), on(workload("g", 16, "b"), "h1", "h2"), on(workload("a0", 8, "a"), "h3")),
        workload("a1", 4, "a"),
        shares={"a": 0.25, "b": 0.75},
        order={"a": 1, "b": 0},
    )
    assert "kept_gang_gpus" not in dry_why(snap_over, "a1").numbers


def test_starts_next_cycle_only_on_a_dry_run() -> None:
    snap = starts_next_cycle()
    r = dry_why(snap, "a1")
    assert r.numbers == {
        "requested": 12,
        "hosts": "h1,h2",
        "host_count": 2,
        "starting_workloads": 1,
    }
    assert "next cycle" in r.text and "h1,h2" in r.text
    # After a real cycle the placed work is no longer pending: no reason for it.
    policy = Policy()
    assert explain_pending(snap, policy, T, run_cycle(snap, policy, T)) == {}


def test_a_dry_run_explains_every_pending_workload_in_queue_order() -> None:
    snap = snapshot(
        cluster(hosts(1)),
        workload("a1", 4, submit=1.0),
        workload("a2", 8, submit=2.0),
        free_work("f1", 8, submit=0.0),
        shares={"a": 1.0},
    )
    policy = Policy()
    reasons = explain_pending(snap, policy, T, run_cycle(snap, policy, T), dry_run=True)
    assert list(reasons) == ["a1", "a2", "f1"]
    assert reasons["a1"].code is PendingReason.STARTS_NEXT_CYCLE
    assert reasons["a2"].code is PendingReason.BETTER_RANKED_FIRST


def test_reasons_are_read_only_since_workloads_share_them() -> None:
    snap = snapshot(
        cluster(hosts(1), on(workload("b1", 8, "b"), "h1")),
        workload("a1", 4, "a", submit=1.0),
        workload("a2", 4, "a", submit=2.0),
        shares={"a": 0.5, "b": 1.0},
    )
    reasons = explain_pending(snap, Policy(), T, run_cycle(snap, Policy(), T))
    assert reasons["a1"] == reasons["a2"]
    with pytest.raises(TypeError):
        reasons["a1"].numbers["requested"] = 1  # type: ignore[index]


def test_waiting_for_notice_names_the_victims_and_the_deadline() -> None:
    r = why(waiting_for_notice(), "a1")
    assert r.code is PendingReason.WAITING_FOR_NOTICE
    assert r.numbers == {
        "requested": 8,
        "victims": "b1",
        "victim_count": 1,
        "victim_gpus": 8,
        "deadline": T + 300,
        "in_s": 300,
    }
    assert "b1" in r.text and "5.0m" in r.text


def test_too_large_when_no_set_of_hosts_holds_the_request() -> None:
    snap = snapshot(cluster(hosts(2)), workload("a1", 24))
    r = why(snap, "a1")
    assert r.code is PendingReason.TOO_LARGE
    assert r.numbers == {
        "requested": 24,
        "largest_host": 8,
        "hosts_of_largest": 2,
        "cluster_gpus": 16,
    }


def test_hosts_draining_when_the_request_fits_only_with_the_unhealthy_hosts() -> None:
    st = cluster([host("h1"), host("h2", state=HostState.DRAINING)])
    r = why(snapshot(st, workload("a1", 16)), "a1")
    assert r.code is PendingReason.HOSTS_DRAINING
    assert r.numbers == {
        "requested": 16,
        "healthy_gpus": 8,
        "unavailable_hosts": 1,
        "unavailable_gpus": 8,
    }


def test_unallocated_work_waits_for_idle_gpus() -> None:
    st = cluster(hosts(1), on(workload("a1", 6), "h1"))
    r = why(snapshot(st, free_work("f1", 4), shares={"a": 1.0}), "f1")
    assert r.code is PendingReason.UNALLOCATED_IDLE_ONLY
    assert r.numbers == {
        "requested": 4,
        "free_gpus": 2,
        "largest_free_block": 2,
        "placed_gpus": 0,
    }


def test_better_ranked_first_when_work_ahead_took_the_free_gpus() -> None:
    r = why(better_ranked_first(), "b1")
    assert r.code is PendingReason.BETTER_RANKED_FIRST
    assert r.numbers == {
        "requested": 8,
        "free_gpus": 8,
        "largest_free_block": 8,
        "placed_gpus": 8,
        "placed_workloads": 1,
        "waiting_requesters": 0,
    }


def test_better_ranked_first_when_a_better_request_claimed_the_victims() -> None:
    # a and c both reclaim the one over-entitlement run; a ranks better and gets it.
    st = cluster(hosts(1), on(workload("b1", 8, "b"), "h1"))
    snap = snapshot(
        st,
        workload("a1", 8, "a"),
        workload("c1", 8, "c"),
        shares={"a": 1.0, "c": 1.0},
        order={"a": 0, "c": 1},
    )
    r = why(snap, "c1")
    assert r.code is PendingReason.BETTER_RANKED_FIRST
    assert r.numbers["waiting_requesters"] == 1
    assert r.numbers["free_gpus"] == 0


def test_better_ranked_first_when_an_earmark_holds_the_free_gpus() -> None:
    # a1 reclaims but b1 is protected: a1 earmarks h1, and its 2 free GPUs go to nobody.
    st = cluster(hosts(1), on(workload("b1", 6, "b"), "h1", start=T - 600))
    snap = snapshot(
        st,
        workload("a1", 8, "a"),
        workload("c1", 2, "c"),
        shares={"a": 1.0, "c": 1.0},
        order={"a": 0, "c": 1},
    )
    assert why(snap, "a1").code is PendingReason.PROTECTED_UNTIL
    r = why(snap, "c1")
    assert r.code is PendingReason.BETTER_RANKED_FIRST
    assert (r.numbers["free_gpus"], r.numbers["placed_workloads"]) == (2, 0)
    assert r.numbers["waiting_requesters"] == 0
    assert "earmarked" in r.text


@pytest.mark.parametrize("victims_left", [True, False], ids=["room-left", "victim-under-notice"])
def test_room_held_names_the_request_the_room_is_held_for(victims_left: bool) -> None:
    """Ranked first, ``other`` would fit h1 (free, or under a notice it could use), but
    that room is asker's: the reason says so, not that work ahead of it took the room."""
    snap = room_held(victims_left=victims_left)
    result = run_cycle(snap, Policy(), T)
    assert "other" not in {p.workload.id for p in result.placements}
    r = explain_pending(snap, Policy(), T, result)["other"]
    assert r.code is PendingReason.ROOM_HELD
    assert r.numbers["holders"] == "asker"
    assert r.numbers["holder_count"] == 1
    assert r.numbers["room_gpus"] == 8
    assert r.numbers["until"] == T - 10 + 300 + Policy().grace_s  # the deadline + the grace
    assert "held for asker" in r.text
    held = [(h.workload_id, h.gpus) for h in result.rooms]
    assert held == ([("asker", (("h1", tuple(range(8))),))] if victims_left else [])


def test_without_a_hold_the_room_went_to_work_ahead() -> None:
    """The same scene with the room's request gone: other takes h1 (no reason at all)."""
    snap = room_held()
    snap.queue.remove("asker")
    result = run_cycle(snap, Policy(), T)
    assert [p.workload.id for p in result.placements] == ["other"]
    assert result.rooms == ()


def test_protected_until_gives_the_protection_end_and_the_hosts() -> None:
    r = why(protected_until(), "a1")
    assert r.code is PendingReason.PROTECTED_UNTIL
    assert r.numbers == {
        "requested": 8,
        "until": T - 600 + HOUR,
        "in_s": HOUR - 600,
        "protected_gpus": 8,
        "hosts": "h1",
        "held": 0,
        "entitlement": 8.0,
    }
    assert "50.0m" in r.text


def test_over_entitlement_when_nothing_worse_ranked_is_over() -> None:
    r = why(over_entitlement(), "a2")
    assert r.code is PendingReason.OVER_ENTITLEMENT
    assert r.numbers == {
        "allocation": "a",
        "requested": 1,
        "held": 8,
        "entitlement": 4.0,
        "owed": 0.0,
    }


def test_over_entitlement_for_a_request_mostly_beyond_the_entitlement() -> None:
    # a holds 2 of 4: an 8-GPU request is owed only 2, so it competes by rank only, and b
    # (over its entitlement, but better-ranked) is out of its reach.
    st = cluster(hosts(2), on(workload("a1", 2, "a"), "h1"), on(workload("b1", 8, "b"), "h2"))
    st.start(workload("b2", 6, "b"), (("h1", (2, 3, 4, 5, 6, 7)),), 0.0)
    snap = snapshot(
        st, workload("a2", 8, "a"), shares={"a": 0.25, "b": 0.25}, order={"a": 1, "b": 0}
    )
    r = why(snap, "a2")
    assert r.code is PendingReason.OVER_ENTITLEMENT
    assert r.numbers["held"] == 2
    assert r.numbers["entitlement"] == 4.0
    assert r.numbers["owed"] == 2.0


@pytest.mark.parametrize("preemption", [True, False])
def test_no_host_large_enough_when_nothing_is_free_or_preemptible(preemption: bool) -> None:
    r = why(no_host_large_enough(), "a1", Policy(preemption=preemption))
    assert r.code is PendingReason.NO_HOST_LARGE_ENOUGH
    assert r.numbers == {
        "requested": 4,
        "free_gpus": 0,
        "largest_free_block": 0,
        "largest_host": 8,
        "preemption": "on" if preemption else "off",
    }


def test_the_baselines_get_reasons_too() -> None:
    st = cluster(hosts(1), on(workload("b1", 6, "b"), "h1"))
    snap = snapshot(st, workload("a1", 4, "a", submit=1.0), workload("a2", 2, "a", submit=2.0))
    legacy = LegacyPriority()
    for policy in (
        Policy(ordering=FIFO),
        Policy(ordering=legacy, victims=legacy),
        Policy(ordering=PARTITIONED),
    ):
        reasons = explain_pending(snap, policy, T, run_cycle(snap, policy, T))
        assert reasons["a1"].code is PendingReason.NO_HOST_LARGE_ENOUGH
        assert "a2" not in reasons  # placed on the 2 free GPUs


def test_only_pending_work_is_explained_in_queue_order() -> None:
    snap = snapshot(
        cluster(hosts(1)),
        workload("a1", 4, submit=1.0),
        workload("a2", 8, submit=2.0),
        free_work("f1", 8, submit=0.0),
        shares={"a": 1.0},
    )
    policy = Policy()
    reasons = explain_pending(snap, policy, T, run_cycle(snap, policy, T))
    assert list(reasons) == ["a2", "f1"]


# -- every pending workload, exactly one reason ---------------------------------------------


@SETTINGS
@given(scenarios(steps=False))
def test_every_pending_workload_gets_one_reason_and_nothing_changes(scenario: Scenario) -> None:
    state, queue, snap = scenario.build()
    policy = scenario.policy
    before = dump(state, queue)
    result = run_cycle(snap, policy, NOW)
    reasons = explain_pending(snap, policy, NOW, result)
    assert dump(state, queue) == before, "explain_pending changed the snapshot"
    placed = {p.workload.id for p in result.placements}
    assert set(reasons) == {w.id for w in queue} - placed
    assert explain_pending(snap, policy, NOW, result) == reasons, "not deterministic"
    waiting = dict(result.waiting_on)
    for wid, r in reasons.items():
        assert isinstance(r.code, PendingReason)
        assert r.text
        assert (r.code is PendingReason.WAITING_FOR_NOTICE) == (wid in waiting)
        w = next(q for q in queue if q.id == wid)
        if r.code is PendingReason.UNALLOCATED_IDLE_ONLY:
            assert policy.fair_tree and not w.allocated
        if r.code in (PendingReason.PROTECTED_UNTIL, PendingReason.OVER_ENTITLEMENT):
            assert policy.fair_tree and w.allocated
        if r.code is PendingReason.PROTECTED_UNTIL:
            assert float(r.numbers["until"]) > NOW
        assert all(isinstance(v, int | float | str) for v in r.numbers.values())


@SETTINGS
@given(scenarios(steps=False))
def test_the_memoised_answer_is_the_one_asked_afresh(scenario: Scenario) -> None:
    # explain_pending shares one answer per (allocation, size) and skips plans the sizes
    # already planned decide; a fresh explainer per workload does neither.
    *_, snap = scenario.build()
    policy = scenario.policy
    result = run_cycle(snap, policy, NOW)
    reasons = explain_pending(snap, policy, NOW, result, dry_run=True)
    placed = {p.workload.id for p in result.placements}
    assert set(reasons) == {w.id for w in snap.queue}
    for w in snap.queue:
        if w.id in placed:
            assert reasons[w.id].code is PendingReason.STARTS_NEXT_CYCLE
        else:
            assert reasons[w.id] == _Explainer(snap, policy, NOW, result).explain(w), w.id


@SETTINGS
@given(scenarios(steps=False))
def test_priority_breakdown_follows_the_queue_order(scenario: Scenario) -> None:
    state, queue, snap = scenario.build()
    before = dump(state, queue)
    rows = priority_breakdown(snap, scenario.policy, NOW)
    assert dump(state, queue) == before
    entries = queue_order(snap, scenario.policy)
    assert [r.workload_id for r in rows] == [e.workload.id for e in entries]
    assert [r.position for r in rows] == list(range(1, len(rows) + 1))


# -- allot prio ------------------------------------------------------------------------------


def test_priority_breakdown_shows_the_inputs() -> None:
    st = cluster(hosts(2), on(workload("b1", 8, "b"), "h1"))
    snap = snapshot(
        st,
        workload("b2", 1, "b", priority=2, submit=100.0),
        workload("a1", 2, "a", submit=50.0),
        free_work("f1", 1, submit=10.0),
        shares={"a": 0.5, "b": 0.25},
        order={"a": 1, "b": 0},
    )
    rows = priority_breakdown(snap, Policy(), 1000.0, fairshare={"a": 0.4, "b": 0.9}, rank={"a": 2})
    assert [r.workload_id for r in rows] == ["a1", "b2", "f1"]
    a1, b2, f1 = rows
    assert (a1.tier, a1.tier_name, a1.held, a1.entitlement) == (0, "under-entitlement", 0, 8.0)
    assert (a1.order_key, a1.fairshare, a1.rank, a1.age_s) == (1, 0.4, 2, 950.0)
    assert a1.sort_key == (0, 0, 1, 0, 50.0, "a1")
    assert (b2.tier, b2.held, b2.entitlement, b2.priority) == (1, 8, 4.0, 2)
    assert b2.sort_key == (0, 1, 0, -2, 100.0, "b2")
    assert (f1.tier, f1.tier_name, f1.order_key, f1.fairshare) == (2, "unallocated", None, None)
    assert f1.sort_key == (1, 0, 0, 0, 10.0, "f1")


# -- preemption lines ------------------------------------------------------------------------


def test_explain_preemption_names_the_preemptor_and_the_numbers() -> None:
    st = cluster(hosts(1), on(workload("b1", 8, "b"), "h1"))
    snap = snapshot(st, workload("a1", 8, "a"), shares={"a": 1.0, "b": 0.25})
    (p,) = run_cycle(snap, Policy(), T).preemptions
    assert p.reason is PreemptReason.RECLAIMED_FOR_ENTITLEMENT
    line = explain_preemption(p, now=T)
    for part in ("b1", "for a1", "reclaimed-for-entitlement", "held 8 of 2.0", "in 5.0m"):
        assert part in line, (part, line)
    assert "requeued" in line


def test_explain_preemption_of_a_drain_has_no_preemptor() -> None:
    st = cluster([host("h1", state=HostState.DRAINING)], on(workload("a1", 8, "a"), "h1"))
    (p,) = run_cycle(snapshot(st), Policy(), T).preemptions
    line = explain_preemption(p)
    assert "host-drain" in line and " for " not in line and f"t={T + 300:.0f}" in line
