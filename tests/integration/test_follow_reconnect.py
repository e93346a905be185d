"""A following command whose NATS goes away and comes back (a real nats-server stopped and
started again on the same port): the SDK's ``Client.on_connection`` hears both, not its own
close; ``allot idle --follow`` says so on stderr and prints the flagged runs again once
back (what came meanwhile was not heard)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.msg import Msg

from allot.adapters.embedded import EmbeddedNats, free_ports
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sdk import Client

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def restartable(tmp_path: Path) -> AsyncIterator[tuple[str, list[EmbeddedNats]]]:
    """A server on a fixed port; the list holds the one running (the test restarts it)."""
    (port,) = free_ports(1)
    servers = [EmbeddedNats(port=port, store_dir=tmp_path / "store").start()]
    try:
        yield f"nats://127.0.0.1:{port}", servers
    finally:
        for server in servers:
            server.stop()


def restart(servers: list[EmbeddedNats], tmp_path: Path, port: int) -> None:
    servers.pop().stop()
    servers.append(EmbeddedNats(port=port, store_dir=tmp_path / "store").start())


async def _until(predicate: object, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_client_hears_its_connection_lost_and_back_but_not_its_own_close(
    tmp_path: Path,
) -> None:
    async with restartable(tmp_path) as (url, servers):
        heard: list[bool] = []
        c = await Client.connect(url)
        try:
            c.on_connection(heard.append)
            servers[0].stop()
            await _until(lambda: heard == [False])
            restart(servers, tmp_path, int(url.rsplit(":", 1)[1]))
            await _until(lambda: heard == [False, True])
        finally:
            await c.close()
        await asyncio.sleep(0.3)
        assert heard == [False, True]  # nothing on close


async def test_idle_follow_says_when_nats_is_lost_and_lists_the_flags_again_once_back(
    tmp_path: Path,
) -> None:
    async with restartable(tmp_path) as (url, servers):
        port = int(url.rsplit(":", 1)[1])
        asked = 0

        async def answer(msg: Msg) -> None:
            nonlocal asked
            asked += 1
            snapshot = m.IdleSnapshot(at=1_700_000_000.0 + asked, threshold_pct=5.0, window_s=60)
            await msg.respond(codec.encode(snapshot))

        # A stand-in for the health service's answer, on a connection that reconnects
        # faster than the command's (1 s).
        health = await nats.connect(url, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
        await health.subscribe(f"{s.QUERY_IDLE}.nlp", cb=answer)
        await health.flush()
        argv = ["idle", "--alloc", "nlp", "--follow", "--json", "--nats-url", url]
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "allot.cli.main", *argv),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        try:
            first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
            assert first["kind"] == "IdleSnapshot" and asked == 1
            await asyncio.sleep(0.5)  # its idle subscription is in place
            restart(servers, tmp_path, port)
            lost = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
            assert "lost NATS at" in lost and "reconnecting" in lost
            back = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
            assert "reconnected to NATS at" in back
            again = json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
            assert again["kind"] == "IdleSnapshot" and asked == 2
            assert again["at"] > first["at"]
            # Still following: a flag published now is printed.
            flag = m.WorkloadFlaggedIdle(
                workload_id="w1",
                allocation="nlp",
                user="alice",
                gpus=2,
                attempt=1,
                idle_since=1_700_000_000.0,
                at=1_700_000_100.0,
                threshold_pct=5.0,
                window_s=60,
            )
            await health.publish(s.idle("nlp", "w1"), msgspec.json.encode(flag))
            line = json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
            assert line["kind"] == "WorkloadFlaggedIdle" and line["data"]["workload_id"] == "w1"
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGINT)
                await asyncio.wait_for(proc.wait(), 20)
            await health.close()
