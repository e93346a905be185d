"""Durability choices: client_id deduplication outlives the stream's duplicate window, and
the stack's NATS fsyncs every JetStream write before acknowledging it."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import pytest
from live_harness import of_type, records, seed

from allot.live import service_main
from allot.live.stack import Stack, StackConfig
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.services.intake import Intake

pytestmark = pytest.mark.integration

_REPLY = msgspec.json.Decoder(m.WorkloadAccepted | m.WorkloadRejected)


@pytest.fixture
async def intake_nc(fresh_log: str) -> AsyncIterator[nats.NATS]:
    """A running intake on a fresh log with one 8-GPU host; yields a plain client."""
    nc = await nats.connect(fresh_log)
    await seed(nc.jetstream(), {"h1": 8})
    intake = Intake(fresh_log, tracing=False)
    await service_main.start(intake)
    try:
        yield nc
    finally:
        await service_main.stop(intake)
        await nc.close()


def _submit_body(client_id: str) -> bytes:
    body = {"type": "SubmitWorkload", "client_id": client_id, "user": "u", "gpus": 1}
    return json.dumps(body).encode()


async def test_client_id_dedupe_outlives_the_duplicate_window(intake_nc: nats.NATS) -> None:
    nc, js = intake_nc, intake_nc.jetstream()
    body = _submit_body("once")
    first = _REPLY.decode((await nc.request(s.submit(None), body, timeout=5)).data)
    assert isinstance(first, m.WorkloadAccepted) and not first.duplicate
    # Shrink the stream's message-id window and outlive it: only the KV record remains.
    info = await js.stream_info("WORKLOADS")
    info.config.duplicate_window = 0.5
    await js.update_stream(info.config)
    await asyncio.sleep(1.0)
    again = _REPLY.decode((await nc.request(s.submit(None), body, timeout=5)).data)
    assert isinstance(again, m.WorkloadAccepted) and again.duplicate
    assert again.workload_id == first.workload_id and again.at == first.at
    assert len(of_type(await records(js), m.WorkloadSubmitted)) == 1
    kv = await js.key_value("allot_clients")
    assert not (await kv.status()).ttl  # kept forever


async def test_a_key_reserved_without_its_record_is_repaired_by_the_retry(
    intake_nc: nats.NATS,
) -> None:
    """Intake reserves the client key, then appends: a crash between the two leaves a key
    with no workload. The client's retry must append the record (at the first time), once."""
    nc, js = intake_nc, intake_nc.jetstream()
    body = _submit_body("torn")
    kv = await js.key_value("allot_clients")
    await kv.create("=.torn", json.dumps({"workload_id": "x", "at": 1.7e9}).encode())
    assert not of_type(await records(js), m.WorkloadSubmitted)

    retry = _REPLY.decode((await nc.request(s.submit(None), body, timeout=5)).data)
    again = _REPLY.decode((await nc.request(s.submit(None), body, timeout=5)).data)

    assert isinstance(retry, m.WorkloadAccepted) and retry.duplicate
    assert isinstance(again, m.WorkloadAccepted) and again.duplicate
    assert retry.at == again.at == 1.7e9
    submitted = of_type(await records(js), m.WorkloadSubmitted)
    assert [(r.workload_id, r.client_id, r.at) for r in submitted] == [
        (retry.workload_id, "torn", 1.7e9)
    ]


def test_the_stack_fsyncs_every_jetstream_write(tmp_path: Path) -> None:
    stack = Stack(StackConfig(run_dir=tmp_path))  # embedded servers, no services started
    stack.servers.start()
    try:
        assert stack.servers.nats is not None
        varz = json.load(urllib.request.urlopen(stack.servers.nats.monitor_url + "/varz"))
        assert varz["jetstream"]["config"]["sync_always"] is True
    finally:
        stack.servers.stop()
