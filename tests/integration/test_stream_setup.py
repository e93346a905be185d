"""``allot.bus.ensure_streams`` on a JetStream that cannot answer yet, against real
nats-servers (free ports, never 4222): a fresh three-node cluster still electing its meta
leader gets its replicated streams once it can (every service calls this at start, and
crashed there before), one that never can is given up on after the bound with the stream
named, and a configuration error is raised at once, never retried."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import nats
import pytest
import structlog
from nats.js.errors import BadRequestError, ServerError
from structlog.testing import capture_logs

from allot import bus
from allot.adapters.embedded import EmbeddedNats, find_nats_server, free_ports
from allot.adapters.nats_cluster import EmbeddedNatsCluster
from allot.bus import streams as bus_streams
from allot.proto.subjects import STREAMS

pytestmark = pytest.mark.integration

RETRY = "jetstream not ready; retrying"


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[MutableMapping[str, Any]]]:
    """What ``allot.bus.streams`` logs during the test (a logger made inside the capture:
    one cached by an earlier test's configuration would bypass it)."""
    with capture_logs() as captured:
        monkeypatch.setattr(bus_streams, "log", structlog.get_logger("allot.bus"))
        yield captured


def _retries(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == RETRY]


async def _listening(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            await asyncio.sleep(0.01)


async def test_a_fresh_cluster_still_electing_its_leader_gets_its_replicated_streams(
    tmp_path: Path, logs: list[MutableMapping[str, Any]]
) -> None:
    ports = free_ports(3)
    cluster = EmbeddedNatsCluster(3, base_dir=tmp_path / "cluster", client_ports=ports)
    starting = asyncio.create_task(asyncio.to_thread(cluster.start))  # returns once ready
    nc = None
    try:
        # As a service started with the cluster: connected to the first node to listen,
        # asking at once, before the nodes have elected a meta leader.
        await _listening(ports[0])
        nc = await nats.connect(f"nats://127.0.0.1:{ports[0]}")
        js = nc.jetstream(timeout=1.0)
        started = time.monotonic()
        await bus.ensure_streams(js, 3, ready_timeout_s=30.0)
        took = time.monotonic() - started

        retries = _retries(logs)
        assert retries, "JetStream answered the first try: the test saw no election"
        assert {r["stream"] for r in retries} <= set(STREAMS)
        assert all(r["error"] and r["retry_in_s"] > 0 for r in retries)
        assert took < 30.0
        for name in STREAMS:
            info = await js.stream_info(name)
            assert info.config.num_replicas == 3
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2
    finally:
        if nc is not None:
            await nc.close()
        try:
            await starting
        finally:
            cluster.stop()


@pytest.fixture
def lone_member(tmp_path: Path) -> Iterator[int]:
    """One node of a three-node JetStream cluster whose peers never come: it never has a
    meta leader, so JetStream never answers. Its client port."""
    client, cluster, peer1, peer2 = free_ports(4)
    conf = tmp_path / "lone.conf"
    conf.write_text(
        f'server_name: "lone"\nlisten: "127.0.0.1:{client}"\n'
        f'jetstream {{ store_dir: "{tmp_path / "store"}" }}\n'
        f'cluster {{ name: "c", listen: "127.0.0.1:{cluster}", routes: '
        f'["nats-route://127.0.0.1:{peer1}", "nats-route://127.0.0.1:{peer2}"] }}\n'
    )
    with (tmp_path / "lone.log").open("wb") as out:
        proc = subprocess.Popen(
            [str(find_nats_server()), "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield client
    finally:
        proc.terminate()
        proc.wait(10)


async def test_jetstream_that_never_answers_is_given_up_on_after_the_bound_naming_the_stream(
    lone_member: int, logs: list[MutableMapping[str, Any]]
) -> None:
    await _listening(lone_member)
    nc = await nats.connect(f"nats://127.0.0.1:{lone_member}")
    try:
        started = time.monotonic()
        with pytest.raises(bus.StreamsNotReadyError) as caught:
            await bus.ensure_streams(nc.jetstream(timeout=0.5), ready_timeout_s=2.0)
        took = time.monotonic() - started
    finally:
        await nc.close()
    assert 2.0 <= took < 3.0  # the bound, not the bound plus a request's timeout
    message = str(caught.value)
    assert "stream WORKLOADS" in message and "within 2 s" in message
    assert "no answer" in message
    assert len(_retries(logs)) >= 2


@pytest.fixture
async def server() -> AsyncIterator[str]:
    with EmbeddedNats() as nats_server:
        yield nats_server.url


async def test_a_configuration_error_is_raised_at_once_not_retried(
    server: str, logs: list[MutableMapping[str, Any]]
) -> None:
    nc = await nats.connect(server)
    js = nc.jetstream()
    try:
        # Another stream already holds the log's subjects: a conflict no wait resolves.
        await js.add_stream(name="OTHER", subjects=["allot.v1.events.>"])
        started = time.monotonic()
        with pytest.raises(BadRequestError) as overlap:
            await bus.ensure_streams(js, ready_timeout_s=30.0)
        assert overlap.value.err_code == 10065  # subjects overlap with an existing stream
        # Three replicas asked of a server that is no cluster.
        with pytest.raises(ServerError) as replicas:
            await bus.ensure_streams(js, 3, ready_timeout_s=30.0)
        assert replicas.value.err_code == 10074
        assert time.monotonic() - started < 5.0
    finally:
        await nc.close()
    assert not _retries(logs)


async def _stream_names(js: Any) -> AsyncIterator[str]:
    for info in await js.streams_info():
        yield info.config.name
