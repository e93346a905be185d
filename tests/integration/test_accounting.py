"""The accounting service against real NATS (``fresh_log``) and real Redis (a unique key
prefix per test): agent records in the WORKLOADS stream become hourly GPU-seconds, exactly
once, and the counters can be rebuilt from the log.

Reference values come from the core's ``split_into_hours`` and ``window_usage``. Times are
multiples of 0.25 s and GPU counts small integers, so every slot piece and every sum is exact
in binary floating point: buckets are compared with ``==``.

The grid-slot splitting is pure; its tests (table-driven and a Hypothesis property) are at
the end and need no server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import resource
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import msgspec
import nats
import pytest
import redis.asyncio as redis_asyncio
from hypothesis import given
from hypothesis import strategies as st
from live_harness import eventually
from nats.aio.client import ServerVersion
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError

from allot import bus
from allot.adapters.embedded import EmbeddedNats
from allot.adapters.usage_store import KEY_TTL_S, RedisUsageStore
from allot.bus import service_main
from allot.cli import accounting_cmd
from allot.core.errors import ValidationError
from allot.core.usage import HOUR_S, split_into_hours, window_usage
from allot.proto import messages as m
from allot.proto import subjects
from allot.proto.subjects import STREAMS as STREAM_NAMES
from allot.sdk import Client
from allot.services.accounting import (
    DURABLE,
    Accounting,
    Charger,
    Marker,
    Slot,
    charged_filters,
    complete_until,
    grid_slots,
    oldest_charged,
    parser,
    rebuild,
    rebuild_reason,
)

HOUR_EDGE = 472_223 * HOUR_S  # 1_700_002_800: an hour boundary in the past
DEADLINE_S = 10.0
WIDE_WINDOW_S = 8 * 86_400 - HOUR_S  # inside the store's retention, around every test run

Buckets = dict[str, dict[int, float]]


# -- fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture
def prefix() -> str:
    return f"acct-test-{uuid.uuid4().hex}"


@pytest.fixture
async def redis_client(redis_url: str, prefix: str) -> AsyncIterator[redis_asyncio.Redis]:
    client = redis_asyncio.Redis.from_url(redis_url)
    await client.ping()
    yield client
    keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@pytest.fixture
async def js(fresh_log: str) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(fresh_log)
    context = nc.jetstream()
    await bus.ensure_streams(context)
    yield context
    await nc.close()


ServiceFactory = Callable[..., Awaitable[Accounting]]


@pytest.fixture
async def service(
    fresh_log: str, redis_url: str, prefix: str, js: JetStreamContext
) -> AsyncIterator[ServiceFactory]:
    """Start an accounting service (stopped at the end of the test)."""
    started: list[Accounting] = []

    async def start(**options: object) -> Accounting:
        svc = Accounting(fresh_log, redis_url, prefix=prefix, **options)  # type: ignore[arg-type]
        await service_main.start(svc)
        started.append(svc)
        return svc

    yield start
    for svc in started:
        await service_main.stop(svc)


def frozen(at: float) -> Callable[[], float]:
    return lambda: at


def started(wid: str, alloc: str | None, at: float, gpus: int, **kw: object) -> m.WorkloadStarted:
    return m.WorkloadStarted(
        workload_id=wid,
        allocation=alloc,
        at=at,
        host="h01",
        gpus=gpus,
        **({"allocated": alloc is not None} | kw),  # type: ignore[arg-type]
    )


def completed(
    wid: str, alloc: str | None, start: float, end: float, gpus: int, **kw: object
) -> m.WorkloadCompleted:
    return m.WorkloadCompleted(
        workload_id=wid,
        allocation=alloc,
        at=end,
        started_at=start,
        gpus=gpus,
        **({"allocated": alloc is not None} | kw),  # type: ignore[arg-type]
    )


async def publish(js: JetStreamContext, record: msgspec.Struct, msg_id: str | None = None) -> int:
    subject = bus.event_subject(getattr(record, "allocation"), record)  # noqa: B009
    return await bus.publish(js, subject, record, msg_id or uuid.uuid4().hex)


async def drained(js: JetStreamContext) -> None:
    """Wait until the accounting consumer has acknowledged every event in the stream."""
    deadline = time.monotonic() + DEADLINE_S
    last = (await js.stream_info("WORKLOADS")).state.last_seq
    while True:
        info = await js.consumer_info("WORKLOADS", "accounting")
        if info.delivered.stream_seq >= last and info.num_ack_pending == 0:
            return
        assert time.monotonic() < deadline, f"consumer not drained: {info}"
        await asyncio.sleep(0.02)


async def all_buckets(store: RedisUsageStore, now: float) -> Buckets:
    return await store.buckets(await store.allocations(), now, WIDE_WINDOW_S)


def reference(*runs: tuple[str, float, float, int]) -> Buckets:
    out: Buckets = {}
    for alloc, start, end, gpus in runs:
        hours = out.setdefault(alloc, {})
        for h, amount in split_into_hours(start, end, gpus).items():
            hours[h] = hours.get(h, 0.0) + amount
    return out


# -- the service -------------------------------------------------------------------------------


@pytest.mark.integration
async def test_allocated_run_across_an_hour_is_charged_exactly(
    service: ServiceFactory, js: JetStreamContext, redis_client: redis_asyncio.Redis, prefix: str
) -> None:
    s, e = HOUR_EDGE - 1234.5, HOUR_EDGE + 2345.25
    svc = await service(clock=frozen(e))  # now: the run has just ended
    await publish(js, started("w1", "nlp", s, 4, attempt=2))
    await publish(js, completed("w1", "nlp", s, e, 4, attempt=2))
    await drained(js)
    store = RedisUsageStore(redis_client, prefix)
    got = await all_buckets(store, e)
    assert got == reference(("nlp", s, e, 4))
    assert set(got["nlp"]) == {HOUR_EDGE // HOUR_S - 1, HOUR_EDGE // HOUR_S}
    # One charge id per slot of the grid, named <workload>:<attempt>:<k>.
    ids = await redis_client.zrange(store.seen_key("nlp"), 0, -1)
    # The last, partial slot is settled (its id and a ":final" id: see _final_charges).
    slots = grid_slots(s, e, 60.0)
    assert sorted(i.decode() for i in ids) == sorted(
        [f"w1:2:{slot.k}" for slot in slots] + [f"w1:2:{slots[-1].k}:final"]
    )
    # The running entry became a tombstone: nothing is left for the live window.
    entry = json.loads(await redis_client.hget(svc.charger.running_key, "w1:2") or b"{}")
    assert entry == {"type": "ended", "ended_at": e}


@pytest.mark.integration
async def test_terminal_record_twice_is_charged_once(
    service: ServiceFactory, js: JetStreamContext, redis_client: redis_asyncio.Redis, prefix: str
) -> None:
    s, e = HOUR_EDGE - 600.0, HOUR_EDGE + 90.5
    svc = await service(clock=frozen(e))
    await publish(js, started("w1", "nlp", s, 2))
    end = completed("w1", "nlp", s, e, 2)
    await publish(js, end, "done-1")
    await publish(js, end, "done-2")  # another msg id: the stream stores both
    await drained(js)
    # A Started redelivered after the end must not revive the run either.
    await publish(js, started("w1", "nlp", s, 2), "started-again")
    assert (await js.stream_info("WORKLOADS")).state.messages == 4
    await drained(js)
    assert svc.handled == 4
    store = RedisUsageStore(redis_client, prefix)
    assert await all_buckets(store, e) == reference(("nlp", s, e, 2))
    assert await svc.charger.accrue(e + 10 * HOUR_S) == 0  # the tombstone stays a tombstone
    assert await all_buckets(store, e) == reference(("nlp", s, e, 2))


@pytest.mark.integration
async def test_unallocated_run_is_never_charged(
    service: ServiceFactory, js: JetStreamContext, redis_client: redis_asyncio.Redis, prefix: str
) -> None:
    s, e = HOUR_EDGE - 600.0, HOUR_EDGE + 600.0
    svc = await service(clock=frozen(s))
    # Charged to an allocation but not allocated (min_runtime_s = 0): free.
    await publish(js, started("w1", "nlp", s, 8, allocated=False))
    await publish(js, completed("w1", "nlp", s, e, 8, allocated=False))
    await publish(js, started("w2", None, s, 8))
    await publish(js, completed("w2", None, s, e, 8))
    await drained(js)
    assert svc.handled == 4
    assert await RedisUsageStore(redis_client, prefix).allocations() == []
    assert await redis_client.hlen(svc.charger.running_key) == 0
    assert await svc.charger.accrue(e + HOUR_S) == 0


@pytest.mark.integration
async def test_undecodable_event_is_skipped_and_the_next_one_charged(
    service: ServiceFactory, js: JetStreamContext, redis_client: redis_asyncio.Redis, prefix: str
) -> None:
    s, e = HOUR_EDGE - 600.0, HOUR_EDGE - 300.0
    svc = await service(clock=frozen(e))
    await js.publish(
        subjects.events("nlp", "w0", "completed"), b'{"type": "WorkloadCompleted", "gpus": -1}'
    )
    await js.publish(subjects.events("nlp", "w0", "completed"), b"\xff not json")
    await publish(js, completed("w1", "nlp", s, e, 1))
    await drained(js)
    assert svc.handled == 3
    store = RedisUsageStore(redis_client, prefix)
    assert await all_buckets(store, e) == reference(("nlp", s, e, 1))


@pytest.mark.integration
async def test_event_is_redelivered_later_while_redis_is_unreachable(
    fresh_log: str, js: JetStreamContext
) -> None:
    svc = Accounting(fresh_log, "redis://127.0.0.1:1", prefix="unused", max_deliver=2)
    await service_main.start(svc)
    try:
        sent = time.monotonic()
        await publish(js, started("w1", "nlp", HOUR_EDGE, 1))
        deadline = sent + DEADLINE_S
        while (info := await js.consumer_info("WORKLOADS", "accounting")).num_redelivered < 1:
            assert time.monotonic() < deadline, f"not redelivered: {info}"
            await asyncio.sleep(0.02)
        # Redelivered after a delay (0.5 s first), then given up after max_deliver.
        assert time.monotonic() - sent >= 0.45
        assert info.delivered.consumer_seq == 2
        await asyncio.sleep(0.3)
        info = await js.consumer_info("WORKLOADS", "accounting")
        assert info.ack_floor.stream_seq == 0 and info.delivered.consumer_seq == 2
        assert svc.handled == 0
    finally:
        await service_main.stop(svc)


@pytest.mark.integration
async def test_running_workload_accrues_complete_slots_before_it_ends(
    service: ServiceFactory, js: JetStreamContext, redis_client: redis_asyncio.Redis, prefix: str
) -> None:
    gpus = 3
    s = math.floor(time.time()) - 10.0  # started 10 s ago: ~9 complete 1 s slots
    svc = await service(slot_s=1.0, accrue_s=0.05)
    await publish(js, started("w1", "nlp", s, gpus))
    store = RedisUsageStore(redis_client, prefix)
    deadline = time.monotonic() + DEADLINE_S
    while True:
        total = sum((await store.buckets(["nlp"], time.time(), HOUR_S * 2))["nlp"].values())
        if total >= 8 * gpus:
            break
        assert time.monotonic() < deadline, f"only {total} GPU-seconds accrued"
        await asyncio.sleep(0.05)
    # Only whole slots ending at least one slot (the lag) before now are charged.
    assert total % gpus == 0
    assert total <= gpus * (time.time() - 1.0 - s)
    entry = json.loads(await redis_client.hget(svc.charger.running_key, "w1:1") or b"{}")
    assert entry["type"] == "running" and entry["accrued"] >= s + 8
    # The end charges the rest under the same ids: the total is exactly the run.
    e = math.floor(time.time() * 4) / 4
    await publish(js, completed("w1", "nlp", s, e, gpus))
    await drained(js)
    assert await store.buckets(["nlp"], e, HOUR_S * 2) == reference(("nlp", s, e, gpus))


@pytest.mark.integration
async def test_an_end_read_late_corrects_the_slots_the_live_window_charged_whole(
    service: ServiceFactory, js: JetStreamContext, redis_client: redis_asyncio.Redis, prefix: str
) -> None:
    """The agent could not publish the end for seconds (a node lost): meanwhile the live
    window charged the run's last partial slot and later slots whole. The late end settles
    them: the total is exactly the run, and reading the end again changes nothing."""
    gpus = 2
    s = math.floor(time.time()) - 12.0
    e = s + 3.25  # ended 8.75 s ago; 1 s slots: ~7 slots after it already charged whole
    svc = await service(slot_s=1.0, accrue_s=0.05)
    await publish(js, started("w1", "nlp", s, gpus))
    store = RedisUsageStore(redis_client, prefix)
    deadline = time.monotonic() + DEADLINE_S
    while (
        sum((await store.buckets(["nlp"], time.time(), HOUR_S * 2))["nlp"].values())
        < (e + 5 - s) * gpus
    ):
        assert time.monotonic() < deadline, "the live window did not charge past the end"
        await asyncio.sleep(0.05)
    await publish(js, completed("w1", "nlp", s, e, gpus))
    await drained(js)
    assert await store.buckets(["nlp"], e, HOUR_S * 2) == reference(("nlp", s, e, gpus))
    await asyncio.sleep(0.3)  # accrual rounds after the end add nothing
    await publish(js, completed("w1", "nlp", s, e, gpus), msg_id="again")
    await drained(js)
    assert await store.buckets(["nlp"], e, HOUR_S * 2) == reference(("nlp", s, e, gpus))
    assert svc.handled >= 3


@pytest.mark.integration
async def test_rebuild_from_the_log_gives_the_same_buckets(
    *,
    service: ServiceFactory,
    js: JetStreamContext,
    fresh_log: str,
    redis_url: str,
    redis_client: redis_asyncio.Redis,
    prefix: str,
) -> None:
    now = HOUR_EDGE + 5000.25
    runs = [  # (workload, allocation, start, end or None while running, gpus)
        ("a1", "nlp", HOUR_EDGE - 7200.5, HOUR_EDGE + 10.25, 8),
        ("a2", "nlp", HOUR_EDGE - 30.0, HOUR_EDGE + 4000.0, 1),
        ("v1", "vision", HOUR_EDGE - 100.0, None, 2),  # still running at `now`
        ("v2", "vision", HOUR_EDGE + 1.5, HOUR_EDGE + 2.0, 16),
    ]
    # The log is written first, then read as a backlog: the live window waits while events
    # are unread or in flight, as after a restart (the frozen clock is past every end).
    for wid, alloc, s, e, gpus in runs:
        await publish(js, started(wid, alloc, s, gpus))
        if e is not None:
            await publish(js, completed(wid, alloc, s, e, gpus))
    await publish(js, completed("a1", "nlp", HOUR_EDGE - 7200.5, HOUR_EDGE + 10.25, 8))  # dup
    failed = m.WorkloadFailed(
        workload_id="v3",
        allocation="vision",
        at=HOUR_EDGE + 50.0,
        started_at=HOUR_EDGE - 50.0,
        gpus=4,
        attempt=3,
        allocated=True,
    )
    await publish(js, failed)
    await publish(js, started("free", None, HOUR_EDGE, 8))
    await js.publish(subjects.events("nlp", "junk", "started"), b"not json")
    svc = await service(clock=frozen(now), accrue_s=0.05)
    await drained(js)

    until = complete_until(now, 60.0)
    expected = reference(
        ("nlp", HOUR_EDGE - 7200.5, HOUR_EDGE + 10.25, 8),
        ("nlp", HOUR_EDGE - 30.0, HOUR_EDGE + 4000.0, 1),
        ("vision", HOUR_EDGE - 100.0, until, 2),
        ("vision", HOUR_EDGE + 1.5, HOUR_EDGE + 2.0, 16),
        ("vision", HOUR_EDGE - 50.0, HOUR_EDGE + 50.0, 4),
    )
    store = RedisUsageStore(redis_client, prefix)
    deadline = time.monotonic() + DEADLINE_S
    while (before := await all_buckets(store, now)) != expected:  # the live window's turn
        assert time.monotonic() < deadline, f"{before} != {expected}"
        await asyncio.sleep(0.05)
    running_before = await redis_client.hgetall(svc.charger.running_key)

    await service_main.stop(svc)
    await Charger(redis_client, prefix).wipe()
    assert await store.allocations() == []

    done = await rebuild(fresh_log, redis_url, prefix=prefix, now=now)
    assert await all_buckets(store, now) == before
    assert done.records == (await js.stream_info("WORKLOADS")).state.messages - 1  # junk
    # The running entry is rebuilt too: the live window resumes where the replay stopped.
    after = await redis_client.hgetall(svc.charger.running_key)
    assert after == running_before
    # A second rebuild is idempotent.
    await rebuild(fresh_log, redis_url, prefix=prefix, now=now)
    assert await all_buckets(store, now) == before


@pytest.mark.integration
@pytest.mark.parametrize("seed", range(6))
async def test_a_batch_charges_what_its_records_one_by_one_charge(
    redis_client: redis_asyncio.Redis, prefix: str, seed: int
) -> None:
    """``apply_many`` (the service's path: a fetched batch in a few Redis round trips)
    against ``apply`` of each record in order, on shuffled starts and ends of several runs
    (an end before its start, repeats, unallocated and unchargeable records included)."""
    rng = random.Random(seed)
    records: list[msgspec.Struct] = []
    runs = []
    for i in range(12):
        start = HOUR_EDGE + rng.randrange(-40_000, 4_000) / 4
        end = start + rng.randrange(1, 40_000) / 4
        alloc = rng.choice(["nlp", "vision", None])
        gpus = rng.randrange(1, 9)
        records += [
            started(f"w{i}", alloc, start, gpus),
            completed(f"w{i}", alloc, start, end, gpus),
        ]
        if alloc is not None:
            runs.append((alloc, start, end, gpus))
    records.append(
        completed(
            "w0", records[1].allocation, records[1].started_at, records[1].at, records[1].gpus
        )
    )  # a repeat
    records.append(started("bad", "nlp", HOUR_EDGE, 0))  # allocated, no GPUs: ignored
    rng.shuffle(records)
    now = HOUR_EDGE + 20_000.0
    batched = Charger(redis_client, prefix, clock=frozen(now))
    one_by_one = Charger(redis_client, f"{prefix}-single", clock=frozen(now))
    try:
        new_in_batch = await batched.apply_many(records)
        new_singly = sum([await one_by_one.apply(r) for r in records])
        want = reference(*runs)
        assert await all_buckets(batched.store, now) == want
        assert await all_buckets(one_by_one.store, now) == want
        assert new_in_batch == new_singly > 0
        assert await batched.apply_many(records) == 0  # again: nothing new
        assert await all_buckets(batched.store, now) == want
    finally:
        await one_by_one.wipe()


@pytest.mark.integration
async def test_rebuild_of_an_empty_log_leaves_an_empty_store(
    fresh_log: str, redis_url: str, redis_client: redis_asyncio.Redis, prefix: str
) -> None:
    store = RedisUsageStore(redis_client, prefix)
    await store.charge("stale", "nlp", HOUR_EDGE, HOUR_EDGE + 1, 1)
    done = await rebuild(fresh_log, redis_url, prefix=prefix, now=HOUR_EDGE)
    assert (done.records, done.charges) == (0, 0)
    assert await store.allocations() == []


# -- whatever a record says ---------------------------------------------------------------------

DAY_S = 86_400


async def usage_total(store: RedisUsageStore, client: redis_asyncio.Redis, alloc: str) -> float:
    """Every GPU-second stored for ``alloc``, whatever its hour."""
    return sum(float(v) for v in (await client.hgetall(store.usage_key(alloc))).values())


@pytest.mark.integration
async def test_a_run_is_charged_its_wall_time_since_its_logged_start_and_never_past_now(
    service: ServiceFactory, js: JetStreamContext, redis_client: redis_asyncio.Redis, prefix: str
) -> None:
    """Issue 34: a record's times are cut to what can have run. A 3-day run whose end says
    a year ahead and whose start says 30 days back is charged its 3 days up to now; an end
    with no logged start, and a start a year back that the live window charges, each at
    most the 8 days the store keeps, in as many slot charges at most. (A year, not 1e11:
    without the bounds this process would take a slot per minute of it; the 1e11 case is
    the memory test's, in a process of its own with its memory capped.)"""
    now = NOW
    year = 365 * DAY_S
    svc = await service(clock=frozen(now))
    await publish(js, started("3d", "nlp", now - 3 * DAY_S, 4))
    await publish(js, completed("3d", "nlp", now - 30 * DAY_S, now + year, 4))
    await publish(js, completed("no-start", "vision", now - year, now + year, 2))
    await publish(js, started("a-year-back", "search", now - year, 1))
    await drained(js)
    store = RedisUsageStore(redis_client, prefix)
    window = await store.buckets(["nlp"], now, WIDE_WINDOW_S)
    assert window == reference(("nlp", now - 3 * DAY_S, now, 4))
    await svc.charger.accrue(now)  # the live window's turn (its timer may have come first)
    kept = now - oldest_charged(now, 60.0)  # the store's 8 days, from a slot's start
    for alloc, gpus in (("vision", 2), ("search", 1)):
        assert 0 < await usage_total(store, redis_client, alloc) <= gpus * kept
    for alloc in ("nlp", "vision", "search"):  # a charge id per slot, and one settled
        assert await redis_client.zcard(store.seen_key(alloc)) <= kept / 60 + 2


def _vm_kib(pid: int, field: str) -> int:
    """``field`` (VmRSS, VmHWM) of ``/proc/<pid>/status``, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


ADDRESS_SPACE_LIMIT = 4 << 30
"""The accounting process's address space in the memory test: without the bounds, a span
of 1e11 s is 1.6 billion slots, which would take this machine's memory whole."""


@pytest.mark.integration
async def test_a_record_spanning_1e11_seconds_leaves_accountings_memory_as_idle(
    *,
    fresh_log: str,
    redis_url: str,
    redis_client: redis_asyncio.Redis,
    prefix: str,
    js: JetStreamContext,
    tmp_path: Path,
) -> None:
    """Issue 34: an end at 1e11 took accounting from 87 MB to ~880 MB (one slot charge
    per minute of the claimed run) and its charges timed out against Redis. The service
    runs as its own process: its peak resident memory while it charges records spanning
    1e11 s stays within 10% of its resident memory when idle."""

    def limit() -> None:  # in the child, before exec
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))

    output = (tmp_path / "accounting.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "allot.services.accounting", "--nats-url", fresh_log, "--redis-url", redis_url),
        *("--prefix", prefix, "--accrue-s", "0.2"),
        env={**os.environ, "ALLOT_OTEL_EXPORTER": "none"},
        stdout=output,
        stderr=asyncio.subprocess.STDOUT,
        preexec_fn=limit,
    )
    charger = Charger(redis_client, prefix)

    async def ended(*wids: str) -> bool:
        raw = await redis_client.hmget(charger.running_key, [f"{w}:1" for w in wids])
        return all(r is not None and b'"ended"' in r for r in raw)

    async def accrued(wid: str) -> bool:
        raw = await redis_client.hget(charger.running_key, f"{wid}:1")
        return raw is not None and b'"accrued"' in raw

    try:
        # Warm: the paths the forged records take (an end, a settle, the live window).
        now = time.time()
        await publish(js, started("warm", "warm", now - 600.25, 2))
        await publish(js, completed("warm", "warm", now - 600.25, now - 0.5, 2))
        await publish(js, started("warm-live", "warm", now - 300.0, 1))
        await eventually(lambda: ended("warm"), bool, timeout=30)
        await eventually(lambda: accrued("warm-live"), bool, timeout=30)
        await asyncio.sleep(1.0)  # a few idle accruals
        idle = _vm_kib(proc.pid, "VmRSS")
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # VmHWM from here on

        now = time.time()
        await publish(js, started("ahead", "nlp", now - 60.0, 8))
        await publish(js, completed("ahead", "nlp", now - 60.0, m.MAX_TIME, 8))
        await publish(js, completed("span", "vision", 0.0, m.MAX_TIME, 8))
        await publish(js, started("since-1970", "search", 0.0, 8))
        await eventually(lambda: ended("ahead", "span"), bool, timeout=60)
        await eventually(lambda: accrued("since-1970"), bool, timeout=60)
        peak = _vm_kib(proc.pid, "VmHWM")
        assert peak <= idle * 1.10, f"peak {peak} KiB against {idle} KiB idle"
        store = RedisUsageStore(redis_client, prefix)
        assert await usage_total(store, redis_client, "nlp") <= 8 * (time.time() - (now - 60.0))
        for alloc in ("vision", "search"):
            assert await usage_total(store, redis_client, alloc) <= 8 * (KEY_TTL_S + 60)
        assert proc.returncode is None
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        output.close()
        print((tmp_path / "accounting.log").read_text(errors="replace")[-4000:])


