"""Fault injection on a three-node NATS cluster (issue 5): one node lost under load.

Like ``bench/chaos.py`` (same stack, load, history and checker; its ``Chaos`` class does
the work), but the log lives on ``allot.adapters.nats_cluster.EmbeddedNatsCluster``: three
nats-server processes on loopback, every stream and KV bucket with 3 replicas
(``ALLOT_STREAM_REPLICAS=3`` in the services' environment), the services given the whole
server list (``ALLOT_NATS_URL=nats://a,nats://b,nats://c``).

Faults (each: one node stopped, ``down_s`` seconds down, restarted on the same store,
then the load runs until the backlog drains):

* ``node-kill:follower``: a node that leads nothing. It is not the JetStream meta leader,
  and every stream and durable consumer leader it held is first moved to another node
  (leader step-down with a preferred peer), so the kill costs only its replicas and the
  connections of the clients attached to it (they reconnect to another node).
* ``node-kill:leader``: the node leading the WORKLOADS stream (the log of record), as it
  is: its raft groups elect new leaders, which nats-server does after its election timeout
  (4-9 s, compiled in: ``server/raft.go``), so this is the slow case.
* ``node-stop:leader`` (and ``node-stop:follower``): the same node stopped with SIGTERM,
  as a rolling restart or planned maintenance does: nats-server hands its leaderships to
  the other nodes as it shuts down, so no election timeout is waited for.

Recovery, the checker's figures and the goals are ``bench/chaos.py``'s. Results go to
``bench/results/chaos-cluster.{md,json}``; exit status 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient

from allot import bus
from allot.adapters.embedded import EmbeddedRedis, unwind_on_sigterm
from allot.adapters.nats_cluster import EmbeddedNatsCluster
from allot.ops.stack import Stack
from allot.proto.subjects import STREAMS
from allot.sdk import Client
from checker import check
from history import Op

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chaos  # bench is not a package: the driver this one extends, by path

RESULTS = chaos.RESULTS
DEFAULT_PLAN = ["node-kill:follower", "node-kill:leader", "node-stop:leader"]
KV_STREAMS = (f"KV_{bus.LEADER_BUCKET}",)


@dataclass
class ClusterConfig(chaos.ChaosConfig):
    nodes: int = 3
    down_s: float = 5.0
    """How long a killed node stays down (at least until the recovery is measured)."""


class _ClusterServers:
    """What ``chaos.Chaos`` reads of its servers; NATS is the cluster (no ``nats-restart``
    fault here: ``nats`` is None)."""

    def __init__(self, cfg: ClusterConfig) -> None:
        self.nats = None
        self.cluster = EmbeddedNatsCluster(
            cfg.nodes, base_dir=cfg.run_dir / "cluster", sync_always=cfg.sync_always
        ).start()
        self.redis: EmbeddedRedis | None = None
        if cfg.redis_url is None:
            self.redis = EmbeddedRedis().start()
        self.nats_url = self.cluster.url
        self.redis_url = cfg.redis_url or self.redis.url  # type: ignore[union-attr]

    def stop(self) -> None:
        if self.redis is not None:
            self.redis.stop()
        self.cluster.stop()


class ClusterChaos(chaos.Chaos):
    servers: _ClusterServers  # type: ignore[assignment]
    cfg: ClusterConfig

    async def inject(self, entry: str) -> Op | None:
        kind, _, target = entry.partition(":")
        if kind not in ("node-kill", "node-stop"):
            return await super().inject(entry)
        cluster = self.servers.cluster
        nc = self.client.nc
        if target == "follower":
            victim = await self._quiet_node(nc, cluster)
        elif target == "leader":
            victim = cluster.index_of(await stream_leader(nc, "WORKLOADS"))
        else:
            raise ValueError(f"{kind}: target must be follower or leader, got {target!r}")
        name = cluster.node_names[victim]
        leads = await leaderships(nc, cluster.node_names[victim])
        meta = cluster.meta_leader()
        op = self.history.fault(
            entry, name, leads=",".join(leads) or "-", meta_leader=int(meta == name)
        )
        await asyncio.to_thread(cluster.kill if kind == "node-kill" else cluster.terminate, victim)
        self._pending.append(asyncio.create_task(self._restart_later(victim, op)))
        return op

    async def _restart_later(self, victim: int, fault: Op) -> None:
        # Down for ``down_s`` measured from the kill (recovery is measured meanwhile).
        await asyncio.sleep(max(0.0, fault.time + self.cfg.down_s - time.monotonic()))
        t0 = time.monotonic()
        await asyncio.to_thread(self.servers.cluster.restart, victim)
        self.notes.append(
            f"{fault.value['target']}: restarted after {self.cfg.down_s:g} s down, "
            f"ready again in {time.monotonic() - t0:.2f} s"
        )

    async def _quiet_node(self, nc: NatsClient, cluster: EmbeddedNatsCluster) -> int:
        """A node that is not the meta leader, after moving every stream and durable
        consumer leadership it holds to another node."""
        meta = cluster.meta_leader()
        victim = next(i for i, n in enumerate(cluster.node_names) if n != meta)
        name = cluster.node_names[victim]
        heir = next(n for n in cluster.node_names if n not in (name, meta))
        deadline = time.monotonic() + 20.0
        while (held := await leaderships(nc, name)) and time.monotonic() < deadline:
            for group in held:
                await step_down(nc, group, heir)
            await asyncio.sleep(0.3)
        if held:
            self.notes.append(f"{name} still led {held} when killed")
        return victim


async def stream_leader(nc: NatsClient, stream: str) -> str:
    info = await nc.jetstream().stream_info(stream)
    if info.cluster is None or not info.cluster.leader:
        raise RuntimeError(f"stream {stream} has no leader")
    return info.cluster.leader


async def leaderships(nc: NatsClient, node: str) -> list[str]:
    """Streams (``S``) and durable consumers (``S/C``) whose raft leader is ``node``."""
    js = nc.jetstream()
    out = []
    for stream in (*STREAMS, *KV_STREAMS):
        with contextlib.suppress(Exception):  # a stream not created yet, a leaderless one
            info = await js.stream_info(stream)
            if info.cluster is not None and info.cluster.leader == node:
                out.append(stream)
            for c in await js.consumers_info(stream):
                if c.config.durable_name and c.cluster is not None and c.cluster.leader == node:
                    out.append(f"{stream}/{c.name}")
    return out


async def step_down(nc: NatsClient, group: str, preferred: str) -> None:
    """Ask the leader of ``group`` (``S`` or ``S/C``) to hand over to ``preferred``."""
    stream, _, consumer = group.partition("/")
    subject = (
        f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}"
        if consumer
        else f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}"
    )
    body = json.dumps({"placement": {"preferred": preferred}}).encode()
    with contextlib.suppress(Exception):  # checked again by the caller's loop
        await nc.request(subject, body, timeout=2.0)


SETUP_TIMEOUT_S = 30.0


async def create_log(url: str, replicas: int, lease_ttl_s: float) -> None:
    """Streams and KV buckets, replicated, before the services start: six services creating
    R3 streams at once on a fresh cluster can outlast nats-py's 5 s API timeout (seen:
    placement's ``add_stream`` timed out and the stack did not start). The services then
    find them and create nothing (same configuration, so their own calls are no-ops).

    Tried again until ``SETUP_TIMEOUT_S``: a fresh cluster that reports a meta leader may
    still leave a JetStream API request unanswered for 5 s (seen once in CI: the first
    ``stream_info`` timed out); every call here is idempotent."""
    nc, js = await bus.connect(url, "allot-chaos-setup")
    deadline = time.monotonic() + SETUP_TIMEOUT_S
    try:
        while True:
            try:
                await bus.ensure_streams(js, replicas)
                await bus.new_lease_bucket(js, lease_ttl_s, replicas)
                return
            except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
    finally:
        await nc.close()


async def run(cfg: ClusterConfig, log: Callable[[str], None] = print) -> chaos.ChaosResult:
    t0 = time.monotonic()
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    servers = await asyncio.to_thread(_ClusterServers, cfg)
    cluster = servers.cluster
    await create_log(cluster.url, cfg.nodes, cfg.lease_ttl_s)
    # The stack's own readiness check (stack._wait_ready) and the SDK client take one URL
    # (nats-py refuses a comma string); the services get every node.
    stack = Stack(
        chaos.stack_config(
            cfg,
            cluster.urls[0],
            servers.redis_url,
            extra_env={"ALLOT_NATS_URL": cluster.url, "ALLOT_STREAM_REPLICAS": str(cfg.nodes)},
        )
    )
    try:
        await asyncio.to_thread(stack.start)
        log(f"stack up on {cluster!r} in {time.monotonic() - t0:.1f} s; run dir {cfg.run_dir}")
        # One URL (the SDK takes one); when that node is killed, nats-py fails over to the
        # other nodes, which the server announced to it (INFO connect_urls).
        async with Client(
            cluster.urls[-1], timeout=cfg.submit_timeout_s, retries=2, name="allot-chaos"
        ) as client:
            run_ = ClusterChaos(cfg, servers, stack, client)  # type: ignore[arg-type]
            replicas = {
                name: (await client.nc.jetstream().stream_info(name)).config.num_replicas
                for name in (*STREAMS, *KV_STREAMS)
            }
            run_.notes.append(f"replicas per stream: {replicas}")
            await run_.watch_placements()
            load = asyncio.create_task(run_.load())
            await asyncio.sleep(cfg.warmup_s)
            for entry in cfg.plan:
                op = await run_.inject(entry)
                if op is None:
                    continue
                took = await run_.wait_recovered(op)
                shown = "NOT recovered" if took is None else f"recovered in {took:.2f} s"
                log(f"{entry:<22} -> {op.value['target']:<10} {shown}; led {op.value['leads']}")
                await run_.settle()
            await run_.stop_load()
            await load
            quiescent = await run_.quiesce()
            records = await chaos.read_log(client.nc.jetstream())
        accounting = await chaos.accounting_check(
            servers.redis_url, cfg.redis_prefix, chaos.gpu_seconds_run(records), timeout=20.0
        )
        (cfg.run_dir / "history.jsonl").write_bytes(run_.history.dumps())
        report = check(run_.history.ops, records, require_placed=quiescent)
        return chaos.ChaosResult(
            report,
            run_.history.ops,
            quiescent,
            run_.notes,
            cfg,
            time.monotonic() - t0,
            accounting,
        )
    finally:
        await asyncio.to_thread(stack.stop)
        await asyncio.to_thread(servers.stop)


ACCOUNTING_GOAL = "accounting equals the log after the wipe"


def to_json(result: chaos.ChaosResult) -> dict[str, Any]:
    data = chaos.to_json(result)
    cfg = result.config
    assert isinstance(cfg, ClusterConfig)
    data["setup"].update(nodes=cfg.nodes, down_s=cfg.down_s)
    # No Redis wipe here: the same check, named for what it is in this run.
    goals = data["goals"]
    goals["accounting equals the log"] = goals.pop(ACCOUNTING_GOAL)
    return data


def to_markdown(data: dict[str, Any]) -> str:
    text = chaos.to_markdown(data)
    head = "# Fault injection (`make chaos`)"
    setup = data["setup"]
    return text.replace(
        head,
        "# Fault injection on a NATS cluster (`bench/chaos_cluster.py`)\n\n"
        f"Three nats-server processes on loopback, streams and KV buckets with "
        f"{setup['nodes']} replicas; each fault stops one node, keeps it down "
        f"{setup['down_s']:g} s and restarts it on its store. `node-kill` = SIGKILL, "
        "`node-stop` = SIGTERM (planned: the node hands its leaderships over). `follower`: "
        "a node leading nothing (not the meta leader; its stream and consumer leaderships "
        "moved away first). `leader`: the WORKLOADS stream leader, as it is (a SIGKILLed "
        "leader is replaced after nats-server's raft election timeout, 4-9 s per group).",
        1,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-url", help="use this Redis")
    ap.add_argument("--rate", type=float, default=20.0, help="submissions per second")
    ap.add_argument("--agents", type=int, default=2)
    ap.add_argument("--hosts", type=int, default=8, help="fake hosts per agent")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the fault plan")
    ap.add_argument("--plan", help=f"comma-separated faults (default: {','.join(DEFAULT_PLAN)})")
    ap.add_argument("--down-s", type=float, default=5.0, help="how long a node stays down")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--run-dir", type=Path, help="logs and stores (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where chaos-cluster.* go")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)
    unwind_on_sigterm()  # a killed run stops its stack too
    plan = args.plan.split(",") if args.plan else DEFAULT_PLAN
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="allot-chaos-cluster-"))
    cfg = ClusterConfig(
        run_dir=run_dir,
        plan=plan * args.rounds,
        redis_url=args.redis_url,
        agents=args.agents,
        hosts=args.hosts,
        rate=args.rate,
        seed=args.seed,
        down_s=args.down_s,
    )
    data = to_json(asyncio.run(run(cfg)))
    stem = None if args.no_write else args.out / "chaos-cluster"
    return chaos.report(data, to_markdown(data), stem, run_dir)


if __name__ == "__main__":
    sys.exit(main())
