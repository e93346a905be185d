"""Fault injection (``make chaos``, issue 5): faults under a steady load, then a checker.

Setup: ``allot.ops.stack.Stack`` on this machine with fake agents (default 2 agent
processes x 8 hosts x 8 GPUs), two placement instances (leader + standby), lease TTL 1 s,
grace 2 s. A steady load (default 20 submissions/s, 1-4 GPUs, fake runs of 1-3 s, five
allocations plus unallocated work) goes through ``history.History``, which
records every submission as invoke then ok / fail / unknown.

Faults, one after another, each followed by a wait for recovery and a few seconds of load:

* ``sigkill:<service>``: SIGKILL of one service process, restarted at once (``leader`` and
  ``standby`` name the placement instances by their current role; ``random`` draws one);
* ``sigstop:leader``: SIGSTOP of the placement leader for 3 lease TTLs, then SIGCONT (the
  old leader wakes up believing it leads: its decisions must be fenced off);
* ``nats-restart``: SIGKILL of nats-server, restarted on the same port and store (only
  when this script started it: not with ``--nats-url``);
* ``redis-wipe``: FLUSHALL (only the run's prefix on a given Redis), then the accounting
  service is stopped, ``allot.services.accounting.rebuild`` replays the log, and it is
  started again.

Recovery after a fault = time from the fault to the first submission invoked after it
that was acknowledged AND placed (``checker``). At the end the load stops, the
run waits until every acknowledged workload has ended, reads HOSTS and WORKLOADS whole,
and runs the checker. Figures are printed and written to ``bench/results/chaos.{md,json}``;
the exit status is 1 when a goal is missed (0 lost, 0 double-booked, 0 stale decisions
applied, recovery <= 5 s after every fault).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import redis.asyncio as redis_asyncio
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from allot import bus
from allot.adapters.embedded import EmbeddedNats, EmbeddedRedis, unwind_on_sigterm
from allot.adapters.usage_store import RedisUsageStore
from allot.core.usage import window_usage
from allot.eventlog.logfold import TERMINAL, LogFold
from allot.ops.stack import AgentSpec, Stack, StackConfig
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sdk import Client
from allot.services.accounting import rebuild
from checker import Report, check
from history import SUBMIT, History, Op

RESULTS = Path(__file__).resolve().parent / "results"
GOAL_RECOVERY_S = 5.0
ALLOCATIONS: tuple[str | None, ...] = ("nlp", "vision", "speech", "search", "ads", None)
GPU_MIX = (1, 1, 2, 4)
SERVICES = (
    "intake",
    "accounting",
    "ranking",
    "health",
    "dispatch",
    "dashboard",
    "leader",
    "standby",
)
RANDOM_POOL = (*SERVICES[:-2], "placement-1", "placement-2")
"""The services by process name (the leader and the standby are whichever placement is)."""


def default_plan(agents: int, random_kills: int) -> list[str]:
    plan = [f"sigkill:{name}" for name in SERVICES]
    plan += [f"sigkill:agent-fake-{chr(ord('a') + i)}" for i in range(agents)]
    plan += ["sigkill:random"] * random_kills
    plan += ["sigstop:leader", "nats-restart", "redis-wipe"]
    return plan


@dataclass
class ChaosConfig:
    run_dir: Path
    plan: list[str]
    nats_url: str | None = None
    redis_url: str | None = None
    agents: int = 2
    hosts: int = 8
    gpus: int = 8
    rate: float = 20.0
    lease_ttl_s: float = 1.0
    grace_s: int = 2
    duration_s: tuple[float, float] = (1.0, 3.0)
    sync_always: bool = True
    """Embedded NATS fsyncs every JetStream write, as the stack's own does."""
    min_runtime_s: int = 60
    """Allocated work's protection. Longer than any fake run, so only unallocated work is
    ever preempted and recovery figures measure the faults, not policy churn
    (docs/decisions/0026)."""
    warmup_s: float = 3.0
    settle_s: float = 3.0
    steady_queue: int = 4
    """Before the next fault, wait until at most this many workloads are pending."""
    drain_timeout_s: float = 60.0
    recovery_timeout_s: float = 30.0
    quiesce_timeout_s: float = 90.0
    seed: int = 1
    submit_timeout_s: float = 1.0
    redis_prefix: str = field(default_factory=lambda: f"chaos{os.getpid()}")


