"""Real servers for integration tests: the ones this machine runs on 127.0.0.1:4222 (NATS)
and :6379 (Redis) when they answer, embedded ones from the wheels otherwise (a fresh
machine has neither). Never a mock.

``ALLOT_TEST_SERVERS=embedded`` starts embedded servers even when the machine's answer
(useful when two test runs share a machine: the streams have fixed names).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.js.errors import BucketNotFoundError, NotFoundError

from allot import compiled_core
from allot.adapters.embedded import EmbeddedNats, EmbeddedRedis

_FORCE_EMBEDDED = os.environ.get("ALLOT_TEST_SERVERS") == "embedded"

STREAMS = ("WORKLOADS", "HOSTS", "USAGE")
KV_BUCKETS = ("allot_leader", "allot_ranking")


def _answers(port: int) -> bool:
    if _FORCE_EMBEDDED:
        return False
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if _answers(6379):
        yield "redis://127.0.0.1:6379"
        return
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    if _answers(4222):
        yield "nats://127.0.0.1:4222"
        return
    with EmbeddedNats() as server:
        yield server.url


@pytest.fixture
async def fresh_log(nats_url: str) -> AsyncIterator[str]:
    """An empty Allot log: the streams and KV buckets are deleted before the test (the
    streams have fixed names, so integration tests run one at a time)."""
    import nats

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for name in STREAMS:
        with contextlib.suppress(NotFoundError):  # absent is what we want
            await js.delete_stream(name)
    for bucket in KV_BUCKETS:
        with contextlib.suppress(NotFoundError, BucketNotFoundError):
            await js.delete_key_value(bucket)
    await nc.close()
    yield nats_url


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A fresh directory every OS account may enter (pytest's ``tmp_path`` is root's
    alone): for workloads run as another user (``--run-as-user``)."""
    path = Path(tempfile.mkdtemp(prefix="allot-open-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _cgroup2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or ``.../unified`` on a
    hybrid host like this one), if anywhere."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return Path(fields[1])
    return None


@pytest.fixture
def cgroup_root() -> Iterator[Path]:
    """A fresh cgroup v2 directory of this process's user (root here and in CI) to hold the
    parts' cgroups (``--cgroup-root``); skipped, visibly, where there is none to make."""
    mount = _cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy is mounted")
    path = mount / f"allot-test-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        path.mkdir()
    except OSError as e:
        pytest.skip(f"cannot make a cgroup under {mount}: {e.strerror}")
    yield path
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")  # every process below it too
    # Children before parents: the deepest path first.
    for cgroup in [*sorted((p for p in path.rglob("*") if p.is_dir()), reverse=True), path]:
        for _ in range(100):
            with contextlib.suppress(OSError):
                cgroup.rmdir()
            if not cgroup.exists():
                break
            time.sleep(0.02)


@pytest.fixture
def past_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test that writes a history hours old into a fresh log in one go: every record
    of HOSTS and USAGE stored long after its own time would otherwise be refused as a copy
    stored again (``allot.bus.replays``, decision 0085) by the readers in this process."""
    import math

    from allot.bus import replays

    monkeypatch.setattr(replays, "REPLAY_AFTER_S", math.inf)


@pytest.fixture
async def paged_log(fresh_log: str) -> AsyncIterator[str]:
    """``fresh_log`` with ``allot.v1.dashboard.log`` answered as the ranking service answers
    it (the dashboard reads the log only through it) and nothing else: for a dashboard test
    whose other queries must go unanswered."""
    from allot import bus
    from allot.bus import history_pages
    from allot.proto import subjects as s

    nc, js = await bus.connect(fresh_log, "test-history")
    server = history_pages.request_server(nc, js, "test-history", s.DASHBOARD_LOG)
    await server.start()
    try:
        yield fresh_log
    finally:
        await server.stop()
        await nc.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``source_core`` observe the core's internals (they subclass or patch its
    private functions), which compiled modules do not allow: with the compiled core in use
    they are deselected here, and ``make test`` runs them in its second pass, on the source
    core (``ALLOT_PURE_CORE=1``), with the golden reports."""
    if compiled_core.STATE != "compiled":
        return
    kept = [i for i in items if i.get_closest_marker("source_core") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
