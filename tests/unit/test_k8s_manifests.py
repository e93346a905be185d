"""deploy/k8s, rendered and checked without a cluster (docs/deploy-kubernetes.md).

Each overlay (dev, production) is rendered the way a user applies it: a copy of deploy/k8s
gets a real ``allot auth gen`` output in ``overlays/<name>/auth`` (the overlay's own roles
file, the base's budget tree), then ``kubectl kustomize`` renders it. No kubectl is a
failure, not a skip: the manifests would go unchecked. Then:

1. every object against the Kubernetes JSON schemas (the ``kubernetes-validate`` package,
   strict: an unknown field fails), for the oldest and the newest version we claim;
2. NATS: three servers of a StatefulSet with a claim each, routes naming every pod through
   the headless Service, everything deploy/nats.conf sets, a configuration nats-server
   accepts, and (integration) three servers started from it where the streams login of the
   Secret ``allot-streams`` makes the log's streams at R3 (as the Job does) and the
   shared services' login ``allot-services`` (from ``auth/users/allot-services.env``: no
   Secret has it) and each service's own login (its Deployment's Secret) find them as
   wanted and may not delete one;
3. the services: compose.yaml's commands (compose.secure.yaml's for the dashboard), each a
   real ``allot.services`` module whose parser takes its flags, the streams' replicas equal
   to the NATS servers, placement's replicas and disruption budget, the agent DaemonSet;
   the Job ``allot-streams`` runs ``allot streams`` with its own login, the only pod that
   has it; each service's Deployment reads its own login's Secret (decision 0084), and no
   Secret is rendered of the shared ``allot-services`` (the strongest login, no pod's);
4. wiring: every ConfigMap and Secret a pod names is rendered, every selector selects pods,
   every pod (the Job's too) meets the `restricted` Pod Security Standard but the agent's
   hostPID;
5. production: Redis replicated with Sentinel behind HAProxy, spread and budgeted;
6. Redis's password (decision 0083): the Secret ``allot-redis`` made from ``auth/redis.env``,
   given to Redis (the server, or the data nodes, Sentinels and HAProxy's check, whose
   scripts are run here with stand-ins for redis-server and redis-cli) and of the Allot
   pods only to accounting and ranking, whose parsers put it into their Redis URL.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import importlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import nats.errors
import pytest
import yaml

from allot import bus
from allot.adapters.embedded import find_nats_server, free_ports
from allot.auth.client import nats_url_from_env
from allot.cli.main import build_parser as allot_parser
from allot.cli.main import main as allot_main
from allot.cli.streams_cmd import run_streams
from allot.ops.auth_gen import SERVICE_NAMES, lettered_password
from allot.ops.log_streams import make_streams

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SERVICES_DIR = ROOT / "services"
OVERLAYS = ("dev", "production")
SCHEMA_VERSIONS = ("1.30.0", "1.37.0")
"""The oldest Kubernetes we claim (docs/deploy-kubernetes.md) and the newest bundled schema."""
COMPOSE_SERVICES = ("intake", "accounting", "ranking", "placement", "health", "dispatch")
COMPOSE_SERVICES += ("dashboard",)
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}
STREAMS_JOB = "allot-streams"
"""The Job that makes the log's streams (``allot streams``), and its Secret's name."""
SHARED_LOGIN = "allot-services"
"""The shared services' login (the operators' tools'): no pod reads it, so no Secret is made
of it; its credentials stay in ``auth/users/allot-services.env``."""
SERVICE_LOGINS = {name: f"allot-{name}" for name in SERVICE_NAMES}
"""Each service's own login (decision 0084), and the name of the Secret its Deployment reads."""
REDIS_SECRET = "allot-redis"
"""Redis's password (``ALLOT_REDIS_PASSWORD``), from ``auth/redis.env``."""
REDIS_CLIENTS = ("accounting", "ranking")
"""The services that use Redis: the only Allot pods given its password."""
REDIS_SERVERS = {
    "dev": {"Deployment/redis"},
    "production": {
        "StatefulSet/redis-node",
        "StatefulSet/redis-sentinel",
        "Deployment/redis-haproxy",
    },
}
"""The workloads of each overlay's Redis component: each takes the password."""

Obj = dict[str, Any]


# -- rendering --------------------------------------------------------------------------------


def _kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail(
            "kubectl is not on PATH: deploy/k8s cannot be rendered (`kubectl kustomize`), so "
            "none of its manifests would be checked. Install kubectl "
            "(https://kubernetes.io/docs/tasks/tools/) and run again."
        )
    return found


@pytest.fixture(scope="module")
def k8s_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/k8s with fresh credentials: `allot auth gen` into each overlay's
    ``auth`` folder, as a user runs it (a user's own overlays/*/auth is left out)."""
    copy_dir = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, copy_dir, ignore=shutil.ignore_patterns("auth"))
    for overlay in OVERLAYS:
        where = copy_dir / "overlays" / overlay
        budgets, roles = copy_dir / "base" / "budgets.yaml", where / "roles.yaml"
        argv = ["auth", "gen", "--budgets", str(budgets), "--roles", str(roles)]
        argv += ["--out", str(where / "auth"), "--server", "nats://nats:4222", "--cost", "4"]
        code = allot_main(argv)
        assert code == 0, f"allot auth gen refuses overlays/{overlay}/roles.yaml"
    return copy_dir


