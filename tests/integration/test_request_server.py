"""``allot.bus.request_server.RequestServer`` on a real NATS: replies, the in-flight bound,
a failing handler left unanswered, a queue group shared by two servers, a draining stop,
a burst beyond the waiting bound dropped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import nats.aio.msg
import nats.errors
import pytest

from allot.bus.request_server import RequestServer

pytestmark = pytest.mark.integration

SUBJECT = "allot.test.rs.*"


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[nats.NATS]:
    client = await nats.connect(nats_url)
    yield client
    await client.close()


async def test_each_request_gets_its_handlers_reply(nc: nats.NATS) -> None:
    async def echo(subject: str, body: bytes) -> bytes:
        return subject.encode() + b":" + body

    server = RequestServer(nc, SUBJECT, "q", echo)
    await server.start()
    try:
        replies = await asyncio.gather(
            *(nc.request(f"allot.test.rs.h{i}", str(i).encode(), timeout=5) for i in range(50))
        )
    finally:
        await server.stop()
    assert [r.data for r in replies] == [f"allot.test.rs.h{i}:{i}".encode() for i in range(50)]
    assert server.handled == 50


async def test_at_most_max_in_flight_run_at_once(nc: nats.NATS) -> None:
    running = peak = 0

    async def slow(_: str, body: bytes) -> bytes:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return body

    server = RequestServer(nc, SUBJECT, "q", slow, max_in_flight=4)
    await server.start()
    try:
        await asyncio.gather(*(nc.request("allot.test.rs.x", b"", timeout=10) for _ in range(20)))
    finally:
        await server.stop()
    assert peak == 4


async def test_a_burst_beyond_max_pending_is_dropped_and_the_server_goes_on(
    nc: nats.NATS, nats_url: str
) -> None:
    """A flood of costly requests does not queue up: past the one in flight and the four
    waiting, nats-py drops them (their askers time out), and the next request is served."""

    async def slow(_: str, body: bytes) -> bytes:
        await asyncio.sleep(0.05)
        return body

    server = RequestServer(nc, SUBJECT, "q", slow, max_in_flight=1, max_pending=4)
    await server.start()
    asker = await nats.connect(nats_url)
    answered: list[bytes] = []

    async def keep(msg: nats.aio.msg.Msg) -> None:
        answered.append(msg.data)

    try:
        inbox = asker.new_inbox()
        await asker.subscribe(inbox, cb=keep)
        for i in range(300):
            await asker.publish("allot.test.rs.x", str(i).encode(), reply=inbox)
        await asker.flush()
        await asyncio.sleep(1.5)  # whatever was kept is answered by now (50 ms each)
        assert 1 <= len(answered) <= 12, len(answered)
        assert (await asker.request("allot.test.rs.x", b"after", timeout=5)).data == b"after"
    finally:
        await asker.close()
        await server.stop()


async def test_a_failing_handler_is_not_answered_and_the_server_goes_on(nc: nats.NATS) -> None:
    async def picky(_: str, body: bytes) -> bytes:
        if body == b"bad":
            raise RuntimeError("boom")
        return b"ok"

    server = RequestServer(nc, SUBJECT, "q", picky)
    await server.start()
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await nc.request("allot.test.rs.x", b"bad", timeout=0.5)
        assert (await nc.request("allot.test.rs.x", b"good", timeout=5)).data == b"ok"
    finally:
        await server.stop()
    assert server.handled == 1


async def test_two_servers_in_one_queue_group_share_the_requests(nc: nats.NATS) -> None:
    seen: dict[str, int] = {"a": 0, "b": 0}

    def named(name: str) -> RequestServer:
        async def handler(_: str, __: bytes) -> bytes:
            seen[name] += 1
            return name.encode()

        return RequestServer(nc, SUBJECT, "q", handler)

    servers = [named("a"), named("b")]
    for server in servers:
        await server.start()
    try:
        await asyncio.gather(*(nc.request("allot.test.rs.x", b"", timeout=5) for _ in range(200)))
    finally:
        for server in servers:
            await server.stop()
    assert seen["a"] + seen["b"] == 200  # each request answered once
    assert seen["a"] > 0 and seen["b"] > 0


async def test_stop_lets_a_request_in_progress_finish(nc: nats.NATS) -> None:
    started = asyncio.Event()

    async def slow(_: str, __: bytes) -> bytes:
        started.set()
        await asyncio.sleep(0.3)
        return b"done"

    server = RequestServer(nc, SUBJECT, "q", slow)
    await server.start()
    pending = asyncio.create_task(nc.request("allot.test.rs.x", b"", timeout=5))
    await started.wait()
    await server.stop()
    assert (await pending).data == b"done"
    with pytest.raises(nats.errors.NoRespondersError):  # stopped: nobody listens any more
        await nc.request("allot.test.rs.x", b"", timeout=1)


async def test_a_request_from_another_connection_right_after_start_is_answered(
    nc: nats.NATS, nats_url: str
) -> None:
    """``start`` returns once the server has the subscription (a test of intake's, sent
    right after ``start`` from another connection, once found no responder)."""
    other = await nats.connect(nats_url)

    async def ok(_: str, __: bytes) -> bytes:
        return b"ok"

    try:
        for _ in range(30):
            server = RequestServer(nc, SUBJECT, "q", ok)
            await server.start()
            try:
                assert (await other.request("allot.test.rs.x", b"", timeout=5)).data == b"ok"
            finally:
                await server.stop()
    finally:
        await other.close()
