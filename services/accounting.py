"""Accounting: allocated GPU-seconds of running work, charged into hourly buckets in Redis.

Charges are a deterministic function of the WORKLOADS log, so no charge messages exist and
the counters can always be rebuilt from the log (``rebuild``). What a run is charged (what
counts as allocated, the slot grid, the live window, the settles, the bounds) is the core's
(``allot.core.usage``, decision 0007), which the simulator calls too; this service reads the
records, asks the core, and writes what it returns:

* ``WorkloadStarted`` (agent) of allocated work marks the attempt running: field
  ``<workload>:<attempt>`` of the hash ``{prefix}:running`` gets {allocation, gpus,
  started_at = WorkloadStarted.at} (HSETNX: a Started redelivered or processed after the
  run's end, e.g. by another instance, never revives it).
* Live window: every ``accrue_s``, each running entry's ``accrued_slots`` are charged and
  its cursor moved past them (compare-and-set).
* A terminal event (``WorkloadCompleted/Failed/Cancelled/Preempted``) with
  ``allocated=True`` queues the run's ``end_charges`` (charges and settles, see
  ``Charger._queue_final_charges``) and replaces the running entry with a tombstone (kept
  for the store's retention, then pruned).
* Slot ``k`` of a run is charged under the id ``<workload>:<attempt>:<k>``, which the store
  dedupes, so a redelivered or replayed event recomputes the same ids and amounts and never
  double-charges.
* Bounds: whatever a record says (a forged or skewed time, up to the schema's 1e11), a run
  is charged only its ``charged_span``: nothing after the clock, nothing before its logged
  start (``WorkloadStarted``; dispatch refuses a start before the placement), nothing
  before ``oldest_charged`` (the store keeps 8 days). So a run with a logged start costs
  its team at most ``gpus x`` the time from that start to now, any run at most 8 days of
  its GPUs, and a record at most one charge per slot of those 8 days (sent
  ``PIPELINE_CHUNK`` at a time), whatever the span of its times.

Readers (the ranking service) construct ``RedisUsageStore(client, prefix)`` and read
``buckets`` directly.

Order is not relied on: a nacked event comes back after later ones, and several instances
may share the durable pull consumer ``accounting``. Every write is
idempotent or commutative (charge ids, HSETNX of a start against the end's tombstone,
compare-and-set of the accrual cursor). Events are pulled in batches
at most every ``FETCH_EVERY_S`` and charged a batch at a time (``Charger.apply_many``); the
live window is accrued between two batches, only once the consumer has no backlog, so a
backlog (after a restart) is not charged up to now before the ends in it are read.

The store follows the log (``Accounting._check_store``). The durable consumer keeps its
acknowledged position in JetStream, but Redis may lose its data (a server that keeps
nothing on disk restarted, as ``allot up``'s embedded one; a failover to a replica that
lagged): the acknowledged charges would then never come back. So the store carries a
marker, the hash ``{prefix}:applied`` = {log: the WORKLOADS stream's name and creation
time, seq: the highest stream sequence whose batch was charged}, advanced (never created)
after each charged batch, before its acks, and written by ``rebuild``. The service rebuilds
the store from the log (``rebuild``'s replay, in the consumer task, before it pulls again)
when the marker is missing or names another log while the consumer has acknowledged
something, or when its ``seq`` is below the consumer's ack floor: at start, after a batch
whose advance found no marker, and at each accrual when the marker is gone. A store that
has lost data keeps no marker (it went with the data: one Redis, one replication stream,
the marker written after the charges it covers), and the replay is idempotent, so a
needless rebuild costs time, never a double charge. Limits: on Redis Cluster the marker is
one key in one slot, so a shard that loses its data while the marker's shard keeps it is
not noticed; two instances that notice at once both rebuild (each wipe is followed by its
full replay, but one instance's wipe can drop running entries the other's replay had
already written, which the next accrual does not charge until their end: a rebuild with
the service stopped is exact).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

import msgspec
import nats
import redis.asyncio as redis_asyncio
import redis.exceptions as redis_errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.client import ServerVersion
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError
from opentelemetry.sdk.trace import TracerProvider
from redis.asyncio.client import Pipeline

from allot import bus
from allot.adapters.usage_store import KEY_TTL_S, RedisUsageStore, charged_until_key
from allot.auth.client import client_tls, inbox_prefix_for_url
from allot.bus.batch_pull import BatchPull
from allot.bus.runtime import (
    Delivery,
    configure_logging,
    make_broker,
    tracer_provider,
    wall_clock,
)
from allot.bus.service_main import base_parser, positive_seconds, run_main
from allot.bus.tasks import stop_tasks
from allot.core import usage
from allot.core.errors import ValidationError
from allot.core.usage import (
    HOUR_S,
    Slot,
    accrued_slots,
    charged_allocation,
    check_slot_s,
    complete_until,  # noqa: F401  (re-exported: the accounting tests import the grid from here)
    end_charges,
    grid_slots,  # noqa: F401  (re-exported, as above)
)
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.proto.subjects import ALL_EVENTS

log = structlog.get_logger("allot.accounting")

DEFAULT_SLOT_S: Final = 60.0
DEFAULT_ACCRUE_S: Final = 30.0
DEFAULT_PREFIX: Final = "allot"
DURABLE: Final = s.ACCOUNTING_DURABLE
MAX_DELIVER: Final = 50
"""Deliveries of an event whose charging failed (Redis down) before it is given up: with
the retry delays doubling from 0.5 s up to ``MAX_RETRY_DELAY_S``, about 22 minutes."""
BATCH: Final = 1000
"""Messages fetched from the durable consumer per pull."""
FETCH_EVERY_S: Final = 1.0
"""Least time between two pulls that found the consumer drained (a pull that filled its
``BATCH`` is followed by the next at once: ``pull_delay``). Charges are not latency-bound
(the live window lags a slot), so events are taken in batches (decision 0008)."""


def pull_delay(fetched: int, pulled_at: float, now: float) -> float:
    """Seconds to wait before the next pull, after one at ``pulled_at`` that gave
    ``fetched`` events. A full batch means a backlog: pull again at once, or the service
    reads at most ``BATCH / FETCH_EVERY_S`` events a second (decision 0008)."""
    if fetched >= BATCH:
        return 0.0
    return max(0.0, pulled_at + FETCH_EVERY_S - now)


PIPELINE_CHUNK: Final = 500
"""Charges queued on one Redis pipeline before it is sent: a run's end or first accrual may
queue one per slot of the store's retention (11,520 of 60 s), and a pipeline holds all it
queued in memory until sent."""


MAX_RETRY_DELAY_S: Final = 30.0
CONNECT_TIMEOUT_S: Final = 5.0

Terminal = m.WorkloadCompleted | m.WorkloadFailed | m.WorkloadCancelled | m.WorkloadPreempted
_TERMINAL: Final = (m.WorkloadCompleted, m.WorkloadFailed, m.WorkloadCancelled, m.WorkloadPreempted)


# -- the grid: the core's (``allot.core.usage``), bound to this store --------------------------


def oldest_charged(now: float, slot_s: float) -> float:
    """The start of the oldest slot charged at ``now``: the store keeps ``KEY_TTL_S`` (8
    days), so older time is never charged, whatever a record says."""
    return usage.oldest_charged(now, slot_s, KEY_TTL_S)


# -- the running hash --------------------------------------------------------------------------


class _Running(msgspec.Struct, frozen=True, kw_only=True, tag="running"):
    allocation: str
    gpus: int
    started_at: float
    accrued: int | None = None
    """First slot the live window has not charged yet (a cursor; losing it only costs
    re-sending charges the store dedupes)."""


class _Ended(msgspec.Struct, frozen=True, kw_only=True, tag="ended"):
    ended_at: float


_Entry = _Running | _Ended
_DECODE_ENTRY: Final = msgspec.json.Decoder(_Entry)
_ENCODE: Final = msgspec.json.Encoder()

# The marker (module docstring): advance ``seq`` to ARGV[2] if higher, only while the marker
# exists and names this log (ARGV[1]); 0 otherwise: the store lost it, or another log's.
# One key, so legal on Redis Cluster in any slot.
_ADVANCE_LUA: Final = """
if redis.call('HGET', KEYS[1], 'log') ~= ARGV[1] then
  return 0
