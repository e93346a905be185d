"""``allot up``: the whole live stack with no Docker, until Ctrl-C (see ``allot.ops.stack``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from allot.auth.client import masked_url
from allot.bus.service_main import add_short_lane_argument, lane_hosts_of
from allot.config.budget_file import load_tree_file
from allot.core.errors import ValidationError
from allot.core.model import DEFAULT_UNALLOCATED_GRACE_S
from allot.core.policy import DEFAULT_UNALLOCATED_SETTLE_S
from allot.ops.nats_nodes import CLUSTER_DIR as NATS_CLUSTER_DIR
from allot.ops.nats_nodes import other_store_note
from allot.ops.run_dir import DEFAULT_RUN_DIR, RUN_DIR_ENV, forget_stack, record_stack
from allot.ops.stack import AgentSpec, Stack, StackConfig, StackError
from allot.proto import subjects as s


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "up",
        help="run the live stack (NATS, Redis, services, fake agents) with no Docker",
        description="Run NATS with JetStream and a Redis-protocol server from the wheels "
        "(or existing ones by URL), the six services (two placement instances), the web "
        "dashboard and fake agents, each a process of its own; "
        "a service or agent process that exits is restarted (--restart-limit); Ctrl-C "
        "stops all: the agents first, then the services, then the servers. "
        "--nats-cluster 3 runs three clustered NATS servers instead of one, every stream "
        "replicated on each, and two accounting instances: losing one node loses nothing.",
    )
    add_stack_options(p)
    add_restart_options(p)
    p.set_defaults(func=run)


def add_stack_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nats-url", help="use this NATS server instead of an embedded one")
    p.add_argument(
        "--nats-cluster",
        type=int,
        default=1,
        metavar="N",
        help="run N clustered NATS servers on loopback (3 or 5; default 1: one server), every "
        "stream and KV bucket replicated on each, every service given all N URLs, two "
        "accounting instances; a node that exits is restarted on its ports and store "
        "(--restart-limit). Stores in RUN_DIR/nats-cluster. Not with --nats-url or --secure",
    )
    p.add_argument("--redis-url", help="use this Redis server instead of an embedded one")
    p.add_argument("--budgets", type=Path, help="budget tree YAML (default: a built-in example)")
    p.add_argument(
        "--run-dir",
        type=Path,
        default=Path(os.environ.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR),
        help=f"logs and JetStream data (env {RUN_DIR_ENV}; default %(default)s); the allot "
        "commands typed in this folder find the stack running there",
    )
    p.add_argument("--agents", type=int, default=2, help="fake agent processes (default 2)")
    p.add_argument("--hosts", type=int, default=4, help="hosts per fake agent (default 4)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per host (default 8)")
    p.add_argument(
        "--grace-s",
        type=int,
        default=300,
        help="preemption grace period, seconds (default %(default)s)",
    )
    p.add_argument(
        "--unallocated-grace-s",
        type=int,
        default=DEFAULT_UNALLOCATED_GRACE_S,
        help=f"grace of unallocated victims (default {DEFAULT_UNALLOCATED_GRACE_S})",
    )
    p.add_argument(
        "--unallocated-settle-s",
        type=float,
        default=DEFAULT_UNALLOCATED_SETTLE_S,
        help="GPUs that came free less than this ago go to allocated work only "
        f"(default {DEFAULT_UNALLOCATED_SETTLE_S:g})",
    )
    add_short_lane_argument(
        p, "comma-separated host ids forming placement's short lane (default none)"
    )
    p.add_argument(
        "--rank-every-s",
        type=float,
        default=300.0,
        help="Fair Tree refresh period, seconds (default %(default)s)",
    )
    p.add_argument(
        "--secure",
        action="store_true",
        help="users with per-role NATS permissions and TLS on loopback (allot auth gen)",
    )
    p.add_argument("--roles", type=Path, help="roles file for --secure (default: generated)")
    p.add_argument(
        "--idle-preempt",
        action="store_true",
        help="preempt allocated work flagged idle once its minimum runtime has passed "
        "(reason idle, not requeued; the health service's --idle-preempt); default: flag only",
    )
    p.add_argument(
        "--dashboard-port",
        type=int,
        default=None,
        help="the web dashboard's port on 127.0.0.1 (default: a free one)",
    )


def add_restart_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--restart-limit",
        type=int,
        default=5,
        help="restart a service or agent process that exits, at most this many times "
        "within --restart-window-s; its next exit stops the stack (exit 1). 0: the first "
        "exit does (default 5)",
    )
    p.add_argument(
        "--restart-window-s",
        type=float,
        default=60.0,
        help="the window of --restart-limit (default 60)",
    )
    p.add_argument(
        "--restart-backoff-s",
        type=float,
        default=0.5,
        help="wait before a restart, doubled for each earlier restart of the same process "
        "within the window, at most 30 s (default 0.5)",
    )


def config_from(args: argparse.Namespace, **overrides: object) -> StackConfig:
    for name in ("agents", "hosts", "gpus"):
        if getattr(args, name) < 1:
            raise ValidationError(f"--{name}", f"must be at least 1, got {getattr(args, name)}")
    dashboard_port = getattr(args, "dashboard_port", None)
    if dashboard_port is not None and not 1 <= dashboard_port <= 65535:
        raise ValidationError("--dashboard-port", f"must be 1-65535, got {dashboard_port}")
    if args.budgets is not None and not args.budgets.is_file():
        raise ValidationError("--budgets", f"{args.budgets} is not a file")
    agents = tuple(
        AgentSpec(f"fake-{chr(ord('a') + i)}" if i < 26 else f"fake-{i}", args.hosts, args.gpus)
        for i in range(args.agents)
    )
    config = StackConfig(
        run_dir=args.run_dir.resolve(),
        nats_url=args.nats_url,
        redis_url=args.redis_url,
        budgets=args.budgets,
        agents=agents,
        grace_s=args.grace_s,
        unallocated_grace_s=args.unallocated_grace_s,
        unallocated_settle_s=args.unallocated_settle_s,
        short_lane=lane_hosts_of(args),
        rank_every_s=args.rank_every_s,
        secure=getattr(args, "secure", False),
        nats_nodes=args.nats_cluster,
        # Several instances share accounting's durable consumer: with a replicated log,
        # losing one instance does not stop the charging either.
        accountings=2 if args.nats_cluster > 1 else 1,
        roles=getattr(args, "roles", None),
        idle_preempt=getattr(args, "idle_preempt", False),
        dashboard_port=dashboard_port,
        restart_limit=args.restart_limit,
        restart_window_s=args.restart_window_s,
        restart_backoff_s=args.restart_backoff_s,
    )
    if config.roles is not None and not config.secure:
        raise ValidationError("--roles", "only makes sense with --secure")
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def redis_export(redis_url: str) -> str:
    """The line that points ``allot accounting`` at the stack's Redis (an embedded one is
    not on the default port: without it, the command reads another server's counters)."""
    return f"export ALLOT_REDIS_URL={redis_url}   # allot accounting"