# -- the store follows the log ------------------------------------------------------------------

RUNS = [  # (workload, allocation, start, end, gpus): ended runs, and one still running
    ("a1", "nlp", HOUR_EDGE - 7200.5, HOUR_EDGE + 10.25, 8),
    ("a2", "nlp", HOUR_EDGE - 30.0, HOUR_EDGE + 4000.0, 1),
    ("v2", "vision", HOUR_EDGE + 1.5, HOUR_EDGE + 2.0, 16),
]
RUNNING = ("v1", "vision", HOUR_EDGE - 100.0, 2)
NOW = HOUR_EDGE + 5000.25


async def charge_runs(js: JetStreamContext, runs: list[tuple[str, str, float, float, int]]) -> None:
    for wid, alloc, s, e, gpus in runs:
        await publish(js, started(wid, alloc, s, gpus))
        await publish(js, completed(wid, alloc, s, e, gpus))


def expected_usage(runs: list[tuple[str, str, float, float, int]]) -> Buckets:
    """The runs, plus RUNNING's complete slots at NOW (the live window's share)."""
    _, alloc, s, gpus = RUNNING
    return reference(
        *[(a, s, e, g) for _, a, s, e, g in runs], (alloc, s, complete_until(NOW, 60.0), gpus)
    )


async def usage_becomes(store: RedisUsageStore, want: Buckets) -> Buckets:
    deadline = time.monotonic() + DEADLINE_S
    while (got := await all_buckets(store, NOW)) != want:
        assert time.monotonic() < deadline, f"{got} != {want}"
        await asyncio.sleep(0.05)
    return got


