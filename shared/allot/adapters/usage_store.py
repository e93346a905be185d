"""Hourly usage counters per allocation: the accounting service's store.

Writes: ``charge`` adds one slot of allocated running time to the allocation's buckets,
in hourly GPU-seconds (``allot.core.usage.split_into_hours``), exactly once per
``charge_id`` (a redelivered message returns ``False`` and changes nothing); ``settle``
makes a slot hold its final piece (``allot.core.usage.settle_hours``). Reads: ``buckets``
returns the hours inside a window, the input of ``allot.core.usage.window_usage``. The
charging rules live in the core; this module only stores what they return.

Retention: both stores keep the ``RETENTION_HOURS`` (8 days) up to the newest hour charged to
an allocation and drop older hours on each charge, so a 7-day window (169 hour buckets
counting the straddling one) is always served whole. Hours of a charge already older than
that are not stored.

Redis layout (``prefix`` defaults to ``allot``), one allocation's keys sharing a hash tag so
the charge script touches a single Redis Cluster slot:

    {prefix}:usage:{<allocation>}   HASH  hour index -> GPU-seconds (HINCRBYFLOAT)
    {prefix}:seen:{<allocation>}    ZSET  applied charge id -> hour index of its last piece

One Lua script does ``ZADD NX`` of the id then, only if the id is new, HINCRBYFLOAT for every
hour, and EXPIRE of both keys 8 days after the last write (Redis 7.0 has no HEXPIRE).

Bounded memory: the accounting service charges one id per (run, slot), so an allocation that
is never idle would grow a plain set of ids without end. Instead both keys are cut at ONE
cutoff, ``newest - RETENTION_HOURS`` (``newest`` = the newest hour in either key): hours
before it are deleted from the hash and ids whose last piece lies before it from the ZSET.
Forgetting such an id is safe: if it is charged again, every hour it touches is before the
cutoff and is deleted again by the same script, so the buckets do not change (``charge``
then returns ``True`` but adds nothing that is kept).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final, Protocol
from urllib.parse import urlsplit

import redis.asyncio as redis_asyncio
from redis.asyncio.client import Pipeline

from allot.auth.client import masked_url
from allot.core.errors import ValidationError
from allot.core.usage import HOUR_S, settle_hours, split_into_hours

RETENTION_HOURS: Final = 8 * 24
KEY_TTL_S: Final = RETENTION_HOURS * HOUR_S


REDIS_SCHEMES: Final = ("redis", "rediss", "unix")


def check_redis_url(url: str, field: str) -> None:
    """Refuse a URL redis-py cannot use (an http:// or a NATS URL pasted in the wrong
    place), naming ``field`` (the option the user typed); the password masked."""
    scheme = urlsplit(url).scheme.lower()
    if scheme not in REDIS_SCHEMES:
        raise ValidationError(
            field, f"{masked_url(url)!r} is no Redis URL (schemes: {', '.join(REDIS_SCHEMES)})"
        )


def redis_failure(exc: BaseException) -> str:
    """Why a Redis request failed, in words: a server that speaks NATS (the two URLs
    swapped) answers with its INFO line, which redis-py reports as a protocol error."""
    text = str(exc) or type(exc).__name__
    if "b'INFO {" in text:
        return "it answers as a NATS server, not Redis"
    lowered = text.lower()
    # Redis says "Authentication required"; valkey, asked HELLO first, that HELLO "must be
    # called with the client already authenticated".
    if any(s in lowered for s in ("authentication required", "already authenticated", "noauth")):
        return (
            f"{text} (this Redis takes a password: ALLOT_REDIS_PASSWORD, from auth/redis.env "
            "of allot auth gen or of an allot up --secure run directory)"
        )
    return text


class UsageStore(Protocol):
    """Idempotent hourly GPU-seconds per allocation."""

    async def charge(
        self, charge_id: str, allocation: str, start: float, end: float, gpus: int
    ) -> bool:
        """Add ``gpus`` GPUs held during ``[start, end)``; ``False`` (and no change) when
        ``charge_id`` was already applied."""
        ...

    async def settle(
        self,
        charge_id: str,
        allocation: str,
        whole: tuple[float, float],
        final: tuple[float, float],
        gpus: int,
    ) -> bool:
        """Make ``charge_id``'s amount ``final`` (``[start, end)``, maybe empty), once per id:
        when ``charge_id`` was applied before, it was applied as ``whole``, and the
        difference is added; otherwise ``final`` is added and ``charge_id`` marked applied,
        so a later ``charge`` of it adds nothing. ``False`` when already settled."""
        ...

    async def buckets(
        self, allocations: Iterable[str], now: float, window_s: int
    ) -> dict[str, dict[int, float]]:
        """The hour buckets of the window ``(now - window_s, now]`` (with the hour that
        straddles its start), for every allocation asked for (``{}`` when none)."""
        ...

    async def allocations(self) -> list[str]:
        """Every allocation with stored buckets, sorted."""
        ...

    async def wipe(self) -> None:
        """Forget every bucket and charge id (tests, rebuild from the log)."""
        ...


def charged_until_key(prefix: str) -> str:
    """The key holding the end of the last slot the accounting service charged running work
    for (``allot.core.usage.complete_until``), read by the usage query and the CLI."""
    return f"{prefix}:charged_until"


class MemoryUsageStore:
    """Plain dicts: the simulator's and the unit tests' store (same rules as Redis)."""

    def __init__(self) -> None:
        self._usage: dict[str, dict[int, float]] = {}
        self._seen: dict[str, dict[str, int]] = {}

    async def charge(
        self, charge_id: str, allocation: str, start: float, end: float, gpus: int
    ) -> bool:
        pieces = _pieces(charge_id, allocation, start, end, gpus)
        seen = self._seen.setdefault(allocation, {})
        if charge_id in seen:
            return False
        seen[charge_id] = _last_hour(pieces, start)
        self._add(allocation, pieces)
        return True

    async def settle(
        self,
        charge_id: str,
        allocation: str,
        whole: tuple[float, float],
        final: tuple[float, float],
        gpus: int,
    ) -> bool:
        final_pieces, correction, last = _settle_pieces(charge_id, allocation, whole, final, gpus)
        seen = self._seen.setdefault(allocation, {})
        settle_id = _settle_id(charge_id)
        if settle_id in seen:
            return False
        seen[settle_id] = last
        if charge_id in seen:
            pieces = correction
        else:
            seen[charge_id] = last
            pieces = final_pieces
        self._add(allocation, pieces)
        return True

    def _add(self, allocation: str, pieces: dict[int, float]) -> None:
        seen = self._seen.setdefault(allocation, {})
        hours = self._usage.setdefault(allocation, {})
        for h, amount in pieces.items():
            hours[h] = hours.get(h, 0.0) + amount
        cutoff = max([*hours, *seen.values()]) - RETENTION_HOURS
        for h in [h for h in hours if h < cutoff]:
            del hours[h]
        for c in [c for c, last in seen.items() if last < cutoff]:
            del seen[c]

    async def buckets(
        self, allocations: Iterable[str], now: float, window_s: int
    ) -> dict[str, dict[int, float]]:
        hour_range = _window_hours(now, window_s)
        result: dict[str, dict[int, float]] = {}
        for allocation in allocations:
            _check_allocation(allocation)
            hours = self._usage.get(allocation, {})
            result[allocation] = {h: hours[h] for h in hour_range if h in hours}
        return result

    async def allocations(self) -> list[str]:
        return sorted(a for a, hours in self._usage.items() if hours)

    async def wipe(self) -> None:
        self._usage.clear()
        self._seen.clear()

    def seen_count(self, allocation: str) -> int:
        """How many charge ids are remembered for ``allocation`` (tests: bounded memory)."""
        return len(self._seen.get(allocation, {}))


# Both scripts end by cutting the usage hash and the seen ZSET at one cutoff and refreshing
# their TTL. KEYS[1] usage hash, KEYS[2] seen zset; ARGV[2] key TTL (s), ARGV[3] retention
# (hours), ARGV[4] the charge's last hour (its score).
_PRUNE_LUA: Final = """
local fields = redis.call('HKEYS', KEYS[1])
local newest = tonumber(redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2])
for _, f in ipairs(fields) do
  local h = tonumber(f)
  if h > newest then newest = h end
