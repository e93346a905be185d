"""``allot.bus.batch_pull.BatchPull`` on a real nats-server: a durable consumer's records
taken a batch per request, each once and in order, acknowledged or redelivered as with
nats-py's ``fetch``; a request nobody answers (no such consumer) gives nothing after
``ANSWER_S``, and a status answering an earlier request does not end the current one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, StorageType
from nats.js.errors import NotFoundError

from allot.bus import batch_pull
from allot.bus.batch_pull import BatchPull

pytestmark = pytest.mark.integration

STREAM = "BATCHPULLTEST"
DURABLE = "reader"


@pytest.fixture
async def stream(nats_url: str) -> AsyncIterator[tuple[NatsClient, JetStreamContext]]:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    with contextlib.suppress(NotFoundError):  # absent: what we want
        await js.delete_stream(STREAM)
    await js.add_stream(name=STREAM, subjects=["batchpull.>"], storage=StorageType.MEMORY)
    await js.add_consumer(
        STREAM, ConsumerConfig(durable_name=DURABLE, ack_policy=AckPolicy.EXPLICIT, ack_wait=1.0)
    )
    yield nc, js
    with contextlib.suppress(NotFoundError):
        await js.delete_stream(STREAM)
    await nc.close()


@contextlib.asynccontextmanager
async def _opened(nc: NatsClient, consumer: str = DURABLE) -> AsyncIterator[BatchPull]:
    pull = BatchPull(nc, STREAM, consumer, batch=10)
    await pull.open()
    try:
        yield pull
    finally:
        await pull.close()


async def _store(js: JetStreamContext, first: int, n: int) -> None:
    for i in range(first, first + n):
        await js.publish(f"batchpull.r{i}", str(i).encode(), headers={"Nats-Msg-Id": f"r{i}"})


async def test_takes_what_the_consumer_holds_a_batch_at_a_time_each_once_in_order(
    stream: tuple[NatsClient, JetStreamContext],
) -> None:
    nc, js = stream
    await _store(js, 0, 25)
    async with _opened(nc) as pull:
        sizes, seen = [], []
        for _ in range(4):
            taken = await pull.take()
            sizes.append(len(taken))
            seen += [int(msg.data) for msg in taken]
            for msg in taken:
                await msg.ack()
        assert sizes == [10, 10, 5, 0]  # full batches, the rest, then nothing (no_wait)
        assert seen == list(range(25))
        await _store(js, 25, 3)
        assert [int(msg.data) for msg in await pull.take()] == [25, 26, 27]


async def test_an_unacknowledged_record_comes_again_after_ack_wait(
    stream: tuple[NatsClient, JetStreamContext],
) -> None:
    nc, js = stream
    await _store(js, 0, 2)
    async with _opened(nc) as pull:
        first = await pull.take()
        await first[0].ack()  # the second is left unacknowledged
        await nc.flush()
        again: list[int] = []
        for _ in range(30):  # ack_wait is 1 s
            again = [int(msg.data) for msg in await pull.take()]
            if again:
                break
            await asyncio.sleep(0.1)
        assert again == [1]


async def test_a_request_nobody_answers_gives_nothing(
    stream: tuple[NatsClient, JetStreamContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    nc, js = stream
    await _store(js, 0, 2)
    monkeypatch.setattr(batch_pull, "ANSWER_S", 0.3)
    async with _opened(nc, "no-such-consumer") as pull:
        assert await pull.take() == []


async def test_only_the_current_requests_status_ends_it(
    stream: tuple[NatsClient, JetStreamContext],
) -> None:
    """A request that timed out may still be answered: its status must not end the next."""
    nc, _ = stream
    async with _opened(nc) as pull:
        assert await pull.take() == []  # request 1, answered "no messages"
        pull._request = 2  # as ``take`` sets it for the next request
        pull._over.clear()
        await pull._on_msg(Msg(nc, subject=f"{pull._inbox}.1", headers={"Status": "404"}))
        assert not pull._over.is_set()
        await pull._on_msg(Msg(nc, subject=f"{pull._inbox}.2", headers={"Status": "408"}))
        assert pull._over.is_set()
