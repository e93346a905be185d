"""Helpers for the live-system tests: seed the log, read it back, poll with a deadline, run
an intake, run the CLI, configure a whole stack."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
import redis.asyncio as redis_asyncio
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from allot import bus
from allot.adapters.usage_store import RedisUsageStore
from allot.bus import service_main
from allot.cli import main as cli_main
from allot.core.budgets import parse_tree
from allot.core.usage import window_usage
from allot.eventlog.budget_wire import spec_from_tree
from allot.ops.stack import StackConfig
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.services.intake import Intake

T = TypeVar("T")

TREE = {
    "name": "root",
    "children": [
        {"name": "nlp", "shares": 1},
        {"name": "vision", "shares": 1},
    ],
}


async def seed(
    js: JetStreamContext,
    hosts: dict[str, int],
    tree: dict[str, object] | None = None,
) -> None:
    """Streams, a budget tree and registered hosts (what ranking and health would write)."""
    await bus.ensure_streams(js)
    spec = spec_from_tree(parse_tree(tree or TREE))
    await bus.publish(js, s.BUDGET_TREE, m.BudgetTreeSet(at=time.time(), by="test", tree=spec))
    for host, gpus in hosts.items():
        await bus.publish(
            js, s.host_state(host), m.HostRegistered(host=host, gpus=gpus, at=time.time())
        )


async def records(js: JetStreamContext, stream: str = "WORKLOADS") -> list[msgspec.Struct]:
    """Every record of a stream, decoded, in order."""
    info = await js.stream_info(stream)
    if info.state.messages == 0:
        return []
    out: list[msgspec.Struct] = []
    sub = await js.subscribe(
        ">", stream=stream, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    try:
        while len(out) < info.state.messages:
            msg = await sub.next_msg(timeout=5)
            out.append(bus.decode_record(msg.subject, msg.data))
            if msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return out


def submitted(wid: str, alloc: str | None, gpus: int, at: float) -> m.WorkloadSubmitted:
    """A submission record as intake appends it (allocated work protected 10 minutes)."""
    return m.WorkloadSubmitted(
        workload_id=wid,
        client_id=wid,
        user="ann",
        gpus=gpus,
        allocation=alloc,
        min_runtime_s=600 if alloc else 0,
        at=at,
    )


async def eventually(
    probe: Callable[[], Awaitable[T]], ok: Callable[[T], bool], timeout: float = 10.0
) -> T:
    """Poll ``probe`` until ``ok``; fail with the last value after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    value = await probe()
    while not ok(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s; last value: {value!r}")
        await asyncio.sleep(0.05)
        value = await probe()
    return value


def of_type(items: list[msgspec.Struct], cls: type[T]) -> list[T]:
    return [r for r in items if isinstance(r, cls)]


async def placements(js: JetStreamContext) -> list[m.WorkloadPlaced]:
    """Every ``WorkloadPlaced`` in WORKLOADS, in order."""
    return of_type(await records(js), m.WorkloadPlaced)


@contextlib.asynccontextmanager
async def running_intake(url: str) -> AsyncIterator[Intake]:
    """An intake (no tracing) on the log at ``url`` for the block's duration."""
    intake = Intake(url, tracing=False)
    await service_main.start(intake)
    try:
        yield intake
    finally:
        await service_main.stop(intake)


def life(log: list[msgspec.Struct], workload_id: str) -> list[str]:
    """The type names of ``workload_id``'s records in ``log``, in order."""
    return [type(r).__name__ for r in log if getattr(r, "workload_id", None) == workload_id]


def assert_preempted_and_requeued(log: list[msgspec.Struct], workload_id: str) -> None:
    """``workload_id``'s records in ``log`` tell a whole preempted-and-requeued life:
    submitted, placed, started, noticed, preempted, requeued, completed, and placed again
    after the requeue."""
    kinds = life(log, workload_id)
    for expected in (
        "WorkloadSubmitted",
        "WorkloadPlaced",
        "WorkloadStarted",
        "PreemptionNotice",
        "WorkloadPreempted",
        "WorkloadRequeued",
        "WorkloadCompleted",
    ):
        assert expected in kinds, (expected, kinds)
    last_placed = len(kinds) - 1 - kinds[::-1].index("WorkloadPlaced")
    assert kinds.index("WorkloadRequeued") < last_placed


async def start_allot(argv: list[str], *, own_group: bool = False) -> asyncio.subprocess.Process:
    """``allot <argv>`` as a child process, its output (unbuffered) piped; ``own_group``:
    in a process group of its own (a signal to the group reaches the whole stack)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "allot.cli.main",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=own_group,
    )


async def allot(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``allot <argv>`` in-process (``allot.cli.main.main``, in a thread: it runs its own
    event loop): its exit status, stdout and stderr. The stack's services are processes of
    their own, so what is captured is the command's alone."""
    capsys.readouterr()
    code = await asyncio.to_thread(cli_main.main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def quick_stack(run_dir: Path, redis_url: str, name: str, **knobs: Any) -> StackConfig:
    """A whole stack (``allot.ops.stack``) whose notices and rankings take seconds (grace 2
    s, a ranking every second), under a Redis prefix of its own (``name`` and a random
    suffix); ``knobs`` are the test's other ``StackConfig`` fields."""
    return StackConfig(
        **{
            "run_dir": run_dir,
            "redis_url": redis_url,
            "redis_prefix": f"{name}{uuid.uuid4().hex[:8]}",
            "grace_s": 2,
            "rank_every_s": 1.0,
            **knobs,
        }
    )


async def charged_as_ran(log: list[Any], redis_url: str, prefix: str) -> None:
    """The GPU-seconds charged in Redis (under ``prefix``) per allocation equal those the
    log's terminal records say ran: nothing lost, nothing charged twice. The nlp and ads
    runs of the end-to-end scenarios each ran past their minimum."""
    ran: dict[str, float] = defaultdict(float)
    for rec in log:
        ended = isinstance(rec, m.WorkloadPreempted | m.WorkloadCompleted | m.WorkloadFailed)
        if ended and rec.allocated and rec.allocation is not None:
            ran[rec.allocation] += rec.gpu_seconds
    assert ran["nlp"] > 8 * 3 and ran["ads"] > 2 * 1.5, ran
    r = redis_asyncio.Redis.from_url(redis_url)
    try:
        store = RedisUsageStore(r, prefix=prefix)

        async def charged() -> dict[str, float]:
            now = time.time()
            return window_usage(await store.buckets(tuple(ran), now, 86400), now, 86400)

        await eventually(
            charged,
            lambda u: all(abs(u.get(a, 0.0) - v) < 1e-6 for a, v in ran.items()),
            timeout=15,
        )
    finally:
        await r.aclose()
