"""``allot streams``: the roles file's streams login makes the log's streams and the lease
bucket (decision 0082); run again it changes nothing; bad input names its option."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from allot import bus
from allot.adapters.embedded import EmbeddedNats
from allot.cli.main import main
from allot.core.budgets import parse_tree
from allot.ops.auth_gen import GeneratedAuth, generate
from allot.proto import subjects as s

pytestmark = pytest.mark.integration

TREE = {"name": "root", "children": [{"name": "nlp", "shares": 1}]}
ROLES = {"users": [{"name": "svc", "role": "service"}, {"name": "keeper", "role": "streams"}]}
BUCKET = f"KV_{bus.LEADER_BUCKET}"


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[EmbeddedNats, GeneratedAuth]]:
    auth = generate(parse_tree(TREE), ROLES, tmp_path / "auth", cost=4)
    with EmbeddedNats(config_file=auth.config_path) as server:
        yield server, auth


def _lines(out: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in out.splitlines())


def test_the_streams_login_makes_the_streams_once_and_the_services_find_them(
    secured: tuple[EmbeddedNats, GeneratedAuth], capsys: pytest.CaptureFixture[str]
) -> None:
    server, auth = secured
    keeper = auth.url("keeper", server.url)
    assert main(["streams", "--nats-url", keeper, "--lease-ttl-s", "4"]) == 0
    made = _lines(capsys.readouterr().out)
    assert made == {**dict.fromkeys(s.STREAMS, "created"), BUCKET: "created (leases last 4 s)"}
    assert main(["streams", "--nats-url", keeper, "--lease-ttl-s", "4"]) == 0
    again = _lines(capsys.readouterr().out)
    assert again == {**dict.fromkeys(s.STREAMS, "as wanted"), BUCKET: "as wanted (leases last 4 s)"}

    async def as_the_services() -> tuple[dict[str, str], float | None]:
        nc, js = await bus.connect(auth.url("svc", server.url), "test-services")
        try:
            found = await bus.ensure_streams(js, ready_timeout_s=0)
            kv = await bus.lease_bucket(js, 4.0)
            with pytest.raises(bus.LeaseBucketError, match="--lease-ttl-s"):
                await bus.lease_bucket(js, 3.0)  # another TTL than the bucket's
            return found, (await kv.status()).ttl
        finally:
            await nc.close()

    found, ttl = asyncio.run(as_the_services())
    assert found == dict.fromkeys(s.STREAMS, "as wanted") and ttl == 4.0


def test_a_login_that_may_not_make_streams_gets_a_message_naming_the_command(
    secured: tuple[EmbeddedNats, GeneratedAuth], capsys: pytest.CaptureFixture[str]
) -> None:
    server, auth = secured
    url = auth.url("svc", server.url)
    assert main(["streams", "--nats-url", url, "--timeout-s", "0"]) == 1
    out = capsys.readouterr().out
    assert "could not create or update stream" in out and "`allot streams`" in out
    assert auth.users["svc"].password not in out


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--replicas", "0"], "--replicas"),
        (["--replicas", "6"], "--replicas"),
        (["--lease-ttl-s", "0"], "--lease-ttl-s"),
        (["--timeout-s", "-1"], "--timeout-s"),
    ],
)
def test_bad_options_are_refused_naming_them(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["streams", "--nats-url", "nats://127.0.0.1:1", *argv]) == 2
    assert option in capsys.readouterr().err