end
if tonumber(redis.call('HGET', KEYS[1], 'seq') or '0') < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'seq', ARGV[2])
end
return 1
"""


class Marker(NamedTuple):
    """What the store says it holds: the charges of ``log`` up to stream sequence ``seq``."""

    log: str
    seq: int


def rebuild_reason(marker: Marker | None, log_id: str, acked: int) -> str | None:
    """Why the store must be rebuilt from the log before consuming, or None. ``acked`` is
    the durable consumer's ack floor (stream sequence): every event up to it was charged
    and will not be delivered again. A consumer that acknowledged nothing will deliver the
    whole log, so any store does then (the marker is just written anew)."""
    if acked <= 0:
        return None
    if marker is None:
        return f"the store has no marker but the consumer has acknowledged up to seq {acked}"
    if marker.log != log_id:
        return f"the store's marker is for another log ({marker.log!r}, now {log_id!r})"
    if marker.seq < acked:
        return (
            f"the store holds charges up to seq {marker.seq} but the consumer has "
            f"acknowledged up to seq {acked}"
        )
    return None


async def log_identity(js: JetStreamContext) -> str:
    """The WORKLOADS stream as the marker names it: a stream deleted and made again (a
    new run dir with the same Redis) restarts its sequences, so its creation time counts."""
    info = await js.stream_info("WORKLOADS")
    return f"WORKLOADS {info.created}"


# Compare-and-set of one field: the accrual cursor must never overwrite a tombstone written
# by an end event in the meantime.
_CAS_LUA: Final = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  return 1
end
return 0
"""


