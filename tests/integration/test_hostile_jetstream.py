"""Issue 34, items 1 and 3: the JetStream API is the services' alone.

A user who may create a consumer chooses its name, filter and delivery subject. A team
re-pointed the accounting service's durable consumer to its own filter (a name it
guessed: accounting then charged nobody), and made nats-server push its records onto an
agent's work subject (past subject permissions). Now every user but the services is
denied ``$JS.>`` and each service durable by name, and reads the log through the watches
intake opens for it (``allot.bus.log_watch``). Each attempt runs as a raw nats-py client
logged in with the generated credentials, against a real nats-server (the wheel's and the
system's), and is refused by the server, logged with the user and the subject, and
changes nothing: the durable keeps its filter, no stream moves, nothing reaches the
agent's work subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import msgspec
import nats
import pytest
import test_security
from live_harness import eventually, seed
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from test_security import TREE, Conn, Secure, Spy, _no_answer, _submit, _value, connect_as, counts

from allot import bus
from allot.bus.log_watch import LogWatchServer
from allot.bus.service_main import start, stop
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sdk import Client, RequestTimeoutError
from allot.services.intake import Intake

pytestmark = pytest.mark.integration
secure = test_security.secure  # the generated config on a real nats-server (both versions)
spy = test_security.spy

DURABLE = s.ACCOUNTING_DURABLE
_WATCH_REPLY = msgspec.json.Decoder(m.WatchStarted | m.CommandRejected)
_ACCEPTED = msgspec.json.Decoder(m.WorkloadAccepted | m.WorkloadRejected)


def _api_attacks(team_filter: str) -> list[tuple[str, bytes]]:
    """What a hostile user sends to the JetStream API: (subject, body)."""
    own = {"durable_name": DURABLE, "ack_policy": "explicit", "filter_subject": team_filter}
    push = {"ack_policy": "none", "filter_subject": team_filter}
    push["deliver_subject"] = s.host_work("h01")  # the server would publish for us
    body = lambda cfg: json.dumps({"stream_name": "WORKLOADS", "config": cfg}).encode()  # noqa: E731
    return [
        # re-point accounting's durable: the filtered create form, the named and durable ones
        (f"$JS.API.CONSUMER.CREATE.WORKLOADS.{DURABLE}.{team_filter}", body(own)),
        (f"$JS.API.CONSUMER.CREATE.WORKLOADS.{DURABLE}", body(own)),
        (f"$JS.API.CONSUMER.DURABLE.CREATE.WORKLOADS.{DURABLE}", body(own)),
        (f"$JS.API.CONSUMER.DELETE.WORKLOADS.{DURABLE}", b""),
        # a push consumer delivering onto an agent's work list
        (f"$JS.API.CONSUMER.CREATE.WORKLOADS.mine.{team_filter}", body(push)),
        ("$JS.API.CONSUMER.CREATE.WORKLOADS", body(push)),
        # reading or wiping the log and the leader lease another way
        ("$JS.API.STREAM.INFO.WORKLOADS", b""),
        ("$JS.API.STREAM.PURGE.WORKLOADS", b""),
        ("$JS.API.DIRECT.GET.WORKLOADS", b'{"last_by_subj": "allot.v1.leader"}'),
        ("$JS.API.INFO", b""),
        ("$KV.allot_leader.placement", b"me"),
    ]


@pytest.mark.parametrize("user", ["nlp", "research-lead", "ops", "agent-h01"])
async def test_no_user_but_the_services_reaches_the_jetstream_api(
    secure: Secure, spy: Spy, user: str
) -> None:
    svc = await connect_as(secure, "svc")
    js = svc.nc.jetstream()
    await seed(js, {"h01": 8}, TREE)
    config = ConsumerConfig(
        durable_name=DURABLE, ack_policy=AckPolicy.EXPLICIT, filter_subject=s.ALL_EVENTS
    )
    await js.add_consumer("WORKLOADS", config)
    work: list[str] = []

    async def on_work(msg: nats.aio.msg.Msg) -> None:
        work.append(msg.subject)

    await svc.nc.subscribe(s.host_work("h01"), cb=on_work)
    hostile = await connect_as(secure, user)
    try:
        before = await counts(js)
        log_before = len(secure.violations())
        attacks = _api_attacks(s.allocation_events("nlp"))
        for subject, body in attacks:
            await _no_answer(hostile, subject, body)
        for subject, _ in attacks:
            await hostile.refused(subject)
        logged = await secure.logged(user, len(attacks), since=log_before)
        assert sorted(v[2] for v in logged) == sorted(subject for subject, _ in attacks)
        assert all(v[1] == "Publish" for v in logged)
        # Nothing moved: the durable keeps its filter, the log its records, the agent
        # its (empty) work list.
        info = await js.consumer_info("WORKLOADS", DURABLE)
        assert info.config.filter_subject == s.ALL_EVENTS
        assert [c.name for c in await js.consumers_info("WORKLOADS")] == [DURABLE]
        assert await counts(js) == before
        await svc.nc.flush()
        assert work == []
    finally:
        await hostile.nc.close()
        await svc.nc.close()


@contextlib.asynccontextmanager
async def _intake_and_team(
    secure: Secure,
) -> AsyncIterator[tuple[Conn, JetStreamContext, Intake, Conn]]:
    """The service user (its log seeded), the real intake service, and team nlp logged in."""
    svc = await connect_as(secure, "svc")
    js = svc.nc.jetstream()
    await seed(js, {"h01": 8}, TREE)
    intake = Intake(secure.url("svc"), tracing=False)
    await start(intake)
    nlp = await connect_as(secure, "nlp")
    try:
        yield svc, js, intake, nlp
    finally:
        await nlp.nc.close()
        await stop(intake)
        await svc.nc.close()


async def test_a_team_watches_its_own_workloads_through_intake_and_nothing_else(
    secure: Secure,
) -> None:
    async with _intake_and_team(secure) as (svc, _js, _intake, nlp):
        reply = await nlp.nc.request(s.submit_as("nlp", "nlp"), _submit("nlp"), timeout=5)
        mine = msgspec.json.decode(reply.data, type=m.WorkloadAccepted).workload_id
        vision = await svc.nc.request(s.submit("vision"), _submit("vision"), timeout=5)
        theirs = msgspec.json.decode(vision.data, type=m.WorkloadAccepted).workload_id
        async with Client(secure.url("nlp")) as c:
            first = await asyncio.wait_for(anext(c.watch(mine, "nlp")), 10)
            assert isinstance(first, m.WorkloadSubmitted) and first.workload_id == mine
            # vision's workload asked under nlp's subject: the filter is nlp's, so nothing
            with pytest.raises(RequestTimeoutError):  # idle: nothing came
                async for _ in c.watch(theirs, "nlp", idle_timeout=1.5, missing_after=None):
                    pytest.fail("a record of vision's workload reached nlp")
        # Raw: another allocation's watch and deliveries are refused by the server; a
        # delivery token that is not one subject token is refused by intake, naming it.
        ask = m.WatchLog(workload_id=theirs, records="events", deliver="x")
        await _no_answer(nlp, s.watch("vision"), codec.encode(ask))
        await nlp.nc.subscribe(s.allocation_watched("vision"))
        await nlp.refused(s.watch("vision"))
        await nlp.refused(s.allocation_watched("vision"))
        bad = codec.encode(ask).replace(b'"deliver":"x"', b'"deliver":"h01.work"')
        reply = await nlp.nc.request(s.watch("nlp"), bad, timeout=5)
        refused = msgspec.json.decode(reply.data, type=m.CommandRejected)
        assert refused.field == "deliver"


async def test_watches_per_allocation_are_bounded_and_abandoned_ones_expire(
    fresh_log: str,
) -> None:
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await bus.ensure_streams(js)
    watches = LogWatchServer(nc, js, time.time, max_watches=2, inactive_s=1.0)
    await watches.start()
    try:

        async def ask(deliver: str) -> msgspec.Struct:
            sub = await nc.subscribe(s.watched("nlp", deliver))
            body = codec.encode(m.WatchLog(workload_id="w1", records="events", deliver=deliver))
            reply = await nc.request(s.watch("nlp"), body, timeout=5)
            await sub.unsubscribe()  # abandoned at once
            return _WATCH_REPLY.decode(reply.data)

        assert isinstance(await ask("a"), m.WatchStarted)
        assert isinstance(await ask("b"), m.WatchStarted)
        third = await ask("c")
        assert isinstance(third, m.CommandRejected) and third.field == "allocation"
        other = await nc.request(
            s.watch("vision"),
            codec.encode(m.WatchLog(workload_id="w1", records="notices", deliver="d")),
            timeout=5,
        )
        assert isinstance(_WATCH_REPLY.decode(other.data), m.WatchStarted)  # per allocation
        # nobody listens: the server removes them, and there is room again
        began = time.monotonic()
        while isinstance(answer := await ask("e"), m.CommandRejected):
            assert time.monotonic() - began < 30, "abandoned watches never expired"
            await asyncio.sleep(0.5)
        assert isinstance(answer, m.WatchStarted)
    finally:
        await watches.stop()
        await nc.close()


async def test_a_watch_goes_on_after_its_consumer_is_gone(fresh_log: str) -> None:
    """A server restart or an expiry removes the consumer: the SDK hears no heartbeat and
    asks again from the record after the last it saw, missing nothing, repeating nothing."""
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await bus.ensure_streams(js)
    watches = LogWatchServer(nc, js, time.time)
    await watches.start()

    def record(n: int) -> m.WorkloadStarted:
        return m.WorkloadStarted(
            workload_id="w1", allocation="nlp", at=1_800_000_000.0 + n, host="h01", attempt=n
        )

    try:
        for n in (1, 2):
            await js.publish(s.events("nlp", "w1", "started"), codec.encode(record(n)))
        seen: list[msgspec.Struct] = []
        async with Client(fresh_log) as c:

            async def follow() -> None:
                async for r in c.watch("w1", "nlp", missing_after=None):
                    seen.append(r)

            task = asyncio.create_task(follow())
            await eventually(lambda: _value(list(seen)), lambda v: len(v) == 2)
            for info in await js.consumers_info("WORKLOADS"):
                await js.delete_consumer("WORKLOADS", info.name)
            for n in (3, 4):
                await js.publish(s.events("nlp", "w1", "started"), codec.encode(record(n)))
            await eventually(lambda: _value(list(seen)), lambda v: len(v) == 4, timeout=15)
            task.cancel()
        assert seen == [record(n) for n in (1, 2, 3, 4)]
    finally:
        await watches.stop()
        await nc.close()


async def test_a_request_whose_reply_subject_is_no_inbox_is_neither_handled_nor_answered(
    secure: Secure, spy: Spy
) -> None:
    """The reply subject is the sender's choice and the server does not check it, while a
    service may publish anywhere: a team once made ranking's answer the newest budget tree
    (ranking then never started again) and, on older servers, purged the log with a reply
    to ``$JS.API.STREAM.PURGE.WORKLOADS``. Each request path refuses it: intake's
    submissions and watches (the raw request server), its cancels (FastStream)."""
    async with _intake_and_team(secure) as (_svc, js, intake, nlp):
        reply = await nlp.nc.request(s.submit_as("nlp", "nlp"), _submit("nlp"), timeout=5)
        wid = msgspec.json.decode(reply.data, type=m.WorkloadAccepted).workload_id
        before = await counts(js)
        spy.set_mark()
        cancel = codec.encode(m.CancelWorkload(workload_id=wid, user="nlp"))
        watch = codec.encode(m.WatchLog(workload_id=wid, records="events", deliver="t"))
        steered = [
            (s.submit_as("nlp", "nlp"), _submit("nlp", "c2"), s.BUDGET_TREE),
            (s.submit_as("nlp", "nlp"), _submit("nlp", "c3"), "$JS.API.STREAM.PURGE.WORKLOADS"),
            (s.cancel_as("nlp", wid, "nlp"), cancel, s.events("nlp", "junk", "placed")),
            (s.watch("nlp"), watch, s.watched("vision", "t")),
        ]
        for subject, body, target in steered:
            await nlp.nc.publish(subject, body, reply=target)
        await nlp.nc.flush()
        await asyncio.sleep(1.0)  # what would have been answered has been by now
        assert nlp.errors == []  # the server let each through: the services refuse them
        assert await counts(js) == before
        assert not any(spy.saw(target) for _, _, target in steered)
        assert intake.accepted == 1
        assert [c.name for c in await js.consumers_info("WORKLOADS")] == []  # no watch
        # an inbox reply still works
        again = await nlp.nc.request(s.submit_as("nlp", "nlp"), _submit("nlp", "c4"), timeout=5)
        assert isinstance(_ACCEPTED.decode(again.data), m.WorkloadAccepted)
