"""The log fold ignores what must not change state: duplicates, stale epochs, old attempts,
placements on busy GPUs, reports for work that is not running."""

from __future__ import annotations

import pytest

from allot.core.budgets import parse_tree
from allot.core.cycle import Snapshot, run_cycle
from allot.core.policy import Policy
from allot.eventlog.budget_wire import spec_from_tree
from allot.eventlog.logfold import CANCEL_LEAVES_S, Drain, LogFold
from allot.proto import messages as m

T = 1000.0


def submitted(
    wid: str, gpus: int = 4, alloc: str | None = "nlp", runtime: int = 600
) -> m.WorkloadSubmitted:
    return m.WorkloadSubmitted(
        workload_id=wid,
        client_id=wid,
        user="u",
        gpus=gpus,
        allocation=alloc,
        min_runtime_s=runtime,
        at=T,
    )


def placed(
    wid: str, gpus: tuple[int, ...], epoch: int = 1, attempt: int = 1, host: str = "h1"
) -> m.WorkloadPlaced:
    return m.WorkloadPlaced(
        workload_id=wid,
        allocation="nlp",
        at=T + 1,
        gpus=len(gpus),
        assignment=(m.HostGpus(host=host, gpus=gpus),),
        attempt=attempt,
        epoch=epoch,
    )


def fold_with_host() -> LogFold:
    f = LogFold()
    tree = parse_tree({"name": "root", "children": [{"name": "nlp", "shares": 1}]})
    assert f.apply(m.BudgetTreeSet(at=T, by="t", tree=spec_from_tree(tree))).changed
    assert f.apply(m.HostRegistered(host="h1", gpus=8, at=T)).changed
    assert f.apply(m.LeaderElected(epoch=1, leader="p1", at=T)).changed
    return f


def test_a_duplicate_submission_is_one_workload() -> None:
    f = fold_with_host()
    assert f.apply(submitted("w1")).changed
    again = f.apply(submitted("w1"))
    assert not again.changed and again.why == "duplicate submission"
    assert len(f.queue) == 1 and f.ignored == 1


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (placed("w1", (0, 1, 2, 3), epoch=0), "stale epoch"),
        (placed("w1", (0, 1, 2, 3), epoch=2), "stale epoch"),
        (placed("w1", (0, 1, 2, 3), attempt=2), "attempt 2 after 0"),
        (placed("w1", (0, 1, 2, 3), host="h9"), "host h9 is unknown"),
        (placed("nobody", (0, 1, 2, 3)), "not pending"),
    ],
    ids=["older-epoch", "future-epoch", "skipped-attempt", "unknown-host", "unknown-workload"],
)
def test_decisions_that_do_not_fit_are_ignored(record: m.WorkloadPlaced, why: str) -> None:
    f = fold_with_host()
    f.apply(submitted("w1"))
    applied = f.apply(record)
    assert not applied.changed and applied.why == why
    assert not f.state.running and len(f.queue) == 1


def test_no_gpu_is_booked_twice() -> None:
    f = fold_with_host()
    f.apply(submitted("w1"))
    f.apply(submitted("w2"))
    assert f.apply(placed("w1", (0, 1, 2, 3))).changed
    clash = f.apply(placed("w2", (2, 3, 4, 5)))
    assert not clash.changed and "not free" in clash.why
    assert f.apply(placed("w2", (4, 5, 6, 7))).changed
    assert sorted(f.state.running) == ["w1", "w2"]


def test_a_newer_leader_fences_the_old_one() -> None:
    f = fold_with_host()
    f.apply(submitted("w1"))
    assert f.apply(m.LeaderElected(epoch=5, leader="p2", at=T)).changed
    assert not f.apply(m.LeaderElected(epoch=3, leader="p1", at=T)).changed
    assert not f.apply(placed("w1", (0, 1, 2, 3), epoch=1)).changed
    assert f.apply(placed("w1", (0, 1, 2, 3), epoch=5)).changed


