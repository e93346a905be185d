"""A service given a NATS login refuses a server that lets clients in without one
(``allot.bus.open_server``): a deployment meant to be secured whose server lost the users
of ``allot auth gen`` (compose's cluster override under its secure one) must not run, open,
as if it were secured. Real nats-servers: one without users, one with ``auth gen``'s."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from allot import bus
from allot.adapters.embedded import EmbeddedNats
from allot.bus.open_server import OpenServerError, without_logins
from allot.core.budgets import parse_tree
from allot.ops.auth_gen import GeneratedAuth, generate

pytestmark = pytest.mark.integration

TREE = {"name": "root", "children": [{"name": "nlp", "shares": 1}]}
ROLES = {"users": [{"name": "svc", "role": "service"}]}


@pytest.fixture
def open_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(store_dir=tmp_path / "open") as server:
        yield server


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[EmbeddedNats, GeneratedAuth]]:
    auth = generate(parse_tree(TREE), ROLES, tmp_path / "auth", cost=4)
    with EmbeddedNats(config_file=auth.config_path) as server:
        yield server, auth


def _with_login(url: str, user: str = "svc", password: str = "some-password") -> str:
    pieces = urlsplit(url)
    return pieces._replace(netloc=f"{user}:{password}@{pieces.netloc}").geturl()


def test_a_login_on_a_server_that_needs_none_is_refused_naming_the_cause(
    open_server: EmbeddedNats,
) -> None:
    async def main() -> None:
        with pytest.raises(OpenServerError) as err:
            await bus.connect(_with_login(open_server.url), "allot-intake-log")
        text = str(err.value)
        assert "without a login" in text and "allot-intake-log" in text
        assert "some-password" not in text, "the error must not print the password"

    asyncio.run(main())


def test_no_login_on_an_open_server_connects(open_server: EmbeddedNats) -> None:
    """The unsecured stack (`make run`, compose.yaml) gives no login: nothing to refuse."""

    async def main() -> None:
        nc, _ = await bus.connect(open_server.url, "allot-intake-log")
        assert nc.is_connected
        await nc.close()

    asyncio.run(main())


def test_a_login_on_a_secured_server_connects(
    secured: tuple[EmbeddedNats, GeneratedAuth],
) -> None:
    server, auth = secured

    async def main() -> None:
        nc, js = await bus.connect(auth.url("svc", server.url), "allot-intake-log")
        assert nc.is_connected
        await js.account_info()  # logged in as the service user, JetStream reachable
        await nc.close()

    asyncio.run(main())


def test_without_logins_strips_each_server_address() -> None:
    url = "nats://a:pw@h1:4222, nats://tok@h2:4223,tls://h3:4224"
    assert without_logins(url) == ["nats://h1:4222", "nats://h2:4223", "tls://h3:4224"]


def test_a_service_given_a_login_stops_on_an_open_server_with_one_line(
    open_server: EmbeddedNats,
) -> None:
    """What an operator sees: the service exits 1 with the cause, not a traceback."""
    env = dict(os.environ, ALLOT_NATS_URL=_with_login(open_server.url))
    env.pop("ALLOT_NATS_USER", None)
    env.pop("ALLOT_NATS_PASSWORD", None)
    run = subprocess.run(
        [sys.executable, "-m", "allot.services.intake"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1, run
    assert "lets clients in without a login" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
