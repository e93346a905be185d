"""``deploy/compose.secure.yaml``: compose mounts what ``allot auth gen`` writes.

Checked against a real ``allot auth gen`` output (``deploy/roles.compose.yaml``) in a copy of
the project: every Allot container gets its own user's credentials (each service its own
login, decision 0084; agents exactly the hosts their command simulates; no container the
shared services' login), every mounted file exists, the URL a container computes names its
user, the one-shot ``streams`` (``allot streams`` as the streams login) runs before every
service, nats-server starts from the secure configuration and takes those credentials (and
refuses a wrong one; the streams login makes the streams, the shared services' login and
each service's own find them and may not delete one), and ``docker compose config`` merges
the two files when a Compose v2 CLI is here.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nats
import nats.errors
import pytest
import yaml
from test_compose import (
    COMPOSE_FILE,
    DEPENDS_ON_CONDITIONS,
    ENGINES,
    NATS_CONF,
    RESTART_POLICIES,
    ROOT,
    SERVICE_KEYS,
    _command,
    _compose_cli,
    _load,
    _services,
    conf_store_dir,
    merge_compose,
    tmpfs_targets,
)

from allot import bus
from allot.adapters.batch_staging import DEFAULT_ACCOUNT, staging_dir
from allot.adapters.embedded import find_nats_server, free_ports
from allot.auth.client import nats_url_from_env
from allot.bus import ATOMIC_STREAMS
from allot.cli.main import build_parser as allot_parser
from allot.cli.streams_cmd import run_streams
from allot.config.yaml_io import load_yaml
from allot.core.budgets import parse_tree
from allot.ops.auth_gen import ACCOUNT, SERVICE_NAMES, GeneratedAuth, generate
from allot.ops.log_streams import make_streams
from allot.services.dashboard.service import build_parser as dashboard_parser

OVERRIDE = ROOT / "deploy" / "compose.secure.yaml"
STREAMS = "streams"
"""The override's one-shot service that makes the log's streams (``allot streams``)."""
SHARED_LOGIN = "allot-services"
"""The shared services' login: the operators' tools', no container's."""


def _env_file(path: Path) -> dict[str, str]:
    pairs = (ln.split("=", 1) for ln in path.read_text().splitlines() if "=" in ln)
    return {k.strip(): v.strip() for k, v in pairs if not k.lstrip().startswith("#")}


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, GeneratedAuth]:
    """A copy of the project's compose files with ``auth/`` written by the real generator."""
    shutil.copy(COMPOSE_FILE, tmp_path / "compose.yaml")
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    tree = parse_tree(load_yaml(ROOT / "deploy" / "budgets.example.yaml"))
    roles = load_yaml(ROOT / "deploy" / "roles.compose.yaml")
    auth = generate(tree, roles, tmp_path / "auth", server_url="nats://nats:4222", cost=4)
    return tmp_path, auth


def _override() -> dict[str, dict[str, dict[str, object]]]:
    data = yaml.safe_load(OVERRIDE.read_text())
    assert set(data) == {"services"}
    return data  # type: ignore[no-any-return]


def _fake_hosts(command: list[str]) -> list[str]:
    args = dict(itertools.pairwise(command))
    return [f"{args['--host-prefix']}-{i:04d}" for i in range(int(args["--hosts"]))]


def _merged() -> dict[str, dict[str, object]]:
    """compose.yaml's services with the override merged over them as Compose merges."""
    services = merge_compose(_load(COMPOSE_FILE), _load(OVERRIDE))["services"]
    assert isinstance(services, dict)
    return services


