"""Idempotency at intake, against a real NATS: a ``client_id`` repeated with the same
values is a retry (``duplicate=True``, the first answer), with other values a refusal
naming ``client_id`` and the field, forever and across an intake restart; a cancel repeated
is accepted again and logs nothing new; only a workload's owner cancels it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import nats
import pytest
from live_harness import of_type, records, running_intake, seed

from allot import bus
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.services.intake import workload_id

pytestmark = pytest.mark.integration

_REPLY: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
    m.WorkloadAccepted
    | m.WorkloadRejected
    | m.CommandAccepted
    | m.CommandRejected
    | m.SubmitBatchAnswered
)
SUBMIT: dict[str, Any] = {
    "type": "SubmitWorkload",
    "client_id": "run-42",
    "user": "ann",
    "gpus": 1,
    "allocation": "nlp",
    "min_runtime_s": 600,
    "command": ["python", "train.py"],
}


@pytest.fixture
async def log_url(fresh_log: str) -> AsyncIterator[str]:
    """A fresh log with one 8-GPU host and the leaves nlp, vision (no intake yet)."""
    nc = await nats.connect(fresh_log)
    await seed(nc.jetstream(), {"h1": 8})
    await nc.close()
    yield fresh_log


async def _ask(url: str, subject: str, body: dict[str, Any]) -> Any:
    nc = await nats.connect(url)
    try:
        return _REPLY.decode((await nc.request(subject, json.dumps(body).encode(), timeout=5)).data)
    finally:
        await nc.close()


async def _submit(url: str, **changes: Any) -> Any:
    body = {**SUBMIT, **changes}
    return await _ask(url, s.submit(body["allocation"]), body)


async def _cancel(
    url: str,
    wid: str,
    user: str = "ann",
    allocation: str = "nlp",
    *,
    operator: bool = False,
    manager: bool = False,
) -> Any:
    body = {"type": "CancelWorkload", "workload_id": wid, "user": user, "allocation": allocation}
    form = s.manager_cancel if manager else s.operator_cancel if operator else s.cancel
    return await _ask(url, form(allocation, wid), body)


async def _log(url: str) -> list[msgspec.Struct]:
    nc = await nats.connect(url)
    try:
        return await records(nc.jetstream())
    finally:
        await nc.close()


async def _append(url: str, record: msgspec.Struct) -> None:
    """Write ``record`` as the service that owns it would (placement, dispatch)."""
    nc = await nats.connect(url)
    try:
        await bus.publish(nc.jetstream(), bus.event_subject("nlp", record), record)
    finally:
        await nc.close()


# -- submissions ------------------------------------------------------------------------------

REUSES = [
    pytest.param({"gpus": 2}, "gpus 1, not 2", id="more GPUs"),
    pytest.param({"user": "bob"}, "user 'ann', not 'bob'", id="another user"),
    pytest.param({"min_runtime_s": 60}, "min_runtime_s 600, not 60", id="another min runtime"),
    pytest.param(
        {"command": ["python", "eval.py"]},
        "command ['python', 'train.py'], not ['python', 'eval.py']",
        id="another command",
    ),
    pytest.param({"priority": 3}, "priority 0, not 3", id="a priority where none was given"),
    pytest.param({"resumable": False}, "resumable True, not False", id="not resumable"),
    pytest.param({"kind": "eval"}, "kind 'training', not 'eval'", id="another kind"),
    pytest.param({"duration_s": 5.0}, "duration_s unset, not 5.0", id="a duration added"),
]


@pytest.mark.parametrize(("change", "differs"), REUSES)
async def test_a_client_id_reused_with_other_values_is_refused_naming_the_field(
    log_url: str, change: dict[str, Any], differs: str
) -> None:
    async with running_intake(log_url):
        first = await _submit(log_url)
        assert isinstance(first, m.WorkloadAccepted) and not first.duplicate
        other = await _submit(log_url, **change)
        retry = await _submit(log_url)
    assert isinstance(other, m.WorkloadRejected), other
    assert other.field == "client_id" and other.client_id == "run-42"
    assert other.reason == (
        f"client_id 'run-42' was already used for a different submission ({differs})"
    )
    assert isinstance(retry, m.WorkloadAccepted) and retry.duplicate
    assert (retry.workload_id, retry.at) == (first.workload_id, first.at)
    assert [r.client_id for r in of_type(await _log(log_url), m.WorkloadSubmitted)] == ["run-42"]


async def test_the_refusal_holds_after_an_intake_restart_and_beyond_the_duplicate_window(
    log_url: str,
) -> None:
    async with running_intake(log_url):
        first = await _submit(log_url, gpus=4)
    assert isinstance(first, m.WorkloadAccepted) and not first.duplicate
    nc = await nats.connect(log_url)  # only the subject check is left to catch a repeat
    js = nc.jetstream()
    info = await js.stream_info("WORKLOADS")
    info.config.duplicate_window = 0.5
    await js.update_stream(info.config)
    await nc.close()
    await asyncio.sleep(1.0)
    async with running_intake(log_url):  # a new process: nothing in memory
        other = await _submit(log_url, gpus=8, user="bob")
        retry = await _submit(log_url, gpus=4)
    assert isinstance(other, m.WorkloadRejected) and other.field == "client_id", other
    assert "(user 'ann', not 'bob'; gpus 4, not 8)" in other.reason
    assert isinstance(retry, m.WorkloadAccepted) and retry.duplicate
    assert (retry.workload_id, retry.at) == (first.workload_id, first.at)
    assert len(of_type(await _log(log_url), m.WorkloadSubmitted)) == 1


async def test_concurrent_reuses_one_wins_the_others_are_refused_or_retries(log_url: str) -> None:
    async with running_intake(log_url):
        answers = await asyncio.gather(*(_submit(log_url, gpus=1 + i % 2) for i in range(10)))
    accepted = [a for a in answers if isinstance(a, m.WorkloadAccepted)]
    refused = [a for a in answers if isinstance(a, m.WorkloadRejected)]
    assert sum(not a.duplicate for a in accepted) == 1
    (logged,) = of_type(await _log(log_url), m.WorkloadSubmitted)
    assert len(accepted) == 5 and len(refused) == 5  # the winner's gpus: 5 each
    other = 2 if logged.gpus == 1 else 1
    assert all(r.reason.endswith(f"(gpus {logged.gpus}, not {other})") for r in refused)


# -- cancels ----------------------------------------------------------------------------------


async def _cancel_records(url: str) -> list[m.CancelRequested]:
    return of_type(await _log(url), m.CancelRequested)


async def test_a_repeated_cancel_is_accepted_and_logs_nothing_new(log_url: str) -> None:
    async with running_intake(log_url):
        sub = await _submit(log_url)
        assert isinstance(sub, m.WorkloadAccepted)
        wid = sub.workload_id
        first = await _cancel(log_url, wid)
        again = await _cancel(log_url, wid)  # still being cancelled: no one has ended it
        together = await asyncio.gather(*(_cancel(log_url, wid) for _ in range(5)))
        assert len(await _cancel_records(log_url)) == 1
        # It ends cancelled (placement's record for pending work): still accepted.
        await _append(log_url, m.WorkloadCancelled(workload_id=wid, allocation="nlp", at=1.0))
        after_end = await _cancel(log_url, wid)
    assert isinstance(first, m.CommandAccepted) and first.detail == f"cancel of {wid} logged"
    for answer in (again, *together):
        assert isinstance(answer, m.CommandAccepted), answer
        assert answer.detail == f"cancel of {wid} already requested; nothing new logged"
    assert isinstance(after_end, m.CommandAccepted), after_end
    assert after_end.detail == f"{wid} was already cancelled; nothing new logged"
    assert len(await _cancel_records(log_url)) == 1


async def test_concurrent_first_cancels_log_one_request(log_url: str) -> None:
    async with running_intake(log_url):
        sub = await _submit(log_url)
        answers = await asyncio.gather(*(_cancel(log_url, sub.workload_id) for _ in range(8)))
    assert all(isinstance(a, m.CommandAccepted) for a in answers), answers
    assert sum(a.detail.endswith(" logged") and "already" not in a.detail for a in answers) == 1
    assert len(await _cancel_records(log_url)) == 1


@pytest.mark.parametrize(
    "end",
    [
        pytest.param(m.WorkloadCompleted, id="completed"),
        pytest.param(m.WorkloadFailed, id="failed"),
    ],
)
async def test_a_cancel_of_work_that_ended_otherwise_is_refused(
    log_url: str, end: type[m.WorkloadCompleted] | type[m.WorkloadFailed]
) -> None:
    async with running_intake(log_url):
        sub = await _submit(log_url)
        await _append(log_url, end(workload_id=sub.workload_id, allocation="nlp", at=1.0))
        answer = await _cancel(log_url, sub.workload_id)
    assert isinstance(answer, m.CommandRejected) and answer.field == "workload_id", answer
    assert answer.reason == f"{sub.workload_id!r} has already ended ({m.EVENT_NAME[end]})"
    assert await _cancel_records(log_url) == []


async def test_only_the_owner_cancels(log_url: str) -> None:
    async with running_intake(log_url):
        sub = await _submit(log_url)
        wid = sub.workload_id
        mallory = await _cancel(log_url, wid, user="mallory")
        assert await _cancel_records(log_url) == []
        ann = await _cancel(log_url, wid)
        mallory_again = await _cancel(log_url, wid, user="mallory")  # even once cancelling
    assert isinstance(mallory, m.CommandRejected) and mallory.field == "user", mallory
    assert mallory.reason == (
        f"'mallory' may not cancel {wid!r}: it was submitted by 'ann', and only its owner "
        "cancels it (or an operator: allot cancel --operator, or a manager of its "
        "allocation: allot cancel --manager)"
    )
    assert isinstance(ann, m.CommandAccepted), ann
    assert isinstance(mallory_again, m.CommandRejected) and mallory_again.field == "user"
    assert [(r.workload_id, r.by) for r in await _cancel_records(log_url)] == [(wid, "ann")]


async def test_an_operator_cancels_anyones_workload_on_the_operators_subject(
    log_url: str,
) -> None:
    """``scancel`` as root: the operators' subject (granted only to operators under ``allot
    auth gen``) skips the owner check; the cancel is logged as the operator's."""
    async with running_intake(log_url):
        sub = await _submit(log_url)
        wid = sub.workload_id
        ops = await _cancel(log_url, wid, user="ops", operator=True)
        again = await _cancel(log_url, wid, user="ops", operator=True)
        unknown = await _cancel(log_url, "w-none", user="ops", operator=True)
    assert isinstance(ops, m.CommandAccepted) and ops.detail == f"cancel of {wid} logged", ops
    assert isinstance(again, m.CommandAccepted) and "already requested" in again.detail
    assert isinstance(unknown, m.CommandRejected) and unknown.field == "workload_id", unknown
    assert [(r.workload_id, r.by) for r in await _cancel_records(log_url)] == [(wid, "ops")]


