"""Intake's rules with no server: submissions (nats-py handler, called directly) and cancels
(FastStream subscribers, under ``TestNatsBroker``); the log is a ``MemoryLog`` holding two
8-GPU hosts and the budget tree root -> nlp, vision."""

from __future__ import annotations

import msgspec
import pytest
from handler_harness import NOW, Clock, ask, broker, running

from allot.bus.request_server import REQUEST_HEADERS
from allot.core.budgets import parse_tree
from allot.eventlog.budget_wire import spec_from_tree
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.services.intake import Intake, submitted_record, workload_id
from memory_log import MemoryLog

Answer = m.WorkloadAccepted | m.WorkloadRejected
Reply = m.CommandAccepted | m.CommandRejected
TREE = spec_from_tree(
    parse_tree(
        {
            "name": "root",
            "children": [{"name": "nlp", "shares": 1}, {"name": "vision", "shares": 1}],
        }
    )
)
W = workload_id("nlp", "c1")


async def seeded_log() -> MemoryLog:
    log = MemoryLog()
    await log.seed(s.BUDGET_TREE, m.BudgetTreeSet(at=NOW - 60, by="test", tree=TREE))
    for host in ("h1", "h2"):
        await log.seed(s.host_state(host), m.HostRegistered(host=host, gpus=8, at=NOW - 60))
    return log