@dataclass
class Charger:
    """Writes the core's charges (``allot.core.usage``) to Redis; shared by the live service
    and ``rebuild``."""

    client: redis_asyncio.Redis
    prefix: str = DEFAULT_PREFIX
    slot_s: float = DEFAULT_SLOT_S
    clock: Callable[[], float] = wall_clock
    """Now, for the last slot the live window can have charged (``_final_charges``)."""

    def __post_init__(self) -> None:
        self.slot_s = check_slot_s(self.slot_s)
        self.store = RedisUsageStore(self.client, self.prefix)
        self.running_key = f"{self.prefix}:running"
        self.marker_key = f"{self.prefix}:applied"
        self.charged_until_key = charged_until_key(self.prefix)
        """The end of the last slot the live window charged (``usage.complete_until``)."""
        self._cas = self.client.register_script(_CAS_LUA)
        self._advance = self.client.register_script(_ADVANCE_LUA)

    async def marker(self) -> Marker | None:
        """The store's marker (module docstring), None when missing or unreadable."""
        raw = await self.client.hmget(self.marker_key, ["log", "seq"])
        log_id, seq = raw[0], raw[1]
        if log_id is None or seq is None or not _text(seq).isdigit():
            return None
        return Marker(_text(log_id), int(_text(seq)))

    async def set_marker(self, log_id: str, seq: int) -> None:
        """Say the store holds the charges of ``log_id`` up to ``seq`` (after a rebuild)."""
        await self.client.hset(self.marker_key, mapping={"log": log_id, "seq": seq})

    async def advance_marker(self, log_id: str, seq: int) -> bool:
        """Raise the marker's ``seq`` to ``seq``; False (and no write) when the marker is
        missing or names another log: the store lost what it had."""
        return bool(await self._advance(keys=[self.marker_key], args=[log_id, seq]))

    async def apply(self, record: msgspec.Struct) -> int:
        """Apply one WORKLOADS record (``apply_many`` of one)."""
        return await self.apply_many([record])

    async def apply_many(self, records: Sequence[msgspec.Struct]) -> int:
        """Apply WORKLOADS records; returns how many charges were new. Records that do not
        concern accounting (or cannot be charged) are logged and ignored.

        A batch costs a few Redis round trips, not a few per record: the starts' HSETNX
        (one pipeline), the ends' running entries (one HMGET), their charges and settles
        (one pipeline), their tombstones (one HSET). Starts go first, which one-by-one
        order gives too: a start and its end in one batch charge the run, and an end
        applied before its start leaves a tombstone the start's HSETNX cannot replace.
        Every step is idempotent, so after a Redis error the batch is applied again."""
        starts: dict[str, bytes] = {}
        ends: list[Terminal] = []
        for r in records:
            if isinstance(r, m.WorkloadStarted):
                entry = _running_entry(r)
                if entry is not None:
                    starts.setdefault(_field(r.workload_id, r.attempt), _ENCODE.encode(entry))
            elif isinstance(r, _TERMINAL) and r.allocated:
                ends.append(r)
        if starts:
            async with self.client.pipeline(transaction=False) as pipe:
                for key, value in starts.items():
                    pipe.hsetnx(self.running_key, key, value)
                await pipe.execute()
        if not ends:
            return 0
        keys = [_field(r.workload_id, r.attempt) for r in ends]
        entries = await self.client.hmget(self.running_key, keys)
        async with self.client.pipeline(transaction=False) as pipe:
            sender = _Sender(pipe)
            for key, r, raw in zip(keys, ends, entries, strict=True):
                await self._queue_final_charges(sender, key, r, _decode_entry(raw))
            applied = await sender.sent()
        # After the charges: if they fail the batch is redelivered and charges again.
        tombstones = {
            key: _ENCODE.encode(_Ended(ended_at=r.at)) for key, r in zip(keys, ends, strict=True)
        }
        await self.client.hset(self.running_key, mapping=tombstones)  # type: ignore[arg-type]
        return applied

    async def _queue_final_charges(
        self, sender: _Sender, run: str, r: Terminal, running: _Entry | None
    ) -> None:
        """Queue the core's ``end_charges`` of the run ``[started_at, r.at)`` read now, with
        the ids the live window uses (nothing, logged, when the run cannot be charged). Its
        start is the later of the record's and the logged one (``WorkloadStarted``, which
        dispatch refuses before the placement): a record cannot move it earlier."""
        started_at = r.started_at
        gpus = r.gpus
        accrued = None
        if isinstance(running, _Running):  # older agents may leave these out
            started_at = (
                running.started_at if started_at is None else max(started_at, running.started_at)
            )
            gpus = gpus or running.gpus
            accrued = running.accrued
        allocation = charged_allocation(r.allocated, r.allocation, gpus)
        if allocation is None or started_at is None:
            log.warning(
                "allocated run not chargeable",
                workload=r.workload_id,
                attempt=r.attempt,
                allocation=r.allocation,
                started_at=started_at,
                gpus=gpus,
            )
            return
        if r.at < started_at:
            log.warning("run ends before it starts", workload=r.workload_id, attempt=r.attempt)
        now = self.clock()
        try:
            charges = end_charges(
                started_at,
                r.at,
                now=now,
                earliest=oldest_charged(now, self.slot_s),
                slot_s=self.slot_s,
                accrued=accrued,
            )
            await self._queue_slots(sender, run, allocation, gpus, charges.slots)
            for settle in charges.settles:
                await self.store.queue_settle(
                    sender.pipe,
                    _charge_id(run, settle.k),
                    allocation,
                    whole=settle.whole,
                    final=settle.final,
                    gpus=gpus,
                )
                await sender.queued()
        except ValidationError as e:  # bad numbers in a record: retrying cannot help
            log.warning(
                "run not chargeable",
                workload=r.workload_id,
                attempt=r.attempt,
                field=e.field,
                reason=e.reason,
            )

    async def accrue(self, now: float) -> int:
        """Charge every running entry's ``accrued_slots`` (its complete slots up to a slot
        before ``now``); prune tombstones older than the store's retention. Returns how many
        charges were new."""
        applied = 0
        async for raw_field, raw_value in self.client.hscan_iter(self.running_key, count=500):
            field = _text(raw_field)
            try:
                entry = _DECODE_ENTRY.decode(raw_value)
            except msgspec.DecodeError as e:
                log.warning("running entry unreadable", field=field, reason=str(e))
                continue
            if isinstance(entry, _Ended):
                if entry.ended_at < now - KEY_TTL_S:
                    await self.client.hdel(self.running_key, field)
                continue
            workload, _, attempt = field.rpartition(":")
            slots = accrued_slots(
                entry.started_at,
                now=now,
                earliest=oldest_charged(now, self.slot_s),
                slot_s=self.slot_s,
                accrued=entry.accrued,
            )
            if not slots or not workload or not attempt.isdigit():
                continue
            applied += await self._charge(
                _field(workload, int(attempt)), entry.allocation, entry.gpus, slots
            )
            moved = msgspec.structs.replace(entry, accrued=slots[-1].k + 1)
            await self._cas(keys=[self.running_key], args=[field, raw_value, _ENCODE.encode(moved)])
        await self.client.set(self.charged_until_key, repr(usage.complete_until(now, self.slot_s)))
        return applied

    async def wipe(self) -> None:
        """Forget the marker, every bucket, charge id and running entry of this prefix (the
        marker first: a wipe cut short leaves a store that says it holds nothing)."""
        await self.client.delete(self.marker_key)
        await self.store.wipe()
        await self.client.delete(self.running_key, self.charged_until_key)

    async def _charge(self, run: str, allocation: str, gpus: int, slots: Sequence[Slot]) -> int:
        async with self.client.pipeline(transaction=False) as pipe:
            sender = _Sender(pipe)
            await self._queue_slots(sender, run, allocation, gpus, slots)
            return await sender.sent()

    async def _queue_slots(
        self, sender: _Sender, run: str, allocation: str, gpus: int, slots: Sequence[Slot]
    ) -> None:
        """Queue each slot's charge under the id the live window and the end share."""
        for sl in slots:
            await self.store.queue_charge(
                sender.pipe,
                _charge_id(run, sl.k),
                allocation,
                start=sl.start,
                end=sl.end,
                gpus=gpus,
            )
            await sender.queued()


