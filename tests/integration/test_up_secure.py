"""``allot up --secure``: the stack runs with users, per-role permissions and TLS on
loopback; a team submits to its own allocation and is refused another's."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from live_harness import eventually

from allot.adapters.batch_staging import staging_dir
from allot.cli import live_cmds
from allot.cli import main as cli_main
from allot.cli.up_cmd import try_line
from allot.ops.auth_gen import ACCOUNT
from allot.ops.stack import AgentSpec, Stack, StackConfig
from allot.sdk import Client
from allot.sdk.errors import NotConnectedError, SdkError

pytestmark = pytest.mark.integration


async def test_secure_stack_serves_a_team_only_its_own_allocation(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = StackConfig(
        run_dir=tmp_path,
        redis_url=redis_url,
        redis_prefix="secure-test",
        secure=True,
        agents=(AgentSpec("fake-a", hosts=2, gpus=8),),
        placements=1,
        grace_s=2,
        rank_every_s=1.0,
    )
    with Stack(config) as stack:
        assert stack.auth is not None and stack.ca_file is not None
        # Streams live in the service account's store; its WORKLOADS stages batches on tmpfs.
        staging = staging_dir(tmp_path / "jetstream", ACCOUNT, "WORKLOADS")
        assert (staging.parent / "meta.inf").is_file() and staging.is_symlink()
        assert stack.servers.nats is not None
        assert stack.servers.nats.staged_in_memory == [f"{ACCOUNT}/WORKLOADS"]
        url = stack.url_for("nlp")
        assert url.startswith("tls://nlp:")
        # The agent connects as its own user, granted only its hosts (docs/security.md),
        # the dashboard as its own (the log to read, its queries to answer), the other
        # services as the service user. Until 2026-12-03 the agent had the service's.
        users = {name: _nats_user(proc.pid) for name, proc in stack.procs.items()}
        assert users.pop("agent-fake-a") == "agent-fake-a"
        assert users.pop("dashboard") == stack.auth.first("dashboard").user == "allot-dashboard"
        # Each service as its own login (decision 0084): placement-1 is placement's.
        assert users == {name: f"allot-{name.split('-')[0]}" for name in users}
        monkeypatch.setenv("ALLOT_NATS_CA", str(stack.ca_file))
        async with Client(url, timeout=2.0, retries=0) as c:
            ok = await c.submit(  # as the login, nlp: the only name its grants allow
                client_id="s1",
                allocation="nlp",
                gpus=1,
                min_runtime_s=60,
                duration_s=120,  # holds a GPU: the 16-GPU runs below stay pending
            )
            assert ok.workload_id
            with pytest.raises(SdkError):  # not granted: the request never reaches intake
                await c.submit(client_id="s2", allocation="vision", gpus=1)
        # Pending work of two teams: 16-GPU runs wait while s1 holds a GPU (protected 60 s).
        async with Client(stack.url_for("vision"), timeout=2.0, retries=0) as vision:
            theirs = await vision.submit(
                client_id="v1", allocation="vision", gpus=16, min_runtime_s=60
            )
        async with Client(url, timeout=2.0, retries=0) as c:
            mine = await c.submit(client_id="n2", allocation="nlp", gpus=16, min_runtime_s=60)
        await _dashboard_confines_each_team(stack, theirs.workload_id, mine.workload_id)
        # The line `allot up` prints to try works as the exported team: no --user (its
        # login is the only name its grants allow), its own allocation.
        submit = try_line(stack).split(";")[0].split()
        assert submit[:2] == ["allot", "submit"] and "--user" not in submit
        argv = [*submit[1:2], "--nats-url", url, *submit[2:]]
        assert await asyncio.to_thread(live_cmds.main, argv) == 0
        # Without the CA the server's certificate is not trusted, and the error says so.
        monkeypatch.delenv("ALLOT_NATS_CA")
        with pytest.raises(NotConnectedError) as caught:
            async with Client(url, timeout=1.0, retries=0) as c:
                await asyncio.wait_for(c.queue(), 3)
        assert "not trusted" in str(caught.value) and "ALLOT_NATS_CA" in str(caught.value)
        assert "is the stack running" not in str(caught.value)
        # The user's env file carries the CA: sourcing it alone is enough.
        env = (stack.auth.users["nlp"].path).read_text().splitlines()
        assert f"ALLOT_NATS_CA={stack.ca_file.resolve()}" in env
    # The server's own log stays in the run directory after stop, each refusal in it (here
    # nlp's submission to vision, above) naming the subject.
    server_log = (tmp_path / "logs" / "nats-server.log").read_text(errors="replace")
    assert any(
        "Violation" in line and "allot.v1.submit.vision.nlp" in line
        for line in server_log.splitlines()
    )
    # The streams login made the streams before the services started, so the services asked
    # nothing of JetStream that their logins may not (decision 0082).
    # Nor anything of what each service's own login is granted (decision 0084).
    refused = [line for line in server_log.splitlines() if "Violation" in line]
    assert refused and not [line for line in refused if "user:allot-" in line]


def _get(url: str, user: str | None = None, password: str = "") -> tuple[int, Any]:
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as e:
        body, status = e.read(), e.code
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")


async def _dashboard_confines_each_team(stack: Stack, theirs: str, mine: str) -> None:
    """The dashboard of a secure stack asks for a login (the users' dashboard passwords, not
    their NATS ones) and shows a team only its own work."""
    assert stack.auth is not None and stack.dashboard_url is not None
    base = stack.dashboard_url
    password = {u: c.dashboard_password for u, c in stack.auth.users.items()}

    def get(path: str, user: str | None = None, pw: str | None = None) -> tuple[int, Any]:
        return _get(base + path, user, password.get(user or "", "") if pw is None else pw)

    assert (await asyncio.to_thread(get, "/healthz"))[0] == 200  # open: health checks
    for path in ("/", "/queue", "/api/queue", f"/workload/{mine}", "/metrics"):
        assert (await asyncio.to_thread(get, path))[0] == 401, path
    assert (await asyncio.to_thread(get, "/api/queue", "nlp", "wrong"))[0] == 401
    nats_password = stack.auth.users["nlp"].password  # never typed at the pages
    assert (await asyncio.to_thread(get, "/api/queue", "nlp", nats_password))[0] == 401
    agent = next(u for u, c in stack.auth.users.items() if c.role == "agent")
    assert (await asyncio.to_thread(get, "/api/queue", agent))[0] == 403

    async def queue_ids(user: str) -> set[str]:
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            status, doc = await asyncio.to_thread(get, "/api/queue", user)
            assert status == 200, doc
            ids = set(doc["data"]["order"])
            if {theirs, mine} & ids or asyncio.get_running_loop().time() > deadline:
                return ids
            await asyncio.sleep(0.5)

    assert mine in await queue_ids("nlp") and theirs not in await queue_ids("nlp")
    assert {mine, theirs} <= await queue_ids("admin")
    status, _ = await asyncio.to_thread(get, f"/api/workload/{theirs}", "nlp")
    assert status == 404  # another team's workload reads as unknown
    assert (await asyncio.to_thread(get, f"/api/workload/{mine}", "nlp"))[0] == 200
    assert (await asyncio.to_thread(get, f"/api/workload/{theirs}", "admin"))[0] == 200
    assert (await asyncio.to_thread(get, "/metrics", "nlp"))[0] == 200


def _nats_user(pid: int) -> str | None:
    """The NATS user in a process's ALLOT_NATS_URL (from /proc: what it connects as)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    url = next(v for v in environ if v.startswith(b"ALLOT_NATS_URL=")).decode()
    return urlsplit(url.partition("=")[2]).username