def run(args: argparse.Namespace) -> int:
    stack = Stack(config_from(args))
    # A plain flag, not a threading.Event: Event.set() in a signal handler deadlocks when
    # the signal lands while this thread holds the Event's lock (inside Event.wait, or a
    # first handler's set()): `kill` twice, or `timeout`'s forwarded TERM, hung allot up
    # for good with its servers running (seen in a trial).
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    # A closed terminal's HUP now reaches allot up alone (the stack's processes have
    # process groups of their own): without a handler it died and left them all running.
    signal.signal(signal.SIGHUP, lambda signum, _frame: stopping.append(signum))
    print("starting the Allot stack (Ctrl-C stops it)...", flush=True)
    try:
        return _run_stack(stack, stopping)
    except StackError as exc:
        print(f"allot up: {exc}", file=sys.stderr)
        return 1


def _run_stack(stack: Stack, stopping: list[int]) -> int:
    with stack:
        # The allot commands typed in this folder find this stack (allot.ops.run_dir).
        record_stack(stack.config.run_dir, Path.cwd())
        try:
            _banner(stack)
            try:
                dead = wait_for_stop(lambda: _supervise(stack), stopping)
                if dead:
                    print(f"allot up: {dead}", file=sys.stderr)
                    return 1
            except KeyboardInterrupt:
                pass
        finally:
            forget_stack(stack.config.run_dir, Path.cwd())
        # A second Ctrl-C or TERM must not cut the stop short (servers left running).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        print("stopping...", flush=True)
    killed = stack.killed
    if killed:  # a service that ignores SIGTERM would also hold up `docker stop`
        print(f"stopped; killed after 10 s without stopping: {', '.join(killed)}")
        return 1
    print("stopped.")
    return 0


