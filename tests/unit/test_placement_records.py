"""What the placement leader publishes for a cycle's result, with no server: a core
``CycleResult`` (and the fold's workloads, the last ranking) in, the records with their
subjects and deduplication ids out (``allot.services.placement.records``). Also the
informational records it adds (requeued, cancelled of pending work), the ranking as it
reads it, and the pacing of queue positions."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import pytest
from builders import free_work, workload

from allot.core.decisions import (
    CycleResult,
    HostTransition,
    Placement,
    Preemption,
    PreemptReason,
)
from allot.core.model import HostState, Workload
from allot.eventlog.last_ranking import LastRanking
from allot.eventlog.logfold import WorkloadRecord
from allot.proto import messages as m
from allot.services.placement.queued import QUEUED_COST_SHARE, QUEUED_EVERY_S, OwedPositions
from allot.services.placement.records import (
    CycleRecords,
    Outgoing,
    cancelled,
    cycle_records,
    requeued,
)

NOW = 5000.0
EPOCH = 7
CYCLE = 42
GRACE_END = NOW + 300

# nlp ranks best of two (rank 2, order 0), vision worst (rank 1, order 1).
RANKING = LastRanking(
    rank_of={"nlp": 2, "vision": 1},
    order={"nlp": 0, "vision": 1},
    fairshare={"nlp": 1.0, "vision": 0.5},
    window_gpu_s={"nlp": 1800.0, "vision": 7200.0},
    version=3,
)


def rec(w: Workload, attempt: int = 0) -> WorkloadRecord:
    """The fold's record of ``w`` after ``attempt`` attempts (0: never placed)."""
    return WorkloadRecord(workload=w, client_id=w.id, command=(), duration_s=None, attempt=attempt)


def notice(p: Preemption, w: Workload, attempt: int, **numbers: object) -> m.PreemptionNotice:
    """The notice of ``p`` (victim ``w`` on its ``attempt``), with the Fair Tree ``numbers``."""
    return m.PreemptionNotice(
        workload_id=p.workload_id,
        allocation=w.allocation,
        at=NOW,
        reason=p.reason.value,
        grace_deadline=p.preempt_at,
        requeue=p.requeue,
        gpus=p.gpus,
        preemptor=p.preemptor,
        victim_held_gpus=p.victim_held_gpus,
        victim_entitlement_gpus=p.victim_entitlement_gpus,
        attempt=attempt,
        epoch=EPOCH,
        **numbers,  # type: ignore[arg-type]
    )


def placed(w: Workload, attempt: int, *hosts: tuple[str, tuple[int, ...]]) -> m.WorkloadPlaced:
    return m.WorkloadPlaced(
        workload_id=w.id,
        allocation=w.allocation,
        at=NOW,
        gpus=w.gpus,
        assignment=tuple(m.HostGpus(host=h, gpus=g) for h, g in hosts),
        min_runtime_s=w.min_runtime_s,
        attempt=attempt,
        epoch=EPOCH,
    )


N1 = workload("n1", 2, "nlp")
N2 = workload("n2", 4, "nlp")
V1 = workload("v1", 4, "vision")
FREE = free_work("f1", 1)
# Submitted to vision with no minimum runtime: it runs unallocated (charged to nobody), so
# the core's preemption names no allocation.
V_UNALLOCATED = workload("v0", 1, "vision", min_runtime_s=0)

RECLAIM = Preemption(
    "v1",
    "vision",
    4,
    PreemptReason.RECLAIMED_FOR_ENTITLEMENT,
    GRACE_END,
    requeue=True,
    preemptor="n2",
    victim_held_gpus=8,
    victim_entitlement_gpus=4.0,
)
DISPLACED = Preemption(
    "v0", None, 1, PreemptReason.DISPLACED_UNALLOCATED, GRACE_END, requeue=True, preemptor="n1"
)
DRAIN = Preemption(
    "v1",
    "vision",
    4,
    PreemptReason.HOST_DRAIN,
    GRACE_END,
    requeue=True,
    victim_entitlement_gpus=-0.5,
)
STRANGER = Preemption(
    "v1", "vision", 4, PreemptReason.BETTER_RANKED, GRACE_END, requeue=False, preemptor="gone"
)