async def test_a_secure_stacks_own_redis_takes_a_password_only_its_clients_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under ``--secure`` the stack's own Redis takes the password of ``auth/redis.env``
    (any user of the machine could otherwise rewrite the usage counters: decision 0086);
    accounting and ranking alone are given it, and ``allot accounting`` finds the stack's
    Redis and logs in with the file sourced."""
    config = StackConfig(
        run_dir=tmp_path,
        redis_prefix="own-redis",
        secure=True,
        agents=(AgentSpec("fake-a", hosts=1, gpus=8),),
        placements=1,
        rank_every_s=1.0,
        accrue_s=1.0,
        slot_s=1.0,
        dashboard=False,
    )
    with Stack(config) as stack:  # ready: ranking has ranked, reading Redis
        assert stack.auth is not None and stack.servers.redis is not None
        password = stack.redis_password
        assert password is not None
        assert f"ALLOT_REDIS_PASSWORD={password}" in stack.auth.redis_env.read_text()  # type: ignore[union-attr]
        port = stack.servers.redis.port
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        assert redis.Redis(port=port, password=password).ping()
        given = {
            name: _env(proc.pid).get("ALLOT_REDIS_PASSWORD") for name, proc in stack.procs.items()
        }
        assert {name for name, pw in given.items() if pw == password} == {"accounting", "ranking"}
        assert all(
            pw is None for name, pw in given.items() if name not in ("accounting", "ranking")
        )
        monkeypatch.setenv("ALLOT_NATS_CA", str(stack.ca_file))
        async with Client(stack.url_for("nlp"), timeout=5.0) as c:
            run = await c.submit(
                client_id="r1", allocation="nlp", gpus=2, min_runtime_s=1, duration_s=2.0
            )
            await eventually(
                lambda: c.status(run.workload_id, scope="nlp"),
                lambda st: st.state == "completed",
                timeout=30,
            )
        monkeypatch.setenv("ALLOT_RUN_DIR", str(tmp_path))
        monkeypatch.delenv("ALLOT_REDIS_URL", raising=False)
        monkeypatch.delenv("ALLOT_REDIS_PASSWORD", raising=False)
        argv = ["accounting", "usage", "--prefix", "own-redis", "--json"]
        assert await asyncio.to_thread(cli_main.main, argv) != 0  # not sourced: refused
        assert "ALLOT_REDIS_PASSWORD" in capsys.readouterr().err
        monkeypatch.setenv("ALLOT_REDIS_PASSWORD", password)  # auth/redis.env, sourced

        async def charged() -> float:
            assert await asyncio.to_thread(cli_main.main, argv) == 0
            return float(json.loads(capsys.readouterr().out)["data"]["gpu_hours"].get("nlp", 0))

        await eventually(charged, lambda h: h > 0, timeout=30)


def _env(pid: int) -> dict[str, str]:
    """A process's environment, from /proc."""
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode().partition("=")[::2] for p in pairs if b"=" in p)
