"""The SDK and the live CLI commands against a real NATS server.

The services are not needed: each test stands up minimal responders (plain nats-py
subscriptions on the request subjects answering fixed, valid replies) and publishes log
records into the WORKLOADS stream itself.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from allot import bus
from allot.adapters.embedded import EmbeddedNats
from allot.bus.log_watch import LogWatchServer
from allot.cli import live_cmds
from allot.core.errors import ValidationError
from allot.proto import codec, subjects
from allot.proto import messages as m
from allot.proto.subjects import Kind
from allot.sdk import (
    BadReplyError,
    Client,
    CommandRejectedError,
    NoResponderError,
    NotConnectedError,
    RequestTimeoutError,
    SubmitRejectedError,
    UnknownWorkloadError,
)
from allot.sdk.client import confirm_subscriptions

pytestmark = pytest.mark.integration

NOW = 1_800_000_000.0
Reply = Callable[[Msg], msgspec.Struct | bytes | None]


class Responders:
    """Fixed-answer stand-ins for the services; records every request it gets."""

    def __init__(self, nc: NatsClient) -> None:
        self.nc = nc
        self.seen: list[tuple[str, bytes]] = []

    async def answer(self, subject: str, reply: Reply) -> None:
        async def cb(msg: Msg) -> None:
            self.seen.append((msg.subject, msg.data))
            out = reply(msg)
            if out is None:
                return  # stay silent: the client times out
            await msg.respond(out if isinstance(out, bytes) else codec.encode(out))

        await self.nc.subscribe(subject, cb=cb)
        await confirm_subscriptions(self.nc)  # one flush is not enough with nats-py 2.16

    def bodies(self, kind: Kind) -> list[Any]:
        return [codec.decode(kind, data) for _, data in self.seen]


@pytest.fixture
async def responders(fresh_log: str) -> AsyncIterator[Responders]:
    """The stand-ins, and the real watch server (intake's), which a watch asks for its
    consumers."""
    nc = await nats.connect(fresh_log)
    watches = LogWatchServer(nc, nc.jetstream(), time.time)
    await watches.start()
    yield Responders(nc)
    await watches.stop()
    await nc.close()


@pytest.fixture
async def client(fresh_log: str) -> AsyncIterator[Client]:
    async with Client(fresh_log, name="test-sdk", timeout=2.0) as c:
        yield c


def accept_submit(msg: Msg) -> m.WorkloadAccepted:
    """Intake's answer: the id derives from the client id; a second one is a duplicate."""
    body = codec.decode(Kind.SUBMIT, msg.data)
    assert isinstance(body, m.SubmitWorkload)
    accept_submit.seen.setdefault(body.client_id, 0)  # type: ignore[attr-defined]
    accept_submit.seen[body.client_id] += 1  # type: ignore[attr-defined]
    return m.WorkloadAccepted(
        workload_id=f"wl-{body.client_id}",
        client_id=body.client_id,
        allocation=body.allocation,
        at=NOW,
        duplicate=accept_submit.seen[body.client_id] > 1,  # type: ignore[attr-defined]
    )


@pytest.fixture(autouse=True)
def _reset_intake() -> None:
    accept_submit.seen = {}  # type: ignore[attr-defined]


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


# -- commands -----------------------------------------------------------------------------------


async def test_submit_encodes_the_body_and_repeats_as_duplicate(
    responders: Responders, client: Client
) -> None:
    await responders.answer(subjects.submit_as("nlp", "ann"), accept_submit)
    first = await client.submit(
        client_id="job-1",
        user="ann",
        gpus=8,
        allocation="nlp",
        min_runtime_s=7200,
        resumable=False,
        kind="eval",
        priority=3,
        command=("python", "train.py"),
        duration_s=90.0,
    )
    again = await client.submit(client_id="job-1", user="ann", gpus=8, allocation="nlp")
    assert (first.workload_id, first.duplicate) == ("wl-job-1", False)
    assert (again.workload_id, again.duplicate) == ("wl-job-1", True)
    body = responders.bodies(Kind.SUBMIT)[0]
    assert body == m.SubmitWorkload(
        client_id="job-1",
        user="ann",
        gpus=8,
        allocation="nlp",
        min_runtime_s=7200,
        resumable=False,
        kind="eval",
        priority=3,
        command=("python", "train.py"),
        duration_s=90.0,
    )


async def test_submit_without_client_id_gets_a_fresh_one_and_unallocated_subject(
    responders: Responders, client: Client
) -> None:
    await responders.answer(subjects.submit_as(None, "ann"), accept_submit)
    a = await client.submit(user="ann", gpus=1)
    b = await client.submit(user="ann", gpus=1)
    assert a.client_id != b.client_id
    assert len(a.client_id) == 16 and int(a.client_id, 16) >= 0
    assert [s for s, _ in responders.seen] == ["allot.v1.submit.~.ann"] * 2


async def test_rejection_becomes_a_validation_error_naming_the_field(
    responders: Responders, client: Client
) -> None:
    await responders.answer(
        subjects.submit_as("nlp", "ann"),
        lambda msg: m.WorkloadRejected(
            client_id="job-2", at=NOW, field="gpus", reason="more than the cluster's 64"
        ),
    )
    with pytest.raises(SubmitRejectedError) as err:
        await client.submit(client_id="job-2", user="ann", gpus=100, allocation="nlp")
    assert isinstance(err.value, ValidationError)
    assert (err.value.field, err.value.reason) == ("gpus", "more than the cluster's 64")
    assert err.value.client_id == "job-2"


async def test_bad_values_fail_locally_naming_the_field(
    responders: Responders, client: Client
) -> None:
    await responders.answer(subjects.submit_as("nlp", "ann"), accept_submit)
    with pytest.raises(ValidationError) as err:
        await client.submit(client_id="j", user="ann", gpus=0, allocation="nlp")
    assert err.value.field == "gpus"
    with pytest.raises(ValidationError) as err:
        await client.submit(client_id="j", user="a b", gpus=1, allocation="nlp")
    assert err.value.field == "user"
    with pytest.raises(ValidationError) as err:
        await client.submit(client_id="j", user="ann", gpus=1, allocation="n.lp")
    assert err.value.field == "allocation"
    # msgspec writes NaN as null: it was sent and read as "no duration".
    for bad in (math.nan, math.inf):
        with pytest.raises(ValidationError) as err:
            await client.submit(client_id="j", user="ann", gpus=1, allocation="nlp", duration_s=bad)
        assert err.value.field == "duration_s" and "finite" in err.value.reason
    item = m.SubmitWorkload(client_id="j", user="ann", gpus=1, duration_s=math.nan)
    with pytest.raises(ValidationError) as err:
        await client.submit_batch([item])
    assert err.value.field == "workloads[0].duration_s"
    assert responders.seen == []


async def test_a_lost_reply_is_retried_with_the_same_client_id(
    fresh_log: str, responders: Responders
) -> None:
    calls = 0

    def drop_first(msg: Msg) -> msgspec.Struct | None:
        nonlocal calls
        calls += 1
        return None if calls == 1 else accept_submit(msg)

    await responders.answer(subjects.submit_as("nlp", "ann"), drop_first)
    async with Client(fresh_log, timeout=0.3, retries=2) as c:
        reply = await c.submit(user="ann", gpus=2, allocation="nlp")
    ids = [b.client_id for b in responders.bodies(Kind.SUBMIT)]
    assert len(ids) == 2 and ids[0] == ids[1] == reply.client_id
    assert responders.seen[0][1] == responders.seen[1][1]  # the same bytes


async def test_a_silent_service_times_out_after_the_retries(
    fresh_log: str, responders: Responders
) -> None:
    await responders.answer(subjects.QUERY_QUEUE, lambda msg: None)
    async with Client(fresh_log, timeout=0.2, retries=1) as c:
        with pytest.raises(RequestTimeoutError, match="2 attempts"):
            await c.queue()
    assert len(responders.seen) == 2


async def _swallow_first_then_leave(url: str, subject: str) -> tuple[NatsClient, list[bytes]]:
    """A service that takes the first request and dies before answering it (its
    connection closes): what a killed intake looks like to the client."""
    nc = await nats.connect(url)
    seen: list[bytes] = []

    async def cb(msg: Msg) -> None:
        seen.append(msg.data)
        await nc.close()

    await nc.subscribe(subject, cb=cb)
    await confirm_subscriptions(nc)
    return nc, seen


async def test_no_responder_after_an_unanswered_attempt_is_not_a_definite_failure(
    fresh_log: str,
) -> None:
    subject = subjects.submit_as("nlp", "ann")
    _, seen = await _swallow_first_then_leave(fresh_log, subject)
    async with Client(fresh_log, timeout=0.3, retries=1) as c:
        t0 = time.monotonic()
        # The first attempt reached a service that may have queued it: "nobody listens
        # now" must end as an unknown outcome, never as NoResponderError ("not done").
        with pytest.raises(RequestTimeoutError):
            await c.submit(client_id="gone-1", user="ann", gpus=1, allocation="nlp")
        assert time.monotonic() - t0 < 3.0
    assert len(seen) == 1


async def test_a_request_rides_through_a_service_restart(
    fresh_log: str, responders: Responders
) -> None:
    subject = subjects.submit_as("nlp", "ann")
    _, seen = await _swallow_first_then_leave(fresh_log, subject)
    async with Client(fresh_log, timeout=1.0, retries=2) as c:
        task = asyncio.create_task(
            c.submit(client_id="restart-1", user="ann", gpus=1, allocation="nlp")
        )
        while not seen:
            await asyncio.sleep(0.01)
        # Past the first attempt's timeout (1 s): nobody listens; the client asks again
        # until 1 s after that timeout, so the service comes back well within.
        await asyncio.sleep(1.2)
        await responders.answer(subject, accept_submit)  # the service is back
        reply = await asyncio.wait_for(task, 5.0)
    assert reply.client_id == "restart-1"
    assert seen[0] == responders.seen[0][1]  # the same bytes, asked again


async def test_no_responder_says_what_to_start(client: Client) -> None:
    with pytest.raises(NoResponderError) as err:
        await client.queue()
    assert str(err.value) == (
        "no placement leader answered allot.v1.query.queue: is the stack running? (allot up)"
    )


async def test_an_unexpected_reply_is_a_bad_reply(responders: Responders, client: Client) -> None:
    await responders.answer(subjects.QUERY_HOSTS, lambda msg: m.CommandAccepted(at=NOW))
    with pytest.raises(BadReplyError, match=r"placement leader answered allot\.v1\.query\.hosts"):
        await client.hosts()


async def _watch_unlogged(c: Client) -> None:
    """A watch of a workload the log has no record of: it asks the leader about it."""
    async for _ in c.watch("wl-x", "nlp", missing_after=0.2, idle_timeout=2.0):
        pass


@pytest.mark.parametrize(
    ("subject", "call", "field"),
    [
        pytest.param(
            subjects.QUERY_STATUS,
            lambda c: c.status("wl-a"),
            "workload_id",
            id="status: the leader refuses the id",
        ),
        pytest.param(
            subjects.query_scoped(subjects.QUERY_STATUS, "nlp"),
            _watch_unlogged,
            "workload_id",
            id="watch: the leader refuses the id it is asked about",
        ),
        pytest.param(
            subjects.QUERY_SHARE, lambda c: c.share(), "ranking", id="share before any ranking"
        ),
        pytest.param(
            subjects.QUERY_QUEUE, lambda c: c.queue(), "body", id="queue: any query may be refused"
        ),
    ],
)
async def test_a_refused_query_is_a_validation_error_naming_the_field(
    responders: Responders,
    client: Client,
    subject: str,
    call: Callable[[Client], Any],
    field: str,
) -> None:
    """It was a ``BadReplyError`` ("unexpected message"), and a watch took it for a leader
    with nothing to say and waited out its idle timeout."""
    await bus.ensure_streams(responders.nc.jetstream())
    await responders.answer(
        subject, lambda msg: m.CommandRejected(at=NOW, field=field, reason="refused here")
    )
    with pytest.raises(CommandRejectedError) as refused:
        await call(client)
    assert (refused.value.field, refused.value.reason) == (field, "refused here")


async def test_cancel_accepted_and_rejected(responders: Responders, client: Client) -> None:
    await responders.answer(
        subjects.cancel_as("nlp", "wl-a", "ann"),
        lambda msg: m.CommandAccepted(at=NOW, detail="pending"),
    )
    await responders.answer(
        subjects.cancel_as("nlp", "wl-b", "bob"),
        lambda msg: m.CommandRejected(at=NOW, field="user", reason="not the submitter"),
    )
    ok = await client.cancel("wl-a", allocation="nlp", user="ann", reason="oops")
    assert ok.detail == "pending"
    with pytest.raises(CommandRejectedError) as err:
        await client.cancel("wl-b", allocation="nlp", user="bob")
    assert (err.value.field, err.value.reason) == ("user", "not the submitter")
    assert responders.bodies(Kind.CANCEL)[0] == m.CancelWorkload(
        workload_id="wl-a", user="ann", allocation="nlp", reason="oops"
    )


async def test_queries_decode_the_leaders_answers(responders: Responders, client: Client) -> None:
    status = m.WorkloadStatus(workload_id="wl-a", state="pending", allocation="nlp", position=3)
    queue = m.QueueSnapshot(
        at=NOW,
        free_gpus=4,
        rows=(
            m.QueueRow(
                position=1,
                workload_id="wl-a",
                allocation="nlp",
                user="ann",
                gpus=2,
                kind="training",
                tier="over-entitlement",
                sort_metric=1.25,
                submitted_at=NOW - 60,
            ),
        ),
    )
    hosts = m.HostsSnapshot(
        at=NOW, hosts=(m.HostRow(host="h01", state="healthy", gpus=8, free_gpus=8),), total=1
    )
    ranking = m.RankingUpdated(at=NOW, window_s=3600, nodes=())
    queries: list[bytes] = []

    def answer_status(msg: Msg) -> msgspec.Struct:
        queries.append(msg.data)
        return status

    await responders.answer(subjects.QUERY_STATUS, answer_status)
    await responders.answer(subjects.QUERY_QUEUE, lambda msg: queue)
    await responders.answer(subjects.QUERY_HOSTS, lambda msg: hosts)
    await responders.answer(subjects.QUERY_SHARE, lambda msg: ranking)
    assert await client.status("wl-a") == status
    assert msgspec.json.decode(queries[0]) == {"type": "StatusQuery", "workload_id": "wl-a"}
    assert await client.queue() == queue
    assert await client.hosts() == hosts
    assert await client.share() == ranking


async def test_hosts_reads_every_page_and_asks_each_after_the_last_host(
    responders: Responders, client: Client
) -> None:
    rows = tuple(
        m.HostRow(host=f"h{i:02d}", state="healthy", gpus=8, free_gpus=8) for i in range(5)
    )
    asked: list[bytes] = []

    def page(msg: Msg) -> msgspec.Struct:
        asked.append(msg.data)
        after = msgspec.json.decode(msg.data)["after"] if msg.data else None
        rest = [r for r in rows if after is None or r.host > after]
        return m.HostsSnapshot(at=NOW, hosts=tuple(rest[:2]), total=len(rows))

    await responders.answer(subjects.QUERY_HOSTS, page)
    got = await client.hosts()
    assert got.hosts == rows and got.total == 5
    assert asked[0] == b""
    assert [msgspec.json.decode(a) for a in asked[1:]] == [
        {"type": "HostsQuery", "after": "h01"},
        {"type": "HostsQuery", "after": "h03"},
    ]
    with pytest.raises(ValidationError, match="after"):
        await client.hosts_page(after="")


async def test_drain_undrain_and_budget_subjects_and_bodies(
    responders: Responders, client: Client
) -> None:
    accepted = m.CommandAccepted(at=NOW)
    await responders.answer(subjects.drain_as("h01", "ops"), lambda msg: accepted)
    await responders.answer(subjects.undrain_as("h01", "ops"), lambda msg: accepted)
    await responders.answer(
        subjects.budget_set_as(["root", "nlp", "pretrain"], "lead"), lambda msg: accepted
    )
    await client.drain("h01", operator="ops", reason="bad fan")
    await client.undrain("h01", operator="ops")
    await client.set_budget(("root", "nlp", "pretrain"), None, set_by="lead")
    got = [(s, msgspec.json.decode(d)) for s, d in responders.seen]
    assert got == [
        (
            "allot.v1.host.h01.drain.ops",
            {"type": "DrainHost", "host": "h01", "operator": "ops", "reason": "bad fan"},
        ),
        (
            "allot.v1.host.h01.undrain.ops",
            {"type": "UndrainHost", "host": "h01", "operator": "ops"},
        ),
        (
            "allot.v1.budget.set.by.lead.root.nlp.pretrain",
            {
                "type": "SetBudget",
                "path": ["root", "nlp", "pretrain"],
                "shares": None,
                "set_by": "lead",
            },
        ),
    ]


async def test_commands_go_to_the_logins_identity_subjects_with_its_name(
    fresh_log: str, responders: Responders, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logged in as alice (a server without auth takes any login), each command names her
    as its sender without being told, on the subject that carries her login."""
    monkeypatch.delenv("ALLOT_NATS_USER", raising=False)
    url = fresh_log.replace("nats://", "nats://alice:pw@")
    accepted = m.CommandAccepted(at=NOW)

    def accept_either(msg: Msg) -> msgspec.Struct:
        body = codec.decode(Kind.SUBMIT_AS, msg.data)
        if isinstance(body, m.SubmitBatch):
            one = m.WorkloadAccepted(at=NOW, client_id="a-2", workload_id="wl-a-2")
            return m.SubmitBatchAnswered(at=NOW, results=(one,))
        return accept_submit(msg)

    await responders.answer(subjects.submit_as("nlp", "alice"), accept_either)
    for subject in (
        subjects.cancel_as("nlp", "wl-a", "alice"),
        subjects.cancel_as("nlp", "wl-a", "alice", subjects.MANAGER),
        subjects.drain_as("h01", "alice"),
        subjects.undrain_as("h01", "alice"),
        subjects.budget_set_as(["root", "nlp"], "alice"),
    ):
        await responders.answer(subject, lambda msg: accepted)
    async with Client(url, timeout=2.0) as c:
        await c.submit(client_id="a-1", gpus=1, allocation="nlp")
        await c.submit_batch(
            [m.SubmitWorkload(client_id="a-2", user="alice", gpus=1, allocation="nlp")]
        )
        await c.cancel("wl-a", allocation="nlp")
        await c.cancel("wl-a", allocation="nlp", as_manager=True)
        await c.drain("h01")
        await c.undrain("h01")
        await c.set_budget(("root", "nlp"), 2)
    assert [subject for subject, _ in responders.seen] == [
        "allot.v1.submit.nlp.alice",
        "allot.v1.submit.nlp.alice",
        "allot.v1.cancel.nlp.wl-a.user.alice",
        "allot.v1.cancel.nlp.wl-a.manager.alice",
        "allot.v1.host.h01.drain.alice",
        "allot.v1.host.h01.undrain.alice",
        "allot.v1.budget.set.by.alice.root.nlp",
    ]
    bodies = [msgspec.json.decode(data) for _, data in responders.seen]
    assert bodies[0]["user"] == "alice" and bodies[1]["workloads"][0]["user"] == "alice"
    assert [b["user"] for b in bodies[2:4]] == ["alice", "alice"]
    assert [b["operator"] for b in bodies[4:6]] == ["alice", "alice"]
    assert bodies[6]["set_by"] == "alice"


# -- following the log --------------------------------------------------------------------------


EV = ""
"""In a story: the record's own lifecycle-event subject (``bus.event_subject``)."""


def _story(wl: str, alloc: str | None, *, requeue: bool) -> list[tuple[str, msgspec.Struct]]:
    ev, pre = EV, subjects.preempt(alloc, wl)
    one = (m.HostGpus(host="h01", gpus=(0, 1)),)
    return [
        (
            ev,
            m.WorkloadSubmitted(
                workload_id=wl, client_id="c", user="ann", gpus=2, allocation=alloc, at=NOW
            ),
        ),
        (
            ev,
            m.WorkloadPlaced(workload_id=wl, allocation=alloc, at=NOW + 1, gpus=2, assignment=one),
        ),
        (ev, m.WorkloadStarted(workload_id=wl, allocation=alloc, at=NOW + 2, host="h01")),
        (
            pre,
            m.PreemptionNotice(
                workload_id=wl,
                allocation=alloc,
                at=NOW + 3,
                reason="better-ranked",
                grace_deadline=NOW + 303,
                requeue=requeue,
                gpus=2,
            ),
        ),
        (
            ev,
            m.WorkloadPreempted(
                workload_id=wl, allocation=alloc, at=NOW + 300, reason="better-ranked"
            ),
        ),
    ]


async def _publish(js: Any, records: list[tuple[str, msgspec.Struct]]) -> None:
    for subject, record in records:
        allocation = getattr(record, "allocation")  # noqa: B009 - every story record has one
        await bus.publish(js, subject or bus.event_subject(allocation, record), record)


async def test_watch_replays_then_follows_and_stops_at_the_end(
    responders: Responders, client: Client
) -> None:
    js = responders.nc.jetstream()
    await bus.ensure_streams(js)
    story = _story("wl-a", "nlp", requeue=True)
    ev = EV
    rest: list[tuple[str, msgspec.Struct]] = [
        (ev, m.WorkloadRequeued(workload_id="wl-a", allocation="nlp", at=NOW + 301, attempt=2)),
        (
            ev,
            m.WorkloadStarted(
                workload_id="wl-a", allocation="nlp", at=NOW + 400, host="h01", attempt=2
            ),
        ),
        (ev, m.WorkloadCompleted(workload_id="wl-a", allocation="nlp", at=NOW + 500, attempt=2)),
        (ev, m.WorkloadFailed(workload_id="wl-a", allocation="nlp", at=NOW + 600)),  # after the end
    ]
    noise = _story("wl-b", "nlp", requeue=False) + _story("wl-a", "cv", requeue=False)
    await _publish(js, story[:3] + noise)

    seen: list[msgspec.Struct] = []

    async def follow() -> None:
        async for record in client.watch("wl-a", "nlp", idle_timeout=5.0):
            seen.append(record)

    task = asyncio.create_task(follow())
    await wait_for(lambda: len(seen) == 3)  # the past, replayed
    await _publish(js, story[3:] + rest)  # then live; the preemption requeues: not the end
    await asyncio.wait_for(task, 5.0)
    expected = [r for _, r in story + rest[:3]]
    assert seen == expected
    assert isinstance(seen[3], m.PreemptionNotice)  # notices in log order with the events


async def test_watch_ends_at_a_preemption_that_is_not_requeued(
    responders: Responders, client: Client
) -> None:
    js = responders.nc.jetstream()
    await bus.ensure_streams(js)
    story = _story("wl-u", None, requeue=False)
    await _publish(js, story)
    seen = [r async for r in client.watch("wl-u", None, idle_timeout=5.0)]
    assert seen == [r for _, r in story]


async def test_watch_with_nothing_to_say_times_out_when_asked(
    responders: Responders, client: Client
) -> None:
    await bus.ensure_streams(responders.nc.jetstream())
    with pytest.raises(RequestTimeoutError):
        async for _ in client.watch("wl-none", "nlp", idle_timeout=0.2):
            pass


async def test_watch_of_a_workload_neither_the_log_nor_the_leader_knows_is_an_error(
    responders: Responders, client: Client
) -> None:
    """A mistyped id or allocation is refused naming workload_id instead of waited for
    forever. A workload the leader knows, an allocation no leader answers for, or records
    in the log keep the watch on the log."""
    js = responders.nc.jetstream()
    await bus.ensure_streams(js)

    def status(msg: Msg) -> m.WorkloadStatus:
        wid = msgspec.json.decode(msg.data, type=m.StatusQuery).workload_id
        return m.WorkloadStatus(workload_id=wid, state="pending" if wid == "wl-k" else "unknown")

    await responders.answer(subjects.query_scoped(subjects.QUERY_STATUS, "nlp"), status)
    began = time.monotonic()
    with pytest.raises(UnknownWorkloadError) as refused:
        async for _ in client.watch("wl-x", "nlp", missing_after=0.3, idle_timeout=10.0):
            pass
    assert (refused.value.field, refused.value.reason) == (
        "workload_id",
        "no workload 'wl-x' in allocation 'nlp' (the log has no record)",
    )
    assert time.monotonic() - began < 5.0
    for wid, allocation in (("wl-k", "nlp"), ("wl-x", None)):  # known; nobody to ask
        with pytest.raises(RequestTimeoutError):
            async for _ in client.watch(wid, allocation, missing_after=0.2, idle_timeout=1.0):
                pass
    story = _story("wl-y", "nlp", requeue=False)  # the leader says unknown; the log has it
    await _publish(js, story)
    seen = [r async for r in client.watch("wl-y", "nlp", missing_after=0.2, idle_timeout=5.0)]
    assert seen == [r for _, r in story]
    # Unallocated work, named "~" as on the subjects, is worded as such; bad arguments are
    # refused naming them.
    await responders.answer(subjects.query_scoped(subjects.QUERY_STATUS, None), status)
    with pytest.raises(UnknownWorkloadError, match="no workload 'wl-x' in unallocated work"):
        async for _ in client.watch("wl-x", "~", missing_after=0.2, idle_timeout=10.0):
            pass
    for wid, after, field in (("w.x", 1.0, "workload_id"), ("wl-x", -1.0, "missing_after")):
        with pytest.raises(ValidationError) as bad:
            async for _ in client.watch(wid, "nlp", missing_after=after):
                pass
        assert bad.value.field == field


async def test_watch_asks_the_leader_again_after_an_ask_that_got_no_answer(
    fresh_log: str, responders: Responders
) -> None:
    """A failover while a mistyped id is watched: the first ask is not answered; the watch
    asks again instead of waiting forever."""
    await bus.ensure_streams(responders.nc.jetstream())
    asked: list[str] = []

    def status(msg: Msg) -> m.WorkloadStatus | None:
        asked.append(msg.subject)
        if len(asked) == 1:
            return None  # no leader for a moment: this ask times out
        wid = msgspec.json.decode(msg.data, type=m.StatusQuery).workload_id
        return m.WorkloadStatus(workload_id=wid, state="unknown")

    await responders.answer(subjects.query_scoped(subjects.QUERY_STATUS, "nlp"), status)
    async with Client(fresh_log, name="test-sdk", timeout=2.0, retries=0) as c:
        with pytest.raises(UnknownWorkloadError):
            async for _ in c.watch("wl-x", "nlp", missing_after=0.3, idle_timeout=20.0):
                pass
    assert len(asked) == 2


async def test_on_preemption_calls_back_sync_and_async(
    responders: Responders, client: Client
) -> None:
    js = responders.nc.jetstream()
    await bus.ensure_streams(js)
    mine: list[m.PreemptionNotice] = []
    team: list[m.PreemptionNotice] = []
    everyone: list[m.PreemptionNotice] = []

    async def checkpoint(notice: m.PreemptionNotice) -> None:
        mine.append(notice)

    def boom(notice: m.PreemptionNotice) -> None:
        raise RuntimeError("a broken callback must not stop the subscription")

    h_mine = await client.on_preemption(checkpoint, allocation="nlp", workload_id="wl-a")
    await client.on_preemption(team.append, allocation="nlp")
    await client.on_preemption(everyone.append)
    await client.on_preemption(boom)

    def notice(alloc: str | None, wl: str) -> m.PreemptionNotice:
        return m.PreemptionNotice(
            workload_id=wl,
            allocation=alloc,
            at=NOW,
            reason="reclaimed-for-entitlement",
            grace_deadline=NOW + 300,
            requeue=True,
            gpus=4,
            preemptor="wl-x",
        )

    a, b, c = notice("nlp", "wl-a"), notice("nlp", "wl-b"), notice(None, "wl-c")
    await _publish(js, [(subjects.preempt(n.allocation, n.workload_id), n) for n in (a, b, c)])
    await wait_for(lambda: len(everyone) == 3 and len(team) == 2 and len(mine) == 1)
    assert mine == [a] and team == [a, b] and everyone == [a, b, c]

    # Another workload's notice replayed onto wl-a's subject (an old record steered there:
    # docs/security.md) reaches no callback, nor does one whose allocation differs.
    await _publish(
        js,
        [
            (subjects.preempt("nlp", "wl-a"), b),
            (subjects.preempt("nlp", "wl-a"), notice("vision", "wl-a")),
            (subjects.preempt("nlp", "wl-b"), b),
        ],
    )
    await wait_for(lambda: len(everyone) == 4)
    assert mine == [a] and team == [a, b, b] and everyone == [a, b, c, b]

    await h_mine.unsubscribe()
    await confirm_subscriptions(client.nc)
    await _publish(js, [(subjects.preempt("nlp", "wl-a"), a)])
    await wait_for(lambda: len(everyone) == 5)
    assert mine == [a]


async def test_on_preemption_for_a_workload_in_any_allocation(
    responders: Responders, client: Client
) -> None:
    got: list[m.PreemptionNotice] = []
    await client.on_preemption(got.append, workload_id="wl-z")
    n = m.PreemptionNotice(
        workload_id="wl-z",
        at=NOW,
        reason="displaced-unallocated",
        grace_deadline=NOW + 30,
        requeue=False,
        gpus=1,
    )
    await responders.nc.publish(subjects.preempt(None, "wl-z"), codec.encode(n))
    await wait_for(lambda: got == [n])


# -- the CLI ------------------------------------------------------------------------------------


async def cli(url: str, *argv: str) -> int:
    """``allot ARGV`` (the live commands) in a thread: it runs its own event loop."""
    # The url goes right after the command name: anything after "--" is the workload's.
    head = 2 if argv[0] == "budgets" else 1
    return await asyncio.to_thread(live_cmds.main, [*argv[:head], "--nats-url", url, *argv[head:]])


async def test_cli_submit_json_envelope(
    fresh_log: str, responders: Responders, capsys: pytest.CaptureFixture[str]
) -> None:
    await responders.answer(subjects.submit_as("nlp", "ann"), accept_submit)
    argv = ["submit", "--alloc", "nlp", "--user", "ann", "--gpus", "4", "--min-runtime", "2h"]
    argv += ["--client-id", "cli-1", "--duration", "90s", "--json", "--", "python", "-m", "x"]
    assert await cli(fresh_log, *argv) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["kind"] == "WorkloadAccepted" and env["at"] == NOW
    assert env["data"]["workload_id"] == "wl-cli-1" and env["data"]["duplicate"] is False
    body = responders.bodies(Kind.SUBMIT)[0]
    assert (body.min_runtime_s, body.duration_s, body.command) == (
        7200,
        90.0,
        ("python", "-m", "x"),
    )

    assert await cli(fresh_log, *argv[:-5]) == 0  # same client id, text output
    assert capsys.readouterr().out.strip() == "wl-cli-1 (duplicate)"


async def test_cli_rejection_is_one_line_naming_the_option(
    fresh_log: str, responders: Responders, capsys: pytest.CaptureFixture[str]
) -> None:
    await responders.answer(
        subjects.submit_as("nlp", "ann"),
        lambda msg: m.WorkloadRejected(at=NOW, field="gpus", reason="more than the cluster's 64"),
    )
    code = await cli(
        fresh_log, "submit", "--alloc", "nlp", "--user", "ann", "--gpus", "100", "--", "true"
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["allot submit: --gpus: more than the cluster's 64"]


async def test_cli_tables_and_commands(
    fresh_log: str, responders: Responders, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = m.HostsSnapshot(
        at=NOW,
        hosts=(m.HostRow(host="h01", state="draining", gpus=8, free_gpus=6, workloads=("wl-a",)),),
        total=1,
    )
    await responders.answer(subjects.QUERY_HOSTS, lambda msg: hosts)
    await responders.answer(subjects.drain_as("h01", "ops"), lambda msg: m.CommandAccepted(at=NOW))
    await responders.answer(
        subjects.budget_set_as(["root", "nlp"], "lead"),
        lambda msg: m.CommandRejected(at=NOW, field="shares", reason="not yours to set"),
    )
    assert await cli(fresh_log, "hosts") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["HOST", "STATE", "GPUS", "FREE", "LANE", "WORKLOADS"]
    assert lines[2].split() == ["h01", "draining", "8", "6", "-", "wl-a"]

    assert await cli(fresh_log, "drain", "h01", "--operator", "ops", "--json") == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "CommandAccepted"

    assert await cli(fresh_log, "budgets", "set", "root/nlp", "parent", "--by", "lead") == 2
    assert capsys.readouterr().err.strip() == "allot budgets: SHARES: not yours to set"
    assert msgspec.json.decode(responders.seen[-1][1])["shares"] is None

    assert await cli(fresh_log, "queue") == 1  # nobody answers: one line, exit 1
    err = capsys.readouterr().err.strip().splitlines()
    # The CLI names the server asked (a shell without allot up's export asks the default).
    assert err == [
        "allot queue: no placement leader answered allot.v1.query.queue: is the stack "
        f"running? (allot up) [asked {fresh_log}; allot up prints the URL to export]"
    ]


async def test_cli_watch_prints_one_line_per_event(
    fresh_log: str, responders: Responders, capsys: pytest.CaptureFixture[str]
) -> None:
    js = responders.nc.jetstream()
    await bus.ensure_streams(js)
    story = _story("wl-w", "nlp", requeue=False)
    await _publish(js, story)
    assert await cli(fresh_log, "watch", "wl-w", "--alloc", "nlp") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == [type(r).__name__ for _, r in story]
    assert await cli(fresh_log, "watch", "wl-w", "--alloc", "nlp", "--json") == 0
    kinds = [json.loads(line)["kind"] for line in capsys.readouterr().out.splitlines()]
    assert kinds == [type(r).__name__ for _, r in story]


def _idle_record(
    wl: str, *, cleared: bool = False
) -> m.WorkloadFlaggedIdle | m.WorkloadIdleCleared:
    if cleared:
        return m.WorkloadIdleCleared(
            workload_id=wl,
            allocation="nlp",
            gpus=2,
            at=NOW + 200,
            idle_since=NOW + 2,
            until=NOW + 200,
            why="busy",
            idle_gpu_seconds=396.0,
        )
    return m.WorkloadFlaggedIdle(
        workload_id=wl,
        allocation="nlp",
        user="ann",
        gpus=2,
        at=NOW + 100,
        idle_since=NOW + 2,
        threshold_pct=5.0,
        window_s=60.0,
        reason="every GPU below 5% for 1m38s",
    )


async def test_cli_watch_prints_the_workloads_idle_flags_among_its_events(
    fresh_log: str, responders: Responders, capsys: pytest.CaptureFixture[str]
) -> None:
    """``allot watch`` of an allocation's workload also follows its idle subject: each flag
    and clear the health service appends from then on is a line among the events (another
    workload's flags are not)."""
    js = responders.nc.jetstream()
    await bus.ensure_streams(js)
    story = _story("wl-i", "nlp", requeue=False)
    await _publish(js, story[:3])
    out: list[str] = []

    async def lines(n: int) -> None:
        def enough() -> bool:
            out.extend(capsys.readouterr().out.splitlines())
            return len(out) >= n

        await wait_for(enough, timeout=10.0)

    watching = asyncio.create_task(cli(fresh_log, "watch", "wl-i", "--alloc", "nlp"))
    await lines(3)  # the past replayed: the idle subscription came before it
    await bus.publish(js, subjects.idle("nlp", "wl-other"), _idle_record("wl-other"))
    await bus.publish(js, subjects.idle("nlp", "wl-i"), _idle_record("wl-i"))
    await lines(4)
    await bus.publish(js, subjects.idle("nlp", "wl-i"), _idle_record("wl-i", cleared=True))
    await lines(5)
    await _publish(js, story[3:])  # the notice, then its end: not requeued, the watch ends
    assert await asyncio.wait_for(watching, 30.0) == 0
    out.extend(capsys.readouterr().out.splitlines())
    assert [line.split()[1] for line in out] == [
        *(type(r).__name__ for _, r in story[:3]),
        "WorkloadFlaggedIdle",
        "WorkloadIdleCleared",
        *(type(r).__name__ for _, r in story[3:]),
    ]
    assert 'reason="every GPU below 5%' in out[3] and "why=busy" in out[4]
    assert "idle_since=2027-01-15T08:00:02Z" in out[3]  # times read as times


async def test_cli_status_and_watch_of_an_unknown_workload_are_errors(
    fresh_log: str, responders: Responders, capsys: pytest.CaptureFixture[str]
) -> None:
    """As ``scontrol show job`` says of an invalid id: one line naming WORKLOAD, exit 2
    (a watch would otherwise wait for records that never come)."""
    await bus.ensure_streams(responders.nc.jetstream())
    story = _story("wl-w", "nlp", requeue=False)
    await _publish(responders.nc.jetstream(), story)

    def status(msg: Msg) -> m.WorkloadStatus:
        wid = msgspec.json.decode(msg.data, type=m.StatusQuery).workload_id
        return m.WorkloadStatus(workload_id=wid, state="completed" if wid == "wl-w" else "unknown")

    for subject in (
        subjects.QUERY_STATUS,
        subjects.query_scoped(subjects.QUERY_STATUS, "nlp"),
        subjects.query_scoped(subjects.QUERY_STATUS, None),
    ):
        await responders.answer(subject, status)
    cases = [
        (("status", "wl-x"), "allot status: WORKLOAD: no workload 'wl-x'"),
        (
            ("status", "wl-x", "--alloc", "nlp"),
            "allot status: WORKLOAD: no workload 'wl-x' in allocation 'nlp'",
        ),
        (
            ("watch", "wl-x", "--alloc", "nlp"),
            "allot watch: WORKLOAD: no workload 'wl-x' in allocation 'nlp'",
        ),
        (("watch", "wl-x"), "allot watch: WORKLOAD: no workload 'wl-x' in allocation '~'"),
        (
            ("watch", "wl-x", "--alloc", "n.lp"),
            "allot watch: --alloc: 'n.lp' contains '.'; a NATS subject token may not contain "
            "'.', '*', '>' or whitespace",
        ),
    ]
    for argv, err in cases:
        assert await cli(fresh_log, *argv) == 2, argv  # a watch that waited would hang here
        out = capsys.readouterr()
        assert (out.out, out.err.strip()) == ("", err)
    assert await cli(fresh_log, "status", "wl-w") == 0
    assert "completed" in capsys.readouterr().out
    assert await cli(fresh_log, "watch", "wl-w", "--alloc", "nlp") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == [type(r).__name__ for _, r in story]


async def test_cli_watch_into_a_closed_pipe_stops_quietly(
    fresh_log: str, responders: Responders
) -> None:
    """``allot watch ... | head``: once the reader is gone, exit 141 (128 + SIGPIPE) with
    nothing on stderr, not a traceback of the pipe and of the watch's cleanup."""
    js = responders.nc.jetstream()
    await bus.ensure_streams(js)
    await _publish(js, _story("wl-p", "nlp", requeue=False))
    read, write = os.pipe()
    os.close(read)  # gone before the first line
    argv = ["watch", "wl-p", "--alloc", "nlp", "--nats-url", fresh_log]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "allot.cli.main", *argv, stdout=write, stderr=asyncio.subprocess.PIPE
    )
    os.close(write)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert (proc.returncode, err.decode()) == (141, "")


async def test_cli_a_mistyped_allocation_filter_is_an_error_not_an_empty_table(
    fresh_log: str, responders: Responders, capsys: pytest.CaptureFixture[str]
) -> None:
    """The leader refuses a per-allocation query of an allocation the budget tree lacks
    (``placement.query_scope``): one line naming ``--alloc``, exit 2. A listing of a real
    allocation with nothing pending stays an empty table, exit 0."""
    reason = "no allocation 'nlpp' in the budget tree (allocations: nlp, vision)"
    refused = m.CommandRejected(at=NOW, field="allocation", reason=reason)
    for query in (subjects.QUERY_QUEUE, subjects.QUERY_PRIO, subjects.QUERY_STATUS):
        await responders.answer(subjects.query_scoped(query, "nlpp"), lambda msg: refused)
    await responders.answer(
        subjects.query_scoped(subjects.QUERY_QUEUE, "nlp"), lambda msg: m.QueueSnapshot(at=NOW)
    )
    for command in (("queue",), ("prio",), ("status", "wl-x"), ("watch", "wl-x")):
        assert await cli(fresh_log, *command, "--alloc", "nlpp") == 2, command
        assert capsys.readouterr().err.strip() == f"allot {command[0]}: --alloc: {reason}"
    assert await cli(fresh_log, "queue", "--alloc", "nlp") == 0
    assert "0 pending" in capsys.readouterr().out


async def test_cli_tilde_names_unallocated_work_in_submit_and_cancel(
    fresh_log: str, responders: Responders, capsys: pytest.CaptureFixture[str]
) -> None:
    """The listings print and take ``~`` for unallocated work; submit and cancel take it
    too (it was refused as a name)."""
    await responders.answer(
        subjects.cancel_as(None, "wl-u", "ann"),
        lambda msg: m.CommandAccepted(at=NOW, detail="pending"),
    )
    assert await cli(fresh_log, "cancel", "wl-u", "--alloc", "~", "--user", "ann") == 0
    assert responders.bodies(Kind.CANCEL)[-1].allocation is None
    await responders.answer(
        subjects.submit_as(None, "ann"),
        lambda msg: m.WorkloadAccepted(at=NOW, client_id="c-u", workload_id="wl-u2"),
    )
    argv = ("submit", "--alloc", "~", "--user", "ann", "--gpus", "1", "--client-id", "c-u")
    assert await cli(fresh_log, *argv, "--", "true") == 0
    assert capsys.readouterr().out.split()[-1] == "wl-u2"


_ON_BEHALF: list[tuple[str, Callable[[str | None, str], str], Kind, str]] = [
    (
        "--operator",
        lambda a, w: subjects.cancel_as(a, w, "ops", subjects.OPERATOR),
        Kind.OPERATOR_CANCEL,
        "ops",
    ),
    (
        "--manager",
        lambda a, w: subjects.cancel_as(a, w, "lead", subjects.MANAGER),
        Kind.MANAGER_CANCEL,
        "lead",
    ),
]


@pytest.mark.parametrize("role", _ON_BEHALF, ids=["operator", "manager"])
async def test_cli_cancel_for_someone_else_goes_to_that_roles_subject(
    fresh_log: str,
    responders: Responders,
    capsys: pytest.CaptureFixture[str],
    role: tuple[str, Callable[[str | None, str], str], Kind, str],
) -> None:
    option, form, kind, name = role
    await responders.answer(
        form("nlp", "wl-o"), lambda msg: m.CommandAccepted(at=NOW, detail="cancel of wl-o logged")
    )
    argv = ("cancel", "wl-o", "--alloc", "nlp", option, name, "--reason", "runaway")
    assert await cli(fresh_log, *argv) == 0
    assert responders.seen[-1][0] == form("nlp", "wl-o")
    assert responders.bodies(kind)[-1] == m.CancelWorkload(
        workload_id="wl-o", user=name, allocation="nlp", reason="runaway"
    )
    assert "cancel of wl-o logged" in capsys.readouterr().out
    for other in ("--user", "--operator" if option == "--manager" else "--manager"):
        both = ("cancel", "wl-o", "--alloc", "nlp", option, name, other, "ann")
        with pytest.raises(SystemExit) as caught:  # argparse: one of --user, --operator, ...
            await cli(fresh_log, *both)
        assert caught.value.code == 2
        assert "not allowed with argument" in capsys.readouterr().err
    assert await cli(fresh_log, "cancel", "wl-o", "--alloc", "nlp", option, "") == 2
    assert f"{option}: must not be empty" in capsys.readouterr().err


async def test_cli_names_default_to_the_login_and_another_name_is_refused(
    fresh_log: str,
    responders: Responders,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ALLOT_NATS_USER", raising=False)
    url = fresh_log.replace("nats://", "nats://ops:pw@")
    done = m.CommandAccepted(at=NOW)
    for subject in (
        subjects.cancel_as("nlp", "wl-o", "ops", subjects.OPERATOR),
        subjects.drain_as("h01", "ops"),
        subjects.budget_set_as(["root", "nlp"], "ops"),
    ):
        await responders.answer(subject, lambda msg: done)
    # --operator without NAME, and no --operator or --by at all: the login's name.
    assert await cli(url, "cancel", "wl-o", "--alloc", "nlp", "--operator") == 0
    assert await cli(url, "drain", "h01") == 0
    assert await cli(url, "budgets", "set", "root/nlp", "2") == 0
    cancel, drain, budget = (msgspec.json.decode(d) for _, d in responders.seen)
    assert (cancel["user"], drain["operator"], budget["set_by"]) == ("ops", "ops", "ops")
    capsys.readouterr()
    seen = len(responders.seen)
    for argv, option in (
        (("submit", "--user", "ann", "--gpus", "1", "--", "true"), "--user"),
        (("cancel", "wl-o", "--manager", "lead"), "--manager"),
        (("drain", "h01", "--operator", "root"), "--operator"),
        (("budgets", "set", "root/nlp", "2", "--by", "lead"), "--by"),
    ):
        assert await cli(url, *argv) == 2, argv
        name = argv[argv.index(option) + 1]
        assert capsys.readouterr().err.strip() == (
            f"allot {argv[0]}: {option}: {name!r} differs from the login 'ops'"
        )
    assert len(responders.seen) == seen  # refused before anything was sent
    # Without a login the name must be given (it was a required option).
    assert await cli(fresh_log, "drain", "h01") == 2
    assert "--operator: must be given" in capsys.readouterr().err


async def test_cli_submit_says_when_an_allocation_alone_leaves_work_unallocated(
    fresh_log: str, responders: Responders, capsys: pytest.CaptureFixture[str]
) -> None:
    await responders.answer(
        subjects.submit_as("nlp", "ann"),
        lambda msg: m.WorkloadAccepted(at=NOW, client_id="c-n", workload_id="wl-n"),
    )
    argv = ("submit", "--alloc", "nlp", "--user", "ann", "--gpus", "1", "--client-id", "c-n")
    for extra, note in (((), True), (("--min-runtime", "30m"), False)):
        assert await cli(fresh_log, *argv, *extra, "--", "true") == 0
        out = capsys.readouterr()
        assert out.out.strip() == "wl-n"  # stdout stays the id alone (scripts read it)
        assert ("--min-runtime 0: this work runs unallocated" in out.err) is note, out.err


async def test_cli_submit_says_when_a_min_runtime_without_allocation_protects_nothing(
    fresh_log: str, responders: Responders, capsys: pytest.CaptureFixture[str]
) -> None:
    await responders.answer(
        subjects.submit_as(None, "ann"),
        lambda msg: m.WorkloadAccepted(at=NOW, client_id="c-u", workload_id="wl-u"),
    )
    argv = ("submit", "--user", "ann", "--gpus", "1", "--client-id", "c-u")
    for extra, note in ((("--min-runtime", "1h"), True), ((), False)):
        assert await cli(fresh_log, *argv, *extra, "--", "true") == 0
        out = capsys.readouterr()
        assert out.out.strip() == "wl-u"
        assert (
            "--min-runtime 1h protects nothing without an allocation (--alloc)" in out.err
        ) is note, out.err
    # The wire takes it (intake accepts a minimum runtime on unallocated work, unused).
    assert [b.min_runtime_s for b in responders.bodies(Kind.SUBMIT)] == [3600, 0]


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (("submit", "--user", "", "--gpus", "1", "--", "true"), "--user"),
        (("submit", "--user", "ann", "--kind", "", "--gpus", "1", "--", "true"), "--kind"),
        (("submit", "--user", "", "--gpus", "1", "--array", "2", "--", "true"), "--user"),
        (("drain", "h1", "--operator", ""), "--operator"),
        (("undrain", "h1", "--operator", ""), "--operator"),
        (("cancel", "wl-o", "--user", ""), "--user"),
        (("budgets", "set", "root/nlp", "3", "--by", ""), "--by"),
    ],
    ids=["user", "kind", "array-user", "drain", "undrain", "cancel-user", "budgets-by"],
)
async def test_cli_an_empty_name_is_one_plain_line_naming_the_option(
    fresh_log: str, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], option: str
) -> None:
    assert await cli(fresh_log, *argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"allot {argv[0]}: {option}: must not be empty (a name of letters, digits, '_' and '-')"
    ]


async def test_an_empty_allocation_from_the_agents_environment_means_unallocated(
    responders: Responders, client: Client
) -> None:
    """``ALLOT_ALLOCATION`` is empty for unallocated work; a training loop passes it on."""
    got: list[m.PreemptionNotice] = []
    await client.on_preemption(got.append, allocation="", workload_id="wl-u")
    every: list[m.PreemptionNotice] = []
    await client.on_preemption(every.append, allocation="")
    n = m.PreemptionNotice(
        workload_id="wl-u",
        at=NOW,
        reason="displaced-unallocated",
        grace_deadline=NOW + 30,
        requeue=True,
        gpus=1,
    )
    await responders.nc.publish(subjects.preempt(None, "wl-u"), codec.encode(n))
    await wait_for(lambda: got == [n] and every == [n])


async def test_a_request_while_nats_is_down_says_so_not_that_the_service_is_silent() -> None:
    server = EmbeddedNats().start()
    try:
        c = await Client.connect(server.url, timeout=0.5, retries=0)
    except BaseException:
        server.stop()
        raise
    try:
        server.stop()
        with pytest.raises(NotConnectedError, match=r"unreachable \(reconnecting\)"):
            await c.queue()
    finally:
        await c.close()


async def test_cli_watch_without_alloc_finds_the_workloads_allocation(
    fresh_log: str, responders: Responders, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user who forgot --alloc was told the workload did not exist ('in allocation ~')."""
    await bus.ensure_streams(responders.nc.jetstream())
    story = _story("wl-f", "nlp", requeue=False)
    await _publish(responders.nc.jetstream(), story)

    def status(msg: Msg) -> m.WorkloadStatus:
        wid = msgspec.json.decode(msg.data, type=m.StatusQuery).workload_id
        return m.WorkloadStatus(workload_id=wid, state="completed", allocation="nlp")

    for subject in (subjects.QUERY_STATUS, subjects.query_scoped(subjects.QUERY_STATUS, "nlp")):
        await responders.answer(subject, status)
    assert await cli(fresh_log, "watch", "wl-f") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == [type(r).__name__ for _, r in story]