class _Sender:
    """A Redis pipeline sent every ``PIPELINE_CHUNK`` queued calls, counting new charges."""

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe = pipe
        self._new = 0

    async def queued(self) -> None:
        """After each call queued on ``pipe``: send them once there are enough."""
        if len(self.pipe) >= PIPELINE_CHUNK:
            await self._send()

    async def sent(self) -> int:
        """Send what is left; how many of all the calls were new charges."""
        await self._send()
        return self._new

    async def _send(self) -> None:
        self._new += sum(1 for reply in await self.pipe.execute() if reply)


def _running_entry(r: m.WorkloadStarted) -> _Running | None:
    """The running entry of an allocated start (None, logged when it cannot be charged)."""
    if not r.allocated:
        return None
    allocation = charged_allocation(r.allocated, r.allocation, r.gpus)
    if allocation is None:
        log.warning(
            "allocated start not chargeable",
            workload=r.workload_id,
            attempt=r.attempt,
            allocation=r.allocation,
            gpus=r.gpus,
        )
        return None
    return _Running(allocation=allocation, gpus=r.gpus, started_at=r.at)


def _decode_entry(raw: bytes | str | None) -> _Entry | None:
    if raw is None:
        return None
    try:
        return _DECODE_ENTRY.decode(raw)
    except msgspec.DecodeError:
        return None


