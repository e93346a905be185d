"""``allot demo``: the live stack, start to finish, in about half a minute.

Starts the whole stack (``allot up``'s, with demo timings: 3 s grace, Fair Tree every 2 s,
usage charged every 2 s) on 32 fake GPUs, then, through the Python SDK, as several teams:

1. a batch user fills every GPU with unallocated (free, preemptible) work;
2. nlp, vision and search submit allocated work while the free work holds every GPU;
3. nlp asks for more GPUs;
4. speech, holding nothing, asks for 4 GPUs once the others' protection has ended;
5. prints ``allot queue``, ``allot share``, ``allot hosts`` and ``allot owed`` as a user
   would see them, then a summary and what each allocation has been charged.

What the demo says happened is built from what it saw (``allot.cli.demo_story``): the
preemption notices it received (printed as they arrive), the workloads' states and the
queue's reasons; after each step, "what happened" tells each preemption and what became
of its victim.

The web dashboard runs with the stack: its URL is printed at the start, and it is gone
when the demo ends unless ``--linger-s`` keeps the stack up (``allot up`` runs one until
Ctrl-C). While the stack runs, ``allot queue`` and the other commands typed in the same
folder find it.

Every step waits for the records it needs and fails loudly otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import redis.asyncio as redis_asyncio

from allot.adapters.usage_store import RedisUsageStore
from allot.cli.demo_story import Work, notice_line, step_story, summary, waiting_story
from allot.core.errors import ValidationError
from allot.core.usage import window_usage
from allot.ops.run_dir import forget_stack, record_stack
from allot.ops.stack import AgentSpec, Stack, StackConfig, StackError
from allot.proto import messages as m
from allot.sdk import Client

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "demo",
        help="the live stack end to end in about half a minute (no Docker)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run-dir", type=Path, default=Path("out/demo"), help="logs and data")
    p.add_argument("--nats-url", help="use this NATS server instead of an embedded one")
    p.add_argument("--redis-url", help="use this Redis server instead of an embedded one")
    p.add_argument(
        "--linger-s",
        type=float,
        default=0.0,
        help="keep the stack (and its dashboard) up this long after the demo, Ctrl-C ends "
        "it sooner (default 0: the dashboard is gone when the demo ends)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.linger_s < float("inf"):
        raise ValidationError("--linger-s", f"must be >= 0, got {args.linger_s:g}")
    try:
        return _run(args)
    except StackError as exc:
        print(f"allot demo: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    config = StackConfig(
        run_dir=args.run_dir.resolve(),
        nats_url=args.nats_url,
        redis_url=args.redis_url,
        agents=(AgentSpec("fake-a", hosts=2, gpus=8), AgentSpec("fake-b", hosts=2, gpus=8)),
        grace_s=3,
        unallocated_grace_s=1,
        unallocated_settle_s=1.0,
        lease_ttl_s=2.0,
        rank_every_s=2.0,
        accrue_s=2.0,
        slot_s=2.0,
        fake_duration_s=120.0,
        # A scripted scenario on a fresh cluster: the previous run's log must not answer
        # this run's submissions as duplicates (same client ids) of long-ended work.
        fresh_store=True,
    )
    print(f"== starting the stack (embedded servers unless given; logs in {config.run_dir}/logs)")
    t0 = time.monotonic()
    with Stack(config) as stack:
        record_stack(config.run_dir, Path.cwd())
        try:
            print(
                f"   ready in {time.monotonic() - t0:.1f} s: NATS {stack.servers.nats_url}, "
                f"Redis {stack.servers.redis_url}, {processes_text(list(stack.procs))}"
            )
            print(
                f"   dashboard {stack.dashboard_url}/ (up while the demo runs; "
                "--linger-s keeps it up after)"
            )
            asyncio.run(_scenario(stack))
            if args.linger_s > 0:
                print(
                    f"\n== the stack stays up {args.linger_s:.0f} s more: "
                    f"{stack.dashboard_url}/ ; allot commands typed in this folder reach "
                    "it (Ctrl-C to stop now)",
                    flush=True,
                )
                with contextlib.suppress(KeyboardInterrupt):
                    time.sleep(args.linger_s)
        finally:
            forget_stack(config.run_dir, Path.cwd())
        print(
            f"\n== stopping the stack: its dashboard ({stack.dashboard_url}/) goes with it "
            "(allot demo --linger-s 600 keeps it up 10 minutes after the demo; make up runs "
            "a stack until Ctrl-C)",
            flush=True,
        )
    print("== stack stopped")
    return 0


def processes_text(names: list[str]) -> str:
    """``10 processes (8 services: ..., 2 fake agents)`` from the stack's process names."""
    agents = [n for n in names if n.startswith("agent-")]
    services = [n for n in names if n not in agents]
    return (
        f"{len(names)} processes ({len(services)} service processes: {', '.join(services)}; "
        f"{len(agents)} fake agent{'s' if len(agents) != 1 else ''})"
    )


UNSETTLED = ("noticed", "unknown")
"""States of a noticed workload that say nothing yet of where it went."""


class _Seen:
    """What the demo saw: every notice in arrival order, and where the step being told
    began."""

    def __init__(self) -> None:
        self.notices: list[m.PreemptionNotice] = []
        self._mark = 0

    def step(self) -> tuple[list[m.PreemptionNotice], list[m.PreemptionNotice]]:
        """(the notices told before, the ones not told yet); these count as told now."""
        earlier, new = self.notices[: self._mark], self.notices[self._mark :]
        self._mark += len(new)
        return earlier, new