end
local cutoff = newest - tonumber(ARGV[3])
for _, f in ipairs(fields) do
  if tonumber(f) < cutoff then redis.call('HDEL', KEYS[1], f) end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. cutoff)
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""

# ARGV[1] charge id, ARGV[5..] hour, amount.
_CHARGE_LUA: Final = (
    """
if redis.call('ZADD', KEYS[2], 'NX', ARGV[4], ARGV[1]) == 0 then
  return 0
end
for i = 5, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
end
"""
    + _PRUNE_LUA
)

# ARGV[1] charge id, ARGV[5] settle id, ARGV[6] n = pairs of the final piece, then n (hour,
# amount) pairs of the final piece, then (hour, amount) pairs of final minus whole.
_SETTLE_LUA: Final = (
    """
if redis.call('ZADD', KEYS[2], 'NX', ARGV[4], ARGV[5]) == 0 then
  return 0
end
local first = 7
local last = 6 + 2 * tonumber(ARGV[6])
if redis.call('ZADD', KEYS[2], 'NX', ARGV[4], ARGV[1]) == 0 then
  first = last + 1
  last = #ARGV
end
for i = first, last, 2 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
end
"""
    + _PRUNE_LUA
)


class RedisUsageStore:
    """Counters in Redis (see the module docstring for the key layout). ``client`` may
    decode responses or not; floats are read back from their string form."""

    def __init__(self, client: redis_asyncio.Redis, prefix: str = "allot") -> None:
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise ValidationError("prefix", f"must be non-empty and brace-free, got {prefix!r}")
        self._client = client
        self._prefix = prefix
        self._charge_script = client.register_script(_CHARGE_LUA)
        self._settle_script = client.register_script(_SETTLE_LUA)

    @property
    def prefix(self) -> str:
        return self._prefix

    def usage_key(self, allocation: str) -> str:
        return f"{self._prefix}:usage:{{{allocation}}}"

    def seen_key(self, allocation: str) -> str:
        return f"{self._prefix}:seen:{{{allocation}}}"

    async def charge(
        self, charge_id: str, allocation: str, start: float, end: float, gpus: int
    ) -> bool:
        keys, args = self._charge_call(charge_id, allocation, start, end, gpus)
        return bool(await self._charge_script(keys=keys, args=args))

    async def settle(
        self,
        charge_id: str,
        allocation: str,
        whole: tuple[float, float],
        final: tuple[float, float],
        gpus: int,
    ) -> bool:
        keys, args = self._settle_call(charge_id, allocation, whole, final, gpus)
        return bool(await self._settle_script(keys=keys, args=args))

    async def queue_charge(
        self,
        pipe: Pipeline,
        charge_id: str,
        allocation: str,
        *,
        start: float,
        end: float,
        gpus: int,
    ) -> None:
        """``charge`` queued on ``pipe``; its reply (1 new, 0 already applied) is one of
        ``pipe.execute()``'s. The arguments are checked now, before anything is sent."""
        keys, args = self._charge_call(charge_id, allocation, start, end, gpus)
        await self._charge_script(keys=keys, args=args, client=pipe)

    async def queue_settle(
        self,
        pipe: Pipeline,
        charge_id: str,
        allocation: str,
        *,
        whole: tuple[float, float],
        final: tuple[float, float],
        gpus: int,
    ) -> None:
        """``settle`` queued on ``pipe``, as ``queue_charge``."""
        keys, args = self._settle_call(charge_id, allocation, whole, final, gpus)
        await self._settle_script(keys=keys, args=args, client=pipe)

    def _charge_call(
        self, charge_id: str, allocation: str, start: float, end: float, gpus: int
    ) -> tuple[list[str], list[str | int]]:
        pieces = _pieces(charge_id, allocation, start, end, gpus)
        args: list[str | int] = [charge_id, KEY_TTL_S, RETENTION_HOURS, _last_hour(pieces, start)]
        if pieces:
            # Hours already past retention would be dropped by the script anyway.
            cutoff = max(pieces) - RETENTION_HOURS
            for h, amount in pieces.items():
                if h >= cutoff:
                    args += [h, repr(float(amount))]
        return [self.usage_key(allocation), self.seen_key(allocation)], args

    def _settle_call(
        self,
        charge_id: str,
        allocation: str,
        whole: tuple[float, float],
        final: tuple[float, float],
        gpus: int,
    ) -> tuple[list[str], list[str | int]]:
        final_pieces, correction, last = _settle_pieces(charge_id, allocation, whole, final, gpus)
        args: list[str | int] = [
            charge_id,
            KEY_TTL_S,
            RETENTION_HOURS,
            last,
            _settle_id(charge_id),
            len(final_pieces),
        ]
        for pieces in (final_pieces, correction):
            for h, amount in pieces.items():
                args += [h, repr(float(amount))]
        return [self.usage_key(allocation), self.seen_key(allocation)], args

    async def buckets(
        self, allocations: Iterable[str], now: float, window_s: int
    ) -> dict[str, dict[int, float]]:
        hour_range = _window_hours(now, window_s)
        names = list(allocations)
        for allocation in names:
            _check_allocation(allocation)
        if not names:
            return {}
        async with self._client.pipeline(transaction=False) as pipe:
            for allocation in names:
                pipe.hmget(self.usage_key(allocation), list(hour_range))
            replies: list[list[bytes | str | None]] = await pipe.execute()
        result: dict[str, dict[int, float]] = {}
        for allocation, values in zip(names, replies, strict=True):
            result[allocation] = {
                h: float(v) for h, v in zip(hour_range, values, strict=True) if v is not None
            }
        return result

    async def charged_until(self) -> float | None:
        """The end of the last slot the accounting service charged running work for
        (``charged_until_key``); None before its first accrual or when unreadable."""
        raw = await self._client.get(charged_until_key(self._prefix))
        try:
            return None if raw is None else float(raw)
        except ValueError:
            return None

    async def allocations(self) -> list[str]:
        head = f"{self._prefix}:usage:{{"
        names: set[str] = set()
        async for key in self._client.scan_iter(match=f"{self._escaped()}:usage:*", count=500):
            text = key.decode() if isinstance(key, bytes) else str(key)
            if text.startswith(head) and text.endswith("}"):
                names.add(text[len(head) : -1])
        return sorted(names)

    async def wipe(self) -> None:
        """Delete this prefix's usage and seen keys (SCAN, so it never blocks the server)."""
        for kind in ("usage", "seen"):
            batch: list[bytes | str] = []
            async for key in self._client.scan_iter(match=f"{self._escaped()}:{kind}:*", count=500):
                batch.append(key)
                if len(batch) >= 500:
                    await self._client.delete(*batch)
                    batch.clear()
            if batch:
                await self._client.delete(*batch)

    def _escaped(self) -> str:
        """The prefix as a literal SCAN pattern."""
        return "".join(f"\\{c}" if c in "*?[]\\" else c for c in self._prefix)