def _field(workload: str, attempt: int) -> str:
    """A run's field in the running hash, and the stem of its charge ids."""
    return f"{workload}:{attempt}"


def _charge_id(run: str, k: int) -> str:
    """Slot ``k`` of run ``run`` (``_field``): the id the live window and the end share."""
    return f"{run}:{k}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# -- the service -------------------------------------------------------------------------------


_CHARGEABLE = tuple(f'"{kind.__name__}"'.encode() for kind in (m.WorkloadStarted, *_TERMINAL))


def _may_charge(data: bytes) -> bool:
    """A cheap pre-filter before decoding: only these records can start or end a charged
    run (anything else that merely mentions one of these strings is decoded and ignored)."""
    return any(tag in data for tag in _CHARGEABLE)


def charged_filters(server: ServerVersion) -> list[str]:
    """The durable consumer's filter: only the events that start or end a charged run
    (``subjects.CHARGED_EVENTS``), so nats-server does not deliver, and accounting does not
    parse and ack, the submissions and placements (half of the log under load). A consumer
    with several filters needs nats-server >= 2.10; an older one delivers every event and
    ``_may_charge`` skips what cannot charge, as before."""
    if bus.takes_several_filters(server):
        return [s.every_workload(event) for event in s.CHARGED_EVENTS]
    return [ALL_EVENTS]


async def _refilter(js: JetStreamContext, config: ConsumerConfig, filters: list[str]) -> None:
    """An existing durable consumer is bound as it is (nats-py does not update it): one made
    with another filter (an older Allot, or the server upgraded past 2.10) gets this one.
    Its acknowledged position is kept; what it had skipped is charged by a rebuild."""
    info = await js.consumer_info("WORKLOADS", DURABLE)
    had = info.config.filter_subjects or [info.config.filter_subject or ""]
    if sorted(had) == sorted(filters):
        return
    try:
        await js.add_consumer("WORKLOADS", config)
    except nats.js.errors.APIError as e:  # e.g. a server that does not allow the change
        log.warning("consumer filter not updated", had=had, wanted=filters, error=repr(e))
    else:
        log.info("consumer filter updated", had=had, now=filters)