@dataclass
class ChaosResult:
    report: Report
    ops: list[Op]
    quiescent: bool
    notes: list[str]
    config: ChaosConfig
    wall_s: float
    accounting: dict[str, Any]
    """GPU-seconds charged in Redis at the end vs run per the log (``accounting_check``)."""


class _Servers:
    """NATS and Redis for the run: given by URL, or embedded ones this run may restart."""

    def __init__(self, cfg: ChaosConfig) -> None:
        self.store = cfg.run_dir / "jetstream"
        self.nats: EmbeddedNats | None = None
        self.redis: EmbeddedRedis | None = None
        # The same durability as the stack's own NATS (``StackConfig.sync_always``).
        self.sync_always = cfg.sync_always
        if cfg.nats_url is None:
            self.nats = EmbeddedNats(
                store_dir=self.store,
                sync_always=self.sync_always,
                memory_staging=bus.ATOMIC_STREAMS,
            ).start()
        if cfg.redis_url is None:
            self.redis = EmbeddedRedis().start()
        self.nats_url = cfg.nats_url or self._nats().url
        self.redis_url = cfg.redis_url or self._redis().url

    def _nats(self) -> EmbeddedNats:
        assert self.nats is not None
        return self.nats

    def _redis(self) -> EmbeddedRedis:
        assert self.redis is not None
        return self.redis

    def restart_nats(self) -> None:
        """SIGKILL nats-server, then start it again on the same ports and store."""
        old = self._nats()
        port, http_port = old.port, old.http_port
        os.kill(old.pid, signal.SIGKILL)
        old.stop()  # reaps the process, removes its runtime dir (the store stays)
        self.nats = EmbeddedNats(
            store_dir=self.store,
            port=port,
            http_port=http_port,
            sync_always=self.sync_always,
            memory_staging=bus.ATOMIC_STREAMS,
        ).start()

    def stop(self) -> None:
        if self.redis is not None:
            self.redis.stop()
        if self.nats is not None:
            self.nats.stop()


# -- reading the log ----------------------------------------------------------------------------


