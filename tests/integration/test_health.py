"""The health service against a real NATS server: registration, missed heartbeats, health
reports, operator drain/undrain, and what it refuses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from allot.bus import service_main
from allot.eventlog.host_work import AGENT_STOPPING
from allot.proto import codec, subjects
from allot.proto import messages as m
from allot.proto.subjects import Kind
from allot.services.health import HealthService

pytestmark = pytest.mark.integration

DEADLINE_S = 5.0
Reply = m.CommandAccepted | m.CommandRejected
T = TypeVar("T")


async def until(check: Callable[[], Awaitable[bool] | bool], what: str) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def host_records(js: JetStreamContext) -> list[msgspec.Struct]:
    """Every record of the HOSTS stream, in order."""
    info = await js.stream_info("HOSTS")
    if info.state.messages == 0:
        return []
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        raw = await js.get_msg("HOSTS", seq)
        assert raw.data is not None
        out.append(codec.decode(Kind.HOST_STATE, raw.data))
    return out


def of(records: list[msgspec.Struct], kind: type[T], host: str) -> list[T]:
    return [r for r in records if isinstance(r, kind) and getattr(r, "host", None) == host]


@asynccontextmanager
async def running(url: str, **kw: float) -> AsyncIterator[HealthService]:
    service = HealthService(url, **kw)
    await service_main.start(service)
    try:
        yield service
    finally:
        await service_main.stop(service)


@pytest.fixture
async def nc(fresh_log: str) -> AsyncIterator[Client]:
    client = await nats.connect(fresh_log)
    yield client
    await client.close()


async def beat(nc: Client, host: str, *, gpus: int = 8, payload_host: str | None = None) -> None:
    hb = m.Heartbeat(host=payload_host or host, sent_at=time.time(), seq=1, gpus=gpus)
    await nc.publish(subjects.heartbeat(host), codec.encode(hb))
    await nc.flush()


async def beats_handled(service: HealthService, n: int) -> None:
    await until(lambda: service.heartbeats >= n, f"{n} heartbeats handled")


async def request(nc: Client, subject: str, body: bytes) -> Reply:
    msg = await nc.request(subject, body, timeout=DEADLINE_S)
    return msgspec.json.decode(msg.data, type=Reply)


async def test_first_heartbeat_registers_the_host_once(fresh_log: str, nc: Client) -> None:
    js = nc.jetstream()
    async with running(fresh_log, timeout_s=30.0) as service:
        for _ in range(5):
            await beat(nc, "h01", gpus=8)
        await beats_handled(service, 5)
        records = await host_records(js)
    registered = of(records, m.HostRegistered, "h01")
    assert len(registered) == 1
    assert registered[0].gpus == 8
    # Nothing else: a registered host starts healthy.
    assert records == registered


async def test_missed_heartbeats_drain_and_resumed_ones_heal(fresh_log: str, nc: Client) -> None:
    js = nc.jetstream()
    async with running(fresh_log, timeout_s=0.5, check_s=0.05):
        await beat(nc, "h01")

        async def drained() -> bool:
            return bool(of(await host_records(js), m.HostDraining, "h01"))

        started = time.monotonic()
        await until(drained, "HostDraining for missed heartbeats")
        assert time.monotonic() - started >= 0.5  # not before the timeout
        draining = of(await host_records(js), m.HostDraining, "h01")
        assert len(draining) == 1
        assert draining[0].reason.startswith("missed heartbeats for ")
        assert draining[0].by is None

        await beat(nc, "h01")

        async def healed() -> bool:
            return bool(of(await host_records(js), m.HostHealthy, "h01"))

        await until(healed, "HostHealthy after heartbeats resumed")
        kinds = [type(r).__name__ for r in await host_records(js)]
        assert kinds[:3] == ["HostRegistered", "HostDraining", "HostHealthy"]


async def test_operator_drain_survives_heartbeats_until_undrain(fresh_log: str, nc: Client) -> None:
    js = nc.jetstream()
    async with running(fresh_log, timeout_s=30.0) as service:
        await beat(nc, "h01")
        await beats_handled(service, 1)

        drain = m.DrainHost(host="h01", operator="alice", reason="bios update")
        reply = await request(nc, subjects.drain("h01"), codec.encode(drain))
        assert isinstance(reply, m.CommandAccepted), reply
        draining = of(await host_records(js), m.HostDraining, "h01")
        assert [(d.by, d.reason) for d in draining] == [("alice", "bios update")]

        for _ in range(3):
            await beat(nc, "h01")
        await beats_handled(service, 4)
        assert not of(await host_records(js), m.HostHealthy, "h01")

        undrain = m.UndrainHost(host="h01", operator="alice")
        reply = await request(nc, subjects.undrain("h01"), codec.encode(undrain))
        assert isinstance(reply, m.CommandAccepted), reply
        assert len(of(await host_records(js), m.HostHealthy, "h01")) == 1
        assert service.book.hosts["h01"].state == "healthy"


@pytest.mark.parametrize(
    ("subject_host", "body", "field"),
    [
        ("ghost", b'{"type": "DrainHost", "host": "ghost", "operator": "alice"}', "host"),
        ("h01", b'{"type": "DrainHost", "host": "h02", "operator": "alice"}', "host"),
        ("h01", b'{"type": "DrainHost", "host": "h01"}', "operator"),
        ("h01", b'{"type": "DrainHost", "host": "h01", "operator": "a.b"}', "operator"),
        ("h01", b'{"type": "DrainHost", "host": "h01", "operator": "al", "x": 1}', "x"),
        ("h01", b'{"type": "UndrainHost", "host": "h01", "operator": "alice"}', "type"),
        ("h01", b"{not json", "body"),
        ("h01", b"", "body"),
    ],
)
async def test_bad_drain_requests_are_rejected_naming_the_field(
    fresh_log: str, nc: Client, subject_host: str, body: bytes, field: str
) -> None:
    js = nc.jetstream()
    async with running(fresh_log, timeout_s=30.0) as service:
        await beat(nc, "h01")
        await beat(nc, "h02")
        await beats_handled(service, 2)
        reply = await request(nc, subjects.drain(subject_host), body)
        assert isinstance(reply, m.CommandRejected), reply
        assert reply.field == field, reply
        assert reply.reason
        # Nothing was drained, and the service still answers.
        assert not [r for r in await host_records(js) if isinstance(r, m.HostDraining)]
        ok = m.DrainHost(host="h01", operator="alice")
        assert isinstance(
            await request(nc, subjects.drain("h01"), codec.encode(ok)), m.CommandAccepted
        )


async def test_on_its_identity_subject_the_operator_must_be_the_login(
    fresh_log: str, nc: Client
) -> None:
    """``host.<h>.drain.<login>``: a drain or undrain naming another operator is refused
    naming ``operator`` and changes nothing; the login's own is recorded under it."""
    js = nc.jetstream()
    async with running(fresh_log, timeout_s=30.0) as service:
        await beat(nc, "h01")
        await beats_handled(service, 1)
        forged = m.DrainHost(host="h01", operator="bob", reason="not mine to say")
        reply = await request(nc, subjects.drain_as("h01", "alice"), codec.encode(forged))
        assert isinstance(reply, m.CommandRejected), reply
        assert (reply.field, reply.reason) == ("operator", "'bob' differs from the login 'alice'")
        assert not of(await host_records(js), m.HostDraining, "h01")
        own = m.DrainHost(host="h01", operator="alice", reason="bios update")
        reply = await request(nc, subjects.drain_as("h01", "alice"), codec.encode(own))
        assert isinstance(reply, m.CommandAccepted), reply
        assert [d.by for d in of(await host_records(js), m.HostDraining, "h01")] == ["alice"]
        undo = m.UndrainHost(host="h01", operator="bob")
        reply = await request(nc, subjects.undrain_as("h01", "alice"), codec.encode(undo))
        assert isinstance(reply, m.CommandRejected) and reply.field == "operator", reply
        assert service.book.hosts["h01"].state == "draining"
        undo = m.UndrainHost(host="h01", operator="alice")
        reply = await request(nc, subjects.undrain_as("h01", "alice"), codec.encode(undo))
        assert isinstance(reply, m.CommandAccepted), reply
        assert service.book.hosts["h01"].state == "healthy"