class Accounting:
    """The live service (``allot.bus.service_main.Service``): a durable pull consumer on the
    WORKLOADS stream's workload events, plus the accrual loop."""

    def __init__(
        self,
        nats_url: str,
        redis_url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        slot_s: float = DEFAULT_SLOT_S,
        accrue_s: float = DEFAULT_ACCRUE_S,
        clock: Callable[[], float] = wall_clock,
        provider: TracerProvider | None = None,
        max_deliver: int = MAX_DELIVER,
    ) -> None:
        if (
            isinstance(accrue_s, bool)
            or not isinstance(accrue_s, int | float)
            or not (math.isfinite(accrue_s) and accrue_s > 0)
        ):
            raise ValidationError(
                "accrue_s", f"must be a positive number of seconds, got {accrue_s!r}"
            )
        self.broker = make_broker(nats_url, "accounting", provider)
        self.broker.subscriber(s.QUERY_USAGE)(self._usage_handler)
        self.redis = redis_asyncio.Redis.from_url(redis_url)
        self.charger = Charger(self.redis, prefix, slot_s, clock)
        self.accrue_s = float(accrue_s)
        self.clock = clock
        self.max_deliver = max_deliver
        self.handled = 0
        """Messages handled (acknowledged), for tests and logs."""
        self.rebuilds: list[str] = []
        """Why each rebuild of the store this instance made was needed, for tests and logs."""
        self.store_checked = asyncio.Event()
        """Set once the store was first checked against the log (and rebuilt if needed)."""
        self._consumer: asyncio.Task[None] | None = None
        self._pull: BatchPull | None = None
        self._js: JetStreamContext | None = None
        self._log_id = ""
        self._store_lost = False
        self._acked_seq = 0
        """The highest stream sequence this instance acknowledged (the ack floor lags)."""

    async def on_started(self) -> None:
        js = self.broker.connection.jetstream()
        await bus.ensure_streams(js)
        # The durable pull consumer is read with nats-py directly, a whole batch at a time
        # (``BatchPull``), its acks in one socket write (decisions 0008, 0074).
        filters = charged_filters(self.broker.connection.connected_server_version)
        one, several = bus.consumer_filter(filters)
        config = ConsumerConfig(
            durable_name=DURABLE,
            ack_policy=AckPolicy.EXPLICIT,
            max_deliver=self.max_deliver,
            ack_wait=60.0,
            filter_subject=one,
            filter_subjects=several,
        )
        try:
            await js.consumer_info("WORKLOADS", DURABLE)
        except NotFoundError:  # created as nats-py's ``pull_subscribe`` created it
            await js.add_consumer("WORKLOADS", dataclasses.replace(config, name=DURABLE))
        else:
            await _refilter(js, config, filters)
        pull = BatchPull(self.broker.connection, "WORKLOADS", DURABLE, BATCH)
        await pull.open()
        self._js = js
        self._pull = pull
        self._consumer = asyncio.create_task(self._consume_forever(pull))
        log.info("accounting started", prefix=self.charger.prefix, slot_s=self.charger.slot_s)

    async def on_stopping(self) -> None:
        await stop_tasks([self._consumer])
        self._consumer = None
        if self._pull is not None:
            await self._pull.close()  # the durable consumer stays
            self._pull = None
        await self.redis.aclose()

    async def _consume_forever(self, pull: BatchPull) -> None:
        """Pull up to ``BATCH`` events (paced by ``pull_delay``), charge them together
        (``Charger.apply_many``), then acknowledge them together: a few Redis round trips
        and one socket write of acks for many events. A failed charge nacks the batch's
        chargeable events with a delay.

        The live window is accrued here too, between two batches, and only after a batch
        that was not full (the consumer had nothing more to give when pulled): a backlog
        (a restart, an outage) may hold the end of a run the window would otherwise charge
        past its end, so it is read first. Being in this task, an accrual never interleaves
        with this instance's charging of an end (a late end read after an accrual is
        settled right, see ``Charger._queue_final_charges``)."""
        loop = asyncio.get_running_loop()
        pulled_at = -math.inf
        accrued_at = -math.inf
        batch: list[Msg] = []
        # Unchecked (Redis or NATS not answering yet), events are still pulled: their
        # charges fail and are retried later, as before, and the check is made again first.
        self._store_lost = not await self._check_store()
        while True:
            if self._store_lost:  # unchecked yet, or a batch's charges found no marker
                await self._check_store()
            await asyncio.sleep(pull_delay(len(batch), pulled_at, loop.time()))
            pulled_at = loop.time()
            try:
                batch = await pull.take()
            except nats.errors.Error as e:  # reconnecting: nats-py retries on its own
                log.warning("events not fetched", error=repr(e))
                await asyncio.sleep(0.5)
                continue
            if batch:
                await self._handle(batch)
            if len(batch) < BATCH and loop.time() >= accrued_at + self.accrue_s:
                accrued_at = loop.time()
                with contextlib.suppress(Exception):  # the accrual below logs Redis down
                    if not await self.redis.exists(self.charger.marker_key):
                        self._store_lost = True
                        continue  # checked (and rebuilt) before anything is accrued
                await self._accrue()

    async def _check_store(self) -> bool:
        """Rebuild the store from the log when it does not hold what the consumer has
        acknowledged (``rebuild_reason``), else make sure it has this log's marker. False
        when Redis or NATS did not answer (checked again later)."""
        assert self._js is not None
        try:
            self._log_id = await log_identity(self._js)
            info = await self._js.consumer_info("WORKLOADS", DURABLE)
            acked = max(info.ack_floor.stream_seq if info.ack_floor else 0, self._acked_seq)
            marker = await self.charger.marker()
            reason = rebuild_reason(marker, self._log_id, acked)
            if reason is None:
                if marker is None or marker.log != self._log_id:
                    await self.charger.set_marker(self._log_id, 0)
                self._store_lost = False
                self.store_checked.set()
                return True
            log.warning("usage store behind the log: rebuilding it from the log", reason=reason)
            began = asyncio.get_running_loop().time()
            done = await _replay(self._js, self.charger, self.clock())
        except Exception as e:  # Redis or NATS down: the next check tries again
            log.warning("usage store not checked against the log", error=repr(e))
            return False
        self.rebuilds.append(reason)
        self._store_lost = False
        self.store_checked.set()
        log.warning(
            "usage store rebuilt from the log",
            reason=reason,
            records=done.records,
            charges=done.charges,
            last_seq=done.last_seq,
            seconds=round(asyncio.get_running_loop().time() - began, 3),
        )
        return True

    async def _handle(self, batch: Sequence[Msg]) -> None:
        chargeable: list[tuple[Msg, msgspec.Struct]] = []
        done: list[Msg] = []
        for raw in batch:
            if not _may_charge(raw.data):
                done.append(raw)  # submissions, placements, queue positions...: nothing to charge
                continue
            try:
                chargeable.append((raw, bus.decode_record(raw.subject, raw.data)))
            except ValidationError as e:
                log.warning("event skipped", subject=raw.subject, field=e.field, reason=e.reason)
                done.append(raw)
        try:
            await self.charger.apply_many([record for _, record in chargeable])
            # Before the acks: a marker past an event is only ever written after its charges.
            seq = max(raw.metadata.sequence.stream for raw in batch)
            if not await self.charger.advance_marker(self._log_id, seq):
                self._store_lost = True  # rebuilt before the next pull (it replays these)
        except Exception as e:  # Redis unreachable: retry later, not in a tight loop
            for raw, _ in chargeable:
                await self._retry_later(raw, e)
        else:
            done += [raw for raw, _ in chargeable]
        for raw in done:
            with contextlib.suppress(nats.errors.Error):  # redelivered if unacked
                await raw.ack()
                self._acked_seq = max(self._acked_seq, raw.metadata.sequence.stream)
        self.handled += len(done)

    async def _retry_later(self, raw: Msg, error: Exception) -> None:
        delivered = raw.metadata.num_delivered
        delay = min(MAX_RETRY_DELAY_S, 0.5 * 2.0 ** (delivered - 1))
        level = log.error if delivered >= self.max_deliver else log.warning
        level(
            "event not charged yet" if delivered < self.max_deliver else "event given up",
            subject=raw.subject,
            delivered=delivered,
            retry_in_s=delay,
            error=repr(error),
        )
        # The retries are bounded (max_deliver); a given-up event is charged by a rebuild.
        with contextlib.suppress(nats.errors.Error):
            await raw.nak(delay=delay)

    async def _usage_handler(self, msg: Delivery) -> bytes:
        return codec.encode(await self.usage(msg.body))

    async def usage(self, body: bytes) -> m.UsageSnapshot | m.CommandRejected:
        """Answer a ``UsageQuery`` (an empty body: the default one) from the store."""
        now = self.clock()
        try:
            query = codec.decode_as(m.UsageQuery, body) if body.strip() else m.UsageQuery()
        except ValidationError as e:
            return m.CommandRejected(at=now, field=e.field, reason=e.reason)
        store = self.charger.store
        try:
            buckets = await store.buckets(await store.allocations(), now, query.window_s)
            charged_until = await store.charged_until()
        except redis_errors.RedisError as e:
            return m.CommandRejected(at=now, field="store", reason=f"usage store unreachable: {e}")
        used = usage.window_usage(buckets, now, query.window_s)
        rows = tuple(
            m.UsageRow(allocation=a, gpu_seconds=g) for a, g in sorted(used.items()) if g > 0
        )
        return m.UsageSnapshot(
            at=now, window_s=query.window_s, charged_until=charged_until, rows=rows
        )

    async def _accrue(self) -> None:
        try:
            applied = await self.charger.accrue(self.clock())
        except Exception as e:  # accrued again once Redis is back
            log.warning("accrual failed", error=repr(e))
            return
        if applied:
            log.debug("accrued", charges=applied)


