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
    # Placement's TTL changed: the streams login sets it, the services' login may not.
    assert main(["streams", "--nats-url", keeper, "--lease-ttl-s", "5"]) == 0
    assert _lines(capsys.readouterr().out)[BUCKET] == "updated (max_age; leases last 5 s)"


def test_what_the_services_find_missing_or_lacking_is_said_not_waited_on(
    secured: tuple[EmbeddedNats, GeneratedAuth],
) -> None:
    """A missing lease bucket: placement's lease loop is told to run ``allot streams``; a
    stream without ``allow_atomic`` (made before the server took it: NATS upgraded alone)
    is used as it is, appends one by one, rather than the service stopping."""
    server, auth = secured

    async def check() -> tuple[str, dict[str, str], tuple[int, int]]:
        knc, kjs = await bus.connect(auth.url("keeper", server.url), "test-keeper")
        nc, _ = await bus.connect(auth.url("svc", server.url), "test-services")
        try:
            for config in bus.stream_configs(1):
                config.allow_atomic = None
                await kjs.add_stream(config)
            js = nc.jetstream(timeout=0.5)
            with pytest.raises(bus.LeaseBucketError) as missing:
                await bus.lease_bucket(js, 3.0)
            found = await bus.ensure_streams(js, ready_timeout_s=0)
            version = nc.connected_server_version
            return str(missing.value), found, (version.major, version.minor)
        finally:
            await nc.close()
            await knc.close()

    missing, found, version = asyncio.run(check())
    assert "missing and could not be made" in missing and "`allot streams`" in missing
    lacking = "as found, without allow_atomic" if version >= (2, 12) else "as wanted"
    assert found == {"WORKLOADS": lacking, "HOSTS": "as wanted", "USAGE": "as wanted"}


def test_a_login_that_may_not_make_streams_gets_a_message_naming_the_command(
    secured: tuple[EmbeddedNats, GeneratedAuth], capsys: pytest.CaptureFixture[str]
) -> None:
    server, auth = secured
    url = auth.url("svc", server.url)
    assert main(["streams", "--nats-url", url]) == 1
    out = capsys.readouterr().out
    # said at the first refusal, not after the 30 s a server that cannot answer yet gets
    assert "may not make the log's streams" in out and "allot-streams.env" in out
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


def test_a_server_not_reached_is_said_within_the_timeout_and_the_password_is_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A wrong address (a careless `--nats-url`) ends the command after about --timeout-s,
    as a one-shot command should, instead of retrying forever as a service does."""
    url = "nats://keeper:s3cret@127.0.0.1:1"
    assert main(["streams", "--nats-url", url, "--timeout-s", "1"]) == 1
    out = capsys.readouterr().out
    assert "no servers available" in out and "127.0.0.1:1" in out and "s3cret" not in out