async def forget_everything(client: redis_asyncio.Redis, prefix: str) -> None:
    """What a Redis that keeps nothing on disk does on restart, for this test's keys (the
    shared server is not flushed: other tests use it)."""
    keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
    assert keys
    await client.delete(*keys)


async def charged_and_stopped(
    service: ServiceFactory, js: JetStreamContext, store: RedisUsageStore
) -> Buckets:
    """Charge RUNS and RUNNING's live window with a service, stop it: the usage before."""
    await charge_runs(js, RUNS)
    wid, alloc, s, gpus = RUNNING
    await publish(js, started(wid, alloc, s, gpus))
    svc = await service(clock=frozen(NOW), accrue_s=0.05)
    await drained(js)
    before = await usage_becomes(store, expected_usage(RUNS))
    await service_main.stop(svc)
    assert svc.rebuilds == []  # a first start over an empty store: nothing acknowledged yet
    return before


@pytest.mark.integration
async def test_a_store_that_lost_its_data_is_rebuilt_from_the_log_at_start(
    service: ServiceFactory, js: JetStreamContext, redis_client: redis_asyncio.Redis, prefix: str
) -> None:
    # `allot up` restarted on the same run dir: the log is on disk, the embedded Redis kept
    # nothing, and the consumer's acknowledged position says it was all charged.
    store = RedisUsageStore(redis_client, prefix)
    before = await charged_and_stopped(service, js, store)
    await forget_everything(redis_client, prefix)
    assert await all_buckets(store, NOW) == {}

    svc = await service(clock=frozen(NOW), accrue_s=0.05)
    await usage_becomes(store, before)  # exactly: nothing lost, nothing twice
    await asyncio.wait_for(svc.store_checked.wait(), DEADLINE_S)
    assert len(svc.rebuilds) == 1 and "no marker" in svc.rebuilds[0]
    assert await all_buckets(store, NOW) == before
    # Charging goes on from the rebuilt store: a new run is charged once, the old ones
    # not again, and a second restart finds the store intact.
    more = [("n9", "nlp", HOUR_EDGE + 60.0, HOUR_EDGE + 130.5, 3)]
    await charge_runs(js, more)
    await drained(js)
    await usage_becomes(store, expected_usage(RUNS + more))
    await service_main.stop(svc)
    again = await service(clock=frozen(NOW), accrue_s=0.05)
    await asyncio.wait_for(again.store_checked.wait(), DEADLINE_S)
    assert again.rebuilds == []
    assert await all_buckets(store, NOW) == expected_usage(RUNS + more)


