"""The leader's answers to queries (core-NATS request/reply, subscribed while it leads),
and the cached queue explanation they share with the cycle.

``allot.v1.query.queue`` (``QueueSnapshot``), ``allot.v1.query.prio`` (``PrioSnapshot``),
``allot.v1.query.hosts`` (``HostsSnapshot``, with each drain's reason, operator and time),
``allot.v1.query.status`` (``StatusQuery`` -> ``WorkloadStatus``; an ended workload's last
attempt and how it ended, like ``sacct``), ``allot.v1.query.allocations``
(``AllocationsSnapshot``: budget, entitlement and held GPUs per leaf) and
``allot.v1.query.placement_stats`` (``PlacementStats``: the cycle-duration histogram since
this instance became leader). The per-allocation forms ``allot.v1.query.{queue,prio,
status}.<alloc>`` answer that allocation's work only; an allocation the budget tree lacks
is refused (``CommandRejected`` naming ``allocation``), so a typo is not mistaken for an
allocation with nothing pending.

Why pending. Each ``QueueRow`` (and ``WorkloadQueued.why``) carries the core's reason
(``allot.core.reasons``, ``docs/reasons.md``): ``explain_pending`` over a DRY ``run_cycle``
of the fold as it is (pure: nothing is published), so work the next cycle would start
reads ``starts-next-cycle`` and the rest the reason that cycle would leave it pending for.
The explanation is cached per fold state (records applied, epochs, ranking version) until
the dry run's next wakeup or ``REASONS_MAX_AGE_S``, whichever is first; a real cycle's
result seeds the cache, and under load an answer up to ``STALE_OK_S`` old is served (why,
and what an answer costs: docs/decisions/0006-queue-explanations-are-cached-and-paced.md).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from allot import bus
from allot.bus.runtime import wall_clock
from allot.core.cycle import run_cycle
from allot.core.decisions import CycleResult
from allot.core.errors import ValidationError
from allot.core.policy import Policy
from allot.core.queue_view import QueueEntry, queue_order
from allot.core.reasons import Why, explain_pending, priority_breakdown
from allot.eventlog.last_ranking import LastRanking
from allot.eventlog.logfold import LogFold, WorkloadRecord
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.services.placement.answers import (
    allocations,
    free_gpus,
    hosts_page,
    prio_rows,
    query_scope,
    queue_row,
    workload_status,
)
from allot.services.placement.histogram import CycleDurations

STALE_OK_S = 1.0
"""A queue answer (positions and reasons) at most this old is served even if records
arrived since: under load the fold changes with every record, and recomputing it for
every query would take the leader's time from scheduling."""
REASONS_MAX_AGE_S = 5.0
"""A cached queue explanation is recomputed at least this often (its ``in_s`` numbers and
texts age; codes change only with the fold or at the dry run's next wakeup)."""

_ENC = msgspec.json.Encoder()

log = structlog.get_logger("allot.placement")

Handler = Callable[[Msg], Awaitable[None]]


class Leader(Protocol):
    """What the answers read from the placement service."""

    fold: LogFold
    policy: Policy
    ranking: LastRanking
    epoch: int
    cycles: int
    decisions: int
    cycle_durations: CycleDurations
    nc: NatsClient | None
    js: JetStreamContext | None
    reads_starts: bool
    """Whether the log follower reads runs' starts; if not, a status query reads one."""


@dataclass(frozen=True, slots=True)
class Explained:
    """The queue as one dry run saw it: positions and each workload's reason."""

    key: tuple[int, ...]
    at: float
    expires: float
    result: CycleResult
    entries: list[QueueEntry] | None = None
    reasons: Mapping[str, Why] | None = None

    def serves(self, key: tuple[int, ...], now: float, stale_ok_s: float) -> bool:
        """Explained, younger than ``stale_ok_s``, and only records arrived since (same
        epochs and ranking): good enough to answer with under load."""
        return self.reasons is not None and now - self.at < stale_ok_s and self.key[1:] == key[1:]