async def test_a_manager_cancels_on_the_managers_subject(log_url: str) -> None:
    """A Slurm account coordinator's ``scancel``: the managers' subject (granted under
    ``allot auth gen`` only for the allocations of the manager's subtree) skips the owner
    check; the cancel is logged as the manager's. The owner's subject still refuses them."""
    async with running_intake(log_url):
        wid = (await _submit(log_url)).workload_id
        as_owner = await _cancel(log_url, wid, user="lead")
        lead = await _cancel(log_url, wid, user="lead", manager=True)
    assert isinstance(as_owner, m.CommandRejected) and as_owner.field == "user", as_owner
    assert isinstance(lead, m.CommandAccepted) and lead.detail == f"cancel of {wid} logged", lead
    assert [(r.workload_id, r.by) for r in await _cancel_records(log_url)] == [(wid, "lead")]


async def test_a_cancel_of_an_unknown_workload_names_it(log_url: str) -> None:
    async with running_intake(log_url):
        answer = await _cancel(log_url, workload_id("nlp", "never"))
    assert isinstance(answer, m.CommandRejected) and answer.field == "workload_id", answer
    assert answer.reason.startswith("no workload ")


# -- names from logins ------------------------------------------------------------------------


async def test_on_its_identity_subject_a_name_other_than_the_login_is_refused(
    log_url: str,
) -> None:
    """The subject's last token is the sender's login (what ``allot auth gen`` grants): a
    submission or cancel naming anyone else is refused naming ``user``, and nothing is
    logged; the bare subjects (the no-auth stack, old clients) check no login."""
    bob = {**SUBMIT, "user": "bob"}
    async with running_intake(log_url):
        forged = await _ask(log_url, s.submit_as("nlp", "alice"), bob)
        batch = {
            "type": "SubmitBatch",
            "workloads": [{**SUBMIT, "client_id": "b-1", "user": "alice"}, bob],
        }
        mixed = await _ask(log_url, s.submit_as("nlp", "alice"), batch)
        alice = await _ask(log_url, s.submit_as("nlp", "alice"), {**SUBMIT, "user": "alice"})
        wid = alice.workload_id
        cancels = {}
        for form, login in ((s.OWNER, "bob"), (s.OPERATOR, "ops"), (s.MANAGER, "lead")):
            body = {"type": "CancelWorkload", "workload_id": wid, "user": "alice"}
            cancels[form] = await _ask(log_url, s.cancel_as("nlp", wid, login, form), body)
        before = len(await _log(log_url))
        ok = await _ask(
            log_url,
            s.cancel_as("nlp", wid, "alice"),
            {"type": "CancelWorkload", "workload_id": wid, "user": "alice"},
        )
    assert isinstance(forged, m.WorkloadRejected), forged
    assert (forged.field, forged.reason) == ("user", "'bob' differs from the login 'alice'")
    assert isinstance(mixed, m.SubmitBatchAnswered)
    assert isinstance(mixed.results[0], m.WorkloadAccepted)
    assert isinstance(mixed.results[1], m.WorkloadRejected)
    assert mixed.results[1].field == "workloads[1].user"
    for form, answer in cancels.items():
        assert isinstance(answer, m.CommandRejected) and answer.field == "user", (form, answer)
        assert answer.reason.startswith("'alice' differs from the login ")
    assert isinstance(ok, m.CommandAccepted), ok
    log = await _log(log_url)
    # the batch's item of alice's, and her own submission; nothing of bob's
    assert [r.user for r in of_type(log, m.WorkloadSubmitted)] == ["alice", "alice"]
    assert len(log) == before + 1
    assert [(r.workload_id, r.by) for r in await _cancel_records(log_url)] == [(wid, "alice")]


async def test_a_cancel_without_allocation_means_the_subjects_and_another_is_refused_in_words(
    log_url: str,
) -> None:
    """The schema marks ``allocation`` optional: left out, it is the subject's (it was
    refused as "None does not match..."). Another allocation is refused naming it."""
    async with running_intake(log_url):
        wid = (await _submit(log_url)).workload_id
        body = {"type": "CancelWorkload", "workload_id": wid, "user": "ann"}
        other = await _ask(log_url, s.cancel("nlp", wid), {**body, "allocation": "vision"})
        unallocated = await _ask(log_url, s.cancel(None, wid), {**body, "allocation": "nlp"})
        ok = await _ask(log_url, s.cancel("nlp", wid), body)
    assert isinstance(other, m.CommandRejected) and other.field == "allocation", other
    assert other.reason == "'vision' differs from the subject's allocation, 'nlp'"
    assert isinstance(unallocated, m.CommandRejected), unallocated
    assert (
        unallocated.reason == "'nlp' differs from the subject's allocation, unallocated work ('~')"
    )
    assert isinstance(ok, m.CommandAccepted), ok
    assert [(r.workload_id, r.allocation) for r in await _cancel_records(log_url)] == [(wid, "nlp")]
