"""Lost work (issue 40; docs/decisions/0053): the definition, and the live figures the log's
preempted records give ``allot owed`` and ``/metrics``."""

from __future__ import annotations

import pytest

from allot.eventlog.lost_work import lost_gpu_seconds
from allot.eventlog.owed_query import owed_snapshot
from allot.eventlog.timeline import LogTimeline
from allot.proto import messages as m
from allot.services.agent.checkpoint import outcome


@pytest.mark.parametrize(
    ("checkpointed_at", "lost"),
    [
        pytest.param(None, 4 * 100.0, id="no-checkpoint-loses-the-whole-attempt"),
        pytest.param(1090.0, 4 * 10.0, id="work-since-the-last-checkpoint-is-lost"),
        pytest.param(900.0, 4 * 100.0, id="a-checkpoint-before-the-start-is-the-start"),
        pytest.param(1200.0, 0.0, id="a-checkpoint-after-the-end-is-the-end"),
    ],
)
def test_lost_gpu_seconds(checkpointed_at: float | None, lost: float) -> None:
    assert lost_gpu_seconds(4, 1000.0, 1100.0, checkpointed_at) == lost


@pytest.mark.parametrize(
    ("confirmed", "code", "terminated", "expected"),
    [
        pytest.param(1052.0, -9, 1052.1, ("done", 1052.0), id="confirmed-within-the-timeout"),
        pytest.param(1070.0, 0, 1060.0, ("late", 1070.0), id="confirmed-after-the-timeout"),
        pytest.param(None, -9, 1060.0, ("missed", None), id="never-confirmed"),
        pytest.param(1020.0, -9, 1060.0, ("missed", 1020.0), id="only-before-the-notice"),
        pytest.param(None, 0, None, ("done", 1055.0), id="exit-0-before-sigterm-confirms"),
        pytest.param(None, 0, 1060.0, ("missed", None), id="exit-0-after-sigterm-does-not"),
        pytest.param(900.0, -9, 1060.0, ("missed", None), id="an-older-attempts-file"),
    ],
)
def test_checkpoint_outcome(
    confirmed: float | None,
    code: int,
    terminated: float | None,
    expected: tuple[str, float | None],
) -> None:
    got = outcome(
        started_at=1000.0,
        noticed_at=1050.0,
        confirm_by=1060.0,
        confirmed=confirmed,
        exit_code=code,
        exited_at=1055.0 if terminated is None else 1075.0,
        terminated_at=terminated,
    )
    assert (got.outcome, got.checkpointed_at) == expected


def test_owed_reports_the_lost_gpu_hours_of_each_allocation_from_the_preempted_records() -> None:
    t = LogTimeline()
    t.apply(m.HostRegistered(host="h", gpus=8, at=0.0))
    t.apply(m.LeaderElected(epoch=1, leader="p", at=0.0))
    spec = m.BudgetNodeSpec(name="root", children=(m.BudgetNodeSpec(name="nlp"),))
    t.apply(m.BudgetTreeSet(at=0.0, by="t", tree=spec))
    t.apply(
        m.WorkloadSubmitted(
            workload_id="w", client_id="w", user="u", gpus=4, allocation="nlp",
            min_runtime_s=60, at=10.0, checkpoint_signal="USR1",
        )
    )  # fmt: skip
    t.apply(
        m.WorkloadPlaced(
            workload_id="w", allocation="nlp", at=100.0, gpus=4, min_runtime_s=60, epoch=1,
            assignment=(m.HostGpus(host="h", gpus=(0, 1, 2, 3)),),
        )
    )  # fmt: skip
    t.apply(
        m.WorkloadPreempted(
            workload_id="w", allocation="nlp", at=3700.0, reason="better-ranked",
            gpus=4, started_at=100.0, allocated=True, checkpoint="late",
            checkpointed_at=1900.0, lost_gpu_seconds=lost_gpu_seconds(4, 100.0, 3700.0, 1900.0),
        )
    )  # fmt: skip
    snap = owed_snapshot(t, m.OwedQuery(window_s=86400.0), now=4000.0)
    (row,) = [r for r in snap.rows if r.allocation == "nlp"]
    assert row.lost_gpu_h == pytest.approx(4 * 1800.0 / 3600.0)
    assert t.lost_gpu_seconds_total() == {"nlp": pytest.approx(4 * 1800.0)}
    assert t.fold.records["w"].checkpoints[0].outcome == "late"