# -- rebuild from the log ----------------------------------------------------------------------


@dataclass(frozen=True)
class Rebuilt:
    records: int
    charges: int
    last_seq: int = 0
    """The stream sequence of the last record replayed (the marker's ``seq``)."""


async def rebuild(
    nats_url: str,
    redis_url: str,
    *,
    prefix: str = DEFAULT_PREFIX,
    slot_s: float = DEFAULT_SLOT_S,
    now: float | None = None,
) -> Rebuilt:
    """Wipe the store and the running hash, replay the whole WORKLOADS stream through the
    same charging code, then charge running work's complete slots up to ``now`` (default:
    the wall clock). Run it with the live service stopped: a live instance HDEL-ing or
    accruing during the wipe could leave a running entry the replay does not see end."""
    slot_s = check_slot_s(slot_s)
    RedisUsageStore(redis_asyncio.Redis(), prefix)  # checks the prefix before any I/O
    nc = await _connect_once(nats_url)
    js = nc.jetstream()
    client = redis_asyncio.Redis.from_url(redis_url, socket_connect_timeout=CONNECT_TIMEOUT_S)
    try:
        await bus.ensure_streams(js)
        at = wall_clock() if now is None else now
        return await _replay(js, Charger(client, prefix, slot_s, clock=lambda: at), at)
    finally:
        await nc.close()
        await client.aclose()


