"""Twin parity (``allot.eventlog.twin``): recorded histories whose live decisions are made
here by the placement service's own path (``LastRanking.snapshot`` -> ``run_cycle`` ->
``cycle_records``) on what a leader had read, then replayed from the log alone.

Each case records one history and says what the replay must conclude: identical
everywhere when the leader read everything; each kind of difference when a record was in
flight, a leader was fenced, a decision was refused, reordered, or made under other grace
settings."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec
import pytest

from allot.core.budgets import parse_tree
from allot.core.cycle import run_cycle
from allot.core.errors import ValidationError
from allot.core.fairshare import rank
from allot.core.policy import Policy, make_policy
from allot.eventlog.budget_wire import spec_from_tree
from allot.eventlog.last_ranking import LastRanking
from allot.eventlog.logfold import LogFold
from allot.eventlog.record_file import decode_records, encode_records
from allot.eventlog.twin import KINDS, Verdict, twin_parity
from allot.eventlog.twin_figures import figures
from allot.proto import messages as m
from allot.services.placement.records import cycle_records
from allot.services.ranking import rank_row

T0 = 1_800_000_000.0
POLICY = make_policy("fairshare", grace_s=10, unallocated_grace_s=5, unallocated_settle_s=0.0)


# -- builders ----------------------------------------------------------------------------------


def host(name: str, at: float, gpus: int = 8) -> m.HostRegistered:
    return m.HostRegistered(host=name, gpus=gpus, at=T0 + at)


def tree(at: float, **shares: int) -> m.BudgetTreeSet:
    spec = {"name": "root", "children": [{"name": a, "shares": s} for a, s in shares.items()]}
    return m.BudgetTreeSet(at=T0 + at, by="test", tree=spec_from_tree(parse_tree(spec)))


def ranking(at: float, *best_first: str) -> m.RankingUpdated:
    """A ranking whose order is ``best_first`` (the ranking service's rows, usage made up
    so Fair Tree ranks them so)."""
    spec = {"name": "root", "children": [{"name": a, "shares": 1} for a in best_first]}
    usage = {a: float(i) for i, a in enumerate(best_first)}
    ranked = rank(parse_tree(spec), usage)
    rows = tuple(rank_row(n) for n in ranked.nodes)
    return m.RankingUpdated(at=T0 + at, window_s=604800.0, nodes=rows)


def submit(
    wid: str, at: float, gpus: int, alloc: str | None = None, min_runtime_s: int = 0
) -> m.WorkloadSubmitted:
    return m.WorkloadSubmitted(
        workload_id=wid,
        client_id=wid,
        user="u",
        gpus=gpus,
        allocation=alloc,
        min_runtime_s=min_runtime_s,
        at=T0 + at,
    )


def completed(wid: str, at: float, attempt: int = 1) -> m.WorkloadCompleted:
    return m.WorkloadCompleted(workload_id=wid, at=T0 + at, attempt=attempt)


def cancel(wid: str, at: float) -> m.CancelRequested:
    return m.CancelRequested(workload_id=wid, by="u", at=T0 + at)


def draining(name: str, at: float) -> m.HostDraining:
    return m.HostDraining(host=name, at=T0 + at, reason="test")


def elected(epoch: int, at: float) -> m.LeaderElected:
    return m.LeaderElected(epoch=epoch, leader=f"p{epoch}", at=T0 + at)


def placed(
    wid: str, at: float, hosts: dict[str, tuple[int, ...]], epoch: int = 1
) -> m.WorkloadPlaced:
    return m.WorkloadPlaced(
        workload_id=wid,
        at=T0 + at,
        gpus=sum(len(g) for g in hosts.values()),
        assignment=tuple(m.HostGpus(host=h, gpus=g) for h, g in hosts.items()),
        epoch=epoch,
    )


def idle_flag(wid: str, at: float, *, preempt: bool = True) -> m.WorkloadFlaggedIdle:
    return m.WorkloadFlaggedIdle(
        workload_id=wid,
        allocation="nlp",
        gpus=4,
        at=T0 + at,
        idle_since=T0 + at - 2.0,
        threshold_pct=5.0,
        window_s=2.0,
        preempt=preempt,
    )


@dataclass
class Log:
    """A history being recorded; ``decide`` is a leader's cycle on what it has read."""

    records: list[msgspec.Struct] = field(default_factory=list)
    unread: set[int] = field(default_factory=set)
    """ids of records stored but not yet read by the leader (in flight)."""

    def add(self, *records: msgspec.Struct) -> Log:
        self.records.extend(records)
        return self

    def in_flight(self, *records: msgspec.Struct) -> Log:
        """Stored, but the next cycle's leader has not read them."""
        self.unread |= {id(r) for r in records}
        return self.add(*records)

    def decide(
        self,
        at: float,
        epoch: int = 1,
        policy: Policy = POLICY,
        unread: Iterable[msgspec.Struct] = (),
        edit: Callable[[list[msgspec.Struct]], list[msgspec.Struct]] = list,
    ) -> list[msgspec.Struct]:
        """The placement service's cycle at ``T0 + at`` on every record read (all but the
        ones in flight, and ``unread``), its records appended (``edit`` may change them:
        a leader's fault); the records appended."""
        unseen = self.unread | {id(r) for r in unread}
        fold, last = LogFold(), LastRanking()
        for r in self.records:
            if id(r) in unseen:
                continue
            if isinstance(r, m.RankingUpdated):
                last = LastRanking.of(r, last.version + 1)
            else:
                fold.apply(r)
        now = T0 + at
        result = run_cycle(last.snapshot(fold), policy, now)
        out = cycle_records(result, fold.records, last, now=now, epoch=epoch, cycle=1)
        written = edit(
            [n.record for n in out.notices]
            + [p.record for p in out.placements]
            + [d.record for d in out.drains]
        )
        self.unread.clear()
        self.add(*written)
        return written