def _pieces(
    charge_id: str, allocation: str, start: float, end: float, gpus: int
) -> dict[int, float]:
    if not isinstance(charge_id, str) or not charge_id:
        raise ValidationError("charge_id", f"must be a non-empty string, got {charge_id!r}")
    _check_allocation(allocation)
    return split_into_hours(start, end, gpus)


def _settle_id(charge_id: str) -> str:
    return f"{charge_id}:final"


def _settle_pieces(
    charge_id: str,
    allocation: str,
    whole: tuple[float, float],
    final: tuple[float, float],
    gpus: int,
) -> tuple[dict[int, float], dict[int, float], int]:
    """``settle_hours`` (the final piece per hour; final minus whole per hour), and the hour
    the ids are remembered under (the whole slot's last, as ``charge`` remembers a slot)."""
    whole_pieces = _pieces(charge_id, allocation, whole[0], whole[1], gpus)
    final_pieces, correction = settle_hours(whole, final, gpus)
    return final_pieces, correction, _last_hour(whole_pieces, whole[0])


def _last_hour(pieces: dict[int, float], start: float) -> int:
    """The hour a charge id is remembered under: its last piece's (the start's if empty)."""
    return max(pieces, default=math.floor(start / HOUR_S))


def _check_allocation(allocation: str) -> None:
    # An empty name would make an empty hash tag "{}", which Redis Cluster ignores: the
    # usage and seen keys could then land in different slots.
    if not isinstance(allocation, str) or not allocation:
        raise ValidationError("allocation", f"must be a non-empty string, got {allocation!r}")


def _window_hours(now: float, window_s: int) -> range:
    """The hour indices ``window_usage`` can count for this window: from the hour that
    straddles ``now - window_s`` to the current one."""
    if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
        raise ValidationError("now", f"must be a finite number of seconds, got {now!r}")
    if isinstance(window_s, bool) or not isinstance(window_s, int) or window_s <= 0:
        raise ValidationError("window_s", f"must be a positive integer, got {window_s!r}")
    return range(math.floor((now - window_s) / HOUR_S), math.floor(now / HOUR_S) + 1)