REPLAY_BATCH: Final = 1000
"""Records charged together during a replay (``Charger.apply_many``, as the live batches)."""


async def _replay(js: JetStreamContext, charger: Charger, now: float) -> Rebuilt:
    """``rebuild`` on open connections: wipe (the marker first), replay, accrue up to
    ``now``, then write the marker of the replayed log."""
    log_id = await log_identity(js)
    await charger.wipe()
    records = 0
    charges = 0
    pending: list[msgspec.Struct] = []
    failure: list[BaseException] = []

    async def flush() -> None:
        nonlocal charges
        batch = pending.copy()
        pending.clear()
        try:
            charges += await charger.apply_many(batch)
        except Exception as e:  # reported after the replay stops
            failure.append(e)

    async def on_record(_: str, record: msgspec.Struct) -> None:
        nonlocal records
        if failure:
            return
        records += 1
        pending.append(record)
        if len(pending) >= REPLAY_BATCH:
            await flush()

    follower = bus.LogFollower(js, on_record, streams=("WORKLOADS",))
    try:
        await follower.start()
    finally:
        await follower.stop()
    if pending and not failure:
        await flush()
    if failure:
        raise failure[0]
    charges += await charger.accrue(now)
    last_seq = follower.last_seq.get("WORKLOADS", 0)
    await charger.set_marker(log_id, last_seq)
    return Rebuilt(records, charges, last_seq)


async def _connect_once(url: str) -> NatsClient:
    """A NATS connection for a one-shot command: a few attempts, then the error (the
    services' ``bus.connect`` retries forever, right for a daemon, wrong for a command)."""

    async def quiet(e: Exception) -> None:
        log.debug("nats connection error", error=repr(e))

    return await nats.connect(
        bus.server_urls(url),  # a cluster's comma-separated list too
        name="allot-accounting-rebuild",
        # The login's own inbox and the CA of a tls:// server (``allot up --secure``), as
        # every client of ``bus.connect``.
        inbox_prefix=inbox_prefix_for_url(url),
        tls=client_tls(url),
        connect_timeout=CONNECT_TIMEOUT_S,
        max_reconnect_attempts=2,
        reconnect_time_wait=0.5,
        error_cb=quiet,
    )


# -- process entry point -----------------------------------------------------------------------


def slot_seconds(text: str) -> float:
    value = positive_seconds(text)
    if value > HOUR_S:
        raise argparse.ArgumentTypeError(f"must be at most 3600 seconds, got {text!r}")
    return value


def prefix_name(text: str) -> str:
    if not text or "{" in text or "}" in text:
        raise argparse.ArgumentTypeError(f"must be non-empty and brace-free, got {text!r}")
    return text


def add_store_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--prefix",
        type=prefix_name,
        default=DEFAULT_PREFIX,
        help="Redis key prefix (default %(default)s)",
    )
    ap.add_argument(
        "--slot-s",
        type=slot_seconds,
        default=DEFAULT_SLOT_S,
        help="charging grid in seconds, at most 3600 (default %(default)s)",
    )


def parser() -> argparse.ArgumentParser:
    ap = base_parser(
        "python -m allot.services.accounting", __doc__.splitlines()[0] if __doc__ else None
    )
    add_store_options(ap)
    ap.add_argument(
        "--accrue-s",
        type=positive_seconds,
        default=DEFAULT_ACCRUE_S,
        help="how often running work's complete slots are charged (default %(default)s)",
    )
    return ap


def build(args: argparse.Namespace) -> Accounting:
    configure_logging("accounting")
    return Accounting(
        args.nats_url,
        args.redis_url,
        prefix=args.prefix,
        slot_s=args.slot_s,
        accrue_s=args.accrue_s,
        provider=tracer_provider("accounting"),
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(build, parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