def test_preempted_resumable_work_is_requeued_and_old_reports_are_ignored() -> None:
    f = fold_with_host()
    f.apply(submitted("w1"))
    f.apply(placed("w1", (0, 1, 2, 3)))
    notice = m.PreemptionNotice(
        workload_id="w1",
        allocation="nlp",
        at=T + 700,
        reason="better-ranked",
        grace_deadline=T + 1000,
        requeue=True,
        gpus=4,
        attempt=1,
        epoch=1,
    )
    assert f.apply(notice).changed and f.records["w1"].status == "noticed"
    gone = f.apply(
        m.WorkloadPreempted(
            workload_id="w1", allocation="nlp", at=T + 800, reason="better-ranked", attempt=1
        )
    )
    assert gone.changed and gone.requeued and "w1" in f.queue
    # A late report of attempt 1 after the requeue changes nothing.
    late = f.apply(m.WorkloadCompleted(workload_id="w1", allocation="nlp", at=T + 900, attempt=1))
    assert not late.changed
    assert f.apply(placed("w1", (4, 5, 6, 7), attempt=2)).changed
    assert f.apply(
        m.WorkloadCompleted(workload_id="w1", allocation="nlp", at=T + 950, attempt=2)
    ).changed
    assert f.records["w1"].status == "completed" and not f.state.running


def test_cancel_of_pending_work_removes_it_and_of_running_work_waits_for_the_agent() -> None:
    f = fold_with_host()
    f.apply(submitted("w1"))
    f.apply(submitted("w2"))
    f.apply(placed("w2", (0, 1, 2, 3)))
    assert f.apply(m.CancelRequested(workload_id="w1", allocation="nlp", by="u", at=T)).changed
    assert f.records["w1"].status == "cancelled" and "w1" not in f.queue
    assert f.apply(m.CancelRequested(workload_id="w2", allocation="nlp", by="u", at=T)).changed
    assert f.records["w2"].status == "running" and f.records["w2"].cancel_requested
    assert f.apply(
        m.WorkloadCancelled(workload_id="w2", allocation="nlp", at=T + 5, attempt=1)
    ).changed
    assert f.records["w2"].status == "cancelled" and not f.state.running
    assert not f.apply(m.CancelRequested(workload_id="w2", allocation="nlp", by="u", at=T)).changed


def test_an_ended_workload_keeps_its_last_attempt_and_how_it_ended() -> None:
    """What `allot status` shows of finished work (like sacct): the last attempt's
    placement time and hosts, the end time, exit code, reason and who cancelled."""
    f = fold_with_host()
    for wid in ("ok", "bad", "stop", "pend"):
        f.apply(submitted(wid, gpus=2))
    f.apply(placed("ok", (0, 1)))
    f.apply(placed("bad", (2, 3)))
    f.apply(placed("stop", (4, 5)))
    f.apply(m.WorkloadCompleted(workload_id="ok", allocation="nlp", at=T + 50, attempt=1))
    f.apply(
        m.WorkloadFailed(
            workload_id="bad", allocation="nlp", at=T + 60, exit_code=3, reason="x" * 1000
        )
    )
    f.apply(m.CancelRequested(workload_id="stop", allocation="nlp", by="ann", at=T + 65))
    f.apply(
        m.WorkloadCancelled(
            workload_id="stop", allocation="nlp", at=T + 70, by="ann", reason="not needed"
        )
    )
    f.apply(m.CancelRequested(workload_id="pend", allocation="nlp", by="bob", at=T + 80))
    ok, bad, stop, pend = (f.records[w] for w in ("ok", "bad", "stop", "pend"))
    assert (ok.status, ok.started_at, ok.assignment) == ("completed", T + 1, (("h1", (0, 1)),))
    assert (ok.ended_at, ok.exit_code, ok.end_reason) == (T + 50, 0, "")
    assert (bad.status, bad.exit_code, bad.assignment) == ("failed", 3, (("h1", (2, 3)),))
    assert bad.end_reason == "x" * 200  # cut: the log keeps the whole text
    assert (stop.status, stop.ended_by, stop.end_reason) == ("cancelled", "ann", "not needed")
    assert stop.assignment == (("h1", (4, 5)),) and stop.ended_at == T + 70
    assert (pend.status, pend.ended_by, pend.assignment, pend.started_at) == (
        "cancelled",
        "bob",
        (),
        None,
    )
    # The ended work holds no GPU.
    assert not f.state.running and len(f.state.free["h1"]) == 8