async def read_stream(js: JetStreamContext, stream: str) -> list[msgspec.Struct]:
    """Every record of ``stream``, decoded, in order (undecodable ones are skipped)."""
    info = await js.stream_info(stream)
    if info.state.messages == 0:
        return []
    out: list[msgspec.Struct] = []
    sub = await js.subscribe(
        ">", stream=stream, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    try:
        while True:
            msg = await sub.next_msg(timeout=10)
            with contextlib.suppress(Exception):
                out.append(bus.decode_record(msg.subject, msg.data))
            if msg.metadata.num_pending == 0 or msg.metadata.sequence.stream >= info.state.last_seq:
                break
    finally:
        await sub.unsubscribe()
    return out


async def read_log(js: JetStreamContext) -> list[msgspec.Struct]:
    """HOSTS then WORKLOADS: the order every reader replays them in."""
    return [*await read_stream(js, "HOSTS"), *await read_stream(js, "WORKLOADS")]


def acknowledged(ops: list[Op]) -> list[str]:
    return [
        str(op.value["workload_id"])
        for op in ops
        if op.f == SUBMIT and op.type == "ok" and "workload_id" in op.value
    ]


# -- the run ------------------------------------------------------------------------------------


class Chaos:
    def __init__(self, cfg: ChaosConfig, servers: _Servers, stack: Stack, client: Client) -> None:
        self.cfg = cfg
        self.servers = servers
        self.stack = stack
        self.client = client
        self.history = History()
        self.rng = random.Random(cfg.seed)
        self.placed: set[str] = set()  # workload ids seen placed live (core subscription)
        self.notes: list[str] = []
        self._stop_load = asyncio.Event()
        self._inflight: set[asyncio.Task[Any]] = set()
        self._pending: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ load
    async def watch_placements(self) -> None:
        """Live view of placements (a core-NATS subscription sees what JetStream stores;
        nats-py subscribes again after a reconnect). Only to know when to move on: the
        figures come from the log at the end."""

        async def on_msg(msg: Msg) -> None:
            with contextlib.suppress(Exception):
                record = bus.decode_record(msg.subject, msg.data)
                if isinstance(record, m.WorkloadPlaced):
                    self.placed.add(record.workload_id)

        await self.client.nc.subscribe(s.every_workload("placed"), cb=on_msg)

    async def load(self) -> None:
        loop = asyncio.get_running_loop()
        period = 1.0 / self.cfg.rate
        lo, hi = self.cfg.duration_s
        next_at = loop.time()
        i = 0
        while not self._stop_load.is_set():
            i += 1
            alloc = self.rng.choice(ALLOCATIONS)
            task = asyncio.create_task(
                self.history.submit(
                    self.client,
                    client_id=f"chaos-{i}",
                    user="chaos",
                    gpus=self.rng.choice(GPU_MIX),
                    allocation=alloc,
                    min_runtime_s=self.cfg.min_runtime_s if alloc else 0,
                    duration_s=round(self.rng.uniform(lo, hi), 3),
                )
            )
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            next_at += period
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def stop_load(self) -> None:
        self._stop_load.set()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    # ------------------------------------------------------------------ roles
    async def leader(self) -> str:
        """The placement instance holding the lease (KV ``allot_leader``/``placement``)."""
        deadline = time.monotonic() + self.cfg.recovery_timeout_s
        while True:
            with contextlib.suppress(Exception):
                kv = await self.client.nc.jetstream().key_value("allot_leader")
                entry = await kv.get("placement")
                if entry.value:
                    return entry.value.decode()
            if time.monotonic() > deadline:
                raise TimeoutError("no placement leader")
            await asyncio.sleep(0.1)

    async def resolve(self, target: str) -> str:
        if target == "leader":
            return await self.leader()
        if target == "standby":
            lead = await self.leader()
            others = [n for n in self.stack.procs if n.startswith("placement-") and n != lead]
            return others[0]
        if target == "random":
            return self.rng.choice([n for n in RANDOM_POOL if n in self.stack.procs])
        return target

    # ------------------------------------------------------------------ faults
    async def inject(self, entry: str) -> Op | None:
        kind, _, target = entry.partition(":")
        if kind == "sigkill":
            name = await self.resolve(target)
            op = self.history.fault(entry, name)
            await asyncio.to_thread(self.stack.kill, name, signal.SIGKILL)
            await asyncio.to_thread(self.stack.spawn, name)
            if name == "dashboard":
                # Not on the submission path: note when its pages answer again (a replay).
                self._pending.append(asyncio.create_task(self._dashboard_back(time.monotonic())))
            return op
        if kind == "sigstop":
            name = await self.resolve(target)
            pause = 3 * self.cfg.lease_ttl_s
            op = self.history.fault(entry, name, paused_s=pause)
            self.stack.kill(name, signal.SIGSTOP)
            # Resumed in the background: recovery (a standby taking over) is measured
            # while it is stopped; the next fault waits for the SIGCONT (``settle``).
            self._pending.append(asyncio.create_task(self._resume_later(name, pause)))
            return op
        if kind == "nats-restart":
            if self.servers.nats is None:
                self.notes.append("nats-restart skipped: NATS was given by URL")
                return None
            op = self.history.fault(entry, "nats-server")
            await asyncio.to_thread(self.servers.restart_nats)
            return op
        if kind == "redis-wipe":
            op = self.history.fault(entry, "redis")
            await self._wipe_redis()
            # The rebuild runs while recovery is measured (submissions do not need Redis).
            self._pending.append(asyncio.create_task(self._rebuild_accounting()))
            return op
        raise ValueError(f"unknown fault {entry!r}")

    async def _dashboard_back(self, since: float, timeout: float = 20.0) -> None:
        url = f"{self.stack.dashboard_url}/healthz"

        def ok() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=1.0) as reply:
                    return bool(reply.status == 200)
            except OSError:
                return False

        while time.monotonic() - since < timeout:
            if await asyncio.to_thread(ok):
                self.notes.append(
                    f"dashboard: /healthz 200 again {time.monotonic() - since:.2f} s after its kill"
                )
                return
            await asyncio.sleep(0.1)
        self.notes.append(f"dashboard: /healthz not 200 within {timeout:.0f} s of its kill")

    async def _resume_later(self, name: str, pause: float) -> None:
        await asyncio.sleep(pause)
        self.stack.kill(name, signal.SIGCONT)

    async def settle(self) -> None:
        """Load runs for ``settle_s``, any stopped process has been continued, and the
        backlog a fault left has drained (else the next fault's recovery would measure
        the previous one's queue)."""
        await asyncio.sleep(self.cfg.settle_s)
        pending, self._pending = self._pending, []
        await asyncio.gather(*pending)
        deadline = time.monotonic() + self.cfg.drain_timeout_s
        total = -1
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # no leader for a moment: ask again
                total = (await self.client.queue(timeout=1.0)).total
                if total <= self.cfg.steady_queue:
                    return
            await asyncio.sleep(0.5)
        self.notes.append(
            f"queue still {total} long {self.cfg.drain_timeout_s:.0f} s after a fault"
        )

    async def _wipe_redis(self) -> None:
        r = redis_asyncio.Redis.from_url(self.servers.redis_url)
        try:
            if self.servers.redis is not None:
                await r.flushall()
            else:  # a shared Redis: wipe only this run's keys
                async for key in r.scan_iter(match=f"*{self.cfg.redis_prefix}*", count=500):
                    await r.delete(key)
        finally:
            await r.aclose()

    async def _rebuild_accounting(self) -> None:
        # rebuild() wants the live service stopped (see its docstring).
        proc = self.stack.procs["accounting"]
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(_wait_or_kill, proc, 10.0)
        done = await rebuild(
            self.servers.nats_url,
            self.servers.redis_url,
            prefix=self.cfg.redis_prefix,
            slot_s=1.0,
        )
        self.notes.append(f"redis-wipe: rebuild replayed {done.records} records")
        await asyncio.to_thread(self.stack.spawn, "accounting")

    async def wait_recovered(self, fault: Op) -> float | None:
        """Seconds (live view) until a submission invoked after ``fault`` is placed."""
        deadline = time.monotonic() + self.cfg.recovery_timeout_s
        start = self.history.ops.index(fault)
        while time.monotonic() < deadline:
            after = {
                str(op.value.get("client_id")): op
                for op in self.history.ops[start:]
                if op.f == SUBMIT and op.type == "invoke"
            }
            for op in self.history.ops[start:]:
                if (
                    op.type == "ok"
                    and str(op.value.get("client_id")) in after
                    and op.value.get("workload_id") in self.placed
                ):
                    return time.monotonic() - fault.time
            await asyncio.sleep(0.05)
        return None

    async def quiesce(self) -> bool:
        """Wait until every acknowledged workload has ended (per a fold of the log)."""
        js = self.client.nc.jetstream()
        deadline = time.monotonic() + self.cfg.quiesce_timeout_s
        wanted = acknowledged(self.history.ops)
        while time.monotonic() < deadline:
            fold = LogFold()
            for rec in await read_log(js):
                fold.apply(rec)
            open_ = [
                w for w in wanted if w not in fold.records or fold.records[w].status not in TERMINAL
            ]
            if not open_:
                return True
            await asyncio.sleep(1.0)
        self.notes.append(f"not quiescent after {self.cfg.quiesce_timeout_s:.0f} s")
        return False