@pytest.mark.integration
async def test_a_restart_with_an_intact_store_does_not_rebuild(
    *,
    service: ServiceFactory,
    js: JetStreamContext,
    fresh_log: str,
    redis_url: str,
    redis_client: redis_asyncio.Redis,
    prefix: str,
) -> None:
    store = RedisUsageStore(redis_client, prefix)
    before = await charged_and_stopped(service, js, store)
    # A charge no record explains: a rebuild would drop it, so it shows there was none.
    await store.charge("not-in-the-log", "sentinel", HOUR_EDGE, HOUR_EDGE + 10.0, 1)
    with_sentinel = await all_buckets(store, NOW)
    assert with_sentinel == before | {"sentinel": {HOUR_EDGE // HOUR_S: 10.0}}

    svc = await service(clock=frozen(NOW), accrue_s=0.05)
    await asyncio.wait_for(svc.store_checked.wait(), DEADLINE_S)
    await asyncio.sleep(0.3)  # a few accruals: the periodic check finds the marker too
    assert svc.rebuilds == []
    assert await all_buckets(store, NOW) == with_sentinel
    await service_main.stop(svc)

    # `allot accounting rebuild` writes the marker as well: the next start trusts it.
    done = await rebuild(fresh_log, redis_url, prefix=prefix, now=NOW)
    assert done.last_seq == (await js.stream_info("WORKLOADS")).state.last_seq
    assert await all_buckets(store, NOW) == before
    svc = await service(clock=frozen(NOW), accrue_s=0.05)
    await asyncio.wait_for(svc.store_checked.wait(), DEADLINE_S)
    assert svc.rebuilds == []


@pytest.mark.integration
async def test_a_store_wiped_while_the_service_runs_is_rebuilt_without_a_restart(
    service: ServiceFactory, js: JetStreamContext, redis_client: redis_asyncio.Redis, prefix: str
) -> None:
    store = RedisUsageStore(redis_client, prefix)
    await charge_runs(js, RUNS)
    wid, alloc, s, gpus = RUNNING
    await publish(js, started(wid, alloc, s, gpus))
    svc = await service(clock=frozen(NOW), accrue_s=0.05)
    await drained(js)
    before = await usage_becomes(store, expected_usage(RUNS))

    # Quiet: the periodic check (at each accrual) notices. The usage is whole again before
    # the rebuild is recorded as done, so the count is waited for, not read at once.
    await forget_everything(redis_client, prefix)
    assert await usage_becomes(store, before) == before
    await rebuilds_become(svc.rebuilds, 1)
    # Busy: the batch after the wipe finds no marker to advance.
    await forget_everything(redis_client, prefix)
    more = [("n9", "nlp", HOUR_EDGE + 60.0, HOUR_EDGE + 130.5, 3)]
    await charge_runs(js, more)
    await drained(js)
    await usage_becomes(store, expected_usage(RUNS + more))
    await rebuilds_become(svc.rebuilds, 2)


async def rebuilds_become(rebuilds: list[str], n: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while len(rebuilds) < n:
        assert time.monotonic() < deadline, f"{len(rebuilds)} rebuilds, not {n}: {rebuilds}"
        await asyncio.sleep(0.05)
    assert len(rebuilds) == n, rebuilds


@pytest.mark.parametrize(
    ("marker", "acked", "rebuilt"),
    [
        pytest.param(None, 0, False, id="first-start-nothing-acknowledged"),
        pytest.param(None, 7, True, id="store-lost-its-data"),
        pytest.param(Marker("WORKLOADS t0", 7), 7, False, id="store-holds-what-was-acked"),
        pytest.param(Marker("WORKLOADS t0", 9), 7, False, id="store-ahead-acks-not-yet-seen"),
        pytest.param(Marker("WORKLOADS t0", 5), 7, True, id="store-older-than-the-acks"),
        pytest.param(Marker("WORKLOADS t1", 9), 7, True, id="marker-of-another-log"),
        pytest.param(Marker("WORKLOADS t1", 9), 0, False, id="new-log-nothing-acknowledged"),
    ],
)
def test_rebuild_reason(marker: Marker | None, acked: int, rebuilt: bool) -> None:
    assert (rebuild_reason(marker, "WORKLOADS t0", acked) is not None) == rebuilt


# -- the command line ---------------------------------------------------------------------------


def cli(argv: list[str]) -> argparse.Namespace:
    top = argparse.ArgumentParser(prog="allot")
    accounting_cmd.add_parser(top.add_subparsers(dest="command", required=True))
    return top.parse_args(["accounting", *argv])


@pytest.mark.integration
def test_usage_command_prints_window_gpu_hours(
    redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    charges = [("nlp", now - 3 * HOUR_S, now - HOUR_S, 2), ("vision", now - 600, now, 1)]

    async def seed() -> None:
        client = redis_asyncio.Redis.from_url(redis_url)
        store = RedisUsageStore(client, prefix)
        for i, (alloc, s, e, gpus) in enumerate(charges):
            await store.charge(f"c{i}", alloc, s, e, gpus)
        await client.aclose()

    asyncio.run(seed())
    try:
        args = cli(["usage", "--redis-url", redis_url, "--prefix", prefix, "--json"])
        assert accounting_cmd.run(args) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed.keys() == {"kind", "at", "data"}  # every listing's envelope
        out = printed["data"]
        want = window_usage(reference(*charges), printed["at"], 7 * 86_400)
        assert out["window_s"] == 7 * 86_400
        assert out["gpu_hours"] == pytest.approx({a: v / HOUR_S for a, v in want.items()})
        assert out["gpu_hours"]["nlp"] == pytest.approx(4.0)

        args = cli(["usage", "--redis-url", redis_url, "--prefix", prefix, "--window-s", "1h"])
        assert accounting_cmd.run(args) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0].split() == ["allocation", "GPU-h", "(last", "1h)"]
        assert [line.split()[0] for line in table[1:3]] == ["nlp", "vision"]
        assert table[3].startswith("Charged as of ")
    finally:

        async def clean() -> None:
            client = redis_asyncio.Redis.from_url(redis_url)
            await RedisUsageStore(client, prefix).wipe()
            await client.aclose()

        asyncio.run(clean())


def test_usage_command_reports_an_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    args = cli(["usage", "--redis-url", "redis://127.0.0.1:1"])
    assert accounting_cmd.run(args) == accounting_cmd.EXIT_UNREACHABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("allot accounting usage: cannot reach")


@pytest.mark.integration
@pytest.mark.parametrize("command", ["usage", "rebuild"])
def test_the_nats_url_given_as_redis_url_is_one_line(
    fresh_log: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The two URLs swapped: redis-py met NATS's INFO line and raised a protocol error.
    # (rebuild is given its NATS server too: the CLI has no default one.)
    nats = ["--nats-url", fresh_log] if command == "rebuild" else []
    args = cli([command, "--redis-url", fresh_log.replace("nats://", "redis://"), *nats])
    assert accounting_cmd.run(args) == accounting_cmd.EXIT_UNREACHABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"allot accounting {command}: cannot reach the server: "
        "it answers as a NATS server, not Redis"
    ]


@pytest.mark.parametrize("url", ["notaurl", "http://127.0.0.1:6379", "nats://u:pw@h:4222"])
@pytest.mark.parametrize("command", ["usage", "rebuild"])
def test_a_url_that_is_no_redis_url_is_bad_input(url: str, command: str) -> None:
    with pytest.raises(ValidationError) as err:
        accounting_cmd.run(cli([command, "--redis-url", url]))
    assert err.value.field == "--redis-url" and "is no Redis URL" in err.value.reason
    assert "pw" not in err.value.reason


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["rebuild", "--slot-s", "0"], "--slot-s"),
        (["rebuild", "--slot-s", "7200"], "--slot-s"),
        (["rebuild", "--prefix", "{x}"], "--prefix"),
        (["usage", "--prefix", "{x}"], "--prefix"),
        (["usage", "--window-s", "0"], "--window-s"),
    ],
)
def test_bad_options_name_the_field(argv: list[str], field: str) -> None:
    # Checked before any connection: no server is needed to be told what is wrong.
    servers = ["--redis-url", "redis://127.0.0.1:1"]
    if argv[0] == "rebuild":
        servers += ["--nats-url", "nats://127.0.0.1:1"]
    args = cli([*argv, *servers])
    with pytest.raises(ValidationError) as info:
        accounting_cmd.run(args)
    assert info.value.field == field