async def _scenario(stack: Stack) -> None:
    url = stack.servers.nats_url
    tag = uuid.uuid4().hex[:6]  # client ids unique to this run (given servers keep the log)
    seen = _Seen()
    works: dict[str, Work] = {}

    def on_notice(notice: m.PreemptionNotice) -> None:
        seen.notices.append(notice)
        print(f"   {notice_line(notice, works)}", flush=True)

    async with Client(url) as c:

        async def submit(
            work: Work, client_id: str, user: str, duration_s: float, min_runtime_s: int = 0
        ) -> str:
            reply = await c.submit(
                client_id=f"{tag}-{client_id}",
                user=user,
                gpus=work.gpus,
                allocation=work.allocation,
                min_runtime_s=min_runtime_s,
                kind="training" if work.allocation else "filler",
                duration_s=duration_s,
            )
            works[reply.workload_id] = work
            return reply.workload_id

        async def tell() -> None:
            """After a step: each notice it brought, once its victim has left (a notice
            arriving later is told with the next step, or in the summary)."""
            earlier, new = seen.step()
            victims = list(dict.fromkeys(n.workload_id for n in new))
            # Told once each victim has left and the leader knows where it went; after
            # 10 s as things stand.
            with contextlib.suppress(TimeoutError):
                await _until(
                    lambda: _statuses(c, victims),
                    lambda st: all(x.state not in UNSETTLED for x in st.values()),
                    "noticed work leaving",
                    timeout=10.0,
                )
            states = await _statuses(c, victims)
            print("   what happened:")
            for line in step_story(new, works, states, earlier):
                print(f"     {line}")

        sub = await c.on_preemption(on_notice)

        print("\n== 1. batch fills all 32 GPUs with unallocated work (free, preemptible)")
        fillers = [
            await submit(Work(f"batch's filler {i + 1}", None, 8), f"fill-{i}", "batch", 120)
            for i in range(4)
        ]
        await _until(lambda: _states(c, fillers), lambda s: s.count("running") == 4, "fillers run")
        await _show(url, "hosts")

        print(
            "\n== 2. nlp, vision and search submit allocated work (protected for 10 s once running)"
        )
        team = [
            await submit(Work("nlp's first run", "nlp", 16), "nlp-1", "ann", 40, 10),
            await submit(Work("vision's run", "vision", 8), "vision-1", "bo", 40, 10),
            await submit(Work("search's run", "search", 8), "search-1", "cy", 40, 10),
        ]
        await _until(lambda: _states(c, team), lambda s: s.count("running") == 3, "teams run")
        started = time.monotonic()
        await _until(
            lambda: _states(c, fillers), lambda s: s.count("pending") == 4, "fillers requeued"
        )
        await tell()
        await _show(url, "queue")

        print("\n== 3. nlp asks for 8 GPUs more")
        nlp_2 = await submit(Work("nlp's second run", "nlp", 8), "nlp-2", "ann", 60, 10)
        await asyncio.sleep(1.0)
        queue = await c.queue()
        row = next((r for r in queue.rows if r.workload_id == nlp_2), None)
        print(f"   what happened: {waiting_story(nlp_2, row, await c.status(nlp_2), works)}")
        await _show(url, "queue")

        print(
            "\n== 4. speech, holding nothing, asks for 4 GPUs once the others' 10 s of "
            "protection are over"
        )
        await asyncio.sleep(max(0.0, started + 10.5 - time.monotonic()))
        speech = await submit(Work("speech's run", "speech", 4), "speech-1", "dee", 30, 10)
        await _until(
            lambda: _states(c, [speech]), lambda s: s == ["running"], "speech runs", timeout=45.0
        )
        await tell()

        print("\n== 5. what users see")
        await asyncio.sleep(2.5)  # one Fair Tree refresh with the usage charged meanwhile
        await _show(url, "queue")
        await _show(url, "share")
        await _show(url, "hosts")
        await _show(url, "owed")
        await sub.unsubscribe()
        victims = list(dict.fromkeys(n.workload_id for n in seen.notices))
        final = await _statuses(c, victims)

    redis = redis_asyncio.Redis.from_url(stack.servers.redis_url)
    try:
        leaves = ("nlp", "vision", "speech", "search", "ads")
        now = time.time()
        buckets = await RedisUsageStore(redis).buckets(leaves, now, 7 * 86400)
        used = window_usage(buckets, now, 7 * 86400)
    finally:
        await redis.aclose()
    print("\n== summary (from the notices received and the workloads' states now)")
    for line in summary(seen.notices, works, final):
        print(f"   {line}")
    print(
        "   GPU-seconds charged so far (allocated work only; unallocated work is free): "
        + ", ".join(f"{a} {used.get(a, 0.0):.0f}" for a in leaves)
    )


async def _states(c: Client, ids: list[str]) -> list[str]:
    return [(await c.status(w)).state for w in ids]


async def _statuses(c: Client, ids: list[str]) -> dict[str, m.WorkloadStatus]:
    return {w: await c.status(w) for w in ids}


async def _until(
    probe: Callable[[], Awaitable[T]],
    ok: Callable[[T], bool],
    what: str,
    timeout: float = 30.0,
) -> T:
    deadline = time.monotonic() + timeout
    value = await probe()
    while not ok(value):
        if time.monotonic() > deadline:
            raise TimeoutError(f"demo: no {what} after {timeout:.0f} s (last: {value!r})")
        await asyncio.sleep(0.2)
        value = await probe()
    return value


async def _show(url: str, command: str) -> None:
    from allot.cli.main import main  # noqa: PLC0415 - main imports this module

    print(f"\n$ allot {command}")
    await asyncio.to_thread(main, [command, "--nats-url", url])