def test_every_container_connects_as_its_own_user(project: tuple[Path, GeneratedAuth]) -> None:
    root, auth = project
    override = _override()["services"]
    allot = {name for name in _services() if name not in ENGINES} | {STREAMS}
    assert allot <= set(override), f"no credentials for {sorted(allot - set(override))}"
    for name in sorted(allot):
        [env_path] = override[name]["env_file"]  # type: ignore[misc]
        env = _env_file(root / str(env_path))
        user = env["ALLOT_NATS_USER"]
        role = auth.users[user].role
        # Compose's `environment` (nats://nats:4222, no user) outranks the env file: the
        # container puts the file's user into the URL itself.
        url = nats_url_from_env({**env, "ALLOT_NATS_URL": "nats://nats:4222"}, "x")
        parts = urlsplit(url)
        assert (parts.hostname, unquote(parts.username or "")) == ("nats", user), name
        assert unquote(parts.password or "") == auth.users[user].password
        command = _command(_merged()[name])
        if command == ["allot", "streams"]:
            # The only login that may create or update a stream (and nothing else).
            assert role == "streams", f"{name} connects as {user} ({role})"
        elif "allot.services.agent" in command:
            assert role == "agent", f"{name} connects as {user} ({role})"
            granted = {s.split(".")[3] for s in auth.grants[user].publish}
            assert granted == set(_fake_hosts(command)), f"{name}: hosts and grants differ"
        elif "allot.services.dashboard" in command:
            # The web-facing process: the log to read and its queries to answer, no more.
            assert role == "dashboard", f"{name} connects as {user} ({role})"
        else:
            # Each service as its own login, granted what that service sends and hears
            # (decision 0084); placement's two replicas share placement's.
            assert name in SERVICE_NAMES, f"{name}: no Allot service"
            assert role == "service", f"{name} connects as {user} ({role})"
            assert (user, auth.users[user].service) == (f"allot-{name}", name), name
        assert user != SHARED_LOGIN, f"{name} connects as the shared services' login"


def test_mounted_files_exist_and_the_dashboard_asks_for_logins(
    project: tuple[Path, GeneratedAuth],
) -> None:
    root, auth = project
    for name, service in _override()["services"].items():
        for volume in service.get("volumes", []):  # type: ignore[attr-defined]
            source = str(volume).split(":")[0]
            assert (root / source).is_file(), f"{name} mounts {source}: not written"
    dashboard = _override()["services"]["dashboard"]["command"]
    assert isinstance(dashboard, list)
    users_file = dashboard[dashboard.index("--users") + 1]
    mounts = [str(v) for v in _override()["services"]["dashboard"]["volumes"]]  # type: ignore[attr-defined]
    assert any(v.split(":")[1] == users_file for v in mounts)
    args = dashboard[dashboard.index("allot.services.dashboard") + 1 :]
    assert dashboard_parser().parse_args(args).users == users_file
    assert auth.dashboard_users is not None and auth.dashboard_users.is_file()


def test_the_streams_are_made_once_before_the_services_start() -> None:
    """The services' login may not create or update a stream: ``streams`` makes them as
    the streams login, once NATS is healthy, and every service of the services' login
    waits for it to exit 0 (its depends_on merged with compose.yaml's nats and redis)."""
    merged = _merged()
    streams = merged[STREAMS]
    assert set(streams) <= SERVICE_KEYS, sorted(set(streams) - SERVICE_KEYS)
    command = _command(streams)
    assert command == ["allot", "streams"], command
    args = allot_parser().parse_args(command[1:])
    # No --nats-url or --replicas: the URL from the environment, the replicas from
    # ALLOT_STREAM_REPLICAS when set (one server here: a new stream gets 1).
    assert args.func is run_streams and args.nats_url is None and args.replicas is None
    assert streams["environment"]["ALLOT_NATS_URL"] == "nats://nats:4222"  # type: ignore[index]
    intake = merged["intake"]
    assert (streams["image"], streams["build"]) == (intake["image"], intake["build"])
    assert streams["depends_on"] == {"nats": {"condition": "service_healthy"}}
    # Once: with a restart policy Compose could miss the exit it waits for.
    assert streams["restart"] == "no" and RESTART_POLICIES.fullmatch(str(streams["restart"]))
    assert "healthcheck" not in streams and "ports" not in streams
    waiting = set()
    for name, service in merged.items():
        deps = service.get("depends_on", {})
        assert isinstance(deps, dict), name
        for target, spec in deps.items():
            assert target in merged and target != name, (name, target)
            assert spec.get("condition", "service_started") in DEPENDS_ON_CONDITIONS
        if STREAMS in deps:
            assert deps[STREAMS] == {"condition": "service_completed_successfully"}, name
            assert {"nats", "redis"} <= set(deps), f"{name}: compose.yaml's depends_on lost"
            waiting.add(name)
    own_login = {
        name
        for name, service in _override()["services"].items()
        if name in SERVICE_NAMES and service.get("env_file") == [f"./auth/users/allot-{name}.env"]
    }
    assert own_login == set(SERVICE_NAMES)
    assert waiting == own_login, sorted(waiting ^ own_login)