def test_preempted_then_completed_keeps_the_last_attempt() -> None:
    f = fold_with_host()
    f.apply(submitted("w1"))
    f.apply(placed("w1", (0, 1, 2, 3)))
    f.apply(
        m.WorkloadPreempted(
            workload_id="w1", allocation="nlp", at=T + 800, reason="better-ranked", attempt=1
        )
    )
    assert f.records["w1"].status == "pending"
    f.apply(placed("w1", (4, 5, 6, 7), attempt=2))
    f.apply(m.WorkloadCompleted(workload_id="w1", allocation="nlp", at=T + 950, attempt=2))
    rec = f.records["w1"]
    assert (rec.attempt, rec.assignment, rec.ended_at) == (2, (("h1", (4, 5, 6, 7)),), T + 950)


def test_equal_assignments_are_one_shared_tuple() -> None:
    """Memory: each ended workload keeps its assignment, so equal ones are shared."""
    f = fold_with_host()
    f.apply(submitted("a"))
    f.apply(submitted("b"))
    f.apply(placed("a", (0, 1, 2, 3)))
    f.apply(m.WorkloadCompleted(workload_id="a", allocation="nlp", at=T + 5))
    f.apply(placed("b", (0, 1, 2, 3)))
    assert f.records["a"].assignment is f.records["b"].assignment


def test_a_drain_keeps_its_reason_operator_and_time_until_the_host_is_healthy() -> None:
    f = fold_with_host()
    f.apply(m.HostDraining(host="h1", at=T + 1, reason="bad fan", by="ops"))
    assert f.drains["h1"] == Drain(T + 1, "bad fan", "ops")
    f.apply(m.HostDrained(host="h1", at=T + 2, epoch=1))
    assert f.state.host("h1").state.value == "drained" and f.drains["h1"].reason == "bad fan"
    f.apply(m.HostDraining(host="h9", at=T + 3, reason="unknown host"))
    assert "h9" not in f.drains
    f.apply(m.HostHealthy(host="h1", at=T + 4))
    assert not f.drains


def test_a_running_cancel_shows_its_gpus_leaving_so_nothing_else_is_preempted_for_them() -> None:
    """Found 2026-12-03: during a cancelled run's checkpoint, a request that needed its
    GPUs preempted another run; they were free seconds later."""
    f = fold_with_host()
    for wid, gpus in (("a", (0, 1, 2, 3)), ("b", (4, 5, 6, 7))):  # free work fills h1
        f.apply(submitted(wid, alloc=None, runtime=0))
        f.apply(placed(wid, gpus))
    assert f.apply(m.CancelRequested(workload_id="b", by="u", at=T + 2)).changed
    assert f.state.running["b"].preempt_at == T + 2 + CANCEL_LEAVES_S
    f.apply(submitted("c"))  # allocated, 4 GPUs: b's are enough
    snapshot = Snapshot(f.state, f.queue, f.shares(), {})
    result = run_cycle(snapshot, Policy(), T + 3)
    assert result.preemptions == ()
    assert dict(result.waiting_on) == {"c": ("b",)}
    assert f.apply(m.WorkloadCancelled(workload_id="b", at=T + 4, attempt=1)).changed
    assert "b" not in f.state.noticed