@pytest.mark.parametrize(
    "argv", [["--slot-s", "0"], ["--slot-s", "nan"], ["--accrue-s", "-1"], ["--prefix", "a{b}"]]
)
def test_service_command_line_rejects_bad_options(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parser().parse_args(argv)
    assert info.value.code == 2


# -- the grid (pure) -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end", "slot_s", "first_k", "want"),
    [
        (0.0, 0.0, 60.0, None, []),
        (10.0, 5.0, 60.0, None, []),
        (0.0, 60.0, 60.0, None, [Slot(0, 0.0, 60.0)]),
        (
            30.0,
            150.0,
            60.0,
            None,
            [Slot(0, 30.0, 60.0), Slot(1, 60.0, 120.0), Slot(2, 120.0, 150.0)],
        ),
        (59.5, 60.25, 60.0, None, [Slot(0, 59.5, 60.0), Slot(1, 60.0, 60.25)]),
        (-90.0, -30.0, 60.0, None, [Slot(-2, -90.0, -60.0), Slot(-1, -60.0, -30.0)]),
        (30.0, 150.0, 60.0, 2, [Slot(2, 120.0, 150.0)]),
        (30.0, 150.0, 60.0, 9, []),
        (30.0, 150.0, 60.0, -5, [Slot(0, 30.0, 60.0), Slot(1, 60.0, 120.0), Slot(2, 120.0, 150.0)]),
        (3599.0, 3601.0, 3600.0, None, [Slot(0, 3599.0, 3600.0), Slot(1, 3600.0, 3601.0)]),
        (0.25, 0.75, 0.5, None, [Slot(0, 0.25, 0.5), Slot(1, 0.5, 0.75)]),
    ],
)
def test_grid_slots(
    start: float, end: float, slot_s: float, first_k: int | None, want: list[Slot]
) -> None:
    assert grid_slots(start, end, slot_s, first_k) == want


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0.0, 1.0, 0.0), "slot_s"),
        ((0.0, 1.0, -1.0), "slot_s"),
        ((0.0, 1.0, 3601.0), "slot_s"),
        ((0.0, 1.0, float("inf")), "slot_s"),
        ((0.0, 1.0, True), "slot_s"),
        ((float("nan"), 1.0, 60.0), "start"),
        ((0.0, float("inf"), 60.0), "end"),
    ],
)
def test_grid_slots_rejects_bad_input(args: tuple[float, float, float], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        grid_slots(*args)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("now", "slot_s", "want"), [(125.0, 60.0, 60.0), (120.0, 60.0, 60.0), (119.9, 60.0, 0.0)]
)
def test_complete_until_lags_one_slot(now: float, slot_s: float, want: float) -> None:
    assert complete_until(now, slot_s) == want