def intake(log: MemoryLog) -> Intake:
    return Intake(broker=broker("intake"), record_log=log, tracing=False)


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Intake reads the wall clock itself (``runtime.wall_clock``): this one stands still
    until a test moves it."""
    clock = Clock()
    monkeypatch.setattr("allot.services.intake.wall_clock", clock)
    return clock


def submission(client_id: str = "c1", **kw: object) -> m.SubmitWorkload:
    fields: dict[str, object] = {"user": "ann", "gpus": 1, "allocation": "nlp", **kw}
    return m.SubmitWorkload(client_id=client_id, **fields)  # type: ignore[arg-type]


async def submit(svc: Intake, subject: str, body: msgspec.Struct | bytes) -> Answer:
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return msgspec.json.decode(await svc.on_submit(subject, data), type=Answer)


def submitted(log: MemoryLog) -> list[object]:
    return log.records("WORKLOADS", m.WorkloadSubmitted)


# -- submissions ------------------------------------------------------------------------------


async def test_a_submission_is_accepted_and_logged_under_its_derived_id() -> None:
    log = await seeded_log()
    svc = intake(log)
    cmd = submission(gpus=12)  # 8 on one host and 4 on the other
    async with running(svc):
        answer = await submit(svc, s.submit_as("nlp", "ann"), cmd)
    assert answer == m.WorkloadAccepted(
        workload_id=W,
        client_id="c1",
        allocation="nlp",
        at=NOW,
        note="unallocated: min_runtime_s is 0, so the work is neither protected nor charged "
        "to nlp; it runs free and may be preempted at any moment",
    )
    assert submitted(log) == [submitted_record(cmd, W, NOW)]
    assert log.streams["WORKLOADS"][0].subject == s.events("nlp", W, "submitted")


REFUSED = [
    pytest.param(
        s.submit_as("nlp", "ann"),
        submission(user="bob"),
        "user",
        id="a user other than the subject's login",
    ),
    pytest.param(
        s.submit_as("nlp", "ann"),
        submission(allocation="vision"),
        "allocation",
        id="an allocation other than the subject's",
    ),
    pytest.param(
        s.submit_as("astro", "ann"),
        submission(allocation="astro"),
        "allocation",
        id="an allocation the budget tree lacks",
    ),
    pytest.param(
        s.submit_as("nlp", "ann"),
        submission(gpus=17),
        "gpus",
        id="more GPUs than the cluster registered",
    ),
    pytest.param(
        s.submit_as("nlp", "ann"),
        b'{"type": "SubmitWorkload", "client_id": "c1", "user": "ann", "gpus": 0}',
        "gpus",
        id="a body the codec refuses names its field",
    ),
]


@pytest.mark.parametrize(("subject", "body", "field"), REFUSED)
async def test_a_submission_is_refused_naming_the_field(
    subject: str, body: msgspec.Struct | bytes, field: str
) -> None:
    log = await seeded_log()
    svc = intake(log)
    async with running(svc):
        answer = await submit(svc, subject, body)
    assert isinstance(answer, m.WorkloadRejected)
    assert answer.field == field
    assert submitted(log) == []


async def test_the_bare_subject_carries_no_login_and_checks_none() -> None:
    log = await seeded_log()
    svc = intake(log)
    async with running(svc):
        answer = await submit(svc, s.submit("nlp"), submission(user="anyone"))
    assert isinstance(answer, m.WorkloadAccepted)
    assert len(submitted(log)) == 1


async def test_a_repeated_client_id_is_answered_as_the_first_submission(
    fixed_clock: Clock,
) -> None:
    log = await seeded_log()
    svc = intake(log)
    async with running(svc):
        first = await submit(svc, s.submit_as("nlp", "ann"), submission())
        fixed_clock.advance(60)
        again = await submit(svc, s.submit_as("nlp", "ann"), submission())
        log.forget_msg_ids()  # past the duplicate window: the subject's condition still holds
        fixed_clock.advance(86400)
        later = await submit(svc, s.submit_as("nlp", "ann"), submission())
    assert isinstance(first, m.WorkloadAccepted) and not first.duplicate
    assert again == msgspec.structs.replace(first, duplicate=True)
    assert later == again  # the first submission's time, not now
    assert len(submitted(log)) == 1
    assert svc.duplicates == 2


async def test_a_retry_of_the_same_request_is_answered_as_its_own_not_a_duplicate() -> None:
    """A request that timed out and is sent again (same ``Allot-Request`` id) finds the
    submission its first attempt stored: accepted, not a duplicate. Another request with
    the same client id is a duplicate."""
    log = await seeded_log()
    svc = intake(log)

    async def submit_as_request(request_id: str) -> Answer:
        REQUEST_HEADERS.set({s.REQUEST_ID_HEADER: request_id})
        return await submit(svc, s.submit_as("nlp", "ann"), submission())

    async with running(svc):
        first = await submit_as_request("r1")
        retry = await submit_as_request("r1")
        log.forget_msg_ids()  # the subject's condition alone finds it too
        late_retry = await submit_as_request("r1")
        other = await submit_as_request("r2")
    assert isinstance(first, m.WorkloadAccepted) and not first.duplicate
    assert retry == first and late_retry == first
    assert other == msgspec.structs.replace(first, duplicate=True)
    assert len(submitted(log)) == 1 and svc.duplicates == 1
    stored = log.streams["WORKLOADS"][0]
    assert stored.headers[s.REQUEST_ID_HEADER] == "r1"


@pytest.mark.parametrize("request_id", ["x" * 65, "two words", "a\nb", ""])
async def test_a_request_id_that_is_not_a_name_is_not_logged(request_id: str) -> None:
    """Hostile headers never reach the log: the id is then as if absent (a retry's
    answer says duplicate, as without the header)."""
    log = await seeded_log()
    svc = intake(log)
    REQUEST_HEADERS.set({s.REQUEST_ID_HEADER: request_id})
    async with running(svc):
        first = await submit(svc, s.submit_as("nlp", "ann"), submission())
        again = await submit(svc, s.submit_as("nlp", "ann"), submission())
    assert isinstance(first, m.WorkloadAccepted) and not first.duplicate
    assert isinstance(again, m.WorkloadAccepted) and again.duplicate
    assert s.REQUEST_ID_HEADER not in log.streams["WORKLOADS"][0].headers


async def test_a_client_id_reused_with_other_values_is_refused_naming_them() -> None:
    log = await seeded_log()
    svc = intake(log)
    async with running(svc):
        await submit(svc, s.submit_as("nlp", "ann"), submission(gpus=1))
        answer = await submit(svc, s.submit_as("nlp", "ann"), submission(gpus=2, priority=3))
    assert isinstance(answer, m.WorkloadRejected)
    assert answer.field == "client_id"
    assert "gpus 1, not 2" in answer.reason
    assert "priority 0, not 3" in answer.reason
    assert len(submitted(log)) == 1


async def test_a_batch_answers_each_item_in_order_naming_the_items_field() -> None:
    log = await seeded_log()
    svc = intake(log)
    batch = m.SubmitBatch(workloads=(submission("c1"), submission("c2", gpus=99), submission("c3")))
    async with running(svc):
        data = await svc.on_submit(s.submit_as("nlp", "ann"), msgspec.json.encode(batch))
    answer = msgspec.json.decode(data, type=m.SubmitBatchAnswered)
    ok1, bad, ok3 = answer.results
    assert isinstance(ok1, m.WorkloadAccepted) and ok1.client_id == "c1"
    assert isinstance(bad, m.WorkloadRejected) and bad.field == "workloads[1].gpus"
    assert isinstance(ok3, m.WorkloadAccepted) and ok3.at > ok1.at  # the batch's order kept
    assert sorted(r.client_id for r in submitted(log)) == ["c1", "c3"]  # type: ignore[attr-defined]


# -- cancels ----------------------------------------------------------------------------------

SUBMITTED = m.WorkloadSubmitted(
    workload_id=W, client_id="c1", user="ann", gpus=1, allocation="nlp", at=NOW - 30
)
COMPLETED = m.WorkloadCompleted(workload_id=W, allocation="nlp", at=NOW - 10)
CANCELLED = m.WorkloadCancelled(workload_id=W, allocation="nlp", at=NOW - 10, by="ann")


def cancel(user: str = "ann", **kw: object) -> m.CancelWorkload:
    return m.CancelWorkload(workload_id=kw.pop("workload_id", W), user=user, **kw)  # type: ignore[arg-type]


CANCELS = [
    # (what the log holds, subject, body, the field refused or the accepted detail's end)
    pytest.param(
        [SUBMITTED],
        s.cancel_as("nlp", W, "ann"),
        cancel(),
        "logged",
        id="the owner cancels on its own login's subject",
    ),
    pytest.param(
        [SUBMITTED],
        s.cancel_as("nlp", W, "ops", s.OPERATOR),
        cancel("ops"),
        "logged",
        id="an operator cancels someone else's workload",
    ),
    pytest.param(
        [SUBMITTED],
        s.cancel_as("nlp", W, "bob"),
        cancel("bob"),
        "user",
        id="another user may not cancel it",
    ),
    pytest.param(
        [SUBMITTED],
        s.cancel_as("nlp", W, "bob"),
        cancel("ann"),
        "user",
        id="a user other than the subject's login",
    ),
    pytest.param(
        [],
        s.cancel_as("nlp", W, "ann"),
        cancel(),
        "workload_id",
        id="an unknown workload",
    ),
    pytest.param(
        [SUBMITTED],
        s.cancel_as("nlp", W, "ann"),
        cancel(workload_id="w0000000000000000"),
        "workload_id",
        id="a workload other than the subject's",
    ),
    pytest.param(
        [SUBMITTED],
        s.cancel_as("vision", W, "ann"),
        cancel(allocation="nlp"),
        "allocation",
        id="an allocation other than the subject's",
    ),
    pytest.param(
        [SUBMITTED, COMPLETED],
        s.cancel_as("nlp", W, "ann"),
        cancel(),
        "workload_id",
        id="a workload that has ended otherwise",
    ),
    pytest.param(
        [SUBMITTED, CANCELLED],
        s.cancel_as("nlp", W, "ann"),
        cancel(),
        "nothing new logged",
        id="a cancelled workload is answered as cancelled",
    ),
]


@pytest.mark.parametrize(("held", "subject", "body", "outcome"), CANCELS)
async def test_a_cancel_is_judged_by_its_subject_and_the_log(
    held: list[msgspec.Struct], subject: str, body: m.CancelWorkload, outcome: str
) -> None:
    log = await seeded_log()
    await log.seed_events("nlp", *held)
    svc = intake(log)
    async with running(svc) as br:
        reply = await ask(br, subject, body, Reply)
    requested = log.records("WORKLOADS", m.CancelRequested)
    if isinstance(reply, m.CommandAccepted):
        assert reply.detail.endswith(outcome), reply
        assert requested == (
            []
            if outcome == "nothing new logged"
            else [m.CancelRequested(workload_id=W, allocation="nlp", by=body.user, at=NOW)]
        )
    else:
        assert reply.field == outcome, reply
        assert requested == []


async def test_a_second_cancel_is_accepted_and_logs_nothing_new() -> None:
    log = await seeded_log()
    await log.seed_events("nlp", SUBMITTED)
    svc = intake(log)
    async with running(svc) as br:
        first = await ask(br, s.cancel_as("nlp", W, "ann"), cancel(), Reply)
        second = await ask(br, s.cancel_as("nlp", W, "ann"), cancel(), Reply)
    assert isinstance(first, m.CommandAccepted) and first.detail == f"cancel of {W} logged"
    assert isinstance(second, m.CommandAccepted)
    assert second.detail == f"cancel of {W} already requested; nothing new logged"
    assert len(log.records("WORKLOADS", m.CancelRequested)) == 1


@pytest.mark.parametrize(
    ("allocation", "min_runtime_s", "allocated", "note"),
    [
        ("nlp", 600, True, ""),
        ("nlp", 0, False, "min_runtime_s is 0"),
        (None, 600, False, "min_runtime_s 600 protects nothing without an allocation"),
        (None, 0, False, ""),
    ],
)
async def test_the_answer_says_whether_the_work_is_allocated_and_why_not(
    allocation: str | None, min_runtime_s: int, allocated: bool, note: str
) -> None:
    """Allocated (protected, charged) takes an allocation AND a minimum runtime; a raw client
    giving only one of them learns from the answer that its work runs unallocated."""
    log = await seeded_log()
    svc = intake(log)
    cmd = submission(allocation=allocation, min_runtime_s=min_runtime_s)
    async with running(svc):
        answer = await submit(svc, s.submit_as(s.allocation_token(allocation), "ann"), cmd)
    assert isinstance(answer, m.WorkloadAccepted)
    assert answer.allocated is allocated
    assert (note in answer.note) if note else answer.note == ""


async def test_an_allocation_left_out_is_the_subjects() -> None:
    log = await seeded_log()
    svc = intake(log)
    cmd = submission(allocation=None, min_runtime_s=60)
    async with running(svc):
        answer = await submit(svc, s.submit_as("nlp", "ann"), cmd)
        free = await submit(
            svc, s.submit_as(s.UNALLOCATED, "ann"), submission("c2", allocation=None)
        )
    assert isinstance(answer, m.WorkloadAccepted) and answer.allocation == "nlp"
    assert answer.workload_id == W and answer.allocated
    assert isinstance(free, m.WorkloadAccepted) and free.allocation is None


async def test_a_tree_in_the_log_not_yet_read_is_waited_for() -> None:
    """The ranking service bootstraps the tree while intake starts: a submission that
    arrives after the tree was appended but before intake's follower handed it over waits
    for it instead of being refused (a stack just said to be ready refused one so)."""
    log = MemoryLog()
    for host in ("h1", "h2"):
        await log.seed(s.host_state(host), m.HostRegistered(host=host, gpus=8, at=NOW - 60))
    svc = intake(log)
    async with running(svc):
        assert svc.fold.tree is None
        await log.seed(s.BUDGET_TREE, m.BudgetTreeSet(at=NOW - 1, by="test", tree=TREE))
        assert svc.fold.tree is None  # appended, not handed over yet
        answer = await submit(svc, s.submit_as("nlp", "ann"), submission())
    assert isinstance(answer, m.WorkloadAccepted), answer


async def test_with_no_tree_in_the_log_a_submission_is_refused_at_once() -> None:
    log = MemoryLog()
    await log.seed(s.host_state("h1"), m.HostRegistered(host="h1", gpus=8, at=NOW - 60))
    svc = intake(log)
    async with running(svc):
        answer = await submit(svc, s.submit_as("nlp", "ann"), submission())
    assert isinstance(answer, m.WorkloadRejected)
    assert (answer.field, answer.reason) == ("allocation", "no budget tree has been set yet")
