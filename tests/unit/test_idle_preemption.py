"""Preemption on idleness (docs/decisions/0055): the core's rule on ``Snapshot.idle``, and
the fold that fills it from the log's idle flags, fenced by attempt, switched by the flag's
``preempt``."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from builders import HOUR, cluster, decide, free_work, host, hosts, on, workload

from allot.core.budgets import parse_tree
from allot.core.cycle import Snapshot, run_cycle
from allot.core.decisions import Preemption, PreemptReason
from allot.core.model import HostState
from allot.core.policy import Policy
from allot.core.reasons import explain_preemption
from allot.eventlog.budget_wire import spec_from_tree
from allot.eventlog.logfold import LogFold
from allot.proto import messages as m

GRACE = 300
SQUAT = workload("sq", 2, "a", min_runtime_s=HOUR)  # placed at 0: protected until 3600


# -- the core's rule ------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    now: float
    idle: frozenset[str]
    notices: list[tuple[str, PreemptReason, float, bool]]
    """(workload, reason, deadline, requeue)"""
    wakeup: float | None
    noticed_at: float | None = None
    """The squatter is already under notice until then."""


CORE_CASES = [
    pytest.param(
        Case(
            5000.0, frozenset({"sq"}), [("sq", PreemptReason.IDLE, 5000.0 + GRACE, False)], 5300.0
        ),
        id="flagged-past-its-protection-gets-a-notice-not-requeued",
    ),
    pytest.param(
        Case(
            3600.0, frozenset({"sq"}), [("sq", PreemptReason.IDLE, 3600.0 + GRACE, False)], 3900.0
        ),
        id="flagged-when-its-protection-ends",
    ),
    pytest.param(
        Case(1000.0, frozenset({"sq"}), [], 3600.0),
        id="flagged-but-protected-wakes-the-cycle-at-its-protection-end",
    ),
    pytest.param(Case(5000.0, frozenset(), [], None), id="not-flagged-nothing"),
    pytest.param(
        Case(5000.0, frozenset({"gone"}), [], None),
        id="a-flagged-id-that-no-longer-runs-nothing",
    ),
    pytest.param(
        Case(5000.0, frozenset({"sq"}), [], None, noticed_at=5100.0),
        id="already-under-notice-nothing-more",
    ),
]


@pytest.mark.parametrize("case", CORE_CASES)
def test_a_run_flagged_idle_is_noticed_once_its_protection_ends(case: Case) -> None:
    state = cluster(hosts(1), on(SQUAT, "h1", start=0.0, preempt_at=case.noticed_at))
    result = decide(state, now=case.now, idle=case.idle, grace_s=GRACE)
    assert [(p.workload_id, p.reason, p.preempt_at, p.requeue) for p in result.preemptions] == (
        case.notices
    )
    assert all(p.preemptor is None for p in result.preemptions)
    assert result.next_wakeup == case.wakeup


def test_an_idle_notice_names_its_reason_and_says_the_run_is_not_requeued() -> None:
    result = decide(cluster(hosts(1), on(SQUAT, "h1")), now=5000.0, idle={"sq"}, grace_s=GRACE)
    (notice,) = result.preemptions
    assert notice == Preemption("sq", "a", 2, PreemptReason.IDLE, 5300.0, False, victim_held_gpus=2)
    line = explain_preemption(notice, 5000.0)
    assert "idle: its GPUs were flagged idle" in line and line.endswith("not requeued")


def test_idle_runs_on_draining_hosts_get_one_notice_the_drains() -> None:
    state = cluster([host("h1", 8, HostState.DRAINING)], on(SQUAT, "h1"))
    result = decide(state, now=5000.0, idle={"sq"}, grace_s=GRACE)
    assert [(p.workload_id, p.reason) for p in result.preemptions] == [
        ("sq", PreemptReason.HOST_DRAIN)
    ]


def test_unallocated_work_has_no_protection_to_wait_for() -> None:
    state = cluster(hosts(1), on(free_work("u", 2), "h1", start=4990.0))
    result = decide(state, now=5000.0, idle={"u"}, grace_s=GRACE, unallocated_grace_s=30)
    assert [(p.workload_id, p.reason, p.preempt_at) for p in result.preemptions] == [
        ("u", PreemptReason.IDLE, 5030.0)
    ]


@pytest.mark.parametrize(
    ("requester", "shares"),
    [
        pytest.param("b1", {"a": 0.5, "b": 0.5}, id="another-allocation-reclaims-nothing-more"),
        pytest.param("a2", {"a": 1.0}, id="its-own-allocation-at-its-entitlement"),
    ],
)
def test_a_request_waits_for_an_idle_notices_gpus_instead_of_preempting(
    requester: str, shares: dict[str, float]
) -> None:
    """The idle notice's GPUs are room this very cycle: one notice, the request waits on it
    (also where the room bound, counted before the walk, must include them)."""
    squat = workload("sq", 8, "a", min_runtime_s=HOUR)
    state = cluster(hosts(1), on(squat, "h1"))
    pending = workload(requester, 8, requester[0], submit=10.0)
    result = decide(
        state,
        pending,
        shares=shares,
        order={a: i for i, a in enumerate(shares)},
        now=5000.0,
        idle={"sq"},
    )
    assert [(p.workload_id, p.reason) for p in result.preemptions] == [("sq", PreemptReason.IDLE)]
    assert dict(result.waiting_on) == {requester: ("sq",)}


# -- the fold: flags of the log into Snapshot.idle ------------------------------------------

T = 1000.0
RUNTIME = 600  # protected until T + 1 + 600


def flag(attempt: int = 1, *, preempt: bool = True, since: float = T + 2) -> m.WorkloadFlaggedIdle:
    return m.WorkloadFlaggedIdle(
        workload_id="sq",
        allocation="nlp",
        attempt=attempt,
        gpus=2,
        at=since + 60,
        idle_since=since,
        threshold_pct=5.0,
        window_s=60.0,
        preempt=preempt,
    )


def cleared(attempt: int = 1, *, since: float = T + 2) -> m.WorkloadIdleCleared:
    return m.WorkloadIdleCleared(
        workload_id="sq",
        allocation="nlp",
        attempt=attempt,
        gpus=2,
        at=since + 120,
        idle_since=since,
        until=since + 120,
        why="busy",
    )


def submitted() -> m.WorkloadSubmitted:
    return m.WorkloadSubmitted(
        workload_id="sq",
        client_id="sq",
        user="u",
        gpus=2,
        allocation="nlp",
        min_runtime_s=RUNTIME,
        at=T,
    )


def placed(attempt: int = 1) -> m.WorkloadPlaced:
    return m.WorkloadPlaced(
        workload_id="sq",
        allocation="nlp",
        at=T + 1 + 10_000 * (attempt - 1),
        gpus=2,
        assignment=(m.HostGpus(host="h1", gpus=(0, 1)),),
        attempt=attempt,
        epoch=1,
    )


def preempted(attempt: int = 1, reason: m.PreemptReason = "better-ranked") -> m.WorkloadPreempted:
    return m.WorkloadPreempted(
        workload_id="sq", allocation="nlp", at=T + 5000 * attempt, reason=reason, attempt=attempt
    )


def fold_of(*records: object) -> LogFold:
    f = LogFold()
    tree = parse_tree({"name": "root", "children": [{"name": "nlp", "shares": 1}]})
    f.apply(m.BudgetTreeSet(at=T, by="t", tree=spec_from_tree(tree)))
    f.apply(m.HostRegistered(host="h1", gpus=8, at=T))
    f.apply(m.LeaderElected(epoch=1, leader="p1", at=T))
    for record in records:
        f.apply(record)  # type: ignore[arg-type]
    return f


FOLD_CASES = [
    pytest.param([submitted(), placed(), flag()], {"sq"}, id="flagged-with-preempt"),
    pytest.param([submitted(), placed(), flag(preempt=False)], set(), id="switch-off-flag-only"),
    pytest.param([submitted(), placed()], set(), id="not-flagged"),
    pytest.param(
        [flag(), submitted(), placed()], {"sq"}, id="the-flag-read-first-usage-before-workloads"
    ),
    pytest.param([submitted(), placed(), flag(), cleared()], set(), id="cleared"),
    pytest.param(
        [submitted(), placed(), flag(), cleared(since=T - 50)],
        {"sq"},
        id="an-older-stretchs-clear-leaves-the-flag",
    ),
    pytest.param(
        [submitted(), placed(), flag(), preempted(), placed(2)],
        set(),
        id="a-flag-of-attempt-1-never-touches-attempt-2",
    ),
    pytest.param(
        [submitted(), placed(), preempted(), placed(2), flag(1)],
        set(),
        id="attempt-1s-flag-arriving-late",
    ),
    pytest.param(
        [flag(2), submitted(), placed(), preempted(), placed(2)],
        {"sq"},
        id="attempt-2s-flag-replayed-before-its-placement",
    ),
]


@pytest.mark.parametrize(("records", "expected"), FOLD_CASES)
def test_the_fold_hands_the_core_the_current_attempts_preempt_flags(
    records: list[object], expected: set[str]
) -> None:
    f = fold_of(*records)
    assert f.idle_preempt() == expected
    # And the cycle after its protection: a notice for exactly those.
    last = f.records["sq"].started_at or T
    now = last + RUNTIME + 1
    snapshot = Snapshot(f.state, f.queue, f.shares(), {}, idle=f.idle_preempt())
    result = run_cycle(snapshot, Policy(grace_s=GRACE), now)
    assert {p.workload_id for p in result.preemptions if p.reason is PreemptReason.IDLE} == expected


def test_flags_of_ended_attempts_are_forgotten() -> None:
    f = fold_of(submitted(), placed(), flag(), preempted())
    assert f.idle_flags == {}
    f = fold_of(submitted(), placed(), flag(), preempted(), placed(2))
    assert f.idle_flags == {}


def test_a_run_noticed_for_idleness_is_not_requeued_though_resumable() -> None:
    f = fold_of(submitted(), placed(), flag())
    notice = m.PreemptionNotice(
        workload_id="sq",
        allocation="nlp",
        at=T + 700,
        reason="idle",
        grace_deadline=T + 1000,
        requeue=False,
        gpus=2,
        epoch=1,
    )
    assert f.apply(notice).changed
    applied = f.apply(preempted(reason="idle"))
    assert applied.changed and not applied.requeued
    rec = f.records["sq"]
    assert (rec.status, rec.end_reason, rec.workload.resumable) == ("preempted", "idle", True)
    assert "sq" not in f.queue and f.idle_preempt() == frozenset()


def test_any_other_notice_of_resumable_work_still_requeues_it() -> None:
    f = fold_of(submitted(), placed())
    f.apply(
        m.PreemptionNotice(
            workload_id="sq",
            allocation="nlp",
            at=T + 700,
            reason="better-ranked",
            grace_deadline=T + 1000,
            requeue=True,
            gpus=2,
            epoch=1,
        )
    )
    assert f.apply(preempted()).requeued
    assert f.records["sq"].status == "pending"
