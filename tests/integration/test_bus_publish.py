"""``allot.live.bus.publish`` sends a msg-id'd record again when its ack does not come (a
stream leader's hand-over can lose it), the same bytes and msg id each time."""

from __future__ import annotations

import nats
import nats.errors
import pytest

from allot.live import bus
from allot.proto import messages as m

pytestmark = pytest.mark.integration

SUBJECT = "allot.test.publish.x"


async def test_an_unacknowledged_publish_is_sent_again_with_the_same_msg_id(
    nats_url: str,
) -> None:
    nc = await nats.connect(nats_url)
    seen: list[tuple[bytes, str | None]] = []

    async def lossy_stream(msg: nats.aio.msg.Msg) -> None:
        seen.append((msg.data, (msg.headers or {}).get("Nats-Msg-Id")))
        if len(seen) >= 3:  # the first two acks are lost
            await msg.respond(b'{"stream":"WORKLOADS","seq":7}')

    sub = await nc.subscribe(SUBJECT, cb=lossy_stream)
    try:
        record = m.WorkloadRequeued(workload_id="w", at=1.0)
        seq = await bus.publish(nc.jetstream(), SUBJECT, record, "requeued:w:1")
    finally:
        await sub.unsubscribe()
        await nc.close()
    assert seq == 7
    assert len(seen) == 3
    assert {data for data, _ in seen} == {bus.encode(record)}
    assert {msg_id for _, msg_id in seen} == {"requeued:w:1"}


async def test_a_publish_never_acknowledged_fails_after_the_last_try(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    tries = 0

    async def silent_stream(_: nats.aio.msg.Msg) -> None:
        nonlocal tries
        tries += 1

    sub = await nc.subscribe(SUBJECT, cb=silent_stream)
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await bus.publish(
                nc.jetstream(), SUBJECT, m.WorkloadRequeued(workload_id="w", at=1.0), "r"
            )
    finally:
        await sub.unsubscribe()
        await nc.close()
    assert tries == bus.PUBLISH_ATTEMPTS
