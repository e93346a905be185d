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
from live_harness import of_type, records, running_intake, seed
from nats.js import JetStreamContext

from allot.ops.stack import Stack, StackConfig
from allot.proto import messages as m
from allot.proto import subjects as s

pytestmark = pytest.mark.integration

_REPLY = msgspec.json.Decoder(m.WorkloadAccepted | m.WorkloadRejected)


@pytest.fixture
async def intake_nc(fresh_log: str) -> AsyncIterator[nats.NATS]:
    """A running intake on a fresh log with one 8-GPU host; yields a plain client."""
    nc = await nats.connect(fresh_log)
    await seed(nc.jetstream(), {"h1": 8})
    try:
        async with running_intake(fresh_log):
            yield nc
    finally:
        await nc.close()


async def _submit(nc: nats.NATS, body: bytes) -> m.WorkloadAccepted | m.WorkloadRejected:
    return _REPLY.decode((await nc.request(s.submit(None), body, timeout=5)).data)


async def _outlive_the_duplicate_window(js: JetStreamContext) -> None:
    """Shrink the stream's message-id window and outlive it: only the log's subject check
    is left to catch a repeat."""
    info = await js.stream_info("WORKLOADS")
    info.config.duplicate_window = 0.5
    await js.update_stream(info.config)
    await asyncio.sleep(1.0)


def _submit_body(client_id: str) -> bytes:
    body = {"type": "SubmitWorkload", "client_id": client_id, "user": "u", "gpus": 1}
    return json.dumps(body).encode()


async def test_client_id_dedupe_outlives_the_duplicate_window(intake_nc: nats.NATS) -> None:
    nc, js = intake_nc, intake_nc.jetstream()
    body = _submit_body("once")
    first = await _submit(nc, body)
    assert isinstance(first, m.WorkloadAccepted) and not first.duplicate
    await _outlive_the_duplicate_window(js)
    again = await _submit(nc, body)
    assert isinstance(again, m.WorkloadAccepted) and again.duplicate
    assert again.workload_id == first.workload_id and again.at == first.at
    assert len(of_type(await records(js), m.WorkloadSubmitted)) == 1


async def test_a_repeat_after_later_records_answers_with_the_first_submission(
    intake_nc: nats.NATS,
) -> None:
    """The workload gains records after its submission (placed, started...): a repeat is
    still refused, and answered with the submission's time, not a later one."""
    nc, js = intake_nc, intake_nc.jetstream()
    body = _submit_body("busy")
    first = await _submit(nc, body)
    assert isinstance(first, m.WorkloadAccepted)
    for event in ("placed", "started"):  # any later records of the workload
        await js.publish(s.events(None, first.workload_id, event), b'{"type":"later"}')
    await _outlive_the_duplicate_window(js)
    again = await _submit(nc, body)
    assert isinstance(again, m.WorkloadAccepted) and again.duplicate
    assert again.at == first.at


async def test_concurrent_repeats_append_one_submission(intake_nc: nats.NATS) -> None:
    nc, js = intake_nc, intake_nc.jetstream()
    body = _submit_body("racy")
    replies = await asyncio.gather(
        *(nc.request(s.submit(None), body, timeout=5) for _ in range(20))
    )
    answers = [_REPLY.decode(r.data) for r in replies]
    assert all(isinstance(a, m.WorkloadAccepted) for a in answers)
    assert sum(not a.duplicate for a in answers if isinstance(a, m.WorkloadAccepted)) == 1
    assert len({a.at for a in answers if isinstance(a, m.WorkloadAccepted)}) == 1
    assert len(of_type(await records(js), m.WorkloadSubmitted)) == 1


def test_the_stack_fsyncs_every_jetstream_write(tmp_path: Path) -> None:
    stack = Stack(StackConfig(run_dir=tmp_path))  # embedded servers, no services started
    stack.servers.start()
    try:
        assert stack.servers.nats is not None
        varz = json.load(urllib.request.urlopen(stack.servers.nats.monitor_url + "/varz"))
        assert varz["jetstream"]["config"]["sync_always"] is True
        # Group commit's batches stage on tmpfs; what they commit is fsynced as above.
        assert stack.servers.nats.staged_in_memory == ["$G/WORKLOADS"]
    finally:
        stack.servers.stop()