@dataclass(frozen=True)
class Case:
    """A cycle's ``result`` over the fold's ``records``; the records it publishes."""

    result: CycleResult
    records: tuple[WorkloadRecord, ...]
    expected: CycleRecords
    ranking: LastRanking = field(default=RANKING)


CASES = {
    "an-empty-cycle-publishes-nothing": Case(CycleResult(), (), CycleRecords()),
    "a-first-placement-is-attempt-1-filed-under-its-allocation": Case(
        CycleResult(placements=(Placement(N1, (("h1", (0, 1)),)),)),
        (rec(N1),),
        CycleRecords(
            placements=(
                Outgoing(
                    "allot.v1.events.nlp.n1.placed",
                    placed(N1, 1, ("h1", (0, 1))),
                    "placed:n1:1",
                ),
            )
        ),
    ),
    "a-requeued-workload-is-placed-as-the-attempt-after-its-last": Case(
        CycleResult(placements=(Placement(N1, (("h2", (3, 4)),)),)),
        (rec(N1, attempt=2),),
        CycleRecords(
            placements=(
                Outgoing(
                    "allot.v1.events.nlp.n1.placed",
                    placed(N1, 3, ("h2", (3, 4))),
                    "placed:n1:3",
                ),
            )
        ),
    ),
    "unallocated-work-is-placed-under-the-tilde-token-and-a-gang-names-every-host": Case(
        CycleResult(
            placements=(
                Placement(N2, (("h1", (0, 1)), ("h2", (0, 1)))),
                Placement(FREE, (("h3", (7,)),)),
            )
        ),
        (rec(N2), rec(FREE)),
        CycleRecords(
            placements=(
                Outgoing(
                    "allot.v1.events.nlp.n2.placed",
                    placed(N2, 1, ("h1", (0, 1)), ("h2", (0, 1))),
                    "placed:n2:1",
                ),
                Outgoing(
                    "allot.v1.events.~.f1.placed", placed(FREE, 1, ("h3", (7,))), "placed:f1:1"
                ),
            )
        ),
    ),
    "a-reclaim-notice-carries-both-allocations-fair-tree-numbers": Case(
        CycleResult(preemptions=(RECLAIM,), placements=()),
        (rec(V1, attempt=1), rec(N2)),
        CycleRecords(
            notices=(
                Outgoing(
                    "allot.v1.preempt.vision.v1",
                    notice(
                        RECLAIM,
                        V1,
                        1,
                        victim_window_gpu_s=7200.0,
                        victim_rank=1,
                        victim_fairshare=0.5,
                        preemptor_allocation="nlp",
                        preemptor_window_gpu_s=1800.0,
                        preemptor_rank=2,
                        preemptor_fairshare=1.0,
                    ),
                    f"notice:v1:1:{EPOCH}",
                ),
            )
        ),
    ),
    "before-any-ranking-a-notice-names-the-allocations-without-numbers": Case(
        CycleResult(preemptions=(RECLAIM,)),
        (rec(V1, attempt=1), rec(N2)),
        CycleRecords(
            notices=(
                Outgoing(
                    "allot.v1.preempt.vision.v1",
                    notice(RECLAIM, V1, 1, preemptor_allocation="nlp"),
                    f"notice:v1:1:{EPOCH}",
                ),
            )
        ),
        ranking=LastRanking(),
    ),
    "an-unallocated-run-is-noticed-under-the-allocation-it-was-submitted-to": Case(
        CycleResult(preemptions=(DISPLACED,)),
        (rec(V_UNALLOCATED, attempt=1), rec(N1)),
        CycleRecords(
            notices=(
                Outgoing(
                    "allot.v1.preempt.vision.v0",
                    notice(
                        DISPLACED,
                        V_UNALLOCATED,
                        1,
                        preemptor_allocation="nlp",
                        preemptor_window_gpu_s=1800.0,
                        preemptor_rank=2,
                        preemptor_fairshare=1.0,
                    ),
                    f"notice:v0:1:{EPOCH}",
                ),
            )
        ),
    ),
    "a-preemptor-the-fold-does-not-know-adds-no-preemptor-numbers": Case(
        CycleResult(preemptions=(STRANGER,)),
        (rec(V1, attempt=2),),
        CycleRecords(
            notices=(
                Outgoing(
                    "allot.v1.preempt.vision.v1",
                    notice(
                        STRANGER,
                        V1,
                        2,
                        victim_window_gpu_s=7200.0,
                        victim_rank=1,
                        victim_fairshare=0.5,
                    ),
                    f"notice:v1:2:{EPOCH}",
                ),
            )
        ),
    ),
    "a-drain-notice-clamps-a-negative-entitlement-and-the-drained-host-is-announced": Case(
        CycleResult(
            preemptions=(DRAIN,),
            transitions=(HostTransition("h2", HostState.DRAINED),),
        ),
        (rec(V1, attempt=1),),
        CycleRecords(
            notices=(
                Outgoing(
                    "allot.v1.preempt.vision.v1",
                    msgspec.structs.replace(
                        notice(
                            DRAIN,
                            V1,
                            1,
                            victim_window_gpu_s=7200.0,
                            victim_rank=1,
                            victim_fairshare=0.5,
                        ),
                        victim_entitlement_gpus=0.0,  # -0.5 from the core, clamped
                    ),
                    f"notice:v1:1:{EPOCH}",
                ),
            ),
            drains=(
                Outgoing(
                    "allot.v1.host.h2.state",
                    m.HostDrained(host="h2", at=NOW, epoch=EPOCH),
                    f"drained:h2:{EPOCH}:{CYCLE}",
                ),
            ),
        ),
    ),
    "a-cycle-that-notices-places-and-drains-keeps-each-kind-in-result-order": Case(
        CycleResult(
            placements=(Placement(FREE, (("h1", (0,)),)), Placement(N1, (("h1", (1, 2)),))),
            preemptions=(RECLAIM,),
            transitions=(
                HostTransition("h3", HostState.DRAINED),
                HostTransition("h1", HostState.DRAINED),
            ),
        ),
        (rec(FREE), rec(N1, attempt=1), rec(V1, attempt=1), rec(N2)),
        CycleRecords(
            notices=(
                Outgoing(
                    "allot.v1.preempt.vision.v1",
                    notice(
                        RECLAIM,
                        V1,
                        1,
                        victim_window_gpu_s=7200.0,
                        victim_rank=1,
                        victim_fairshare=0.5,
                        preemptor_allocation="nlp",
                        preemptor_window_gpu_s=1800.0,
                        preemptor_rank=2,
                        preemptor_fairshare=1.0,
                    ),
                    f"notice:v1:1:{EPOCH}",
                ),
            ),
            placements=(
                Outgoing(
                    "allot.v1.events.~.f1.placed", placed(FREE, 1, ("h1", (0,))), "placed:f1:1"
                ),
                Outgoing(
                    "allot.v1.events.nlp.n1.placed", placed(N1, 2, ("h1", (1, 2))), "placed:n1:2"
                ),
            ),
            drains=(
                Outgoing(
                    "allot.v1.host.h3.state",
                    m.HostDrained(host="h3", at=NOW, epoch=EPOCH),
                    f"drained:h3:{EPOCH}:{CYCLE}",
                ),
                Outgoing(
                    "allot.v1.host.h1.state",
                    m.HostDrained(host="h1", at=NOW, epoch=EPOCH),
                    f"drained:h1:{EPOCH}:{CYCLE}",
                ),
            ),
        ),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_cycle_result_maps_to_the_records_the_leader_publishes(case: Case) -> None:
    records = {r.workload.id: r for r in case.records}
    got = cycle_records(case.result, records, case.ranking, now=NOW, epoch=EPOCH, cycle=CYCLE)
    assert got == case.expected
    assert len(got) == len(case.expected.notices + case.expected.placements) + len(
        case.expected.drains
    )


def test_mapping_a_result_reads_the_fold_and_ranking_and_changes_neither() -> None:
    records = {"n1": rec(N1), "v1": rec(V1, attempt=1), "n2": rec(N2)}
    before = dict(records)
    result = CycleResult(placements=(Placement(N1, (("h1", (0, 1)),)),), preemptions=(RECLAIM,))
    first = cycle_records(result, records, RANKING, now=NOW, epoch=EPOCH, cycle=CYCLE)
    again = cycle_records(result, records, RANKING, now=NOW, epoch=EPOCH, cycle=CYCLE)
    assert first == again
    assert records == before and all(records[k] is before[k] for k in records)


def test_a_requeue_is_announced_for_the_attempt_that_was_preempted() -> None:
    out = requeued(rec(V1, attempt=2), at=NOW, epoch=EPOCH)
    assert out == Outgoing(
        "allot.v1.events.vision.v1.requeued",
        m.WorkloadRequeued(workload_id="v1", allocation="vision", at=NOW, attempt=2, epoch=EPOCH),
        "requeued:v1:2",
    )


@pytest.mark.parametrize(
    ("attempt", "announced"),
    [(0, 1), (2, 2)],
    ids=["never-placed-work-ends-its-first-attempt", "requeued-work-ends-its-last-attempt"],
)
def test_a_cancel_of_pending_work_is_announced_by_the_leader(attempt: int, announced: int) -> None:
    request = m.CancelRequested(workload_id="f1", at=NOW, by="ann", reason="not needed")
    out = cancelled(rec(FREE, attempt=attempt), request)
    assert out == Outgoing(
        "allot.v1.events.~.f1.cancelled",
        m.WorkloadCancelled(
            workload_id="f1",
            allocation=None,
            at=NOW,
            by="ann",
            reason="not needed",
            attempt=announced,
        ),
        "cancelled:f1",
    )


def rank_row(name: str, rank: int | None, fairshare: float | None, usage: float) -> m.RankRow:
    return m.RankRow(
        path=f"root.{name}",
        name=name,
        leaf=True,
        raw_shares=1,
        norm_shares=0.5,
        raw_usage=usage,
        effective_usage=0.0,
        level_fs=1.0,
        rank=rank,
        fairshare=fairshare,
    )


def test_the_ranking_orders_ranked_leaves_best_first_and_skips_accounts_and_unranked() -> None:
    account = m.RankRow(
        path="root.team",
        name="team",
        leaf=False,
        raw_shares=1,
        norm_shares=1.0,
        raw_usage=0.0,
        effective_usage=0.0,
        level_fs=1.0,
    )
    update = m.RankingUpdated(
        at=NOW,
        window_s=3600.0,
        nodes=(
            account,
            rank_row("nlp", 2, 1.0, 1800.0),
            rank_row("vision", 1, None, 7200.0),
            rank_row("new", None, None, 0.0),
        ),
    )
    got = LastRanking.of(update, version=4)
    assert got == LastRanking(
        rank_of={"nlp": 2, "vision": 1},
        order={"nlp": 0, "vision": 1},  # smaller is served first: the best rank gets 0
        fairshare={"nlp": 1.0, "vision": 0.0},
        window_gpu_s={"nlp": 1800.0, "vision": 7200.0},
        version=4,
    )


def test_positions_are_owed_to_new_work_at_most_once_a_second() -> None:
    owed = OwedPositions()
    owed.new = {"a", "b", "placed"}
    # A cycle considered a and placed (placed is gone): a is sent and forgotten.
    owed.new.discard("placed")
    assert owed.take(NOW, {"a", "placed"}, explain_cost_s=0.01) == ({"a"}, None)
    assert owed.new == {"b"} and owed.last_at == NOW
    # Within the second, b waits: the next batch is due a second after the last.
    assert owed.take(NOW + 0.5, {"b"}, explain_cost_s=0.01) == (set(), NOW + QUEUED_EVERY_S)
    assert owed.take(NOW + 1.0, {"b"}, explain_cost_s=0.01) == ({"b"}, None)
    # Nothing owed: nothing sent, no wake-up.
    assert owed.take(NOW + 9.0, {"c"}, explain_cost_s=0.01) == (set(), None)


def test_a_costly_explanation_spaces_position_batches_to_a_share_of_the_leader() -> None:
    owed = OwedPositions()
    owed.new = {"a", "b"}
    assert owed.take(NOW, {"a"}, explain_cost_s=0.1) == ({"a"}, None)
    # 0.1 s of explaining may take 5% of the time: the next batch waits 2 s, not 1.
    every = 0.1 / QUEUED_COST_SHARE
    assert every == pytest.approx(2.0)
    assert owed.take(NOW + 1.5, {"b"}, explain_cost_s=0.1) == (set(), NOW + every)
    assert owed.take(NOW + every, {"b"}, explain_cost_s=0.1) == ({"b"}, None)