times = st.floats(min_value=1.6e9, max_value=1.8e9, allow_nan=False)


@given(
    start=times,
    slots_long=st.floats(min_value=0.0, max_value=300.0),
    slot_s=st.sampled_from([0.5, 1.0, 7.0, 60.0, 90.0, 3600.0]),
    gpus=st.integers(min_value=1, max_value=64),
    cut=st.floats(min_value=0.0, max_value=1.0),
)
def test_grid_slot_pieces_tile_the_run(
    start: float, slots_long: float, slot_s: float, gpus: int, cut: float
) -> None:
    length = slots_long * slot_s
    end = start + length
    slots = grid_slots(start, end, slot_s)
    # Pieces never overlap, stay inside the run and inside their slot, in order.
    for a, b in itertools.pairwise(slots):
        assert a.end <= b.start and a.k < b.k
    for slot in slots:
        assert start <= slot.start < slot.end <= end
        assert slot.k * slot_s <= slot.start and slot.end <= (slot.k + 1) * slot_s
    # And they add up to the whole run.
    total = math.fsum((s.end - s.start) * gpus for s in slots)
    assert total == pytest.approx(gpus * (end - start), rel=1e-12, abs=1e-6)
    # The live window's pieces (complete slots up to some moment, the run's end unknown) are
    # the run's own pieces wherever the run had not ended: the end event recomputes the
    # same amount for every id the window charged.
    until = complete_until(start + cut * length, slot_s)
    by_k = {s.k: s for s in slots}
    for slot in grid_slots(start, until, slot_s):
        if slot.end <= end:
            assert by_k[slot.k] == slot