async def test_undrain_of_an_unknown_host_is_rejected(fresh_log: str, nc: Client) -> None:
    async with running(fresh_log, timeout_s=30.0):
        body = codec.encode(m.UndrainHost(host="ghost", operator="alice"))
        reply = await request(nc, subjects.undrain("ghost"), body)
    assert isinstance(reply, m.CommandRejected)
    assert reply.field == "host"


async def test_heartbeat_naming_another_host_is_ignored(fresh_log: str, nc: Client) -> None:
    js = nc.jetstream()
    async with running(fresh_log, timeout_s=30.0) as service:
        await beat(nc, "h01", payload_host="h99")
        await nc.publish(subjects.heartbeat("h01"), b"{garbage")
        await beats_handled(service, 2)
        assert service.ignored == {"host mismatch": 1, "bad heartbeat": 1}
        assert await host_records(js) == []
        assert service.book.hosts == {}


async def test_health_reports_drain_and_heal(fresh_log: str, nc: Client) -> None:
    js = nc.jetstream()
    async with running(fresh_log, timeout_s=30.0) as service:
        await beat(nc, "h01")
        await beats_handled(service, 1)
        bad = m.HealthReport(host="h01", sent_at=time.time(), healthy=False, failed_gpus=(3,))
        await nc.publish(subjects.health("h01"), codec.encode(bad))

        async def draining() -> bool:
            return bool(of(await host_records(js), m.HostDraining, "h01"))

        await until(draining, "HostDraining after a failed health report")
        (record,) = of(await host_records(js), m.HostDraining, "h01")
        assert record.reason == "failed GPUs 3"

        # Heartbeats do not end a drain for failed hardware ...
        await beat(nc, "h01")
        await beats_handled(service, 2)
        assert not of(await host_records(js), m.HostHealthy, "h01")

        # ... a healthy report does.
        good = m.HealthReport(host="h01", sent_at=time.time(), healthy=True)
        await nc.publish(subjects.health("h01"), codec.encode(good))

        async def healthy() -> bool:
            return bool(of(await host_records(js), m.HostHealthy, "h01"))

        await until(healthy, "HostHealthy after a healthy report")