class Queries:
    """The query handlers of ``leader`` (``handlers``) and their cache (``explained``)."""

    def __init__(self, leader: Leader) -> None:
        self.leader = leader
        self.explained: Explained | None = None
        self.explain_cost_s = 0.0  # the last full explanation of the queue (seconds)

    def handlers(self) -> list[tuple[str, Handler]]:
        """The subjects the leader answers and their handlers."""
        return [
            (s.QUERY_QUEUE, self._on_query_queue),
            (s.QUERY_PRIO, self._on_query_prio),
            (s.QUERY_HOSTS, self._on_query_hosts),
            (s.QUERY_STATUS, self._on_query_status),
            (s.ALL_QUERY_QUEUE, self._on_query_queue),
            (s.ALL_QUERY_PRIO, self._on_query_prio),
            (s.ALL_QUERY_STATUS, self._on_query_status),
            (s.QUERY_ALLOCATIONS, self._on_query_allocations),
            (s.QUERY_PLACEMENT_STATS, self._on_query_placement_stats),
        ]

    # ------------------------------------------------------------------ the cache
    def seed(self, now: float, result: CycleResult) -> None:
        """A real cycle's ``result``: until its decisions come back, the fold is the one it
        was computed on, so it is the dry run a queue query would compute. A cached answer
        for this very fold stays (the same decisions, already explained), and so does an
        explained answer younger than STALE_OK_S (queries may serve it under load)."""
        key, cached = self._fold_key(), self.explained
        if (
            cached is None
            or (cached.key != key and not cached.serves(key, now, STALE_OK_S))
            or now >= cached.expires
        ):
            self.explained = Explained(key, now, _expiry(now, result), result)

    def explain(self, now: float, stale_ok_s: float = 0.0) -> Explained:
        """Positions and reasons of every pending workload: the cached answer while the
        fold is unchanged and it has not expired (or it is younger than ``stale_ok_s``),
        else a dry ``run_cycle`` (pure: the snapshot is only read and nothing is published)
        and ``explain_pending``."""
        key = self._fold_key()
        cached = self.explained
        if cached is not None and cached.serves(key, now, stale_ok_s):
            return cached
        if cached is not None and (cached.key != key or now >= cached.expires):
            cached = None
        if cached is not None and cached.reasons is not None:
            return cached
        started = time.perf_counter()
        leader = self.leader
        snapshot = leader.ranking.snapshot(leader.fold)
        if cached is None:
            result = run_cycle(snapshot, leader.policy, now)
            cached = Explained(key, now, _expiry(now, result), result)
        entries = queue_order(snapshot, leader.policy)
        reasons = explain_pending(
            snapshot, leader.policy, cached.at, cached.result, dry_run=True, entries=entries
        )
        self.explained = Explained(key, cached.at, cached.expires, cached.result, entries, reasons)
        self.explain_cost_s = time.perf_counter() - started
        return self.explained

    def _fold_key(self) -> tuple[int, ...]:
        """Changes whenever a cycle's inputs may have: every record the fold applied
        (workloads, hosts, budget tree, leader), our epoch, the ranking."""
        leader = self.leader
        return (leader.fold.applied, leader.fold.epoch, leader.epoch, leader.ranking.version)

    # ------------------------------------------------------------------ handlers
    async def _on_query_queue(self, msg: Msg) -> None:
        """The whole queue, or (``allot.v1.query.queue.<alloc>``) one allocation's rows with
        their cluster-wide positions, ``total`` counting that allocation's."""
        leader = self.leader
        now = wall_clock()
        try:
            scope = query_scope(msg.subject, s.QUERY_QUEUE, leader.fold.tree)
        except ValidationError as e:
            await _refuse(msg, now, e)
            return
        explained = self.explain(now, stale_ok_s=STALE_OK_S)
        assert explained.entries is not None and explained.reasons is not None
        entries = explained.entries
        if scope is not None:
            entries = [e for e in entries if s.allocation_token(e.workload.allocation) == scope]
        rows = tuple(
            queue_row(e, explained.reasons.get(e.workload.id), now, leader.ranking)
            for e in entries[: m.MAX_QUEUE_ROWS]
        )
        free = free_gpus(leader.fold)

        def snapshot(n: int) -> m.QueueSnapshot:
            return m.QueueSnapshot(
                at=now, epoch=leader.epoch, free_gpus=free, rows=rows[:n], total=len(entries)
            )

        await msg.respond(codec.encode_within(snapshot, len(rows), self._max_payload()))

    async def _on_query_allocations(self, msg: Msg) -> None:
        await msg.respond(_ENC.encode(allocations(self.leader.fold, wall_clock())))

    async def _on_query_placement_stats(self, msg: Msg) -> None:
        """The cycle-duration histogram since this instance became leader; ``cycles`` and
        ``decisions`` count since it started."""
        leader = self.leader
        h = leader.cycle_durations
        stats = m.PlacementStats(
            at=wall_clock(),
            epoch=leader.epoch,
            cycles=leader.cycles,
            decisions=leader.decisions,
            buckets_s=h.buckets_s,
            counts=h.counts(),
            sum_s=h.sum_s,
            count=h.count,
            decide_s=h.decide_s,
            append_wait_s=h.append_wait_s,
        )
        await msg.respond(_ENC.encode(stats))

    async def _on_query_prio(self, msg: Msg) -> None:
        """``allot prio``: each pending position broken into its inputs (the core's
        ``priority_breakdown`` over the same snapshot a cycle would read)."""
        leader = self.leader
        now = wall_clock()
        try:
            scope = query_scope(msg.subject, s.QUERY_PRIO, leader.fold.tree)
        except ValidationError as e:
            await _refuse(msg, now, e)
            return
        ranking = leader.ranking
        rows = priority_breakdown(
            ranking.snapshot(leader.fold),
            leader.policy,
            now,
            fairshare=ranking.fairshare,
            rank=ranking.rank_of,
        )
        if scope is not None:
            rows = [r for r in rows if s.allocation_token(r.allocation) == scope]
        wire = prio_rows(rows)

        def prio_snapshot(n: int) -> m.PrioSnapshot:
            return m.PrioSnapshot(at=now, rows=wire[:n], total=len(rows))

        await msg.respond(codec.encode_within(prio_snapshot, len(wire), self._max_payload()))

    def _max_payload(self) -> int:
        nc = self.leader.nc
        return codec.answer_limit(nc.max_payload if nc is not None else 0)

    async def _on_query_hosts(self, msg: Msg) -> None:
        """One page: the hosts after the query's ``after``, as many as one message holds
        (10,000 hosts' rows are more than NATS's 1 MiB)."""
        now = wall_clock()
        try:
            first = msg.data.strip() in (b"", b"{}")  # as this query was asked before pages
            query = m.HostsQuery() if first else codec.decode_as(m.HostsQuery, msg.data)
        except ValidationError as e:
            await _refuse(msg, now, e)
            return
        await msg.respond(hosts_page(self.leader.fold, query, now, self._max_payload()))

    async def _on_query_status(self, msg: Msg) -> None:
        leader = self.leader
        now = wall_clock()
        try:
            query = codec.decode_as(m.StatusQuery, msg.data)
            scope = query_scope(msg.subject, s.QUERY_STATUS, leader.fold.tree)
        except ValidationError as e:
            await _refuse(msg, now, e)
            return
        rec = leader.fold.records.get(query.workload_id)
        if rec is not None and scope is not None:
            # Another allocation's workload is "unknown": a team learns nothing of it.
            rec = rec if s.allocation_token(rec.workload.allocation) == scope else None
        if rec is None:
            status = m.WorkloadStatus(workload_id=query.workload_id, state="unknown")
        else:
            if rec.run_started_at is None and rec.status != "pending" and not leader.reads_starts:
                await self._read_start(rec)
            position = None
            if rec.status == "pending":
                entries = queue_order(leader.ranking.snapshot(leader.fold), leader.policy)
                position = next(
                    (e.position for e in entries if e.workload.id == rec.workload.id), None
                )
            status = workload_status(leader.fold, rec, position)
        await msg.respond(_ENC.encode(status))

    async def _read_start(self, rec: WorkloadRecord) -> None:
        """The start of ``rec``'s last attempt, read from the log when asked (the follower
        skips starts, ``DECISION_INPUTS``): the last record on the workload's own
        ``started`` subject, kept in the fold once found."""
        js = self.leader.js
        assert js is not None
        w = rec.workload
        try:
            last = await js.get_last_msg("WORKLOADS", s.events(w.allocation, w.id, "started"))
            record = bus.decode_record(last.subject or "", last.data or b"")
        except (NotFoundError, ValidationError):
            return  # not started yet (or unreadable: shown as not started)
        except (nats.errors.Error, TimeoutError) as e:
            log.warning("start not read for status", workload=w.id, error=repr(e))
            return
        self.leader.fold.apply(record)


def _expiry(now: float, result: CycleResult) -> float:
    """Until when a dry run at ``now`` stands for the fold: its next wakeup (a notice
    deadline, a protection end it waits on, a drain due), at most REASONS_MAX_AGE_S."""
    expires = now + REASONS_MAX_AGE_S
    if result.next_wakeup is not None:
        expires = min(expires, result.next_wakeup)
    return expires


async def _refuse(msg: Msg, now: float, e: ValidationError) -> None:
    await msg.respond(_ENC.encode(m.CommandRejected(at=now, field=e.field, reason=e.reason)))
