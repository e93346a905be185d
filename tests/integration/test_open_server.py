"""A service given a NATS login refuses a server that lets clients in without one
(``allot.bus.open_server``): a deployment meant to be secured whose server lost the users
of ``allot auth gen`` (compose's cluster override under its secure one) must not run, open,
as if it were secured. Real nats-servers: one without users, one with ``auth gen``'s."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from allot.adapters.embedded import EmbeddedNats, free_ports
from allot.auth.client import PASSWORD_ENV, USER_ENV, nats_url_from_env
from allot.bus.open_server import OpenServerError, addresses, refuse_an_open_server
from allot.core.budgets import parse_tree
from allot.ops.auth_gen import GeneratedAuth, generate
from allot.ops.stack import Stack, StackConfig

pytestmark = pytest.mark.integration

TREE = {"name": "root", "children": [{"name": "nlp", "shares": 1}]}
ROLES = {"users": [{"name": "svc", "role": "service"}, {"name": "keeper", "role": "streams"}]}


@pytest.fixture
def open_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(store_dir=tmp_path / "open") as server:
        yield server


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[EmbeddedNats, GeneratedAuth]]:
    auth = generate(parse_tree(TREE), ROLES, tmp_path / "auth", cost=4)
    with EmbeddedNats(config_file=auth.config_path) as server:
        yield server, auth


def _with_login(url: str, login: str = "svc:some-password") -> str:
    pieces = urlsplit(url)
    return pieces._replace(netloc=f"{login}@{pieces.netloc}").geturl()


def _refused(url: str) -> str | None:
    """The check's error text for ``url``, None when it lets the service run."""
    try:
        asyncio.run(refuse_an_open_server(url, "allot-intake"))
    except OpenServerError as exc:
        return str(exc)
    return None


def test_a_login_on_a_server_that_needs_none_is_refused_naming_the_cause(
    open_server: EmbeddedNats,
) -> None:
    said = _refused(_with_login(open_server.url))
    assert said is not None and "without a login" in said and "allot-intake" in said
    assert "some-password" not in said, "the error must not print the password"
    assert _refused(_with_login(open_server.url, "a-token")) is not None, "a token is a login"


def test_each_written_form_of_the_url_is_checked(open_server: EmbeddedNats) -> None:
    """A bare host:port (nats:// is implied) and a trailing comma, as the services take
    them (``allot.bus.server_urls``), are checked too."""
    bare = _with_login(open_server.url).removeprefix("nats://")
    assert _refused(bare) is not None
    assert _refused(_with_login(open_server.url) + ",") is not None


def test_one_open_server_among_secured_ones_is_refused_every_time(
    open_server: EmbeddedNats, secured: tuple[EmbeddedNats, GeneratedAuth]
) -> None:
    """The case the check is for in a cluster: one node's configuration lost its users.
    Each address is asked on its own, so the order a client would try them does not
    matter."""
    server, auth = secured
    login = auth.url("svc", server.url)
    password = urlsplit(login).password
    both = f"{login},{_with_login(open_server.url, f'svc:{password}')}"
    for _ in range(5):
        assert _refused(both) is not None


def test_no_login_and_a_login_on_a_secured_server_pass(
    open_server: EmbeddedNats, secured: tuple[EmbeddedNats, GeneratedAuth]
) -> None:
    """The unsecured stack (`make run`, compose.yaml) gives no login: nothing to refuse."""
    server, auth = secured
    assert _refused(open_server.url) is None
    assert _refused(auth.url("svc", server.url)) is None


def test_a_server_that_does_not_answer_is_not_judged_and_not_waited_for() -> None:
    (port,) = free_ports(1)  # nothing listens there
    started = time.monotonic()
    assert _refused(f"nats://svc:pw@127.0.0.1:{port}") is None
    assert time.monotonic() - started < 10


def test_addresses_strip_each_login() -> None:
    url = "nats://a:pw@h1:4222, tok@h2:4223,tls://h3:4224,"
    assert addresses(url) == [
        ("nats://a:pw@h1:4222", "nats://h1:4222"),
        ("nats://tok@h2:4223", "nats://h2:4223"),
        ("tls://h3:4224", "tls://h3:4224"),
    ]


@pytest.mark.parametrize("service", ["intake", "dispatch"])
def test_every_service_given_a_login_stops_on_an_open_server_with_one_line(
    open_server: EmbeddedNats, service: str
) -> None:
    """What an operator sees: the service exits 1 with the cause, not a traceback. Dispatch
    reaches NATS through its broker alone (no connection of its own)."""
    env = dict(os.environ, ALLOT_NATS_URL=_with_login(open_server.url))
    env.pop("ALLOT_NATS_USER", None)
    env.pop("ALLOT_NATS_PASSWORD", None)
    run = subprocess.run(
        [sys.executable, "-m", f"allot.services.{service}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1, run
    assert "lets clients in without a login" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr


def test_allot_up_gives_its_own_open_server_no_login_from_the_callers_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, open_server: EmbeddedNats
) -> None:
    """A team member's shell holds their login (`. auth/users/alice.env`); the services of
    an `allot up` on its own unsecured server must not carry it there, where the check
    above would stop them. A login for a server given with --nats-url is kept."""
    monkeypatch.setenv(USER_ENV, "alice")
    monkeypatch.setenv(PASSWORD_ENV, "secret")
    for config, kept in (
        (StackConfig(run_dir=tmp_path / "own"), False),
        (StackConfig(run_dir=tmp_path / "given", nats_url=open_server.url), True),
    ):
        stack = Stack(config)
        stack.servers.start()
        try:
            env = stack.env()
            assert (env.get(USER_ENV), env.get(PASSWORD_ENV)) == (
                ("alice", "secret") if kept else (None, None)
            )
            if not kept:
                assert _refused(nats_url_from_env(env, "")) is None
        finally:
            stack.servers.stop()