@pytest.fixture(scope="module")
def rendered(k8s_copy: Path) -> dict[str, list[Obj]]:
    """overlay -> its objects, rendered from ``k8s_copy`` by `kubectl kustomize`."""
    kubectl = _kubectl()
    out: dict[str, list[Obj]] = {}
    for overlay in OVERLAYS:
        where = k8s_copy / "overlays" / overlay
        proc = subprocess.run(
            [kubectl, "kustomize", str(where)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, (
            f"kubectl kustomize deploy/k8s/overlays/{overlay} failed:\n{proc.stderr}"
        )
        out[overlay] = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return out


def _name(obj: Mapping[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def _one(objs: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _generated(objs: list[Obj], kind: str, name: str) -> Obj:
    """A ConfigMap or Secret of a generator: its name carries a hash suffix."""
    found = [o for o in objs if o["kind"] == kind and _base_name(o["metadata"]["name"]) == name]
    assert len(found) == 1, f"expected one {kind} {name}-<hash>, found {len(found)}"
    return found[0]


def _base_name(name: str) -> str:
    return re.sub(r"-[a-z0-9]{10}$", "", name)


def _pod_spec(obj: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def _containers(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = _pod_spec(obj)
    return [*spec.get("initContainers", []), *spec["containers"]]


def _workloads(objs: list[Obj]) -> list[Obj]:
    return [o for o in objs if o["kind"] in WORKLOADS]


def _secret_text(secret: Mapping[str, Any], key: str) -> str:
    return base64.b64decode(secret["data"][key]).decode()


def _secret_env(secret: Mapping[str, Any]) -> dict[str, str]:
    """A Secret made from an env file (`secretGenerator: envs:`): one key per variable."""
    return {key: _secret_text(secret, key) for key in secret["data"]}


def _env_file(path: Path) -> dict[str, str]:
    """An env file as `secretGenerator: envs:` reads it: `KEY=VALUE` lines, comments and
    blank lines left out."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def _shared_login(k8s_copy: Path, overlay: str) -> dict[str, str]:
    """The shared services' login as `allot auth gen` wrote it into the overlay's ``auth``
    folder (what the operators source for their tools): in no rendered Secret."""
    return _env_file(k8s_copy / "overlays" / overlay / "auth" / "users" / f"{SHARED_LOGIN}.env")


def _expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion in env values, commands and args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), value)


# == 1. the Kubernetes schemas =================================================================


def _kubernetes_validate() -> Any:
    try:
        import kubernetes_validate
    except ModuleNotFoundError:
        pytest.fail("the package kubernetes-validate is missing: `make install` (dev extra)")
    return kubernetes_validate


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_matches_the_kubernetes_schema(
    rendered: dict[str, list[Obj]], overlay: str, version: str
) -> None:
    kubernetes_validate = _kubernetes_validate()
    errors = []
    for obj in rendered[overlay]:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            field = ".".join(str(p) for p in e.path) or "(the object)"
            errors.append(f"{_name(obj)}: {field}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(
                f"{_name(obj)}: no schema for {obj['apiVersion']} in Kubernetes {version}"
            )
    assert not errors, (
        f"overlays/{overlay} against the Kubernetes {version} schemas:\n" + "\n".join(errors)
    )


def test_the_schema_check_catches_a_misspelt_and_a_mistyped_field(
    rendered: dict[str, list[Obj]],
) -> None:
    kubernetes_validate = _kubernetes_validate()
    placement = _one(rendered["production"], "Deployment", "placement")
    misspelt = copy.deepcopy(placement)
    misspelt["spec"]["replica"] = 2
    mistyped = copy.deepcopy(placement)
    mistyped["spec"]["replicas"] = "two"
    for bad in (misspelt, mistyped):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, SCHEMA_VERSIONS[-1], strict=True)


# == 2. NATS ===================================================================================


def _nats_config(objs: list[Obj]) -> str:
    return str(_generated(objs, "ConfigMap", "nats-config")["data"]["nats.conf"])


def _routes(conf: str) -> list[str]:
    block = re.search(r"(?ms)^cluster \{.*?^\s*routes \[(.*?)\]", conf)
    assert block, "nats.conf has no `cluster { routes [...] }`"
    return block[1].split()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_nats_runs_three_servers_with_jetstream_on_a_claim_each(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objs = rendered[overlay]
    sts = _one(objs, "StatefulSet", "nats")
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["podManagementPolicy"] == "Parallel", "a quorum needs all pods started"
    claims = {c["metadata"]["name"]: c for c in sts["spec"]["volumeClaimTemplates"]}
    assert "data" in claims and claims["data"]["spec"]["resources"]["requests"]["storage"]
    (container,) = _pod_spec(sts)["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/data"] == "data", "JetStream's store_dir must be the claim"
    assert re.search(r"(?m)^\s*store_dir: /data$", _nats_config(objs))
    headless = _one(objs, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True, "routes resolve before ready"
    pdb = _one(objs, "PodDisruptionBudget", "nats")
    assert pdb["spec"]["maxUnavailable"] == 1, "a drain may take one server: two keep quorum"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_nats_routes_name_every_server_through_the_headless_service(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objs = rendered[overlay]
    sts = _one(objs, "StatefulSet", "nats")
    conf = _nats_config(objs)
    port = re.search(r"(?ms)^cluster \{.*?^\s*port: (\d+)", conf)
    assert port, "nats.conf's cluster block names no port"
    (container,) = _pod_spec(sts)["containers"]
    assert {"name": "cluster", "containerPort": int(port[1])} in container["ports"]
    service = sts["spec"]["serviceName"]
    env = _nats_env(objs, container)
    password = _secret_env(_generated(objs, "Secret", "allot-nats-route"))["NATS_ROUTE_PASSWORD"]
    assert env["NATS_ROUTE_PASSWORD"] == password and len(password) >= 32
    expected = [
        f"nats://allot-route:{password}@nats-{i}.{service}:{port[1]}"
        for i in range(sts["spec"]["replicas"])
    ]
    assert [_variable(route, env) for route in _routes(conf)] == expected


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_nats_routes_take_only_servers_that_log_in(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    """A cluster block without `authorization` lets anything that reaches the route port
    join the cluster, and through it read and write every stream."""
    conf = _nats_config(rendered[overlay])
    block = re.search(r"(?ms)^cluster \{.*?^\s*authorization \{(.*?)\}", conf)
    assert block, "nats.conf's cluster block has no authorization: any server may join"
    settings = dict(re.findall(r"(?m)^\s*(\w+):\s*(\S+)\s*$", block[1]))
    assert settings == {"user": "allot-route", "password": "$NATS_ROUTE_PASSWORD"}


def _variable(value: str, env: Mapping[str, str]) -> str:
    """A nats-server configuration value: `$NAME` is the environment variable NAME."""
    return env[value[1:]] if value.startswith("$") else value


def _settings(conf: str) -> dict[str, str]:
    """The `key: value` lines of a nats-server configuration, keyed by their block
    (`jetstream.sync_interval`); lists and includes are left out."""
    out, blocks, in_list = {}, [], False
    for raw in conf.splitlines():
        line = raw.split("#", 1)[0].strip()
        if in_list or line.endswith("["):
            in_list = not line.endswith("]")
        elif opened := re.fullmatch(r"([a-z_]+)\s*[:=]?\s*\{", line):
            blocks.append(opened[1])
        elif line == "}":
            blocks.pop()
        elif setting := re.fullmatch(r"([a-z_]+)\s*[:=]\s*([^\[\]{}]+)", line):
            out[".".join([*blocks, setting[1]])] = setting[2].strip()
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_nats_conf_carries_everything_deploy_nats_conf_sets(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    compose_conf = _settings((ROOT / "deploy" / "nats.conf").read_text())
    k8s_conf = _settings(_nats_config(rendered[overlay]))
    missing = {k: v for k, v in compose_conf.items() if k8s_conf.get(k) != v}
    assert not missing, f"deploy/k8s/base/nats/nats.conf differs from deploy/nats.conf: {missing}"
    assert k8s_conf["jetstream.sync_interval"] == "always"
    assert k8s_conf["cluster.port"] == "6222"


def _nats_files(objs: list[Obj], into: Path, pod: int = 0) -> dict[str, str]:
    """Write what the pod `nats-<pod>` sees at /etc/nats-config (its projected volume) into
    `into`; return its container's environment."""
    sts = _one(objs, "StatefulSet", "nats")
    (container,) = _pod_spec(sts)["containers"]
    volume = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}["/etc/nats-config"]
    (projected,) = [v["projected"] for v in _pod_spec(sts)["volumes"] if v["name"] == volume]
    for source in projected["sources"]:
        kind, ref = (
            ("ConfigMap", source["configMap"])
            if "configMap" in source
            else (
                "Secret",
                source["secret"],
            )
        )
        obj = _one(objs, kind, ref["name"])
        items = ref.get("items") or [{"key": k, "path": k} for k in obj["data"]]
        for item in items:
            text = obj["data"][item["key"]]
            target = into / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(_secret_text(obj, item["key"]) if kind == "Secret" else text)
    return _nats_env(objs, container, pod)


def _nats_env(objs: list[Obj], container: Mapping[str, Any], pod: int = 0) -> dict[str, str]:
    """The environment of the NATS container of pod `nats-<pod>`: values (with `$(VAR)`
    expanded), the pod's name and the keys of rendered Secrets."""
    env: dict[str, str] = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = _expand(var["value"], env)
        elif var["valueFrom"].get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[var["name"]] = f"nats-{pod}"
        elif ref := var["valueFrom"].get("secretKeyRef"):
            env[var["name"]] = _secret_text(_one(objs, "Secret", ref["name"]), ref["key"])
    return env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_nats_server_accepts_the_rendered_configuration(
    rendered: dict[str, list[Obj]], overlay: str, tmp_path: Path
) -> None:
    env = _nats_files(rendered[overlay], tmp_path)
    assert env["SERVER_NAME"] == "nats-0", "POD_NAME must come before SERVER_NAME in env"
    proc = _nats_server_check(tmp_path / "nats.conf", env)
    assert proc.returncode == 0, f"nats-server -t rejects overlays/{overlay}'s nats.conf: {proc}"


def _nats_server_check(conf: Path, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """nats-server's own check of a configuration file (`-t`) in the pod's environment."""
    return subprocess.run(
        [str(find_nats_server()), "-c", str(conf), "-t"],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize("token", ["-rn_s0X5", "7-n_s0X5", "12e5", "true", "0x1F", "a_b-c"])
def test_nats_server_reads_every_route_password_auth_gen_makes(
    rendered: dict[str, list[Obj]], tmp_path: Path, token: str
) -> None:
    """The password is a value of nats-server's configuration (`password:
    $NATS_ROUTE_PASSWORD`, unquoted so that it is substituted): tokens that read as a
    number, a date or a boolean would stop every server (about 2% of random ones did)."""
    env = _nats_files(rendered["production"], tmp_path)
    env["NATS_ROUTE_PASSWORD"] = lettered_password(token)
    proc = _nats_server_check(tmp_path / "nats.conf", env)
    assert proc.returncode == 0, f"nats-server -t refuses {env['NATS_ROUTE_PASSWORD']!r}: {proc}"


@pytest.fixture
def nats_cluster(
    rendered: dict[str, list[Obj]], tmp_path: Path
) -> Iterator[tuple[list[int], list[int], list[int]]]:
    """The production overlay's three servers on loopback, from the rendered configuration
    (the pod's own files and environment), on free ports: the store, pid file, route port
    and the routes' hosts pointed at this machine, their login kept (`--cluster` or
    `--routes` on the command line would replace the file's routes and drop it).
    Yields the client, monitoring and route ports."""
    objs = rendered["production"]
    ports = free_ports(9)
    client, monitor, cluster = ports[0:3], ports[3:6], ports[6:9]
    procs = []
    try:
        for i in range(3):
            node = tmp_path / f"nats-{i}"
            env = _nats_files(objs, node, pod=i)
            conf = (node / "nats.conf").read_text()
            conf = conf.replace("store_dir: /data", f"store_dir: {node / 'store'}")
            conf = conf.replace("/var/run/nats/nats.pid", str(node / "nats.pid"))
            conf = re.sub(
                r"(?m)^(cluster \{.*?^\s*)port: 6222$",
                rf"\1listen: 127.0.0.1:{cluster[i]}",
                conf,
                count=1,
                flags=re.S,
            )
            (node / "nats.conf").write_text(conf)
            for j, port in enumerate(cluster):
                env[f"NATS_ROUTE_{j}"] = re.sub(
                    r"@nats-\d+\.[^:]+:6222$", f"@127.0.0.1:{port}", env[f"NATS_ROUTE_{j}"]
                )
                assert env[f"NATS_ROUTE_{j}"].endswith(f"@127.0.0.1:{port}")
            argv = [str(find_nats_server()), "-c", str(node / "nats.conf"), "-a", "127.0.0.1"]
            argv += ["-p", str(client[i]), "-m", str(monitor[i])]
            log = (node / "nats.log").open("w")
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
        yield client, monitor, cluster
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=15)


@pytest.mark.integration
def test_three_servers_from_the_rendered_configuration_serve_the_log_at_r3(
    rendered: dict[str, list[Obj]],
    k8s_copy: Path,
    nats_cluster: tuple[list[int], list[int], list[int]],
    tmp_path: Path,
) -> None:
    """As the Job and the services do it: the streams login of the Secret allot-streams
    makes the streams and the lease bucket at allot-env's replicas (``allot streams``'s
    core), then the shared services' login (``auth/users/allot-services.env``, as the
    operators' tools take it: no Secret has it) and each service's own login (its
    Deployment's Secret) start as a service does (``ensure_streams``; placement's
    lease bucket): each finds them as wanted, R3 on the cluster, and its stream delete is
    refused (the server drops the request: no answer)."""
    objs = rendered["production"]
    client, monitor, _ = nats_cluster
    deadline = time.monotonic() + 60
    _wait_healthy(monitor, deadline, tmp_path)
    env = _allot_env(objs)
    replicas = int(env["ALLOT_STREAM_REPLICAS"])
    here = f"nats://127.0.0.1:{client[0]}"  # allot-env's nats://nats:4222, on loopback

    def url(secret: str) -> str:
        """The URL a pod with this Secret and allot-env (its envFrom) computes; for the
        shared login, a tool with its env file sourced and the port-forward's URL."""
        if secret == SHARED_LOGIN:
            creds = _shared_login(k8s_copy, "production")
        else:
            creds = _secret_env(_generated(objs, "Secret", secret))
        return nats_url_from_env({**creds, "ALLOT_NATS_URL": here}, "")

    # A fresh cluster may take a few seconds to place R3 streams: make_streams tries again.
    made = asyncio.run(
        make_streams(url(STREAMS_JOB), replicas, timeout_s=max(deadline - time.monotonic(), 5))
    )
    names = ("WORKLOADS", "HOSTS", "USAGE")
    assert {k: made[k] for k in names} == dict.fromkeys(names, "created"), made
    assert made[f"KV_{bus.LEADER_BUCKET}"].startswith("created"), made

    async def as_service(secret: str) -> None:
        """A service's start with the login of ``secret``: the streams found, not made."""
        nc, js = await bus.connect(url(secret), f"test-{secret}")
        try:
            found = await bus.ensure_streams(js, replicas, ready_timeout_s=10)
            assert found == dict.fromkeys(names, "as wanted"), (secret, found)
            if secret in (SHARED_LOGIN, SERVICE_LOGINS["placement"]):
                await bus.lease_bucket(js, bus.LEASE_TTL_S)  # placement's start: found
            with pytest.raises(nats.errors.TimeoutError):
                await nc.jetstream(timeout=1).delete_stream("HOSTS")
        finally:
            await nc.close()

    for secret in SERVICE_LOGINS.values():
        asyncio.run(as_service(secret))

    async def as_services() -> dict[str, tuple[int, str]]:
        nc, js = await bus.connect(url(SHARED_LOGIN), "test-services")
        try:
            found = await bus.ensure_streams(js, replicas, ready_timeout_s=10)
            assert found == dict.fromkeys(names, "as wanted"), found
            await bus.lease_bucket(js, bus.LEASE_TTL_S)  # placement's start: found, not made
            with pytest.raises(nats.errors.TimeoutError):
                await nc.jetstream(timeout=2).delete_stream("HOSTS")
            out = {}
            for name in (*names, f"KV_{bus.LEADER_BUCKET}"):
                info = await js.stream_info(name)  # HOSTS is still there
                assert info.cluster is not None
                out[name] = (info.config.num_replicas or 0, info.cluster.name or "")
            return out
        finally:
            await nc.close()

    assert asyncio.run(as_services()) == dict.fromkeys(
        (*names, f"KV_{bus.LEADER_BUCKET}"), (3, "allot")
    )


def _wait_healthy(monitor: list[int], deadline: float, logs: Path) -> None:
    """Every server answers /healthz (JetStream up, a meta leader elected) before
    ``deadline``; else fail with the tail of each server's log under ``logs``."""
    for port in monitor:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    break
            except OSError:
                if time.monotonic() >= deadline:
                    tails = "\n".join(
                        f"{log}:\n{log.read_text()[-1500:]}"
                        for log in sorted(logs.glob("nats-*/nats.log"))
                    )
                    pytest.fail(f"no healthy cluster on :{port} in time; logs:\n{tails}")
                time.sleep(0.2)


def _route_names(monitor_port: int) -> set[str]:
    """The names of the servers routed to this one (none while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/routez", timeout=2) as r:
            routez = json.load(r)
    except OSError:
        return set()
    return {str(route.get("remote_name", "")) for route in routez.get("routes") or []}


@pytest.mark.integration
@pytest.mark.parametrize("with_password", [False, True])
def test_a_server_without_the_route_password_cannot_join_the_cluster(
    rendered: dict[str, list[Obj]],
    nats_cluster: tuple[list[int], list[int], list[int]],
    tmp_path: Path,
    with_password: bool,
) -> None:
    """A server of its own, routed at the cluster's first server: refused without the
    routes' login (it would otherwise see every stream and message of the cluster); with
    it, the same server joins (the control: the check can fail)."""
    _, monitor, cluster = nats_cluster
    _wait_healthy(monitor, time.monotonic() + 30, tmp_path)
    secret = _secret_env(_generated(rendered["production"], "Secret", "allot-nats-route"))
    password = secret["NATS_ROUTE_PASSWORD"] if with_password else "guess"
    login = f"allot-route:{password}@" if with_password else ""
    own_client, own_route = free_ports(2)
    conf = tmp_path / "rogue.conf"
    conf.write_text(
        f"server_name: rogue\nport: {own_client}\n"
        f"cluster {{\n  name: allot\n  listen: 127.0.0.1:{own_route}\n"
        f"  authorization {{\n    user: allot-route\n    password: {password}\n  }}\n"
        f"  routes [ nats://{login}127.0.0.1:{cluster[0]} ]\n}}\n"
    )
    log_path = tmp_path / "rogue.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [str(find_nats_server()), "-c", str(conf), "-a", "127.0.0.1"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 10
        while True:
            joined = "rogue" in _route_names(monitor[0])
            refused = "Authorization Violation" in log_path.read_text()
            if joined or (refused and not with_password) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if with_password:
            assert joined, f"the control did not join in 10 s: {log_path.read_text()[-2000:]}"
        else:
            assert refused and not joined, f"joined or no refusal: {log_path.read_text()[-2000:]}"
    finally:
        proc.terminate()
        proc.wait(timeout=15)


# == 3. the services and the agent =============================================================


def _compose_commands() -> dict[str, list[str]]:
    """compose.yaml's command of each service, compose.secure.yaml's where it sets one."""
    plain = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    secure = yaml.safe_load((ROOT / "deploy" / "compose.secure.yaml").read_text())["services"]
    return {
        name: [str(a) for a in (secure.get(name, {}).get("command") or spec.get("command", []))]
        for name, spec in plain.items()
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_service_runs_the_compose_command_with_logins(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    compose = _compose_commands()
    for name in COMPOSE_SERVICES:
        (container,) = _pod_spec(_one(rendered[overlay], "Deployment", name))["containers"]
        assert container["command"] == compose[name], f"{name}: not compose's command"
        assert "args" not in container, f"{name}: the command is the whole command line"


def _allot_env(objs: list[Obj]) -> dict[str, str]:
    data: dict[str, str] = _generated(objs, "ConfigMap", "allot-env")["data"]
    return data


def _parser_of(module_name: str) -> argparse.ArgumentParser:
    """The module's `build_parser()` or `parser()`; a package's is in its `service` module,
    whose `main` its `__main__` runs."""
    for name in (module_name, f"{module_name}.service"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        make = getattr(module, "build_parser", None) or getattr(module, "parser", None)
        if callable(make):
            parser: argparse.ArgumentParser = make()
            return parser
    pytest.fail(f"{module_name}: no build_parser() or parser() to check its flags with")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_allot_command_is_a_real_module_whose_parser_takes_its_flags(
    rendered: dict[str, list[Obj]],
    overlay: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = _allot_env(rendered[overlay])
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    checked = agents = jobs = 0
    for obj in _workloads(rendered[overlay]):
        for c in _pod_spec(obj)["containers"]:
            if "allot" not in c["image"].rsplit("/", 1)[-1]:
                continue
            where = f"{_name(obj)} container {c['name']}"
            command = [_expand(a, {"NODE_NAME": "gpu-node-01"}) for a in c["command"]]
            if obj["kind"] == "Job":
                # The `allot` CLI's console script (deploy/Dockerfile installs the package).
                assert command[:1] == ["allot"], f"{where}: {command}"
                parsed = allot_parser().parse_args(command[1:])
                assert parsed.func is run_streams, f"{where}: not `allot streams`"
                jobs += 1
                continue
            assert command[:1] == ["python"] and "-m" in command, f"{where}: `python -m ...`"
            flags = command[1 : command.index("-m")]
            module_name, args = command[len(flags) + 2], command[len(flags) + 3 :]
            if module_name == "allot.services.agent":
                # Workloads write to the agent's working directory: nothing imported from
                # it (-P), nor from a user site (-s) (tests/unit/test_compose.py runs it).
                assert flags == ["-P", "-s"], f"{where}: the agent runs `python -P -s -m`"
                agents += 1
            else:
                assert not flags, f"{where}: unexpected interpreter flags {flags}"
            short = module_name.removeprefix("allot.services.")
            assert module_name.startswith("allot.services.") and (
                (SERVICES_DIR / f"{short}.py").is_file() or (SERVICES_DIR / short).is_dir()
            ), f"{where}: {module_name} is no module of services/"
            parser = _parser_of(module_name)
            parser.allow_abbrev = False  # `--gpu` for `--gpus` would pass here and be a typo
            try:
                parsed = parser.parse_args(args)
            except SystemExit:
                pytest.fail(f"{where}: {module_name} rejects {args}: {capsys.readouterr().err}")
            assert parsed.nats_url == env["ALLOT_NATS_URL"], f"{where}: env URL not read"
            checked += 1
    assert checked >= len(COMPOSE_SERVICES) + 1 and agents == 1 and jobs == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_wait_for_nats_health_on_the_nats_service(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objs = rendered[overlay]
    nats_ports = {p["port"] for p in _one(objs, "Service", "nats")["spec"]["ports"]}
    waiting = [_one(objs, "Deployment", name) for name in COMPOSE_SERVICES]
    for obj in [*waiting, _one(objs, "Job", STREAMS_JOB)]:
        name = _name(obj)
        (init,) = _pod_spec(obj)["initContainers"]
        assert init["command"][:2] == ["python", "-c"], f"{name}: {init['command']}"
        code = init["command"][2]
        compile(code, f"{name}/wait-for-nats", "exec")  # a syntax error fails here
        url = re.search(r"http://nats:(\d+)/healthz", code)
        assert url and int(url[1]) in nats_ports, f"{name}: waits on no port of Service/nats"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_reach_nats_and_redis_by_their_services_and_replicate_streams_like_nats(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objs = rendered[overlay]
    env = _allot_env(objs)
    assert env["ALLOT_NATS_URL"] == "nats://nats:4222"
    assert env["ALLOT_REDIS_URL"] == "redis://redis:6379"
    assert _one(objs, "Service", "nats")["spec"]["ports"][0]["port"] == 4222
    assert _one(objs, "Service", "redis")["spec"]["ports"][0]["port"] == 6379
    assert env["ALLOT_STREAM_REPLICAS"] == str(
        _one(objs, "StatefulSet", "nats")["spec"]["replicas"]
    )
    for obj in _workloads(objs):
        for c in _pod_spec(obj)["containers"]:
            if "allot" not in c["image"].rsplit("/", 1)[-1]:
                continue
            refs = [next(iter(r.values()))["name"] for r in c["envFrom"]]
            assert _base_name(refs[-1]) == "allot-env", (
                f"{_name(obj)}: allot-env must come last in envFrom, so its ALLOT_NATS_URL "
                "wins over the one in the credentials file"
            )
            # Each its own login: every service its own (decision 0084), the dashboard its
            # own, the agents theirs (never the shared services' `>`).
            name = obj["metadata"]["name"]
            login = "allot-agent" if "agent" in name else SERVICE_LOGINS.get(name, "?")
            login = "allot-dashboard" if name == "dashboard" else login
            login = STREAMS_JOB if obj["kind"] == "Job" else login
            # Redis's password only where Redis is used (it is in no other Secret or
            # ConfigMap: its place in the list does not matter).
            redis = [REDIS_SECRET] if name in REDIS_CLIENTS and obj["kind"] == "Deployment" else []
            assert [_base_name(r) for r in refs] == [login, *redis, "allot-env"], _name(obj)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_credentials_are_the_users_allot_auth_gen_wrote(
    rendered: dict[str, list[Obj]], k8s_copy: Path, overlay: str
) -> None:
    objs = rendered[overlay]
    services = _shared_login(k8s_copy, overlay)  # in no Secret: the operators' file
    agent = _secret_env(_generated(objs, "Secret", "allot-agent"))
    dashboard = _secret_env(_generated(objs, "Secret", "allot-dashboard"))
    streams = _secret_env(_generated(objs, "Secret", STREAMS_JOB))
    assert services["ALLOT_NATS_USER"] == "allot-services" and services["ALLOT_NATS_PASSWORD"]
    assert streams["ALLOT_NATS_USER"] == STREAMS_JOB and streams["ALLOT_NATS_PASSWORD"]
    assert streams["ALLOT_NATS_PASSWORD"] != services["ALLOT_NATS_PASSWORD"]
    assert agent["ALLOT_NATS_USER"] == "allot-agent" and agent["ALLOT_NATS_PASSWORD"]
    assert dashboard["ALLOT_NATS_USER"] == "allot-dashboard" and dashboard["ALLOT_NATS_PASSWORD"]
    auth = _secret_text(_generated(objs, "Secret", "allot-nats-auth"), "nats.conf")
    assert 'user: "allot-services"' in auth and 'user: "allot-agent"' in auth
    # Each service's own login (decision 0084): what it sends and hears, no more. No
    # `allot.v1.>` or `>` to publish, nothing of a stream's making, no `>` to read; its
    # answers in the logins' inboxes, and its own inbox to read.
    for service, login in SERVICE_LOGINS.items():
        block = auth[auth.index(f'user: "{login}"') :].split("}\n      }", 1)[0]
        publish = block[block.index("publish:") : block.index("subscribe:")]
        subscribe = block[block.index("subscribe:") :]
        assert '"allot.v1.>"' not in publish and '">"' not in publish, service
        assert "STREAM.CREATE" not in publish and "STREAM.DELETE" not in publish, service
        assert '"_INBOX_alice.>"' in publish, service
        assert '">"' not in subscribe and f'"_INBOX_{login}.>"' in subscribe, service
    # role dashboard: no `>`; its answers in the askers' inboxes (the teams', ops'...)
    block = auth[auth.index('user: "allot-dashboard"') :].split("}\n      }", 1)[0]
    assert '"_INBOX_alice.>"' in block and '">"' not in block
    # role service: records and the JetStream it uses, not making, changing or deleting a
    # stream (an allow list: publish has no `>`; subscribe does)
    block = auth[auth.index('user: "allot-services"') :].split("}\n      }", 1)[0]
    publish = block[block.index("publish:") : block.index("subscribe:")]
    assert '"allot.v1.>"' in publish and '"$JS.API.CONSUMER.CREATE.>"' in publish
    assert (
        '">"' not in publish and "STREAM.CREATE" not in publish and "STREAM.DELETE" not in publish
    )
    # role streams: stream information, creation and update, answers in its own inbox
    block = auth[auth.index(f'user: "{STREAMS_JOB}"') :].split("}\n      }", 1)[0]
    assert '"$JS.API.STREAM.CREATE.*"' in block and '"_INBOX_allot-streams.>"' in block
    assert '">"' not in block and "DELETE" not in block
    users = _secret_text(
        _generated(objs, "Secret", "allot-dashboard-users"), "dashboard-users.json"
    )
    assert '"allot-services"' in users


HARDENED = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
"""Every container of the services' Deployments and of the Job: nothing more."""


def _reachable_ports(policy: Mapping[str, Any], labels: Mapping[str, str]) -> set[int]:
    """The ports of ``policy``'s pods a pod with ``labels`` may reach (a rule without
    ``from`` lets every pod in)."""
    return {
        p["port"]
        for rule in policy["spec"]["ingress"]
        if not rule.get("from") or any(_selects(f["podSelector"], labels) for f in rule["from"])
        for p in rule["ports"]
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_job_allot_streams_makes_the_streams_with_its_own_login(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    """The services' login may not create or update a stream: the Job runs `allot streams`
    as the streams login, with the shared settings (the URL, ALLOT_STREAM_REPLICAS=3),
    hardened as the services are, tried again while NATS comes up, and kept once done."""
    objs = rendered[overlay]
    (job,) = [o for o in objs if o["kind"] == "Job"]
    assert job["metadata"]["name"] == STREAMS_JOB
    spec = _pod_spec(job)
    (c,) = spec["containers"]
    assert c["command"] == ["allot", "streams"] and "args" not in c and "env" not in c
    refs = [(kind, ref["name"]) for r in c["envFrom"] for kind, ref in r.items()]
    assert [(kind, _base_name(name)) for kind, name in refs] == [
        ("secretRef", STREAMS_JOB),
        ("configMapRef", "allot-env"),
    ], "the streams login, then allot-env (last: its ALLOT_NATS_URL wins)"
    assert refs[0][1] == _generated(objs, "Secret", STREAMS_JOB)["metadata"]["name"]
    assert refs[1][1] == _generated(objs, "ConfigMap", "allot-env")["metadata"]["name"]
    assert _allot_env(objs)["ALLOT_STREAM_REPLICAS"] == "3"
    intake = _one(objs, "Deployment", "intake")
    (service,) = _pod_spec(intake)["containers"]
    assert {x["image"] for x in _containers(job)} == {service["image"]}, "the services' image"
    # Hardened as the services' pods are.
    assert spec["securityContext"] == _pod_spec(intake)["securityContext"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    for x in _containers(job):
        assert x["securityContext"] == HARDENED, x["name"]
    # Tries again while NATS comes up; kept once done (no TTL: a later apply does not
    # silently make and run another one).
    assert spec["restartPolicy"] in {"Never", "OnFailure"}
    assert job["spec"]["backoffLimit"] >= 10
    assert "ttlSecondsAfterFinished" not in job["spec"]
    # Its pods reach NATS's clients port and monitoring (its init container waits for
    # /healthz there), not Redis.
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert {4222, 8222} <= _reachable_ports(_one(objs, "NetworkPolicy", "nats"), labels)
    assert not _reachable_ports(_one(objs, "NetworkPolicy", "redis"), labels)
    assert labels.get("app.kubernetes.io/component") != "service", "no service's patches"


def _secrets_named(spec: Mapping[str, Any]) -> set[str]:
    """Every Secret a pod spec names: volumes, envFrom and single variables."""
    names = {name for kind, name in _referenced(spec) if kind == "Secret"}
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        for var in c.get("env", []):
            if ref := var.get("valueFrom", {}).get("secretKeyRef"):
                names.add(ref["name"])
    return names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_job_has_the_streams_login(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objs = rendered[overlay]
    streams = _generated(objs, "Secret", STREAMS_JOB)["metadata"]["name"]
    having = {_name(o) for o in _workloads(objs) if streams in _secrets_named(_pod_spec(o))}
    assert having == {f"Job/{STREAMS_JOB}"}, having
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    assert deployments and not [d for d in deployments if streams in _secrets_named(_pod_spec(d))]
    job_secrets = _secrets_named(_pod_spec(_one(objs, "Job", STREAMS_JOB)))
    assert SHARED_LOGIN not in {_base_name(name) for name in job_secrets}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_service_reads_only_its_own_login_and_no_pod_the_shared_one(
    rendered: dict[str, list[Obj]], k8s_copy: Path, overlay: str
) -> None:
    """Decision 0084: each service's Deployment reads exactly the Secret of its own login
    (``allot-<service>``, a ``service`` row naming that service), which no other workload
    reads; the shared services' login (a row of its own, which `allot auth gen` requires)
    is in no Secret and read by no workload: its env file stays with the operators."""
    objs = rendered[overlay]
    rows = yaml.safe_load((k8s_copy / "overlays" / overlay / "roles.yaml").read_text())
    row_of = {row["name"]: row for row in rows["users"]}
    assert row_of[SHARED_LOGIN] == {"name": SHARED_LOGIN, "role": "service"}
    shared = _shared_login(k8s_copy, overlay)
    assert shared["ALLOT_NATS_USER"] == SHARED_LOGIN and shared["ALLOT_NATS_PASSWORD"]
    named = {_name(o): _secrets_named(_pod_spec(o)) for o in _workloads(objs)}
    assert not [
        w for w, secrets in named.items() if SHARED_LOGIN in {_base_name(s) for s in secrets}
    ], named
    for service, login in SERVICE_LOGINS.items():
        assert row_of[login] == {"name": login, "role": "service", "service": service}
        secret = _generated(objs, "Secret", login)
        creds = _secret_env(secret)
        assert creds["ALLOT_NATS_USER"] == login and creds["ALLOT_NATS_PASSWORD"], service
        assert creds["ALLOT_NATS_PASSWORD"] != shared["ALLOT_NATS_PASSWORD"]
        (c,) = _pod_spec(_one(objs, "Deployment", service))["containers"]
        logins = [
            _base_name(r["secretRef"]["name"])
            for r in c["envFrom"]
            if "secretRef" in r and r["secretRef"]["name"] != _name_of(objs, REDIS_SECRET)
        ]
        assert logins == [login], f"{service} reads {logins}"
        having = {w for w, secrets in named.items() if secret["metadata"]["name"] in secrets}
        assert having == {f"Deployment/{service}"}, having


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_holds_the_shared_services_login(
    rendered: dict[str, list[Obj]], k8s_copy: Path, overlay: str
) -> None:
    """The shared services' login is the strongest (every record, command and query,
    everything to read) and no pod mounts it: a Secret of it would only hand it to whoever
    may read the namespace's Secrets. None is rendered, under its name or another, and its
    password is in no rendered object."""
    objs = rendered[overlay]
    secrets = [o for o in objs if o["kind"] == "Secret"]
    assert secrets, "no Secret rendered at all"
    named = [_name(o) for o in secrets if _base_name(o["metadata"]["name"]) == SHARED_LOGIN]
    assert not named, f"overlays/{overlay} renders {named}"
    password = _shared_login(k8s_copy, overlay)["ALLOT_NATS_PASSWORD"]
    assert password
    for secret in secrets:
        values = [_secret_text(secret, key) for key in secret.get("data", {})]
        values += [str(v) for v in secret.get("stringData", {}).values()]
        assert not [v for v in values if password in v], _name(secret)
        env = _secret_env(secret) if "data" in secret else {}
        assert env.get("ALLOT_NATS_USER") != SHARED_LOGIN, _name(secret)
    assert not [_name(o) for o in objs if password in json.dumps(o)]


def _name_of(objs: list[Obj], secret: str) -> str:
    """The rendered (hashed) name of a generated Secret."""
    return str(_generated(objs, "Secret", secret)["metadata"]["name"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_dashboard_serves_its_port_behind_its_service_with_logins(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objs = rendered[overlay]
    spec = _pod_spec(_one(objs, "Deployment", "dashboard"))
    (c,) = spec["containers"]
    port = int(c["command"][c["command"].index("--http-port") + 1])
    assert c["command"][c["command"].index("--http-host") + 1] == "0.0.0.0"
    assert {"name": "http", "containerPort": port} in c["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, probe
    (service_port,) = _one(objs, "Service", "dashboard")["spec"]["ports"]
    assert service_port["targetPort"] == "http"
    users = Path(c["command"][c["command"].index("--users") + 1])
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    (volume,) = [v for v in spec["volumes"] if v["name"] == mounts[str(users.parent)]]
    secret = _one(objs, "Secret", volume["secret"]["secretName"])
    assert users.name in secret["data"]
    # Root owns a Secret's files: the image's user 10001 reads it through its group.
    assert spec["securityContext"]["fsGroup"] == 10001 and volume["secret"]["defaultMode"] == 0o440


def test_secrets_never_enter_the_repository() -> None:
    assert "overlays/*/auth/" in (K8S / ".gitignore").read_text().splitlines()
    for path in K8S.rglob("*"):
        if path.is_file() and "auth" not in path.relative_to(K8S).parts:
            text = path.read_text(errors="replace")
            assert "ALLOT_NATS_PASSWORD=" not in text and "$2a$" not in text, path
            assert not re.search(r"ALLOT_REDIS_PASSWORD=r[A-Za-z0-9_-]{32}", text), path


@pytest.mark.parametrize(("overlay", "replicas"), [("dev", 1), ("production", 2)])
def test_placement_replicas_and_disruption_budget(
    rendered: dict[str, list[Obj]], overlay: str, replicas: int
) -> None:
    objs = rendered[overlay]
    assert _one(objs, "Deployment", "placement")["spec"]["replicas"] == replicas
    pdb = _one(objs, "PodDisruptionBudget", "placement")
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {"app.kubernetes.io/name": "placement"}},
    }


def test_production_runs_the_agent_on_every_gpu_node_with_the_hosts_pids(
    rendered: dict[str, list[Obj]],
) -> None:
    ds = _one(rendered["production"], "DaemonSet", "agent")
    spec = _pod_spec(ds)
    assert spec["hostPID"] is True
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}, "a restart stops the workloads"
    (agent,) = spec["containers"]
    command = agent["command"]
    assert command[command.index("--host") + 1] == "$(NODE_NAME)"
    node_name = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    assert node_name in agent["env"]
    assert "--fake" not in command


def test_dev_simulates_exactly_the_hosts_its_agent_user_is_granted(
    rendered: dict[str, list[Obj]],
) -> None:
    objs = rendered["dev"]
    assert not [o for o in objs if o["kind"] == "DaemonSet"], "dev has no GPU DaemonSet"
    (agent,) = _pod_spec(_one(objs, "Deployment", "fake-agent"))["containers"]
    cmd = agent["command"]
    n, prefix = int(cmd[cmd.index("--hosts") + 1]), cmd[cmd.index("--host-prefix") + 1]
    roles = yaml.safe_load((K8S / "overlays" / "dev" / "roles.yaml").read_text())["users"]
    (row,) = [r for r in roles if r["name"] == "allot-agent"]
    assert row["hosts"] == [f"{prefix}-{i:04d}" for i in range(n)]


def test_the_base_budget_tree_is_deploy_budgets_example() -> None:
    copy_text = (K8S / "base" / "budgets.yaml").read_text()
    assert copy_text == (ROOT / "deploy" / "budgets.example.yaml").read_text(), (
        "deploy/k8s/base/budgets.yaml must stay a copy of deploy/budgets.example.yaml"
    )


# == 4. wiring and pod security ================================================================


def _referenced(spec: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(kind, name) of every ConfigMap and Secret a pod spec names."""
    refs = set()
    for v in spec.get("volumes", []):
        sources = [*v.get("projected", {}).get("sources", []), v]
        for s in sources:
            if "configMap" in s:
                refs.add(("ConfigMap", s["configMap"]["name"]))
            if "secret" in s:
                refs.add(("Secret", s["secret"].get("secretName") or s["secret"].get("name")))
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        for r in c.get("envFrom", []):
            if "configMapRef" in r:
                refs.add(("ConfigMap", r["configMapRef"]["name"]))
            if "secretRef" in r:
                refs.add(("Secret", r["secretRef"]["name"]))
    return refs


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if not all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        inside = labels.get(e["key"]) in e.get("values", [])
        if (e["operator"] == "In" and not inside) or (e["operator"] == "NotIn" and inside):
            return False
    return True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_configmap_and_secret_a_pod_names_is_rendered(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objs = rendered[overlay]
    present = {(o["kind"], o["metadata"]["name"]) for o in objs}
    for obj in _workloads(objs):
        missing = _referenced(_pod_spec(obj)) - present
        assert not missing, f"overlays/{overlay} {_name(obj)} names what is not rendered: {missing}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_selector_selects_pods_and_every_target_port_exists(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objs = rendered[overlay]
    pods = [(o["spec"]["template"]["metadata"]["labels"], o) for o in _workloads(objs)]
    for obj in objs:
        if obj["kind"] == "Service":
            selector: Mapping[str, Any] = {"matchLabels": obj["spec"]["selector"]}
        elif obj["kind"] in {"PodDisruptionBudget"}:
            selector = obj["spec"]["selector"]
        elif obj["kind"] == "NetworkPolicy":
            selector = obj["spec"]["podSelector"]
            for rule in obj["spec"]["ingress"]:
                for peer in rule.get("from", []):
                    assert any(_selects(peer["podSelector"], lbl) for lbl, _ in pods), (
                        f"overlays/{overlay} {_name(obj)}: `from` selects no pod"
                    )
        elif obj["kind"] == "Job":
            # The Job controller makes the selector (its own uid): none may be written.
            assert "selector" not in obj["spec"] and not obj["spec"].get("manualSelector")
            continue
        elif obj["kind"] in WORKLOADS:
            selector = obj["spec"]["selector"]
            assert _selects(selector, obj["spec"]["template"]["metadata"]["labels"]), _name(obj)
            continue
        else:
            continue
        chosen = [o for lbl, o in pods if _selects(selector, lbl)]
        assert chosen, f"overlays/{overlay} {_name(obj)} selects no pod"
        if obj["kind"] == "Service":
            names = {
                p["name"]
                for o in chosen
                for c in _pod_spec(o)["containers"]
                for p in c.get("ports", [])
            }
            for port in obj["spec"]["ports"]:
                assert port["targetPort"] in names, f"{_name(obj)}: no port {port['targetPort']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_pods_where_workloads_run_reach_only_the_nats_client_port(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    """Workloads run inside the agents' pods: no NetworkPolicy lets those reach Redis (whose
    password they do not have either), a NATS route or NATS monitoring."""
    objs = rendered[overlay]
    agents = [
        o["spec"]["template"]["metadata"]["labels"]
        for o in _workloads(objs)
        if o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "agent"
    ]
    assert agents
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert {p["metadata"]["name"] for p in policies} == {"nats", "redis"}
    for policy in policies:
        for rule in policy["spec"]["ingress"]:
            ports = {p["port"] for p in rule["ports"]}
            peers = [peer["podSelector"] for peer in rule.get("from", [])]
            if not peers or any(_selects(s, lbl) for s in peers for lbl in agents):
                assert ports == {4222}, f"{_name(policy)}: agent pods reach {ports}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_restricted_but_the_agents_host_pids(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    for obj in _workloads(rendered[overlay]):
        spec = _pod_spec(obj)
        where = f"overlays/{overlay} {_name(obj)}"
        assert spec.get("hostPID", False) is (_name(obj) == "DaemonSet/agent"), where
        assert not spec.get("hostNetwork") and not spec.get("hostIPC"), where
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert spec["automountServiceAccountToken"] is False, where
        for c in _containers(obj):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, f"{where} {c['name']}"
            assert sc["capabilities"] == {"drop": ["ALL"]}, f"{where} {c['name']}"
            assert not sc.get("privileged"), f"{where} {c['name']}"
    # The agent's workloads run as its uid and, with hostPID, see the node's processes: a
    # process of the same uid is theirs to read (/proc/<pid>/environ) and signal.
    uids = {
        _name(obj): (_pod_spec(obj)["securityContext"]["runAsUser"], "agent" in _name(obj))
        for obj in _workloads(rendered[overlay])
        if any("allot" in c["image"].rsplit("/", 1)[-1] for c in _containers(obj))
    }
    agent_uids = {uid for uid, agent in uids.values() if agent}
    service_uids = {uid for uid, agent in uids.values() if not agent}
    assert agent_uids and service_uids and not agent_uids & service_uids, uids
    namespace = _one(rendered[overlay], "Namespace", f"allot{'-dev' if overlay == 'dev' else ''}")
    enforce = namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
    assert enforce == ("restricted" if overlay == "dev" else "privileged")


# == 5. production: Redis replicated, everything stateful spread and budgeted =================


def test_production_redis_is_a_primary_a_replica_and_three_sentinels_behind_haproxy(
    rendered: dict[str, list[Obj]],
) -> None:
    objs = rendered["production"]
    assert not [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "redis"]
    nodes = _one(objs, "StatefulSet", "redis-node")
    assert nodes["spec"]["replicas"] == 2
    sentinels = _one(objs, "StatefulSet", "redis-sentinel")
    assert sentinels["spec"]["replicas"] == 3
    scripts = _generated(objs, "ConfigMap", "redis-scripts")["data"]
    quorum = re.search(r"sentinel monitor allot \S+ 6379 (\d+)", scripts["sentinel.sh"])
    assert quorum and int(quorum[1]) == 3 // 2 + 1, "a failover needs a majority of Sentinels"
    assert "redis-sentinel-$i.redis-sentinel" in scripts["redis-node.sh"]
    cfg = _generated(objs, "ConfigMap", "redis-haproxy")["data"]["haproxy.cfg"]
    servers = re.findall(r'(?m)^\s*server (\S+) "(\S+?)\.', cfg)
    assert servers == [(f"redis-node-{i}", f"redis-node-{i}") for i in range(2)]
    assert "expect string role:master" in cfg and "on-marked-down shutdown-sessions" in cfg
    service = _one(objs, "Service", "redis")
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "redis-haproxy"}


def test_production_spreads_and_budgets_every_stateful_piece(
    rendered: dict[str, list[Obj]],
) -> None:
    objs = rendered["production"]
    for name in ("nats", "redis-node", "placement"):
        kind = "Deployment" if name == "placement" else "StatefulSet"
        rule = _pod_spec(_one(objs, kind, name))["affinity"]["podAntiAffinity"]
        (term,) = rule["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname", name
        assert term["labelSelector"] == {"matchLabels": {"app.kubernetes.io/name": name}}
    budgets = {o["metadata"]["name"] for o in objs if o["kind"] == "PodDisruptionBudget"}
    expected = {"nats", "placement", "accounting", "redis-node", "redis-sentinel", "redis-haproxy"}
    assert budgets == expected
    assert _one(objs, "Deployment", "accounting")["spec"]["replicas"] == 2


# == 6. Redis's password ======================================================================


def _redis_password(objs: list[Obj]) -> str:
    return _secret_env(_generated(objs, "Secret", REDIS_SECRET))["ALLOT_REDIS_PASSWORD"]


def _container_env(objs: list[Obj], container: Mapping[str, Any]) -> dict[str, str]:
    """The variables a container gets from rendered objects: ``envFrom`` in order (a later
    source wins), then ``env`` over them (values with `$(VAR)` expanded, Secret and
    ConfigMap keys); the downward API's (fieldRef) are left out."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if ref := source.get("secretRef"):
            env.update(_secret_env(_one(objs, "Secret", ref["name"])))
        elif ref := source.get("configMapRef"):
            env.update(_one(objs, "ConfigMap", ref["name"])["data"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = _expand(var["value"], env)
        elif ref := var["valueFrom"].get("secretKeyRef"):
            env[var["name"]] = _secret_text(_one(objs, "Secret", ref["name"]), ref["key"])
        elif ref := var["valueFrom"].get("configMapKeyRef"):
            env[var["name"]] = _one(objs, "ConfigMap", ref["name"])["data"][ref["key"]]
    return env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_redis_password_is_auth_gens_given_only_to_redis_accounting_and_ranking(
    rendered: dict[str, list[Obj]], k8s_copy: Path, overlay: str
) -> None:
    """`allot auth gen` wrote auth/redis.env (0600) next to the overlay; its one variable is
    the Secret allot-redis, and no other Secret carries it. Of the workloads only Redis's
    own and the two services that use Redis name that Secret (a workload in an agent pod
    must not get it from the pod's environment)."""
    objs = rendered[overlay]
    env_file = k8s_copy / "overlays" / overlay / "auth" / "redis.env"
    assert env_file.is_file(), f"allot auth gen wrote no overlays/{overlay}/auth/redis.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    (line,) = [x for x in env_file.read_text().splitlines() if x and not x.startswith("#")]
    key, _, password = line.partition("=")
    assert key == "ALLOT_REDIS_PASSWORD" and re.fullmatch(r"r[A-Za-z0-9_-]{32,}", password)
    secret = _generated(objs, "Secret", REDIS_SECRET)
    assert _secret_env(secret) == {"ALLOT_REDIS_PASSWORD": password}
    carrying = [
        _name(o)
        for o in objs
        if o["kind"] == "Secret" and "ALLOT_REDIS_PASSWORD" in o.get("data", {})
    ]
    assert carrying == [_name(secret)]
    name = secret["metadata"]["name"]
    having = {_name(o) for o in _workloads(objs) if name in _secrets_named(_pod_spec(o))}
    clients = {f"Deployment/{service}" for service in REDIS_CLIENTS}
    assert having == clients | REDIS_SERVERS[overlay], having
    # The two services take it whole (envFrom), so that it reaches their Redis URL.
    for service in REDIS_CLIENTS:
        (c,) = _pod_spec(_one(objs, "Deployment", service))["containers"]
        assert {"secretRef": {"name": name}} in c["envFrom"], service


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_accounting_and_ranking_put_the_password_into_their_redis_url(
    rendered: dict[str, list[Obj]], overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each service's parser in its pod's environment (Secrets and allot-env, as envFrom
    lists them): accounting's and ranking's `--redis-url` default logs in to
    redis://redis:6379 (allot.auth.client.redis_url_from_env); no other service has the
    password anywhere in its environment or its options."""
    objs = rendered[overlay]
    password = _redis_password(objs)
    for key in [k for k in os.environ if k.startswith(("ALLOT_", "REDISCLI_"))]:
        monkeypatch.delenv(key)
    for service in COMPOSE_SERVICES:
        (c,) = _pod_spec(_one(objs, "Deployment", service))["containers"]
        env = _container_env(objs, c)
        command = c["command"]
        module_name, args = command[command.index("-m") + 1], command[command.index("-m") + 2 :]
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            parsed = _parser_of(module_name).parse_args(args)
        if service in REDIS_CLIENTS:
            assert parsed.redis_url == f"redis://:{password}@redis:6379", service
        else:
            assert "ALLOT_REDIS_PASSWORD" not in env, service
            assert password not in repr(vars(parsed)), service


_PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_redis_piece_takes_the_password_and_its_redis_cli_logs_in(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    """Every container of the Redis component gets ALLOT_REDIS_PASSWORD from the Secret;
    every one that runs redis-cli (its probes, its start script) gets REDISCLI_AUTH, the
    variable redis-cli logs in with. redis-cli exits 0 on an error answer (NOAUTH too), so
    a readiness probe must look for the PONG. The pod specs name the variable, never the
    value."""
    objs = rendered[overlay]
    password = _redis_password(objs)
    for obj in _workloads(objs):
        for c in _containers(obj):
            where = f"overlays/{overlay} {_name(obj)} {c['name']}"
            env = _container_env(objs, c)
            probes = [" ".join(c[p]["exec"]["command"]) for p in _PROBES if "exec" in c.get(p, {})]
            runs_cli = [p for p in probes if "redis-cli" in p]
            if _name(obj) in REDIS_SERVERS[overlay]:
                assert env.get("ALLOT_REDIS_PASSWORD") == password, where
                if c["image"].startswith("redis:"):
                    assert runs_cli and "grep -qx PONG" in " ".join(
                        c["readinessProbe"]["exec"]["command"]
                    ), where
            if runs_cli or c["image"].startswith("redis:"):
                assert env.get("REDISCLI_AUTH") == password, where
        assert password not in json.dumps(obj), f"{_name(obj)} spells the password out"


def test_dev_redis_starts_with_requirepass(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["dev"]
    (c,) = _pod_spec(_one(objs, "Deployment", "redis"))["containers"]
    env = _container_env(objs, c)
    args = [_expand(a, env) for a in c["args"]]
    assert args[args.index("--requirepass") + 1] == _redis_password(objs)
    assert args[:5] == ["redis-server", "--save", "", "--appendonly", "no"], "nothing on disk"


def test_production_haproxy_checks_log_in_before_ping_and_info(
    rendered: dict[str, list[Obj]],
) -> None:
    """HAProxy puts environment variables in only inside double quotes; the data nodes
    answer +OK to the right password (a wrong one: -WRONGPASS, and the node is down)."""
    cfg = _generated(rendered["production"], "ConfigMap", "redis-haproxy")["data"]["haproxy.cfg"]
    checks = re.findall(r"(?m)^\s*tcp-check (.+?)\s*$", cfg)
    assert checks[:5] == [
        "connect",
        r'send "AUTH ${ALLOT_REDIS_PASSWORD}\r\n"',
        "expect string +OK",
        r"send PING\r\n",
        "expect string +PONG",
    ], checks


_STAND_INS = {
    # Records its REDISCLI_AUTH and arguments; answers PONG to a ping, nothing otherwise
    # (no Sentinel knows a primary, no node says it is one: the first start).
    "redis-cli": '#!/bin/sh\necho "$REDISCLI_AUTH|$*" >>"$CALLS"\n'
    'case " $* " in *" ping "*) echo PONG ;; esac\n',
    "redis-server": '#!/bin/sh\nprintf "%s\\n" "$@" >"$ARGS"\n',  # its arguments only
    "timeout": '#!/bin/sh\nshift\nexec "$@"\n',
}


def _run_redis_script(
    objs: list[Obj], script: str, pod: str, tmp_path: Path, password: str | None
) -> tuple[subprocess.CompletedProcess[str], list[str], list[str]]:
    """Run the component's start script ``script`` (from its rendered ConfigMap) as pod
    ``pod`` with stand-ins for redis-cli, redis-server and timeout, its /data in tmp_path.
    Returns the run, redis-server's arguments and redis-cli's calls (`AUTH|args`)."""
    text = _generated(objs, "ConfigMap", "redis-scripts")["data"][script]
    data, stand_ins = tmp_path / "data", tmp_path / "bin"
    data.mkdir()
    stand_ins.mkdir()
    for name, body in _STAND_INS.items():
        (stand_ins / name).write_text(body)
        (stand_ins / name).chmod(0o755)
    (tmp_path / script).write_text(text.replace("/data/", f"{data}/"))
    env = {"PATH": f"{stand_ins}:/usr/bin:/bin", "POD_NAME": pod}
    env |= {"CALLS": str(tmp_path / "calls"), "ARGS": str(tmp_path / "args")}
    if password is not None:
        env["ALLOT_REDIS_PASSWORD"] = password
    proc = subprocess.run(
        ["sh", str(tmp_path / script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    args = (tmp_path / "args").read_text().splitlines() if (tmp_path / "args").exists() else []
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return proc, args, calls


def _option(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, f"{flag} given {args.count(flag)} times: {args}"
    return args[args.index(flag) + 1]


def test_production_data_nodes_take_the_password_and_give_it_to_their_primary(
    rendered: dict[str, list[Obj]], tmp_path: Path
) -> None:
    """redis-node.sh as pod redis-node-1 on a first start: a replica of redis-node-0 that
    takes the password (requirepass) and logs in to its primary with it (masterauth:
    either node may be the primary after a failover); every question it asks with
    redis-cli logs in. Without the password it does not start a Redis at all."""
    objs = rendered["production"]
    password = _redis_password(objs)
    proc, args, calls = _run_redis_script(objs, "redis-node.sh", "redis-node-1", tmp_path, password)
    assert proc.returncode == 0, proc.stderr
    assert _option(args, "--requirepass") == password
    assert _option(args, "--masterauth") == password
    assert _option(args, "--replicaof") == "redis-node-0.redis-node"
    assert calls and all(call.startswith(f"{password}|") for call in calls), calls
    (tmp_path / "bare").mkdir()
    proc, args, _ = _run_redis_script(
        objs, "redis-node.sh", "redis-node-1", tmp_path / "bare", None
    )
    assert proc.returncode != 0 and not args and "ALLOT_REDIS_PASSWORD" in proc.stderr


def test_production_sentinels_take_the_password_and_monitor_with_it(
    rendered: dict[str, list[Obj]], tmp_path: Path
) -> None:
    """sentinel.sh as pod redis-sentinel-0 on a first start: its configuration (0600)
    takes the password (requirepass: no pod without it may ask or command a Sentinel;
    Sentinels log in to each other with it) and logs in to the primary and its replica
    with it (auth-pass, after the monitor line that declares the primary)."""
    objs = rendered["production"]
    password = _redis_password(objs)
    proc, args, calls = _run_redis_script(
        objs, "sentinel.sh", "redis-sentinel-0", tmp_path, password
    )
    assert proc.returncode == 0, proc.stderr
    conf = tmp_path / "data" / "sentinel.conf"
    assert args == [str(conf), "--sentinel"]
    assert conf.stat().st_mode & 0o777 == 0o600
    lines = conf.read_text().splitlines()
    assert f"requirepass {password}" in lines
    monitor = lines.index("sentinel monitor allot redis-node-0.redis-node 6379 2")
    assert lines.index(f"sentinel auth-pass allot {password}") > monitor
    assert calls and all(call.startswith(f"{password}|") for call in calls), calls
    (tmp_path / "bare").mkdir()
    proc, args, _ = _run_redis_script(
        objs, "sentinel.sh", "redis-sentinel-0", tmp_path / "bare", None
    )
    assert proc.returncode != 0 and not args