def start(*hosts_: m.HostRegistered, shares: dict[str, int] | None = None) -> Log:
    """Hosts, a tree, a first ranking and a leader, as a stack starts."""
    allocs = shares or {"nlp": 1, "vision": 1}
    return Log().add(*hosts_, tree(0.0, **allocs), ranking(0.0, *allocs), elected(1, 0.0))


# -- the cases ---------------------------------------------------------------------------------


def replay_matches_a_leader_that_read_everything() -> Log:
    log = start(host("a", 0.0), host("b", 0.0))
    log.add(submit("free1", 1.0, 8), submit("free2", 1.0, 8))
    log.decide(1.01)  # unallocated work fills both hosts
    log.add(submit("nlp1", 2.0, 4, "nlp", 60))
    log.decide(2.01)  # notice to unallocated work
    log.add(
        m.WorkloadPreempted(
            workload_id="free1", at=T0 + 3.0, reason="displaced-unallocated", attempt=1
        )
    )
    log.decide(3.01)  # nlp1 placed where free1 was, free1 back in the queue
    log.add(submit("vis1", 4.0, 4, "vision", 60))
    log.decide(4.01)
    log.add(completed("nlp1", 10.0))
    log.decide(10.01)  # free1 (8 GPUs) still does not fit: a cycle that leaves no record
    return log


def a_submission_in_flight() -> Log:
    log = start(host("a", 0.0))
    log.add(submit("w1", 1.0, 4))
    log.in_flight(submit("w2", 1.001, 4))  # stored while the leader decided
    log.decide(1.002)  # places w1 only
    return log


def a_run_end_in_flight() -> Log:
    log = start(host("a", 0.0), host("b", 0.0))
    log.add(submit("old", 1.0, 8, "nlp", 1))
    log.decide(1.01)  # old on one host
    log.add(submit("big", 2.0, 16, "vision", 60), submit("small", 2.1, 4, "nlp", 60))
    # The end was stamped 250 ms before it was stored (dispatch's linger): not yet read.
    log.in_flight(completed("old", 19.75))
    log.decide(20.0)  # small on the free host: big needed both
    return log


