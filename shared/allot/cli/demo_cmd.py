"""``allot demo``: the live stack, start to finish, in about a minute.

Starts the whole stack (``allot up``'s, with demo timings: 3 s grace, Fair Tree every 2 s,
usage charged every 2 s) on 32 fake GPUs, then, through the Python SDK, as several teams:

1. a batch user fills every GPU with unallocated (free, preemptible) work;
2. nlp, vision and search submit allocated work: the free work gets preemption notices
   (a subscriber prints them), leaves, and is requeued because it is resumable;
3. nlp asks for more than its share and waits (it is over its entitlement);
4. speech, holding nothing, asks once the others' protection has ended: it reclaims GPUs
   from the allocation most over its entitlement (nlp), whose run is requeued;
5. prints ``allot queue``, ``allot share``, ``allot hosts`` and ``allot owed`` as a user
   would see them, and what each allocation has been charged.

The web dashboard runs with the stack: its URL is printed at the start (``--linger-s``
keeps the stack up after the last step, to look at it).

Every step waits for the log to show the expected record and fails loudly otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import redis.asyncio as redis_asyncio

from allot.adapters.usage_store import RedisUsageStore
from allot.core.errors import ValidationError
from allot.core.usage import window_usage
from allot.ops.stack import AgentSpec, Stack, StackConfig, StackError
from allot.proto import messages as m
from allot.sdk import Client

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "demo",
        help="the live stack end to end in about a minute (no Docker)",
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
        help="keep the stack (and its dashboard) up this long after the demo (default 0)",
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
        print(
            f"   ready in {time.monotonic() - t0:.1f} s: NATS {stack.servers.nats_url}, "
            f"Redis {stack.servers.redis_url}, {len(stack.procs)} service processes"
        )
        print(f"   dashboard {stack.dashboard_url}/ (live while the demo runs)")
        asyncio.run(_scenario(stack))
        if args.linger_s > 0:
            print(
                f"\n== the stack stays up {args.linger_s:.0f} s more: {stack.dashboard_url}/ "
                "(Ctrl-C to stop now)",
                flush=True,
            )
            with contextlib.suppress(KeyboardInterrupt):
                time.sleep(args.linger_s)
    print("== stack stopped")
    return 0


async def _scenario(stack: Stack) -> None:
    url = stack.servers.nats_url
    tag = uuid.uuid4().hex[:6]  # client ids unique to this run (given servers keep the log)
    notices: list[m.PreemptionNotice] = []

    def on_notice(notice: m.PreemptionNotice) -> None:
        notices.append(notice)
        print(
            f"   NOTICE  {notice.workload_id} ({notice.allocation or 'unallocated'}, "
            f"{notice.gpus} GPUs): {notice.reason}, leave within "
            f"{notice.grace_deadline - notice.at:.0f} s"
            + (f", for {notice.preemptor}" if notice.preemptor else "")
        )

    async with Client(url) as c:
        sub = await c.on_preemption(on_notice)

        print("\n== 1. batch fills all 32 GPUs with unallocated work (free, preemptible)")
        fillers = [
            (
                await c.submit(
                    client_id=f"{tag}-fill-{i}", user="batch", gpus=8, kind="filler", duration_s=120
                )
            ).workload_id
            for i in range(4)
        ]
        await _until(lambda: _states(c, fillers), lambda s: s.count("running") == 4, "fillers run")
        await _show(url, "hosts")

        print("\n== 2. three teams submit allocated work (protected for 10 s once running)")
        team_work = {
            "nlp": await c.submit(
                client_id=f"{tag}-nlp-1",
                user="ann",
                allocation="nlp",
                gpus=16,
                min_runtime_s=10,
                duration_s=40,
            ),
            "vision": await c.submit(
                client_id=f"{tag}-vision-1",
                user="bo",
                allocation="vision",
                gpus=8,
                min_runtime_s=10,
                duration_s=40,
            ),
            "search": await c.submit(
                client_id=f"{tag}-search-1",
                user="cy",
                allocation="search",
                gpus=8,
                min_runtime_s=10,
                duration_s=40,
            ),
        }
        ids = [a.workload_id for a in team_work.values()]
        await _until(lambda: _states(c, ids), lambda s: s.count("running") == 3, "teams run")
        started = time.monotonic()
        await _until(
            lambda: _states(c, fillers), lambda s: s.count("pending") == 4, "fillers requeued"
        )
        print(
            "   the four fillers were noticed, left within the grace period and are "
            "queued again (resumable)"
        )
        await _show(url, "queue")

        print("\n== 3. nlp asks for more than its share: it waits (over its entitlement)")
        await c.submit(
            client_id=f"{tag}-nlp-2",
            user="ann",
            allocation="nlp",
            gpus=8,
            min_runtime_s=10,
            duration_s=60,
        )
        await asyncio.sleep(1.0)
        await _show(url, "queue")
        print(
            "\n== 4. speech, holding nothing, asks for 4 GPUs once the others' 10 s of "
            "protection are over: it reclaims from the allocation most over its entitlement"
        )
        await asyncio.sleep(max(0.0, started + 10.5 - time.monotonic()))
        speech = await c.submit(
            client_id=f"{tag}-speech-1",
            user="dee",
            allocation="speech",
            gpus=4,
            min_runtime_s=10,
            duration_s=30,
        )
        await _until(
            lambda: asyncio.sleep(0, list(notices)),
            lambda ns: any(n.reason == "reclaimed-for-entitlement" for n in ns),
            "reclaim for speech",
        )
        await _until(
            lambda: _states(c, [speech.workload_id]), lambda s: s == ["running"], "speech runs"
        )

        print("\n== 5. what users see")
        await asyncio.sleep(2.5)  # one Fair Tree refresh with the usage charged meanwhile
        await _show(url, "queue")
        await _show(url, "share")
        await _show(url, "hosts")
        await _show(url, "owed")
        await sub.unsubscribe()

    redis = redis_asyncio.Redis.from_url(stack.servers.redis_url)
    try:
        leaves = ("nlp", "vision", "speech", "search", "ads")
        now = time.time()
        buckets = await RedisUsageStore(redis).buckets(leaves, now, 7 * 86400)
        used = window_usage(buckets, now, 7 * 86400)
    finally:
        await redis.aclose()
    counts = Counter(n.reason for n in notices)
    print("\n== summary")
    print(f"   preemption notices: {dict(counts)}")
    print(
        "   GPU-seconds charged so far (allocated work only; unallocated work is free): "
        + ", ".join(f"{a} {used.get(a, 0.0):.0f}" for a in leaves)
    )


async def _states(c: Client, ids: list[str]) -> list[str]:
    return [(await c.status(w)).state for w in ids]


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
            raise RuntimeError(f"demo: no {what} after {timeout:.0f} s (last: {value!r})")
        await asyncio.sleep(0.2)
        value = await probe()
    return value


async def _show(url: str, command: str) -> None:
    from allot.cli.main import main  # noqa: PLC0415 - main imports this module

    print(f"\n$ allot {command}")
    await asyncio.to_thread(main, [command, "--nats-url", url])