async def test_a_stopping_agents_report_drains_until_its_next_heartbeat(
    fresh_log: str, nc: Client
) -> None:
    """``agent stopping``: out of service at once (not after the heartbeat timeout), back
    with the agent's return."""
    js = nc.jetstream()
    async with running(fresh_log, timeout_s=30.0) as service:
        await beat(nc, "h01")
        await beats_handled(service, 1)
        stop = m.HealthReport(host="h01", sent_at=time.time(), healthy=False, detail=AGENT_STOPPING)
        await nc.publish(subjects.health("h01"), codec.encode(stop))

        async def draining() -> bool:
            return bool(of(await host_records(js), m.HostDraining, "h01"))

        await until(draining, "HostDraining after the agent's stop")
        (record,) = of(await host_records(js), m.HostDraining, "h01")
        assert (record.reason, record.by) == (AGENT_STOPPING, None)

        await beat(nc, "h01")  # the agent is back

        async def healthy() -> bool:
            return bool(of(await host_records(js), m.HostHealthy, "h01"))

        await until(healthy, "HostHealthy after the returning agent's heartbeat")


async def test_restart_rebuilds_hosts_and_drain_causes_from_the_log(
    fresh_log: str, nc: Client
) -> None:
    js = nc.jetstream()
    async with running(fresh_log, timeout_s=30.0) as service:
        await beat(nc, "h01")
        await beat(nc, "h02")
        await beats_handled(service, 2)
        drain = m.DrainHost(host="h01", operator="alice")
        assert isinstance(
            await request(nc, subjects.drain("h01"), codec.encode(drain)), m.CommandAccepted
        )
    before = await host_records(js)

    t0 = time.monotonic()
    async with running(fresh_log, timeout_s=0.5, check_s=0.05) as service:
        assert service.book.hosts["h01"].cause == "operator"
        assert service.book.hosts["h02"].state == "healthy"
        # A known host is not registered again, and heartbeats do not end an operator drain.
        await beat(nc, "h01")
        await beats_handled(service, 1)
        assert await host_records(js) == before

        # h02 never beats again: it is declared missing one timeout after the restart.
        async def h02_draining() -> bool:
            return bool(of(await host_records(js), m.HostDraining, "h02"))

        await until(h02_draining, "h02 drained for missed heartbeats after the restart")
        assert time.monotonic() - t0 >= 0.5
        after = await host_records(js)
    assert len(of(after, m.HostRegistered, "h01")) == 1
    assert not of(after, m.HostHealthy, "h01")