# -- the server filters what accounting reads ----------------------------------------------------


@pytest.mark.parametrize(
    ("version", "filters"),
    [
        ("2.9.10", [subjects.ALL_EVENTS]),  # no multi-filter consumers: read all, skip here
        ("2.10.0", [subjects.every_workload(e) for e in subjects.CHARGED_EVENTS]),
        ("2.15.1", [subjects.every_workload(e) for e in subjects.CHARGED_EVENTS]),
    ],
)
def test_the_consumer_filter_follows_what_the_server_can_do(
    version: str, filters: list[str]
) -> None:
    assert charged_filters(ServerVersion(version)) == filters


@pytest.fixture(scope="module")
def filtering_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The wheel's nats-server (>= 2.10: consumers with several filters), whatever the
    suite's own server is (this machine's is 2.9, which reads everything)."""
    with EmbeddedNats(store_dir=tmp_path_factory.mktemp("filtering")) as server:
        yield server.url


@pytest.mark.integration
async def test_only_the_charged_events_reach_accounting(
    filtering_server: str, redis_url: str, redis_client: redis_asyncio.Redis, prefix: str
) -> None:
    """Submissions and placements are never delivered to accounting (half of the log under
    load), and the runs are charged exactly as when it read everything. The durable
    consumer already exists with the unfiltered form (made by an older version, or on a
    server before 2.10): it is given the filter, not bound as it was."""
    nc = await nats.connect(filtering_server)
    js = nc.jetstream()
    for name in STREAM_NAMES:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)
    await bus.ensure_streams(js)
    s, e = HOUR_EDGE - 900.0, HOUR_EDGE + 300.0
    one = (m.HostGpus(host="h01", gpus=(0, 1)),)
    story: list[msgspec.Struct] = []
    for wid, alloc in (("w1", "nlp"), ("w2", "cv"), ("free", None)):
        story += [
            m.WorkloadSubmitted(workload_id=wid, client_id=wid, user="u", gpus=2, at=s),
            m.WorkloadPlaced(workload_id=wid, allocation=alloc, at=s, gpus=2, assignment=one),
            started(wid, alloc, s, 2),
            completed(wid, alloc, s, e, 2),
        ]
    for record in story:
        await publish(js, record)
    await js.add_consumer(
        "WORKLOADS",
        ConsumerConfig(
            durable_name=DURABLE, ack_policy=AckPolicy.EXPLICIT, filter_subject=subjects.ALL_EVENTS
        ),
    )
    svc = Accounting(filtering_server, redis_url, prefix=prefix, clock=frozen(e))
    await service_main.start(svc)
    try:
        info = await js.consumer_info("WORKLOADS", DURABLE)
        assert sorted(info.config.filter_subjects or []) == sorted(
            subjects.every_workload(event) for event in subjects.CHARGED_EVENTS
        )
        deadline = time.monotonic() + DEADLINE_S
        while (info := await js.consumer_info("WORKLOADS", DURABLE)).num_pending or (
            info.num_ack_pending
        ):
            assert time.monotonic() < deadline, f"consumer not drained: {info}"
            await asyncio.sleep(0.02)
        assert info.delivered.consumer_seq == 6  # 3 starts and 3 ends of the 12 records
        assert svc.handled == 6
        got = await all_buckets(RedisUsageStore(redis_client, prefix), e)
        assert got == reference(("nlp", s, e, 2), ("cv", s, e, 2))
    finally:
        await service_main.stop(svc)
        await nc.close()


@pytest.mark.integration
async def test_the_usage_query_answers_the_charged_gpu_seconds_and_until_when(
    service: ServiceFactory, js: JetStreamContext, fresh_log: str
) -> None:
    """``allot.v1.query.usage``: a finished run in full, running work by whole slots up to
    ``charged_until``; a bad query is refused naming its field. The window is two hours:
    the oldest hour bucket counts pro rata (``allot.core.usage``), and with a one-hour
    window a run just before the top of the hour fell partly outside it (a flake that
    struck only in the minutes after each hour)."""
    now = math.floor(time.time())
    await service(slot_s=1.0, accrue_s=0.05)
    await publish(js, completed("done", "vision", now - 100.0, now - 40.0, 2))
    await publish(js, started("run", "nlp", now - 10.0, 3))
    await drained(js)
    async with Client(fresh_log) as client:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            snap = await client.usage(window_s=7200)
            rows = {r.allocation: r.gpu_seconds for r in snap.rows}
            if rows.get("nlp", 0) >= 8 * 3 and snap.charged_until is not None:
                break
            assert time.monotonic() < deadline, f"nothing accrued: {snap}"
            await asyncio.sleep(0.05)
        assert rows["vision"] == pytest.approx(60.0 * 2)
        assert snap.window_s == 7200 and snap.at >= now
        # running work: whole slots, ending at charged_until, which lags now by a slot
        assert rows["nlp"] % 3 == 0
        assert rows["nlp"] == pytest.approx(3 * (snap.charged_until - (now - 10.0)), abs=3.0)
        assert snap.charged_until <= snap.at - 1.0
        nc = client.nc
        bad = await nc.request(
            subjects.QUERY_USAGE, b'{"type":"UsageQuery","window_s":0}', timeout=5
        )
        refused = msgspec.json.decode(bad.data, type=m.CommandRejected)
        assert refused.field == "window_s"