_ENDED = (m.WorkloadCompleted, m.WorkloadFailed, m.WorkloadCancelled, m.WorkloadPreempted)


def gpu_seconds_run(records: list[msgspec.Struct]) -> dict[str, float]:
    """Allocation -> GPU-seconds the agents say allocated work held (their end records)."""
    ran: dict[str, float] = {}
    for r in records:
        if isinstance(r, _ENDED) and r.allocated and r.allocation is not None:
            ran[r.allocation] = ran.get(r.allocation, 0.0) + r.gpu_seconds
    return ran


async def accounting_check(
    redis_url: str, prefix: str, ran: dict[str, float], timeout: float
) -> dict[str, Any]:
    """After a wipe and a rebuild, Redis must again hold what ran: the charged GPU-seconds
    per allocation equal the log's (polled: the live service charges ends as they come)."""
    r = redis_asyncio.Redis.from_url(redis_url)
    store = RedisUsageStore(r, prefix=prefix)
    deadline = time.monotonic() + timeout
    charged: dict[str, float] = {}
    try:
        while True:
            now = time.time()
            charged = window_usage(await store.buckets(list(ran), now, 86400), now, 86400)
            worst = max((abs(charged.get(a, 0.0) - v) for a, v in ran.items()), default=0.0)
            if worst < 1e-3 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        await r.aclose()
    return {
        "ran_gpu_s": {a: round(v, 3) for a, v in sorted(ran.items())},
        "charged_gpu_s": {a: round(charged.get(a, 0.0), 3) for a in sorted(ran)},
        "max_abs_diff_gpu_s": round(worst, 6),
        "match": worst < 1e-3,
    }