@pytest.fixture
def secure_nats(project: tuple[Path, GeneratedAuth]) -> Iterator[tuple[str, GeneratedAuth]]:
    """nats-server started from deploy/nats.secure.conf laid out as compose mounts it."""
    root, auth = project
    etc = root / "etc-nats"
    (etc / "auth").mkdir(parents=True)
    plain, count = re.subn(
        r"(?m)^(\s*store_dir:\s*)/data\s*$",
        rf"\g<1>{root}/store",
        (ROOT / "deploy" / "nats.conf").read_text(),
    )
    assert count == 1
    (etc / "allot.conf").write_text(plain)
    shutil.copy(ROOT / "deploy" / "nats.secure.conf", etc / "secure.conf")
    shutil.copy(auth.config_path, etc / "auth" / "nats.conf")
    test = subprocess.run(
        [str(find_nats_server()), "-c", str(etc / "secure.conf"), "-t"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert test.returncode == 0, f"nats-server rejects the secure config: {test.stderr}"
    client, monitor = free_ports(2)
    argv = [str(find_nats_server()), "-c", str(etc / "secure.conf"), "-a", "127.0.0.1"]
    proc = subprocess.Popen(
        [*argv, "-p", str(client), "-m", str(monitor)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{monitor}/healthz", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"nats://127.0.0.1:{client}", auth
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.integration
def test_the_secure_server_takes_the_generated_credentials(
    secure_nats: tuple[str, GeneratedAuth],
) -> None:
    server, auth = secure_nats

    async def check() -> None:
        creds = auth.users["allot-services"]
        env = {"ALLOT_NATS_USER": creds.user, "ALLOT_NATS_PASSWORD": creds.password}
        nc = await nats.connect(nats_url_from_env({**env, "ALLOT_NATS_URL": server}, "x"))
        js = nc.jetstream()
        info = await js.account_info()  # JetStream is on for the service user's account
        assert info.limits is not None
        await nc.close()
        wrong = {**env, "ALLOT_NATS_PASSWORD": "not-it", "ALLOT_NATS_URL": server}
        with pytest.raises((nats.errors.Error, OSError)):
            await nats.connect(
                nats_url_from_env(wrong, "x"), allow_reconnect=False, connect_timeout=2
            )

    asyncio.run(check())


@pytest.mark.integration
def test_the_streams_login_makes_the_streams_and_the_services_login_only_reads_them(
    secure_nats: tuple[str, GeneratedAuth],
) -> None:
    """What the override runs, against the secure configuration: ``allot streams``'s core as
    allot-streams, then a service's start (``ensure_streams``) as allot-services and as each
    service's own login finds the streams as they should be; their stream delete is
    refused (not answered)."""
    server, auth = secure_nats

    def url(user: str) -> str:
        creds = auth.users[user]
        env = {"ALLOT_NATS_USER": creds.user, "ALLOT_NATS_PASSWORD": creds.password}
        return nats_url_from_env({**env, "ALLOT_NATS_URL": server}, "")

    async def check() -> None:
        made = await make_streams(url("allot-streams"), timeout_s=10)
        assert made == {
            **dict.fromkeys(("WORKLOADS", "HOSTS", "USAGE"), "created"),
            f"KV_{bus.LEADER_BUCKET}": f"created (leases last {bus.LEASE_TTL_S:g} s)",
        }
        again = await make_streams(url("allot-streams"), timeout_s=10)
        assert set(again.values()) == {
            "as wanted",
            f"as wanted (leases last {bus.LEASE_TTL_S:g} s)",
        }
        for user in (SHARED_LOGIN, *(f"allot-{name}" for name in SERVICE_NAMES)):
            nc, js = await bus.connect(url(user), f"test-{user}")
            try:
                found = await bus.ensure_streams(js, ready_timeout_s=0)
                assert found == dict.fromkeys(("WORKLOADS", "HOSTS", "USAGE"), "as wanted")
                if user in (SHARED_LOGIN, "allot-placement"):  # placement's start: found
                    await bus.lease_bucket(js, bus.LEASE_TTL_S)
                with pytest.raises(nats.errors.TimeoutError):
                    await nc.jetstream(timeout=1).delete_stream("HOSTS")
                assert (await js.stream_info("HOSTS")).config.name == "HOSTS", user
            finally:
                await nc.close()

    asyncio.run(check())


def test_nats_stages_the_allot_accounts_batches_on_tmpfs() -> None:
    """Under the override the streams live in the ALLOT account (deploy/nats.secure.conf
    includes nats.conf, so the same store_dir): its atomic streams stage on tmpfs too."""
    assert '"allot.conf"' in (ROOT / "deploy" / "nats.secure.conf").read_text()
    targets = tmpfs_targets(_override()["services"]["nats"])
    for stream in ATOMIC_STREAMS:
        assert staging_dir(conf_store_dir(NATS_CONF), ACCOUNT, stream) in targets, targets


def test_docker_compose_config_merges_the_override(
    project: tuple[Path, GeneratedAuth],
) -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no Compose v2 CLI here: the YAML checks of this file ran")
    root, _ = project
    argv = [*cli, "--project-directory", str(root), "-f", str(root / "compose.yaml")]
    argv += ["-f", str(root / "deploy" / "compose.secure.yaml"), "config", "--format", "json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    resolved = json.loads(proc.stdout)["services"]
    assert resolved["nats"]["command"] == ["-c", "/etc/nats/secure.conf"]
    targets = {v["target"] for v in resolved["nats"]["volumes"]}
    assert {"/etc/nats/allot.conf", "/etc/nats/secure.conf", "/etc/nats/auth/nats.conf"} <= targets
    # Compose appends the override's tmpfs to the base file's: both accounts stage on tmpfs.
    staged = tmpfs_targets(resolved["nats"])
    assert staged == tmpfs_targets(_services()["nats"]) | tmpfs_targets(
        _override()["services"]["nats"]
    ), staged
    assert staging_dir(conf_store_dir(NATS_CONF), DEFAULT_ACCOUNT, "WORKLOADS") in staged
    assert staging_dir(conf_store_dir(NATS_CONF), ACCOUNT, "WORKLOADS") in staged
    assert resolved["intake"]["environment"]["ALLOT_NATS_URL"] == "nats://nats:4222"
    # Compose merges depends_on key by key: compose.yaml's engines and the override's streams.
    for name in SERVICE_NAMES:
        assert resolved[name]["environment"]["ALLOT_NATS_USER"] == f"allot-{name}", name
        deps = {k: v["condition"] for k, v in resolved[name]["depends_on"].items()}
        assert deps == {
            "nats": "service_healthy",
            "redis": "service_healthy",
            "streams": "service_completed_successfully",
        }, name
    streams = resolved["streams"]
    assert streams["command"] == ["allot", "streams"] and streams["restart"] == "no"
    assert streams["environment"]["ALLOT_NATS_USER"] == "allot-streams"
    assert streams["environment"]["ALLOT_NATS_URL"] == "nats://nats:4222"
    assert streams["image"] == resolved["intake"]["image"]
    assert resolved["agent-a"]["environment"]["ALLOT_NATS_USER"] == "agent-a"
    assert "--users" in resolved["dashboard"]["command"]