def a_cancel_in_flight() -> Log:
    log = start(host("a", 0.0))
    log.add(submit("w1", 1.0, 8))
    log.in_flight(cancel("w1", 1.001))
    log.decide(1.002)  # places w1: every fold refuses it (no longer pending)
    return log


def a_ranking_in_flight() -> Log:
    log = start(host("a", 0.0))
    log.add(submit("n1", 1.0, 8, "nlp", 60), submit("v1", 1.0, 8, "vision", 60))
    log.in_flight(ranking(1.5, "vision", "nlp"))  # vision first from now on
    log.decide(1.501)  # nlp's, by the ranking it held
    return log


def a_budget_change_in_flight() -> Log:
    log = start(host("a", 0.0), host("b", 0.0))
    log.add(submit("n0", 1.0, 4, "nlp", 600))
    log.decide(1.01)
    log.add(submit("n1", 2.0, 8, "nlp", 60), submit("v1", 2.0, 8, "vision", 60))
    # nlp 1 of 10 shares: over its entitlement (1.6 GPUs), behind vision from now on.
    log.in_flight(tree(2.5, nlp=1, vision=9))
    log.decide(2.501)
    return log


def a_host_change_in_flight() -> Log:
    log = start(host("a", 0.0), host("b", 0.0))
    log.add(submit("busy", 1.0, 8, "nlp", 600))
    log.decide(1.01)
    log.add(submit("w", 2.0, 8, "vision", 60))
    log.in_flight(draining("b", 2.4))
    log.decide(2.401)  # w on b, which the log already says is draining
    return log


def a_stale_leader_fenced() -> Log:
    log = start(host("a", 0.0), host("b", 0.0))
    log.add(submit("w1", 1.0, 8))
    late = submit("w2", 1.5, 8)  # the old leader, cut off from the log, never reads it
    log.add(late, elected(2, 2.0))
    log.decide(4.0, epoch=1, unread=[late])  # the old leader's cycle: w1 only
    return log


def another_leaders_decision_in_flight() -> Log:
    log = start(host("a", 0.0))
    log.add(submit("w1", 1.0, 8), submit("w2", 1.0, 8), elected(2, 2.0))
    new = log.decide(2.1, epoch=2)  # the new leader places w1 on a
    old = log.records[-len(new) :]
    log.decide(2.15, epoch=1, unread=old)  # the old one had not read that: w1 too
    return log


def interleaved_leaders() -> Log:
    """A paused old leader's two placements, stored around the new leader's."""
    log = start(host("a", 0.0), host("b", 0.0))
    new_epoch = elected(2, 1.5)
    log.add(submit("x", 1.0, 8), submit("y", 1.0, 8), new_epoch)
    old = log.decide(1.2, epoch=1, unread=[new_epoch])  # decided before the election
    del log.records[-len(old) :]
    log.add(old[0])
    log.decide(1.6, epoch=2)
    log.add(*old[1:])
    return log


def an_idle_run_preempted_after_its_protection() -> Log:
    log = start(host("a", 0.0))
    log.add(submit("sq", 1.0, 4, "nlp", 5), submit("fl", 1.0, 4, "nlp", 5))
    log.decide(1.01)  # both on a, protected until 6.01
    log.add(idle_flag("sq", 3.0), idle_flag("fl", 3.0, preempt=False))
    assert log.decide(3.01) == []  # flagged while protected: nothing yet
    notices = log.decide(6.5)  # sq's notice (reason idle); fl is flagged only
    assert [(n.workload_id, getattr(n, "reason", "")) for n in notices] == [("sq", "idle")]
    return log


def an_idle_flag_in_flight() -> Log:
    log = start(host("a", 0.0), host("b", 0.0))
    log.add(submit("sq", 1.0, 4, "nlp", 1))
    log.decide(1.01)  # sq on a, protected until 2.01
    log.add(submit("w", 5.0, 4, "vision", 60))
    log.in_flight(idle_flag("sq", 5.0005))
    log.decide(5.001)  # w placed; the flag (stored meanwhile) would also notice sq
    return log