def _wait_or_kill(proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stack_config(
    cfg: ChaosConfig, nats_url: str, redis_url: str, extra_env: dict[str, str] | None = None
) -> StackConfig:
    """The stack every fault run uses: ``cfg.agents`` fake agents, two placement
    instances, fast ranking, accrual and heartbeats so faults show within seconds."""
    return StackConfig(
        run_dir=cfg.run_dir,
        nats_url=nats_url,
        redis_url=redis_url,
        agents=tuple(
            AgentSpec(f"fake-{chr(ord('a') + i)}", hosts=cfg.hosts, gpus=cfg.gpus)
            for i in range(cfg.agents)
        ),
        placements=2,
        grace_s=cfg.grace_s,
        # Policy timings as short as the grace: unallocated work restarts a second after
        # GPUs free up, so the queue drains between faults within the run's timeouts.
        unallocated_settle_s=1.0,
        lease_ttl_s=cfg.lease_ttl_s,
        rank_every_s=2.0,
        accrue_s=1.0,
        slot_s=1.0,
        heartbeat_timeout_s=10.0,
        fake_duration_s=2.0,
        redis_prefix=cfg.redis_prefix,
        extra_env=extra_env or {},
    )


async def run(cfg: ChaosConfig, log: Callable[[str], None] = print) -> ChaosResult:
    """Start everything, inject ``cfg.plan`` under load, check, stop everything."""
    t0 = time.monotonic()
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    servers = await asyncio.to_thread(_Servers, cfg)
    stack = Stack(stack_config(cfg, servers.nats_url, servers.redis_url))
    try:
        await asyncio.to_thread(stack.start)
        log(f"stack up in {time.monotonic() - t0:.1f} s; run dir {cfg.run_dir}")
        async with Client(
            servers.nats_url, timeout=cfg.submit_timeout_s, retries=2, name="allot-chaos"
        ) as client:
            chaos = Chaos(cfg, servers, stack, client)
            await chaos.watch_placements()
            load = asyncio.create_task(chaos.load())
            await asyncio.sleep(cfg.warmup_s)
            for entry in cfg.plan:
                op = await chaos.inject(entry)
                if op is None:
                    continue
                took = await chaos.wait_recovered(op)
                shown = "NOT recovered" if took is None else f"recovered in {took:.2f} s"
                log(f"{entry:<28} -> {op.value['target']:<16} {shown}")
                await chaos.settle()
            await chaos.stop_load()
            await load
            quiescent = await chaos.quiesce()
            records = await read_log(client.nc.jetstream())
        accounting = await accounting_check(
            servers.redis_url, cfg.redis_prefix, gpu_seconds_run(records), timeout=20.0
        )
        (cfg.run_dir / "history.jsonl").write_bytes(chaos.history.dumps())
        report = check(chaos.history.ops, records, require_placed=quiescent)
        return ChaosResult(
            report,
            chaos.history.ops,
            quiescent,
            chaos.notes,
            cfg,
            time.monotonic() - t0,
            accounting,
        )
    finally:
        await asyncio.to_thread(stack.stop)
        await asyncio.to_thread(servers.stop)


# -- results ------------------------------------------------------------------------------------


def goals(result: ChaosResult) -> dict[str, bool]:
    rep = result.report
    recov = rep.recovery_summary()["all"]
    worst = recov["max_s"]
    return {
        "0 lost": rep.lost == 0,
        "0 double-booked": rep.double_placements == 0 and rep.gpu_double_booked == 0,
        "0 stale decisions applied": rep.stale_decisions_applied == 0,
        "epochs strictly increase": not any(
            v.kind == "epoch_not_increasing" for v in rep.violations
        ),
        "recovery <= 5 s after every fault": recov["unrecovered"] == 0
        and worst is not None
        and float(worst) <= GOAL_RECOVERY_S,
        "no other violation": rep.ok,
        "accounting equals the log after the wipe": bool(result.accounting["match"]),
    }


def to_json(result: ChaosResult) -> dict[str, Any]:
    rep = result.report
    cfg = result.config
    return {
        "setup": {
            "agents": cfg.agents,
            "hosts_per_agent": cfg.hosts,
            "gpus_per_host": cfg.gpus,
            "rate_per_s": cfg.rate,
            "lease_ttl_s": cfg.lease_ttl_s,
            "grace_s": cfg.grace_s,
            "duration_s": list(cfg.duration_s),
            "min_runtime_s": cfg.min_runtime_s,
            "plan": cfg.plan,
            "seed": cfg.seed,
        },
        "figures": rep.figures(),
        "recovery": rep.recovery_summary(),
        "faults": [
            {"kind": r.kind, "target": r.target, "recovery_s": r.seconds} for r in rep.recoveries
        ],
        "violations": [{"kind": v.kind, "detail": v.detail} for v in rep.violations[:100]],
        "violations_total": len(rep.violations),
        "goals": goals(result),
        "quiescent": result.quiescent,
        "accounting": result.accounting,
        "notes": result.notes,
        "wall_s": round(result.wall_s, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": _git("rev-parse", "--short", "HEAD"),
    }


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def _s(v: object) -> str:
    return "-" if v is None else f"{float(v):.2f} s"  # type: ignore[arg-type]


def to_markdown(data: dict[str, Any]) -> str:
    f = data["figures"]
    setup = data["setup"]
    lines = [
        "# Fault injection (`make chaos`)",
        "",
        f"{data['date']}, commit {data['commit']}, {data['machine']}; run took "
        f"{data['wall_s']} s. Stack: {setup['agents']} fake agents x "
        f"{setup['hosts_per_agent']} hosts x {setup['gpus_per_host']} GPUs, two placement "
        f"instances, lease TTL {setup['lease_ttl_s']} s, grace {setup['grace_s']} s; load "
        f"{setup['rate_per_s']:g} submissions/s (1-4 GPUs, fake runs of "
        f"{setup['duration_s'][0]:g}-{setup['duration_s'][1]:g} s; allocated work protected "
        f"{setup['min_runtime_s']} s, so only unallocated work is preempted), "
        f"seed {setup['seed']}.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| submissions invoked | {f['invoked']} |",
        f"| acknowledged | {f['acknowledged']} |",
        f"| failed (definite: no responder, refused) | {f['failed']} |",
        f"| unknown (timeout), of which in the log | {f['unknown']}, {f['unknown_observed']} |",
        f"| **lost** (acknowledged, never in the log) | **{f['lost']}** |",
        f"| unexpected (in the log, never or failed submitted) | {f['unexpected']} |",
        f"| duplicated `WorkloadSubmitted` records (ignored by the fold) | "
        f"{f['duplicated_records']} |",
        f"| placements applied | {f['placements_applied']} |",
        f"| placements ignored by the fold | {f['placements_ignored'] or 0} |",
        f"| current-epoch placements the fold refused | {f['current_epoch_placements_refused']} |",
        f"| **double placements** (one attempt placed twice) | **{f['double_placements']}** |",
        f"| **GPU double-booked** | **{f['gpu_double_booked']}** |",
        f"| leader epochs (applied) | {' < '.join(map(str, f['epochs']))} |",
        f"| stale `LeaderElected` records (ignored) | {f['stale_leader_records']} |",
        f"| stale decisions in the log / **applied** | {f['stale_decisions']} / "
        f"**{f['stale_decisions_applied']}** |",
        f"| acknowledged never placed | {f['unplaced']} |",
        f"| final state of acknowledged work | {f['outcomes']} |",
        f"| GPU-seconds charged in Redis at the end vs run (log), max difference | "
        f"{data['accounting']['max_abs_diff_gpu_s']} |",
        "",
        "Recovery = time from the fault to the first submission invoked after it that was "
        "acknowledged and placed.",
        "",
        "| fault | n | p50 | max | unrecovered |",
        "|---|---|---|---|---|",
    ]
    for kind, row in data["recovery"].items():
        lines.append(
            f"| {kind} | {row['faults']} | {_s(row['p50_s'])} | {_s(row['max_s'])} | "
            f"{row['unrecovered']} |"
        )
    lines += ["", "| goal | met |", "|---|---|"]
    lines += [f"| {g} | {'yes' if ok else '**NO**'} |" for g, ok in data["goals"].items()]
    if data["violations"]:
        lines += ["", f"Violations ({data['violations_total']}; first ones):", ""]
        lines += [f"- {v['kind']}: {v['detail']}" for v in data["violations"][:20]]
    if data["notes"]:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in data["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nats-url", help="use this NATS (no nats-restart fault)")
    ap.add_argument("--redis-url", help="use this Redis (the wipe deletes only the run's keys)")
    ap.add_argument("--rate", type=float, default=20.0, help="submissions per second")
    ap.add_argument("--agents", type=int, default=2)
    ap.add_argument("--hosts", type=int, default=8, help="fake hosts per agent")
    ap.add_argument("--random-kills", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="repeat the whole fault plan")
    ap.add_argument("--plan", help="comma-separated faults instead of the default plan")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--min-runtime-s", type=int, default=60, help="allocated work's protection")
    ap.add_argument("--run-dir", type=Path, help="logs and store (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where chaos.{md,json} go")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)
    unwind_on_sigterm()  # a killed run stops its stack too
    plan = args.plan.split(",") if args.plan else default_plan(args.agents, args.random_kills)
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="allot-chaos-"))
    cfg = ChaosConfig(
        run_dir=run_dir,
        plan=plan * args.rounds,
        nats_url=args.nats_url,
        redis_url=args.redis_url,
        agents=args.agents,
        hosts=args.hosts,
        rate=args.rate,
        seed=args.seed,
        min_runtime_s=args.min_runtime_s,
    )
    data = to_json(asyncio.run(run(cfg)))
    return report(data, to_markdown(data), None if args.no_write else args.out / "chaos", run_dir)


def report(data: dict[str, Any], text: str, stem: Path | None, run_dir: Path) -> int:
    """Print the results, write ``<stem>.md`` and ``<stem>.json`` unless ``stem`` is None;
    the exit status says whether every goal was met."""
    print()
    print(text)
    if stem is not None:
        stem.parent.mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        stem.with_suffix(".md").write_text(text, encoding="utf-8")
        print(f"wrote {stem}.md and {stem.name}.json; history in {run_dir}")
    return 0 if all(data["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
