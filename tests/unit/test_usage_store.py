"""Contract tests for the usage-store port (STYLE rule 11): every case runs against the
in-memory store and against the Redis store on a real server (127.0.0.1:6379, a unique key
prefix per test, its keys deleted afterwards). The Redis cases carry the ``integration``
marker. Reference values come from the core's ``split_into_hours`` and ``window_usage``,
never from re-derived math."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Iterable

import pytest
import redis.asyncio as redis_asyncio
from redis.crc import key_slot

from allot.adapters.usage_store import (
    KEY_TTL_S,
    RETENTION_HOURS,
    MemoryUsageStore,
    RedisUsageStore,
    UsageStore,
)
from allot.core.errors import ValidationError
from allot.core.usage import DEFAULT_WINDOW_S, HOUR_S, split_into_hours, window_usage

NOW = 1_700_000_000.0 + 1234.5  # mid-hour, so the window has a straddling edge bucket
DAY = 86_400


def approx_buckets(expected: dict[str, dict[int, float]]) -> dict[str, dict[int, object]]:
    return {
        a: {h: pytest.approx(v, rel=1e-12) for h, v in hs.items()} for a, hs in expected.items()
    }


def reference(charges: Iterable[tuple[str, float, float, int]]) -> dict[str, dict[int, float]]:
    """Buckets summed straight from split_into_hours: what any store must return."""
    out: dict[str, dict[int, float]] = {}
    for allocation, start, end, gpus in charges:
        hours = out.setdefault(allocation, {})
        for h, amount in split_into_hours(start, end, gpus).items():
            hours[h] = hours.get(h, 0.0) + amount
    return out


async def connect(url: str) -> redis_asyncio.Redis:
    client = redis_asyncio.Redis.from_url(url)
    await client.ping()  # a real server (tests/conftest.py): never skipped
    return client


async def delete_prefix(client: redis_asyncio.Redis, prefix: str) -> None:
    keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
    if keys:
        await client.delete(*keys)


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[redis_asyncio.Redis]:
    client = await connect(redis_url)
    yield client
    await client.aclose()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.integration)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[UsageStore]:
    if request.param == "memory":
        yield MemoryUsageStore()
        return
    client = await connect(request.getfixturevalue("redis_url"))
    prefix = f"allot-test-{uuid.uuid4().hex}"
    try:
        yield RedisUsageStore(client, prefix=prefix)
    finally:
        await delete_prefix(client, prefix)
        await client.aclose()


async def test_charge_then_read_equals_split_into_hours_sums(store: UsageStore) -> None:
    charges = [
        ("a", NOW - 5 * HOUR_S - 0.25, NOW - 2 * HOUR_S + 17.5, 3),
        ("a", NOW - 3 * HOUR_S, NOW, 8),
    ]
    for i, (allocation, start, end, gpus) in enumerate(charges):
        assert await store.charge(f"c{i}", allocation, start, end, gpus) is True
    got = await store.buckets(["a"], NOW, DEFAULT_WINDOW_S)
    assert got == approx_buckets(reference(charges))


async def test_redelivered_charge_id_does_not_double_charge(store: UsageStore) -> None:
    assert await store.charge("c1", "a", NOW - HOUR_S, NOW, 2) is True
    # Redelivery, even with different (e.g. corrupted) fields, changes nothing.
    assert await store.charge("c1", "a", NOW - HOUR_S, NOW, 2) is False
    assert await store.charge("c1", "a", NOW - 9 * HOUR_S, NOW, 7) is False
    got = await store.buckets(["a"], NOW, DEFAULT_WINDOW_S)
    assert got == approx_buckets(reference([("a", NOW - HOUR_S, NOW, 2)]))


# A slot straddling an hour boundary: the whole slot charged early, the run's end inside it.
WHOLE = (NOW - HOUR_S - 30.0, NOW - HOUR_S + 30.0)
FINAL = (WHOLE[0], WHOLE[0] + 42.5)


@pytest.mark.parametrize("charged_whole_first", [True, False])
async def test_settle_makes_a_slot_its_final_piece_whichever_comes_first(
    store: UsageStore, charged_whole_first: bool
) -> None:
    """The live window's whole charge and the end's settle of the same slot id, in both
    orders and each redelivered: the slot counts its final piece exactly once."""
    if charged_whole_first:
        assert await store.charge("w:1:7", "a", *WHOLE, 2) is True
    assert await store.settle("w:1:7", "a", WHOLE, FINAL, 2) is True
    assert await store.settle("w:1:7", "a", WHOLE, FINAL, 2) is False
    assert await store.charge("w:1:7", "a", *WHOLE, 2) is False
    got = await store.buckets(["a"], NOW, DEFAULT_WINDOW_S)
    assert got == approx_buckets(reference([("a", *FINAL, 2)]))


async def test_settle_to_nothing_refunds_a_slot_charged_after_the_end(store: UsageStore) -> None:
    assert await store.charge("w:1:8", "a", *WHOLE, 4) is True
    assert await store.settle("w:1:8", "a", WHOLE, (WHOLE[0], WHOLE[0]), 4) is True
    got = await store.buckets(["a"], NOW, DEFAULT_WINDOW_S)
    assert all(abs(v) < 1e-9 for v in got["a"].values()), got


async def test_fifty_racing_duplicates_charge_once(store: UsageStore) -> None:
    results = await asyncio.gather(
        *(store.charge("dup", "a", NOW - 2.5 * HOUR_S, NOW, 4) for _ in range(50))
    )
    assert sorted(results) == [False] * 49 + [True]
    got = await store.buckets(["a"], NOW, DEFAULT_WINDOW_S)
    assert got == approx_buckets(reference([("a", NOW - 2.5 * HOUR_S, NOW, 4)]))


async def test_empty_interval_is_applied_once_and_adds_nothing(store: UsageStore) -> None:
    assert await store.charge("zero", "a", NOW, NOW, 1) is True
    assert await store.charge("zero", "a", NOW, NOW, 1) is False
    assert await store.buckets(["a"], NOW, DEFAULT_WINDOW_S) == {"a": {}}


async def test_window_excludes_old_hours(store: UsageStore) -> None:
    # 7.5 days ago: kept by the store (inside retention) but outside a 7-day window.
    await store.charge("old", "a", NOW - 7.5 * DAY, NOW - 7.5 * DAY + HOUR_S, 1)
    await store.charge("new", "a", NOW - HOUR_S, NOW, 1)
    got = await store.buckets(["a"], NOW, 7 * DAY)
    assert got == approx_buckets(reference([("a", NOW - HOUR_S, NOW, 1)]))
    # A wider window still sees the old hours: they were excluded, not lost.
    wide = await store.buckets(["a"], NOW, 8 * DAY)
    assert sum(wide["a"].values()) == pytest.approx(2 * HOUR_S)


async def test_hours_past_retention_are_pruned_on_the_next_charge(store: UsageStore) -> None:
    old_end = NOW - (RETENTION_HOURS + 3) * HOUR_S
    await store.charge("old", "a", old_end - HOUR_S, old_end, 1)
    assert sum((await store.buckets(["a"], old_end, HOUR_S))["a"].values()) == HOUR_S
    await store.charge("new", "a", NOW - HOUR_S, NOW, 1)
    assert await store.buckets(["a"], old_end, HOUR_S) == {"a": {}}


async def test_bucket_straddling_the_window_start_is_returned(store: UsageStore) -> None:
    edge_hour = int((NOW - DEFAULT_WINDOW_S) // HOUR_S)
    await store.charge("edge", "a", edge_hour * HOUR_S, (edge_hour + 1) * HOUR_S, 1)
    got = await store.buckets(["a"], NOW, DEFAULT_WINDOW_S)
    assert got == {"a": {edge_hour: float(HOUR_S)}}


async def test_two_allocations_stay_separate(store: UsageStore) -> None:
    await store.charge("c1", "a", NOW - 2 * HOUR_S, NOW, 1)
    await store.charge("c1", "b", NOW - HOUR_S, NOW, 5)  # same id, other allocation: applied
    await store.charge("c2", "b", NOW - 3 * HOUR_S, NOW - 2 * HOUR_S, 2)
    got = await store.buckets(["a", "b", "unknown"], NOW, DEFAULT_WINDOW_S)
    expected = reference(
        [
            ("a", NOW - 2 * HOUR_S, NOW, 1),
            ("b", NOW - HOUR_S, NOW, 5),
            ("b", NOW - 3 * HOUR_S, NOW - 2 * HOUR_S, 2),
        ]
    )
    expected["unknown"] = {}
    assert got == approx_buckets(expected)


@pytest.mark.parametrize("half_life_s", [None, 2 * DAY], ids=["sliding", "decayed"])
async def test_window_usage_over_store_equals_window_usage_over_same_charges(
    store: UsageStore, half_life_s: float | None
) -> None:
    rng = random.Random(4)
    charges: list[tuple[str, float, float, int]] = []
    for i in range(60):
        allocation = rng.choice(["nlp/train", "vision", "nlp/evals"])
        start = NOW - rng.uniform(0, 7.5 * DAY)
        end = min(NOW, start + rng.uniform(0, 30 * HOUR_S))
        gpus = rng.randint(1, 16)
        charges.append((allocation, start, end, gpus))
        assert await store.charge(f"w{i}", allocation, start, end, gpus)
    names = ["nlp/train", "vision", "nlp/evals", "idle"]
    expected_buckets = reference(charges)
    expected_buckets["idle"] = {}
    got = window_usage(
        await store.buckets(names, NOW, DEFAULT_WINDOW_S), NOW, DEFAULT_WINDOW_S, half_life_s
    )
    want = window_usage(expected_buckets, NOW, DEFAULT_WINDOW_S, half_life_s)
    assert got.keys() == want.keys()
    for name in names:
        assert got[name] == pytest.approx(want[name], rel=1e-12, abs=1e-9)
    assert got["idle"] == 0.0
    assert min(got[n] for n in names[:3]) > 0  # the seed charges every real allocation


async def test_wipe_empties_buckets_and_forgets_charge_ids(store: UsageStore) -> None:
    await store.charge("c1", "a", NOW - HOUR_S, NOW, 1)
    await store.charge("c2", "b", NOW - HOUR_S, NOW, 1)
    await store.wipe()
    assert await store.buckets(["a", "b"], NOW, DEFAULT_WINDOW_S) == {"a": {}, "b": {}}
    assert await store.charge("c1", "a", NOW - HOUR_S, NOW, 1) is True  # rebuild replays


async def test_charge_ids_past_retention_are_forgotten_without_changing_buckets(
    store: UsageStore,
) -> None:
    # An allocation that is never idle must not remember every charge id forever.
    old_end = NOW - (RETENTION_HOURS + 3) * HOUR_S
    for i in range(5):
        await store.charge(f"old{i}", "a", old_end - HOUR_S, old_end, 1)
    await store.charge("new", "a", NOW - HOUR_S, NOW, 1)
    await assert_seen_count(store, "a", 1)
    # Charged again, a forgotten id touches only hours before the cutoff: nothing is kept.
    await store.charge("old0", "a", old_end - HOUR_S, old_end, 1)
    await assert_seen_count(store, "a", 1)
    wide = await store.buckets(["a"], NOW, (RETENTION_HOURS + 10) * HOUR_S)
    assert wide == approx_buckets(reference([("a", NOW - HOUR_S, NOW, 1)]))
    # Ids inside retention are still remembered.
    assert await store.charge("new", "a", NOW - HOUR_S, NOW, 1) is False


async def test_ids_of_empty_intervals_are_bounded_too(store: UsageStore) -> None:
    old = NOW - (RETENTION_HOURS + 3) * HOUR_S
    await store.charge("old-empty", "a", old, old, 1)
    await store.charge("new-empty", "a", NOW, NOW, 1)
    await assert_seen_count(store, "a", 1)
    assert await store.charge("new-empty", "a", NOW, NOW, 1) is False


async def test_allocations_lists_those_with_buckets(store: UsageStore) -> None:
    assert await store.allocations() == []
    await store.charge("c1", "b", NOW - HOUR_S, NOW, 1)
    await store.charge("c2", "a", NOW - HOUR_S, NOW, 1)
    await store.charge("c3", "empty", NOW, NOW, 1)  # nothing stored: not listed
    assert await store.allocations() == ["a", "b"]


async def assert_seen_count(store: UsageStore, allocation: str, count: int) -> None:
    if isinstance(store, MemoryUsageStore):
        assert store.seen_count(allocation) == count
        return
    assert isinstance(store, RedisUsageStore)
    client = store._client  # the layout is what is under test
    assert await client.zcard(store.seen_key(allocation)) == count


async def test_no_allocations_asked_gives_empty_result(store: UsageStore) -> None:
    assert await store.buckets([], NOW, DEFAULT_WINDOW_S) == {}


BadCharge = tuple[str, str, float, float, int]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("", "a", NOW - 1, NOW, 1), "charge_id"),
        (("c", "", NOW - 1, NOW, 1), "allocation"),
        (("c", "a", NOW, NOW - 1, 1), "end"),
        (("c", "a", NOW - 1, NOW, 0), "gpus"),
        (("c", "a", float("nan"), NOW, 1), "start"),
    ],
    ids=["empty-charge-id", "empty-allocation", "end-before-start", "zero-gpus", "nan-start"],
)
async def test_bad_charge_is_rejected_and_changes_nothing(
    store: UsageStore, args: BadCharge, field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        await store.charge(*args)
    assert info.value.field == field
    assert await store.charge("c", "a", NOW - 1, NOW, 1) is True  # the id was not consumed


@pytest.mark.parametrize("window_s", [0, -5, 1.5, True], ids=["zero", "negative", "float", "bool"])
async def test_bad_window_is_rejected(store: UsageStore, window_s: int) -> None:
    with pytest.raises(ValidationError):
        await store.buckets(["a"], NOW, window_s)


# Redis-only: the layout the accounting service and Redis Cluster rely on.


@pytest.mark.integration
async def test_redis_keys_share_a_slot_and_expire(redis_client: redis_asyncio.Redis) -> None:
    prefix = f"allot-test-{uuid.uuid4().hex}"
    store = RedisUsageStore(redis_client, prefix=prefix)
    try:
        await store.charge("c1", "nlp/train", NOW - HOUR_S, NOW, 2)
        usage, seen = store.usage_key("nlp/train"), store.seen_key("nlp/train")
        assert usage == f"{prefix}:usage:{{nlp/train}}"
        assert seen == f"{prefix}:seen:{{nlp/train}}"
        assert key_slot(usage.encode()) == key_slot(seen.encode())
        assert await redis_client.type(usage) == b"hash"
        assert await redis_client.type(seen) == b"zset"
        last_hour = max(split_into_hours(NOW - HOUR_S, NOW, 2))
        assert await redis_client.zrange(seen, 0, -1, withscores=True) == [(b"c1", last_hour)]
        for key in (usage, seen):
            assert KEY_TTL_S - 60 < await redis_client.ttl(key) <= KEY_TTL_S
        fields = await redis_client.hgetall(usage)
        assert {int(h): float(v) for h, v in fields.items()} == split_into_hours(
            NOW - HOUR_S, NOW, 2
        )
    finally:
        await store.wipe()
    assert [k async for k in redis_client.scan_iter(match=f"{prefix}:*")] == []


@pytest.mark.integration
async def test_redis_wipe_leaves_other_prefixes_alone(redis_client: redis_asyncio.Redis) -> None:
    mine = RedisUsageStore(redis_client, prefix=f"allot-test-{uuid.uuid4().hex}")
    other = RedisUsageStore(redis_client, prefix=f"allot-test-{uuid.uuid4().hex}")
    try:
        await mine.charge("c1", "a", NOW - HOUR_S, NOW, 1)
        await other.charge("c1", "a", NOW - HOUR_S, NOW, 1)
        await mine.wipe()
        assert await mine.buckets(["a"], NOW, DEFAULT_WINDOW_S) == {"a": {}}
        assert await other.buckets(["a"], NOW, DEFAULT_WINDOW_S) == approx_buckets(
            reference([("a", NOW - HOUR_S, NOW, 1)])
        )
    finally:
        await mine.wipe()
        await other.wipe()


def test_redis_prefix_with_braces_is_rejected() -> None:
    client = redis_asyncio.Redis(host="127.0.0.1", port=6379)  # no I/O until a command
    with pytest.raises(ValidationError):
        RedisUsageStore(client, prefix="{x}")