def a_refused_decision() -> Log:
    log = start(host("a", 0.0))
    log.add(submit("w1", 1.0, 4))
    log.decide(1.01)
    log.add(submit("w2", 2.0, 4))
    # A leader's fault: w2 on w1's GPUs. Every fold refuses it.
    log.add(placed("w2", 2.01, {"a": (0, 1, 2, 3)}))
    return log


def placements_in_another_order() -> Log:
    log = start(host("a", 0.0))
    log.add(submit("w1", 1.0, 4), submit("w2", 1.0, 4))
    log.decide(1.01, edit=lambda records: records[::-1])
    return log


def other_grace_settings() -> Log:
    log = start(host("a", 0.0))
    log.add(submit("free", 1.0, 8))
    log.decide(1.01)
    log.add(submit("n1", 2.0, 8, "nlp", 60))
    log.decide(2.01, policy=make_policy("fairshare", 300, 30, 0.0))  # the stack's grace
    return log


def a_decision_nothing_explains() -> Log:
    log = start(host("a", 0.0), host("b", 0.0, gpus=4))
    log.add(submit("w1", 1.0, 4))
    log.add(placed("w1", 1.01, {"a": (4, 5, 6, 7)}))  # best fit is b
    return log


@dataclass(frozen=True)
class Case:
    history: Callable[[], Log]
    verdict: Verdict
    kind: str | None
    cycle: int = -1
    """Which cycle (by time) the verdict is of; the others are identical."""
    interleaved: bool = False


CASES = [
    Case(replay_matches_a_leader_that_read_everything, Verdict.IDENTICAL, None),
    Case(a_submission_in_flight, Verdict.WITHIN_TOLERANCE, "submission-in-flight"),
    Case(a_run_end_in_flight, Verdict.WITHIN_TOLERANCE, "run-end-in-flight"),
    Case(a_cancel_in_flight, Verdict.WITHIN_TOLERANCE, "cancel-in-flight"),
    Case(a_ranking_in_flight, Verdict.WITHIN_TOLERANCE, "ranking-in-flight"),
    Case(a_budget_change_in_flight, Verdict.WITHIN_TOLERANCE, "budget-change-in-flight"),
    Case(a_host_change_in_flight, Verdict.WITHIN_TOLERANCE, "host-change-in-flight"),
    Case(an_idle_run_preempted_after_its_protection, Verdict.IDENTICAL, None),
    Case(an_idle_flag_in_flight, Verdict.WITHIN_TOLERANCE, "idle-flag-in-flight"),
    Case(a_stale_leader_fenced, Verdict.DIFFERENT, "fenced"),
    Case(another_leaders_decision_in_flight, Verdict.WITHIN_TOLERANCE, "decision-in-flight"),
    Case(interleaved_leaders, Verdict.IDENTICAL, None, cycle=0, interleaved=True),
    Case(a_refused_decision, Verdict.DIFFERENT, "refused"),
    Case(placements_in_another_order, Verdict.DIFFERENT, "order"),
    Case(other_grace_settings, Verdict.DIFFERENT, "notice-deadline"),
    Case(a_decision_nothing_explains, Verdict.DIFFERENT, "unexplained"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.history.__name__ for c in CASES])
def test_each_history_is_judged_as_its_leader_decided(case: Case) -> None:
    parity = twin_parity(case.history().records, POLICY)
    judged = parity.cycles[case.cycle]
    assert (judged.verdict, judged.kind) == (case.verdict, case.kind), judged
    assert judged.interleaved is case.interleaved
    others = [c for c in parity.cycles if c is not judged]
    assert all(c.verdict is Verdict.IDENTICAL for c in others), others
    assert case.kind is None or case.kind in KINDS