def _banner(stack: Stack) -> None:
    """What runs, where, and how to reach it; its last line starts with ``try:``."""
    c = stack.config
    print(f"  NATS   {masked_url(stack.url_for())}  ({_origin(stack, 'nats')})")
    if stack.cluster is not None:
        cluster = stack.cluster
        print(
            f"  {cluster.n} NATS nodes (streams with {cluster.n} replicas; one that exits is "
            f"restarted), logs in {c.run_dir / NATS_CLUSTER_DIR}/n<i>/nats-server.log:"
        )
        for i, name in enumerate(stack.node_names):
            print(f"    {name:<14} pid {cluster.pid(i)}")
    note = other_store_note(c.run_dir, c.nats_nodes)
    if note is not None:
        print(f"  {note}")
    print(f"  Redis  {stack.servers.redis_url}  ({_origin(stack, 'redis')})")
    gpus = sum(a.host_count * a.gpus for a in c.agents)
    print(f"  hosts  {sum(a.host_count for a in c.agents)} fake hosts, {gpus} GPUs")
    print(f"  {len(stack.procs)} processes (services and agents):")
    for name, proc in stack.procs.items():
        print(f"    {name:<14} pid {proc.pid}")
    print(f"  logs   {c.run_dir / 'logs'}")
    if stack.dashboard_url is not None:
        print(f"  dashboard  {stack.dashboard_url}/  (metrics: {stack.dashboard_url}/metrics)")
    if stack.auth is not None:
        print(f"  secure: TLS on loopback, CA {stack.ca_file}")
        print(f"  users:  {', '.join(stack.auth.users)}")
        print(f"  credentials: {c.run_dir / 'auth' / 'users'}/<user>.env (0600)")
        print(
            "  dashboard login: any of these users with ALLOT_DASHBOARD_PASSWORD from its "
            "credentials file (a team sees only its own work)"
        )
        print(f"  export ALLOT_NATS_CA={stack.ca_file}")
        team = next((u for u, cr in stack.auth.users.items() if cr.role == "team"), None)
        if team is not None:
            print(f"  export ALLOT_NATS_URL='{stack.url_for(team)}'   # as team {team}")
    else:
        print(f"  {found_line(c.run_dir)}")
        print(f"  export ALLOT_NATS_URL={stack.servers.nats_url}   # or this, from anywhere")
    print(f"  {redis_export(stack.servers.redis_url)}")
    if stack.redis_password is not None and stack.auth is not None and stack.auth.redis_env:
        print(
            f"  set -a; . {stack.auth.redis_env}; set +a   # Redis's password, for allot accounting"
        )
    print(f"  try:   {try_line(stack)}", flush=True)


def found_line(run_dir: Path) -> str:
    """How the CLI finds this stack: by itself in this folder (and below), elsewhere with
    ``ALLOT_RUN_DIR``."""
    return (
        "allot commands typed in this folder find this stack by themselves; elsewhere: "
        f"export {RUN_DIR_ENV}={run_dir}"
    )


def _supervise(stack: Stack) -> str | None:
    # Ctrl-C's KeyboardInterrupt held off meanwhile: raised between a restart's fork and
    # its entry in ``stack.procs``, it would leave that process out of the stop, and in a
    # process group of its own no later Ctrl-C reaches it.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return stack.supervise(lambda line: print(f"allot up: {line}", file=sys.stderr, flush=True))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def wait_for_stop(
    dead: Callable[[], str | None], stopping: Sequence[int], pause_s: float = 0.5
) -> str | None:
    """Wait until a stop is asked (``stopping`` gets a signal: None) or ``dead`` (the
    stack's supervision, which restarts what it can) says why the stack must stop."""
    while not stopping:
        time.sleep(pause_s)  # the flag is seen within half a second
        problem = dead()
        # A TERM sent to the whole process group (`timeout`, systemd, a container runtime)
        # reaches the services too, and they may exit before this loop sees the flag: that
        # is the stop asked for, not a death to report.
        if problem and not stopping:
            return problem
    return None


def try_line(stack: Stack) -> str:
    """Commands to try that the exported user may run: under ``--secure`` the first team
    user, whose requests must name its own allocation (``--alloc``) and who submits as its
    login (no ``--user``); otherwise the first leaf of the budget tree, as user ``ann``."""
    assert stack.budgets_path is not None
    leaves = load_tree_file(stack.budgets_path).leaves()
    alloc = leaves[0] if leaves else "nlp"
    scope = ""
    user = " --user ann"
    if stack.auth is not None:
        team = next((u for u, cr in stack.auth.users.items() if cr.role == "team"), None)
        # The team's grants name its allocations: submit.<allocation>.<login>.
        granted = [
            g.split(".")[3]
            for g in (stack.auth.grants[team].publish if team is not None else ())
            if g.startswith(f"{s.PREFIX}.submit.") and g.split(".")[3] != s.UNALLOCATED
        ]
        if granted:
            alloc = granted[0]
        scope = f" --alloc {alloc}"
        user = ""
    return (
        f"allot submit --alloc {alloc}{user} --gpus 8 --min-runtime 1h --duration 10m;  "
        f"allot queue{scope};  allot share;  allot hosts;  allot owed"
    )


def _origin(stack: Stack, which: str) -> str:
    if which == "nats" and stack.cluster is not None:
        return f"embedded, a {stack.cluster.n}-node cluster"
    return "embedded" if which in stack.servers.embedded else "given"
