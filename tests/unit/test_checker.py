"""The fault-injection checker on hand-built histories and logs (no servers).

Each case is a small story: a history (what clients did and were told) and a log (what
the services wrote). The checks behind the fold (double placement, GPU double-booking,
stale decisions, epochs) can only fire when the fold misbehaves, so those cases run the
checker over ``_LyingFold``: a fold that claims to apply every decision the real one
refuses, which is what a fencing or booking bug would look like from outside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
import pytest

import history as h
from allot.core.errors import ValidationError
from allot.eventlog.logfold import Applied, LogFold
from allot.proto import messages as m
from allot.sdk.errors import NoResponderError, RequestTimeoutError, SubmitRejectedError
from checker import Report, check

T0 = 1_800_000_000.0  # wall clock of the story's start; monotonic starts at 0


class _LyingFold(LogFold):
    """Says ``changed`` for every decision the real fold refuses (state left untouched)."""

    def apply(self, record: msgspec.Struct) -> Applied:
        result = super().apply(record)
        decision = m.WorkloadPlaced | m.PreemptionNotice | m.LeaderElected
        if isinstance(record, decision) and not result.changed:
            return Applied(True)
        return result


# -- builders ------------------------------------------------------------------------------------


def op(type_: h.OpType, cid: str, t: float, wid: str | None = None, alloc: str = "nlp") -> h.Op:
    value: h.Value = {"client_id": cid, "allocation": alloc, "gpus": 1}
    if wid is not None:
        value["workload_id"] = wid
    return h.Op(process="c", type=type_, f=h.SUBMIT, value=value, time=t, wall=T0 + t)


def ok(cid: str, t: float, wid: str | None = None) -> list[h.Op]:
    """A submission invoked at ``t`` and acknowledged 0.01 s later."""
    return [op("invoke", cid, t), op("ok", cid, t + 0.01, wid or f"w-{cid}")]


def done(type_: h.OpType, cid: str, t: float) -> list[h.Op]:
    return [op("invoke", cid, t), op(type_, cid, t + 1.0)]


def fault(t: float, kind: str = "sigkill", target: str = "intake") -> h.Op:
    return h.Op(
        process="nemesis",
        type="info",
        f=h.FAULT,
        value={"kind": kind, "target": target},
        time=t,
        wall=T0 + t,
    )


HOSTS: list[msgspec.Struct] = [m.HostRegistered(host="h1", gpus=2, at=T0)]


def leader(epoch: int, t: float = 0.0) -> m.LeaderElected:
    return m.LeaderElected(epoch=epoch, leader=f"p{epoch}", at=T0 + t)


def submitted(cid: str, t: float = 0.0, alloc: str = "nlp") -> m.WorkloadSubmitted:
    # Intake derives the id from (allocation, client_id): another allocation, another id.
    return m.WorkloadSubmitted(
        workload_id=f"w-{cid}" if alloc == "nlp" else f"w-{alloc}-{cid}",
        client_id=cid,
        user="u",
        gpus=1,
        allocation=alloc,
        at=T0 + t,
    )


def placed(
    cid: str, epoch: int, t: float = 0.0, gpu: int = 0, attempt: int = 1
) -> m.WorkloadPlaced:
    return m.WorkloadPlaced(
        workload_id=f"w-{cid}",
        allocation="nlp",
        at=T0 + t,
        gpus=1,
        assignment=(m.HostGpus(host="h1", gpus=(gpu,)),),
        attempt=attempt,
        epoch=epoch,
    )


def completed(cid: str, t: float = 0.0, attempt: int = 1) -> m.WorkloadCompleted:
    return m.WorkloadCompleted(workload_id=f"w-{cid}", allocation="nlp", at=T0 + t, attempt=attempt)


@dataclass
class Case:
    name: str
    ops: list[h.Op]
    log: list[msgspec.Struct]
    violations: dict[str, int] = field(default_factory=dict)
    figures: dict[str, object] = field(default_factory=dict)
    lying: bool = False
    require_placed: bool = False


CASES = [
    Case(
        "clean run: acknowledged, placed, completed",
        ok("a", 1.0),
        [*HOSTS, leader(1), submitted("a", 1.0), placed("a", 1, 1.1), completed("a", 2.0)],
        figures={"acknowledged": 1, "lost": 0, "placements_applied": 1, "epochs": [1]},
    ),
    Case(
        "acknowledged but never logged is lost",
        ok("a", 1.0),
        [*HOSTS, leader(1)],
        violations={"lost": 1},
        figures={"lost": 1},
    ),
    Case(
        "logged but never submitted is unexpected",
        [],
        [*HOSTS, leader(1), submitted("ghost")],
        violations={"unexpected": 1},
        figures={"unexpected": 1},
    ),
    Case(
        "a submission that certainly failed must not be in the log",
        done("fail", "a", 1.0),
        [*HOSTS, submitted("a", 1.5)],
        violations={"unexpected": 1},
        figures={"failed": 1, "unexpected": 1},
    ),
    Case(
        "an unknown outcome may be in the log, or not",
        done("unknown", "a", 1.0) + done("unknown", "b", 2.0),
        [*HOSTS, submitted("a", 1.5)],
        figures={"unknown": 2, "unknown_observed": 1},
    ),
    Case(
        "the same client id in another allocation is another submission",
        ok("a", 1.0),
        [*HOSTS, submitted("a", 1.0), submitted("a", 1.0, alloc="vision")],
        violations={"unexpected": 1},
    ),
    Case(
        "a second record of one submission is counted, not a violation",
        ok("a", 1.0),
        [*HOSTS, submitted("a", 1.0), submitted("a", 1.2)],
        figures={"duplicated_records": 1},
    ),
    Case(
        "a stale placement the fold ignores is counted, not a violation",
        ok("a", 1.0),
        [*HOSTS, leader(1), leader(2), submitted("a"), placed("a", 1), placed("a", 2)],
        figures={"stale_decisions": 1, "stale_decisions_applied": 0, "placements_applied": 1},
    ),
    Case(
        "a stale placement applied is a violation",
        ok("a", 1.0),
        [*HOSTS, leader(1), leader(2), submitted("a"), placed("a", 1)],
        violations={"stale_decision_applied": 1},
        lying=True,
    ),
    Case(
        "a stale preemption notice applied is a violation",
        ok("a", 1.0),
        [
            *HOSTS,
            leader(1),
            submitted("a"),
            placed("a", 1),
            leader(2),
            m.PreemptionNotice(
                workload_id="w-a",
                allocation="nlp",
                at=T0,
                reason="better-ranked",
                grace_deadline=T0 + 5,
                requeue=True,
                gpus=1,
                epoch=1,
            ),
        ],
        violations={"stale_decision_applied": 1},
        lying=True,
    ),
    Case(
        "an older LeaderElected left by a paused leader is ignored and counted",
        [],
        [leader(3), leader(2), leader(4)],
        figures={"epochs": [3, 4], "stale_leader_records": 1},
    ),
    Case(
        "an older LeaderElected applied is a violation",
        [],
        [leader(3), leader(2)],
        violations={"epoch_not_increasing": 1},
        lying=True,
    ),
    Case(
        "one attempt placed twice is a double placement (and a double booking)",
        ok("a", 1.0),
        [*HOSTS, leader(1), submitted("a"), placed("a", 1), placed("a", 1)],
        violations={"double_placement": 1, "gpu_double_booked": 1},
        lying=True,
    ),
    Case(
        "two workloads on one GPU at once is a double booking",
        ok("a", 1.0) + ok("b", 1.0),
        [*HOSTS, leader(1), submitted("a"), submitted("b"), placed("a", 1), placed("b", 1)],
        violations={"gpu_double_booked": 1},
        figures={"current_epoch_placements_refused": 0, "placements_applied": 2},
        lying=True,
    ),
    Case(
        "a refused double booking is counted; the GPU is free again after the end",
        ok("a", 1.0) + ok("b", 1.0),
        [
            *HOSTS,
            leader(1),
            submitted("a"),
            submitted("b"),
            placed("a", 1),
            placed("b", 1),
            completed("a"),
            placed("b", 1),
        ],
        figures={"current_epoch_placements_refused": 1, "placements_applied": 2},
    ),
    Case(
        "a placement on an unknown host is refused",
        ok("a", 1.0),
        [leader(1), submitted("a"), placed("a", 1)],
        figures={"placements_applied": 0, "placements_ignored": {"host h1 is unknown": 1}},
    ),
    Case(
        "unplaced work is a violation only when placement is required",
        ok("a", 1.0),
        [*HOSTS, leader(1), submitted("a")],
        violations={"unplaced": 1},
        figures={"unplaced": 1, "unfinished": 1, "outcomes": {"pending": 1}},
        require_placed=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_checker(case: Case) -> None:
    fold = _LyingFold() if case.lying else None
    report = check(case.ops, case.log, require_placed=case.require_placed, fold=fold)
    assert _kinds(report) == case.violations, report.violations
    figures = report.figures()
    for name, want in case.figures.items():
        assert figures[name] == want, (name, figures)


def _kinds(report: Report) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in report.violations:
        out[v.kind] = out.get(v.kind, 0) + 1
    return out


# -- recovery --------------------------------------------------------------------------------------


def test_recovery_is_the_first_post_fault_submission_acknowledged_and_placed() -> None:
    ops = [
        *ok("before", 1.0),
        fault(10.0),
        # invoked after the fault, acknowledged at 12.01, never placed: does not count
        op("invoke", "x", 10.5),
        op("ok", "x", 12.01, "w-x"),
        # acknowledged at 11.01 but placed only at 13.0 (wall): recovery 3.0
        *ok("late", 11.0),
        # acknowledged at 12.51, placed at 12.6: recovery 2.6 (the best)
        *ok("good", 12.5),
        fault(20.0, "sigstop", "placement-1"),
        fault(30.0, "nats-restart", "nats"),
        *ok("after", 31.0),
    ]
    log = [
        *HOSTS,
        leader(1),
        submitted("before", 1.0),
        submitted("x", 10.5),
        submitted("late", 11.0),
        submitted("good", 12.5),
        submitted("after", 31.0),
        placed("before", 1, 1.1),
        completed("before", 1.5),
        placed("good", 1, 12.6, gpu=1),
        placed("late", 1, 13.0),
        completed("late", 14.0),
        completed("good", 14.0),
        placed("after", 1, 31.5),
    ]
    report = check(ops, log)
    assert report.violations == []
    got = [(r.kind, r.target, r.seconds) for r in report.recoveries]
    assert got[0][:2] == ("sigkill", "intake") and got[0][2] == pytest.approx(2.6)
    assert got[1] == ("sigstop", "placement-1", None)  # nothing submitted before the next
    assert got[2][2] == pytest.approx(1.5)
    summary = report.recovery_summary()
    assert summary["all"]["faults"] == 3 and summary["all"]["unrecovered"] == 1
    assert summary["all"]["max_s"] == pytest.approx(2.6)
    assert summary["sigstop"]["p50_s"] is None


# -- history ---------------------------------------------------------------------------------------


def test_history_round_trips_as_json_lines_and_names_a_bad_line() -> None:
    ops = [*ok("a", 1.0), fault(2.0)]
    assert h.loads(h.dumps(ops)) == ops
    with pytest.raises(ValidationError) as e:
        h.loads(h.dumps(ops) + b'{"type": "invoke"}\n')
    assert e.value.field == "history line 4"


class _Client:
    """Stands in for ``allot.sdk.Client`` to drive each way a submit can end."""

    def __init__(self, outcome: BaseException | None) -> None:
        self.outcome = outcome

    async def submit(self, **kw: object) -> m.WorkloadAccepted:
        if self.outcome is not None:
            raise self.outcome
        return m.WorkloadAccepted(
            workload_id="w1", client_id=str(kw["client_id"]), allocation="nlp", at=T0
        )


@pytest.mark.parametrize(
    ("outcome", "kind"),
    [
        (None, "ok"),
        (SubmitRejectedError("gpus", "too many", "a"), "fail"),
        (ValidationError("gpus", "must be >= 1"), "fail"),
        (NoResponderError("allot.v1.submit.nlp", "intake service"), "fail"),
        (RequestTimeoutError("allot.v1.submit.nlp", "intake service", 1.0, 3), "unknown"),
        (ConnectionResetError("gone"), "unknown"),
    ],
)
async def test_history_submit_classifies_each_outcome(
    outcome: BaseException | None, kind: str
) -> None:
    ticks = iter([1.0, 2.0])
    hist = h.History(clock=lambda: next(ticks), wall_clock=lambda: T0)
    reply = await hist.submit(_Client(outcome), client_id="a", user="u", gpus=1, allocation="nlp")  # type: ignore[arg-type]
    assert (reply is not None) == (kind == "ok")
    types: Sequence[str] = [o.type for o in hist.ops]
    assert types == ["invoke", kind]
    assert [o.time for o in hist.ops] == [1.0, 2.0]
    if kind == "ok":
        assert hist.ops[1].value["workload_id"] == "w1"
    else:
        assert hist.ops[1].error.startswith(type(outcome).__name__)