def test_a_leader_that_read_everything_is_reproduced_placement_for_placement() -> None:
    log = replay_matches_a_leader_that_read_everything()
    parity = twin_parity(log.records, POLICY)
    summed = figures(parity)
    assert len(parity.cycles) == 4
    assert summed["placements"] == {
        "live": 4,
        "identical": 4,
        "exact": 4,
        "within_tolerance": 0,
        "different": 0,
        "replay_only": 0,
        "fraction_identical": 1.0,
    }
    assert summed["notices"]["live"] == summed["notices"]["exact"] == 1
    assert summed["kinds"] == {} and summed["differences"] == []


def test_an_in_flight_record_is_explained_with_its_lag_and_the_cycle_counts_as_identical() -> None:
    parity = twin_parity(a_run_end_in_flight().records, POLICY)
    judged = parity.cycles[-1]
    assert judged.lag_s == pytest.approx(0.25)  # stamped 250 ms before the cycle
    assert judged.dropped == 1
    summed = figures(parity)
    assert summed["placements"]["within_tolerance"] == 1
    assert summed["fraction_identical"] == 1.0
    assert summed["kinds"]["run-end-in-flight"]["placements"] == 1


def test_a_record_in_flight_longer_than_the_tolerance_is_a_difference() -> None:
    log = start(host("a", 0.0))
    log.add(submit("w1", 1.0, 4))
    log.in_flight(submit("w2", 1.5, 4))  # half a second before the cycle
    log.decide(2.0)
    assert twin_parity(log.records, POLICY).cycles[0].verdict is Verdict.WITHIN_TOLERANCE
    strict = twin_parity(log.records, POLICY, tolerance_s=0.1)
    assert (strict.cycles[0].verdict, strict.cycles[0].kind) == (Verdict.DIFFERENT, "unexplained")
    assert figures(strict)["placements"]["replay_only"] == 1
    assert strict.fraction_identical == pytest.approx(1 / 2)


def test_no_cut_drops_what_the_leader_had_read_before_its_previous_decisions() -> None:
    log = start(host("a", 0.0, gpus=4))
    log.add(submit("free", 1.0, 4))
    log.in_flight(submit("n1", 1.005, 4, "nlp", 60))
    log.decide(1.01)  # free on a
    # A leader that decided as if its own placement of free were not back: n1 on free's
    # GPUs. Only a cut before that placement explains it, and the leader waits for its
    # decisions before deciding again: not excused, and every fold refuses it.
    log.decide(1.03, unread=log.records[-1:])
    parity = twin_parity(log.records, POLICY)
    assert (parity.cycles[-1].verdict, parity.cycles[-1].kind) == (Verdict.DIFFERENT, "refused")


def test_only_the_window_is_compared() -> None:
    log = replay_matches_a_leader_that_read_everything()
    parity = twin_parity(log.records, POLICY, since=T0 + 2.5, until=T0 + 5.0)
    assert [round(c.at - T0, 2) for c in parity.cycles] == [3.01, 4.01]


@pytest.mark.parametrize(
    ("kwargs", "field_"),
    [
        ({"tolerance_s": -1.0}, "tolerance_s"),
        ({"tolerance_s": math.inf}, "tolerance_s"),
        ({"since": T0 + 2, "until": T0 + 1}, "since"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs: dict[str, float], field_: str) -> None:
    with pytest.raises(ValidationError) as e:
        twin_parity([], POLICY, **kwargs)
    assert e.value.field == field_


def test_a_recorded_file_replays_as_the_log_and_bad_lines_are_named() -> None:
    records = a_ranking_in_flight().records
    started = m.WorkloadStarted(workload_id="w", at=T0, host="a")
    data = encode_records([*records, started])
    assert decode_records(data, "f") == records  # runs' starts are left out
    with pytest.raises(ValidationError) as e:
        decode_records(data + b'{"type": "Nope", "at": 1}\n', "--from f")
    assert e.value.field == "--from f"
    assert e.value.reason.startswith(f"line {len(records) + 1}:")
