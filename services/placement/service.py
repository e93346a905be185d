"""Placement: the one writer of scheduling decisions, calling the core's ``run_cycle``.

Every instance follows the log from the start (``LogFollower`` into a ``LogFold``: HOSTS,
then the budget tree, then WORKLOADS), so a standby is always warm. One instance holds the
lease (NATS KV bucket ``allot_leader``, key ``placement``, TTL ``lease_ttl_s``): it is
created with ``create`` (fails if held) and renewed with ``update(last=revision)``; the
revision of the winning ``create`` is the leader's **epoch**, strictly increasing. The new
leader appends ``LeaderElected(epoch)`` and acts only once its own fold has applied it;
every decision carries the epoch and folds ignore decisions of older epochs, so a paused
old leader cannot double-book GPUs (fencing).

The leader runs a cycle when the fold changed (a submission, an end, a host change, a new
budget tree or ranking) or at the core's ``next_wakeup``, and never while its previous
decisions have not come back through the log: the state a cycle sees is always the fold of
the log, the same state a standby or a restarted instance rebuilds. Decisions go out as
``WorkloadPlaced`` (agents start the work), ``PreemptionNotice`` (owners and agents; the
agent sends SIGTERM and SIGKILL at the grace deadline) and ``HostDrained``. Informational
records (``WorkloadRequeued``, ``WorkloadCancelled`` of pending work) are published by the
leader as it sees the records that cause them; queue positions (``WorkloadQueued``) go to
``allot.v1.queued.<alloc>.<workload>`` on core NATS, at most once a second, not to the log.

Queries (core-NATS request/reply, answered by the leader only): ``allot.v1.query.queue``
(``QueueSnapshot``), ``allot.v1.query.prio`` (``PrioSnapshot``), ``allot.v1.query.hosts``
(``HostsSnapshot``, with each drain's reason, operator and time: ``host_rows``),
``allot.v1.query.status`` (``StatusQuery`` -> ``WorkloadStatus``; an ended workload's last
attempt and how it ended, like ``sacct``: ``workload_status``),
``allot.v1.query.allocations`` (``AllocationsSnapshot``: budget, entitlement and held GPUs
per leaf) and ``allot.v1.query.placement_stats`` (``PlacementStats``: the cycle-duration
histogram since this instance became leader). The per-allocation forms
``allot.v1.query.{queue,prio,status}.<alloc>`` answer that allocation's work only; an
allocation the budget tree lacks is refused (``CommandRejected`` naming ``allocation``:
``query_scope``), so a typo is not mistaken for an allocation with nothing pending.

Why pending. Each ``QueueRow`` (and ``WorkloadQueued.why``) carries the core's reason
(``allot.core.reasons``, ``docs/reasons.md``): ``explain_pending`` over a DRY
``run_cycle`` of the fold as it is (pure: nothing is published), so work the next cycle
would start reads ``starts-next-cycle`` and the rest the reason that cycle would leave it
pending for. ``est_start`` is an ESTIMATE (``estimated_start``: the notice deadline, the
protection end, or now). The answer is cached per fold state (records applied, epochs,
ranking version) until the dry run's next wakeup or ``REASONS_MAX_AGE_S``, whichever is
first, and a real cycle's result seeds the cache: repeated queries cost nothing, and one
uncached answer on 1,000 hosts with 10,000 pending costs ~0.1 s (``bench/bench_reasons.py``).
Under load (records arriving all the time) an answer up to ``STALE_OK_S`` old is served,
and ``WorkloadQueued`` batches are spaced so they take at most ``QUEUED_COST_SHARE`` of
the leader's time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import socket
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue
from opentelemetry import context as otel_context
from opentelemetry import trace

from allot import bus
from allot.bus import group_commit
from allot.bus.runtime import configure_logging, make_broker, tracer_provider, wall_clock
from allot.bus.service_main import base_parser, run_main
from allot.bus.tasks import stop_tasks
from allot.core.budgets import BudgetTree
from allot.core.cycle import Snapshot, run_cycle
from allot.core.decisions import CycleResult
from allot.core.errors import ValidationError
from allot.core.model import HostState
from allot.core.policy import POLICIES, make_policy
from allot.core.queue_view import TIER_NAMES, UNALLOCATED, QueueEntry, queue_order
from allot.core.reasons import Why, estimated_start, explain_pending, priority_breakdown
from allot.eventlog.logfold import TERMINAL, LogFold, WorkloadRecord
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s

LEADER_BUCKET = "allot_leader"
LEASE_KEY = "placement"
QUEUED_EVERY_S = 1.0
QUEUED_COST_SHARE = 0.05
"""``WorkloadQueued`` batches take at most this share of the leader's time: the next batch
waits ``cost / QUEUED_COST_SHARE`` when explaining the queue took ``cost`` (10,000 pending:
~0.1 s, so one batch every ~2 s instead of every second)."""
STALE_OK_S = 1.0
"""A queue answer (positions and reasons) at most this old is served even if records
arrived since: under load the fold changes with every record, and recomputing it for
every query would take the leader's time from scheduling."""
"""At most one batch of ``WorkloadQueued`` per second (positions are costly to compute)."""
REASONS_MAX_AGE_S = 5.0
"""A cached queue explanation is recomputed at least this often (its ``in_s`` numbers and
texts age; codes change only with the fold or at the dry run's next wakeup)."""
CYCLE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Upper bounds of the cycle-duration histogram (``PlacementStats``); +Inf is implied."""
MAX_REASON_NUMBERS = 16

DECISION_INPUTS: tuple[str, ...] = (
    *(s.every_workload(e) for e in s.EVENT_NAMES if e != "started"),
    s.ALL_PREEMPT,
    s.LEADER,
)
"""What of WORKLOADS the placement follower reads: everything but runs' starts, which
decide nothing (protection counts from the placement) and come in bursts (an agent's
reports, group-committed every 250 ms: ~125 at a time at 500 runs/s), ahead of the
submissions placement waits for in the same stream. ``bench/bench_live.py --rates 500``,
pairs taken in turn, reading without the starts / with them: p99 35-43 / 46-63 ms on a
slow spell (2026-12-03 17:xx, a throwaway switch), 18.8 / 26.4, 19.2 / 25.9, 22.9 / 21.9,
22.9 / 27.0, 21.4 / 27.5 ms on a fast one (22:00-22:45); p50 the same. ``allot status``
reads a run's start when asked (``_read_start``)."""

_ENC = msgspec.json.Encoder()
_RANKING = msgspec.json.Decoder(m.RankingUpdated)

log = structlog.get_logger("allot.placement")
tracer = trace.get_tracer("allot.placement")


class CycleDurations:
    """A cumulative histogram of cycle durations, Prometheus style: ``counts[i]`` cycles
    took <= ``buckets_s[i]``; the last count (+Inf) is every cycle. Beside it, the sums
    of two parts of those durations: deciding, and waiting for the cycle's appends."""

    def __init__(self, buckets_s: Sequence[float] = CYCLE_BUCKETS_S) -> None:
        self.buckets_s = tuple(buckets_s)
        self._per_bucket = [0] * (len(self.buckets_s) + 1)  # not cumulative; last: +Inf
        self.sum_s = 0.0
        self.count = 0
        self.decide_s = 0.0
        self.append_wait_s = 0.0

    def observe(self, seconds: float, decide_s: float = 0.0, append_wait_s: float = 0.0) -> None:
        # bisect_left: a duration equal to a bound belongs to that bound's bucket (le).
        self._per_bucket[bisect_left(self.buckets_s, seconds)] += 1
        self.sum_s += seconds
        self.count += 1
        self.decide_s += decide_s
        self.append_wait_s += append_wait_s

    def counts(self) -> tuple[int, ...]:
        out: list[int] = []
        total = 0
        for n in self._per_bucket:
            total += n
            out.append(total)
        return tuple(out)


@dataclass(frozen=True, slots=True)
class _Explained:
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


class PlacementService:
    def __init__(
        self,
        nats_url: str,
        *,
        policy: str = "fairshare",
        grace_s: int = 300,
        lease_ttl_s: float = 3.0,
        name: str | None = None,
        tracing: bool = True,
    ) -> None:
        self.nats_url = nats_url
        self.policy = make_policy(policy, grace_s)
        self.lease_ttl_s = lease_ttl_s
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"[:64].replace(".", "-")
        provider = tracer_provider("placement") if tracing else None
        self.broker = make_broker(nats_url, "placement", provider)
        self.fold = LogFold()
        self.nc: NatsClient | None = None
        self.js: JetStreamContext | None = None
        self._appends: group_commit.GroupCommit | None = None
        self.follower: bus.LogFollower | None = None
        self.epoch = 0  # ours while leader; 0 otherwise
        self.leader = False
        self.order: dict[str, int] = {}
        self.fairshare: dict[str, float] = {}
        self.rank_of: dict[str, int] = {}
        self.window_gpu_s: dict[str, float] = {}
        self.cycles = 0
        self.cycle_durations = CycleDurations()
        self._ranking_version = 0
        self._explained: _Explained | None = None
        self._explain_cost_s = 0.0  # the last full explanation of the queue (seconds)
        self.decisions = 0
        self.caught_up = False
        self._dirty = asyncio.Event()
        self._awaiting_seq = 0
        self._next_wakeup: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._query_subs: list[Subscription] = []
        self._ranking_sub: Subscription | None = None
        self._new_pending: set[str] = set()
        self._reads_starts = True
        """Whether the log follower reads runs' starts (a server before 2.10 cannot skip
        them); otherwise ``allot status`` reads a run's start when asked."""
        self._last_queued_at = 0.0
        self._stopping = False
        # Trace context of each pending workload's submission: the placement decision
        # continues that trace (submit -> intake -> place is one trace).
        self._trace_of: dict[str, otel_context.Context] = {}

    # ------------------------------------------------------------------ lifecycle
    async def on_started(self) -> None:
        self.nc, self.js = await bus.connect(self.nats_url, f"allot-placement-{self.name}")
        await bus.ensure_streams(self.js)
        # A cycle that places many (a backlog, a freed host) stores them as atomic batches.
        self._appends = await group_commit.for_stream(self.nc, self.js, "WORKLOADS")
        await self._load_ranking()
        self._ranking_sub = await self.nc.subscribe(s.RANKING, cb=self._on_ranking)
        self._reads_starts = not bus.takes_several_filters(self.nc.connected_server_version)
        self.follower = bus.LogFollower(
            self.js,
            self._on_record,
            streams=("HOSTS", "USAGE", "WORKLOADS"),
            subjects={"USAGE": s.BUDGET_TREE}
            if self._reads_starts
            else {"USAGE": s.BUDGET_TREE, "WORKLOADS": DECISION_INPUTS},
        )
        await self.follower.start()
        self.caught_up = True
        log.info(
            "log replayed",
            hosts=len(self.fold.state.host_ids),
            pending=len(self.fold.queue),
            running=len(self.fold.state.running),
            epoch=self.fold.epoch,
        )
        self._tasks = [
            asyncio.create_task(self._lease_loop()),
            asyncio.create_task(self._cycle_loop()),
        ]

    async def on_stopping(self) -> None:
        self._stopping = True
        await stop_tasks(self._tasks)
        await self._step_down("stopping")
        if self.follower is not None:
            await self.follower.stop()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()

    # ------------------------------------------------------------------ the log
    def _on_record(self, _subject: str, record: msgspec.Struct) -> None:
        applied = self.fold.apply(record)
        if applied.changed:
            self._dirty.set()
        if isinstance(record, m.BudgetTreeSet):
            self._dirty.set()
        if not (self.leader and self.caught_up and self.fold.epoch == self.epoch):
            return
        # Informational records that follow from what was just applied.
        if isinstance(record, m.WorkloadSubmitted) and applied.changed:
            self._new_pending.add(record.workload_id)
            if trace.get_current_span().get_span_context().is_valid:
                self._trace_of[record.workload_id] = otel_context.get_current()
        elif isinstance(record, m.WorkloadPreempted) and applied.requeued:
            rec = self.fold.records[record.workload_id]
            self._spawn_publish(
                rec.workload.allocation,
                m.WorkloadRequeued(
                    workload_id=rec.workload.id,
                    allocation=rec.workload.allocation,
                    at=record.at,
                    attempt=rec.attempt,
                    epoch=self.epoch,
                ),
                f"requeued:{rec.workload.id}:{rec.attempt}",
            )
            self._new_pending.add(rec.workload.id)
        elif isinstance(record, m.CancelRequested) and applied.changed:
            rec = self.fold.records[record.workload_id]
            self._trace_of.pop(rec.workload.id, None)
            if rec.status == "cancelled":  # it was pending: nobody else will say it ended
                self._spawn_publish(
                    rec.workload.allocation,
                    m.WorkloadCancelled(
                        workload_id=rec.workload.id,
                        allocation=rec.workload.allocation,
                        at=record.at,
                        by=record.by,
                        reason=record.reason,
                        attempt=max(1, rec.attempt),
                    ),
                    f"cancelled:{rec.workload.id}",
                )

    async def _append(
        self, allocation: str | None, record: msgspec.Struct, msg_id: str, *, together: bool
    ) -> int:
        """Append a decision; its stream sequence. ``together``: one of several placements of
        a cycle, committed as one atomic batch (``GroupCommit.append``)."""
        assert self._appends is not None and self.follower is not None
        subject = bus.event_subject(allocation, record)
        # Every reader hands it over only once it has read HOSTS this far: the hosts it
        # names are registered there (``bus.HOSTS_SEQ_HEADER``).
        hosts_read = {bus.HOSTS_SEQ_HEADER: str(self.follower.last_seq.get("HOSTS", 0))}
        return (
            await self._appends.append(subject, record, msg_id, hosts_read, together=together)
        ).seq

    def _spawn_publish(self, allocation: str | None, record: msgspec.Struct, msg_id: str) -> None:
        assert self.js is not None
        subject = bus.event_subject(allocation, record)
        task = asyncio.create_task(bus.publish(self.js, subject, record, msg_id))
        task.add_done_callback(_log_failure)

    async def _load_ranking(self) -> None:
        assert self.js is not None
        try:
            last = await self.js.get_last_msg("USAGE", s.RANKING)
        except NotFoundError:
            return
        with contextlib.suppress(msgspec.ValidationError, msgspec.DecodeError):
            self._use_ranking(_RANKING.decode(last.data or b""))

    async def _on_ranking(self, msg: Msg) -> None:
        try:
            self._use_ranking(_RANKING.decode(msg.data))
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            log.warning("bad ranking message", error=str(e))
            return
        self._dirty.set()

    def _use_ranking(self, ranking: m.RankingUpdated) -> None:
        leaves = [row for row in ranking.nodes if row.leaf and row.rank is not None]
        n = len(leaves)
        self.rank_of = {row.name: row.rank for row in leaves if row.rank is not None}
        self.order = {name: n - r for name, r in self.rank_of.items()}
        self.fairshare = {row.name: row.fairshare or 0.0 for row in leaves}
        self.window_gpu_s = {row.name: max(0.0, row.raw_usage) for row in leaves}
        self._ranking_version += 1

    def _ranking_numbers(self, victim: str | None, preemptor: str | None) -> dict[str, Any]:
        """The Fair Tree numbers behind a notice: window usage, rank and fairshare factor of
        the victim's and the preemptor's allocations, as last ranked (absent when unknown)."""
        out: dict[str, Any] = {}
        if victim is not None:
            out["victim_window_gpu_s"] = self.window_gpu_s.get(victim)
            out["victim_rank"] = self.rank_of.get(victim)
            out["victim_fairshare"] = self.fairshare.get(victim)
        rec = self.fold.records.get(preemptor) if preemptor is not None else None
        alloc = rec.workload.allocation if rec is not None else None
        if alloc is not None:
            out["preemptor_allocation"] = alloc
            out["preemptor_window_gpu_s"] = self.window_gpu_s.get(alloc)
            out["preemptor_rank"] = self.rank_of.get(alloc)
            out["preemptor_fairshare"] = self.fairshare.get(alloc)
        return out

    # ------------------------------------------------------------------ leadership
    async def _lease_loop(self) -> None:
        """Take the lease when it is free, renew it while leading. Nothing NATS raises may
        end this task: a dead lease loop is an instance that never leads again (``make
        chaos-cluster``, 2026-12-02 17:51: the LeaderElected append failing during a stream
        leader's election ended both instances' loops, and nothing was placed after)."""
        assert self.js is not None
        kv = None
        while kv is None and not self._stopping:
            try:
                kv = await self.js.create_key_value(
                    bucket=LEADER_BUCKET,
                    ttl=self.lease_ttl_s,
                    history=1,
                    replicas=bus.stream_replicas(),
                )
            except Exception as e:  # NATS unavailable: retry
                log.warning("lease bucket not ready", error=str(e))
                await asyncio.sleep(self.lease_ttl_s / 4)
        if kv is None:
            return
        revision = 0
        while not self._stopping:
            if not self.leader:
                try:
                    revision = await kv.create(LEASE_KEY, self.name.encode())
                except KeyWrongLastSequenceError:
                    await asyncio.sleep(self.lease_ttl_s / 4)
                    continue
                except Exception as e:  # NATS unavailable: retry
                    log.warning("lease create failed", error=str(e))
                    await asyncio.sleep(self.lease_ttl_s / 4)
                    continue
                try:
                    await self._become_leader(revision, kv)
                except Exception as e:  # the LeaderElected append failed: let the lease go
                    log.warning("leadership not taken", epoch=revision, error=repr(e))
                    await self._step_down(f"taking leadership failed: {e!r}")
                    with contextlib.suppress(Exception):
                        await kv.delete(LEASE_KEY)
                    await asyncio.sleep(self.lease_ttl_s / 4)
            else:
                await asyncio.sleep(self.lease_ttl_s / 3)
                try:
                    revision = await kv.update(LEASE_KEY, self.name.encode(), last=revision)
                except Exception as e:
                    await self._step_down(f"lease lost: {e}")

    async def _become_leader(self, epoch: int, kv: KeyValue) -> None:
        assert self.js is not None and self.follower is not None and self.nc is not None
        record = m.LeaderElected(epoch=epoch, leader=self.name, at=wall_clock())
        seq = await bus.publish(self.js, s.LEADER, record, f"leader:{epoch}")
        await self.follower.wait_for("WORKLOADS", seq, timeout=10.0)
        if self.fold.epoch != epoch:
            log.warning("elected but the log shows a newer epoch", ours=epoch, log=self.fold.epoch)
            with contextlib.suppress(Exception):
                await kv.delete(LEASE_KEY)
            return
        self.epoch = epoch
        self.leader = True
        self._awaiting_seq = seq
        self._new_pending = {w.id for w in self.fold.queue}
        self.cycle_durations = CycleDurations()
        for subject, handler in (
            (s.QUERY_QUEUE, self._on_query_queue),
            (s.QUERY_PRIO, self._on_query_prio),
            (s.QUERY_HOSTS, self._on_query_hosts),
            (s.QUERY_STATUS, self._on_query_status),
            (s.ALL_QUERY_QUEUE, self._on_query_queue),
            (s.ALL_QUERY_PRIO, self._on_query_prio),
            (s.ALL_QUERY_STATUS, self._on_query_status),
            (s.QUERY_ALLOCATIONS, self._on_query_allocations),
            (s.QUERY_PLACEMENT_STATS, self._on_query_placement_stats),
        ):
            self._query_subs.append(
                await self.nc.subscribe(subject, cb=bus.inbox_replies_only(handler))
            )
        log.info("leader", epoch=epoch, name=self.name)
        self._dirty.set()

    async def _step_down(self, why: str) -> None:
        if self.leader:
            log.warning("stepping down", epoch=self.epoch, why=why)
        self.leader = False
        self.epoch = 0
        for sub in self._query_subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._query_subs.clear()

    # ------------------------------------------------------------------ cycles
    async def _cycle_loop(self) -> None:
        while not self._stopping:
            timeout = None
            if self._next_wakeup is not None:
                timeout = max(0.0, self._next_wakeup - wall_clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), timeout)
            self._dirty.clear()
            if not self.leader or self.fold.epoch != self.epoch or self.follower is None:
                continue
            if self.follower.last_seq.get("WORKLOADS", 0) < self._awaiting_seq:
                continue  # our last decisions are not back yet: the record will wake us
            try:
                await self._cycle()
            except Exception:
                log.exception("cycle failed")
                await asyncio.sleep(0.5)
                self._dirty.set()

    async def _cycle(self) -> None:
        assert self.js is not None
        started = time.perf_counter()
        now = wall_clock()
        snapshot = self._snapshot()
        # The new pending work this cycle decides on. Work submitted while its decisions
        # are being appended is the next cycle's: its queue position would be computed (a
        # dry run over the whole queue) only to be overtaken by its placement a moment later.
        considered = set(self._new_pending)
        result = run_cycle(snapshot, self.policy, now)
        decided = time.perf_counter()
        self.cycles += 1
        # Until its decisions come back, the fold is the one this result was computed on:
        # it is the dry run a queue query would compute (see _explain). A cached answer for
        # this very fold stays (the same decisions, already explained), and so does an
        # explained answer younger than STALE_OK_S (queries may serve it under load).
        key, cached = self._fold_key(), self._explained
        if (
            cached is None
            or (cached.key != key and not cached.serves(key, now, STALE_OK_S))
            or now >= cached.expires
        ):
            self._explained = _Explained(key, now, self._expiry(now, result), result)
        self._next_wakeup = result.next_wakeup
        publishes: list[Awaitable[int]] = []
        epoch = self.epoch
        for p in result.preemptions:
            rec = self.fold.records[p.workload_id]
            # Filed, like every other event of the workload, under the allocation it was
            # submitted to, also when it runs unallocated (``min_runtime_s`` 0: charged to
            # nobody, ``p.allocation`` None); until 2026-12-03 such a notice went to
            # ``preempt.~.<w>`` and neither its team's subscribers nor `allot watch` saw it.
            filed = rec.workload.allocation
            publishes.append(
                bus.publish(
                    self.js,
                    s.preempt(filed, p.workload_id),
                    m.PreemptionNotice(
                        workload_id=p.workload_id,
                        allocation=filed,
                        at=now,
                        reason=p.reason.value,
                        grace_deadline=p.preempt_at,
                        requeue=p.requeue,
                        gpus=p.gpus,
                        preemptor=p.preemptor,
                        victim_held_gpus=p.victim_held_gpus,
                        victim_entitlement_gpus=max(0.0, p.victim_entitlement_gpus),
                        attempt=rec.attempt,
                        epoch=epoch,
                        **self._ranking_numbers(p.allocation, p.preemptor),
                    ),
                    f"notice:{p.workload_id}:{rec.attempt}:{epoch}",
                )
            )
        # A cycle's placements go to the log as one atomic batch: one fsync for the cycle
        # instead of one each, so the stream's one writer is free sooner for the
        # submissions queued behind it. Measured with `bench/bench_live.py --rates 500
        # --no-write`, ten pairs taken in turn on a slow spell (2026-12-03 15:11-15:27):
        # p50 lower in 8 of 10 (median 16.4 against 24 ms), p99 in 8 of 10 (97 against 120).
        together = len(result.placements) > 1
        for placement in result.placements:
            w = placement.workload
            attempt = self.fold.records[w.id].attempt + 1
            parent = self._trace_of.pop(w.id, None)
            with tracer.start_as_current_span(
                "placement.decide",
                context=parent,
                attributes={"allot.workload": w.id, "allot.allocation": w.allocation or "~"},
            ):
                # The task copies the current context now: its publish carries this span.
                publish = asyncio.ensure_future(
                    self._append(
                        w.allocation,
                        m.WorkloadPlaced(
                            workload_id=w.id,
                            allocation=w.allocation,
                            at=now,
                            gpus=w.gpus,
                            assignment=tuple(
                                m.HostGpus(host=h, gpus=g) for h, g in placement.assignment
                            ),
                            min_runtime_s=w.min_runtime_s,
                            attempt=attempt,
                            epoch=epoch,
                        ),
                        f"placed:{w.id}:{attempt}",
                        together=together,
                    )
                )
            publishes.append(publish)
            self._new_pending.discard(w.id)
        for t in result.transitions:
            if t.state is HostState.DRAINED:
                publishes.append(
                    bus.publish(
                        self.js,
                        s.host_state(t.host),
                        m.HostDrained(host=t.host, at=now, epoch=epoch),
                        f"drained:{t.host}:{epoch}:{self.cycles}",
                    )
                )
        append_wait_s = 0.0
        if publishes:
            appending = time.perf_counter()
            seqs = await asyncio.gather(*publishes[: len(publishes) - len(result.transitions)])
            if len(result.transitions):
                await asyncio.gather(*publishes[len(seqs) :])
            append_wait_s = time.perf_counter() - appending
            self.decisions += len(publishes)
            if seqs:
                self._awaiting_seq = max(seqs)
            log.info(
                "cycle",
                epoch=epoch,
                placed=len(result.placements),
                noticed=len(result.preemptions),
                pending=len(self.fold.queue),
            )
        every = max(QUEUED_EVERY_S, self._explain_cost_s / QUEUED_COST_SHARE)
        waiting = considered & self._new_pending  # those it placed are gone
        if waiting and now - self._last_queued_at >= every:
            await self._publish_queued(now, waiting)
        elif waiting:
            # Wake for the next batch of positions, sooner than the core's next wake-up (a
            # protection end may be hours away).
            due = self._last_queued_at + every
            self._next_wakeup = due if self._next_wakeup is None else min(self._next_wakeup, due)
        self.cycle_durations.observe(
            time.perf_counter() - started, decided - started, append_wait_s
        )

    async def _publish_queued(self, now: float, waiting: set[str]) -> None:
        """``WorkloadQueued`` for ``waiting``: new pending work a cycle left pending."""
        assert self.js is not None
        self._last_queued_at = now
        fresh = {wid for wid in waiting if wid in self.fold.queue}
        self._new_pending -= waiting
        if not fresh:
            return
        explained = self._explain(now, stale_ok_s=STALE_OK_S)
        assert explained.entries is not None and explained.reasons is not None
        assert self.nc is not None
        for entry in explained.entries:
            w = entry.workload
            if w.id not in fresh:
                continue
            row = self._queue_row(entry, explained.reasons.get(w.id), now)
            # Derived and re-published as the queue moves: core NATS, not the log.
            await self.nc.publish(
                s.queued(w.allocation, w.id),
                bus.encode(
                    m.WorkloadQueued(
                        workload_id=w.id,
                        allocation=w.allocation,
                        at=now,
                        position=row.position,
                        sort_metric=row.sort_metric,
                        rank=row.rank,
                        why=row.why,
                        reason=row.reason,
                        est_start=row.est_start,
                    )
                ),
            )

    # ------------------------------------------------------------------ views
    def _snapshot(self) -> Snapshot:
        return Snapshot(self.fold.state, self.fold.queue, self.fold.shares(), self.order)

    def _queue_entries(self) -> list[QueueEntry]:
        return queue_order(self._snapshot(), self.policy)

    def _fold_key(self) -> tuple[int, ...]:
        """Changes whenever a cycle's inputs may have: every record the fold applied
        (workloads, hosts, budget tree, leader), our epoch, the ranking."""
        return (self.fold.applied, self.fold.epoch, self.epoch, self._ranking_version)

    def _expiry(self, now: float, result: CycleResult) -> float:
        """Until when a dry run at ``now`` stands for the fold: its next wakeup (a notice
        deadline, a protection end it waits on, a drain due), at most REASONS_MAX_AGE_S."""
        expires = now + REASONS_MAX_AGE_S
        if result.next_wakeup is not None:
            expires = min(expires, result.next_wakeup)
        return expires

    def _explain(self, now: float, stale_ok_s: float = 0.0) -> _Explained:
        """Positions and reasons of every pending workload: the cached answer while the
        fold is unchanged and it has not expired (or it is younger than ``stale_ok_s``),
        else a dry ``run_cycle`` (pure: the snapshot is only read and nothing is published)
        and ``explain_pending``."""
        key = self._fold_key()
        cached = self._explained
        if cached is not None and cached.serves(key, now, stale_ok_s):
            return cached
        if cached is not None and (cached.key != key or now >= cached.expires):
            cached = None
        if cached is not None and cached.reasons is not None:
            return cached
        started = time.perf_counter()
        snapshot = self._snapshot()
        if cached is None:
            result = run_cycle(snapshot, self.policy, now)
            cached = _Explained(key, now, self._expiry(now, result), result)
        entries = queue_order(snapshot, self.policy)
        reasons = explain_pending(
            snapshot, self.policy, cached.at, cached.result, dry_run=True, entries=entries
        )
        self._explained = _Explained(
            key, cached.at, cached.expires, cached.result, entries, reasons
        )
        self._explain_cost_s = time.perf_counter() - started
        return self._explained

    def _sort_metric(self, entry: QueueEntry) -> float:
        """Tier index plus (1 - Fair Tree factor): smaller is served first."""
        if entry.tier == UNALLOCATED or entry.workload.allocation is None:
            return float(UNALLOCATED)
        return entry.tier + (1.0 - self.fairshare.get(entry.workload.allocation, 0.0))

    def _free_gpus(self) -> int:
        st = self.fold.state
        return sum(len(f) for h, f in st.free.items() if st.host(h).schedulable)

    async def _on_query_queue(self, msg: Msg) -> None:
        """The whole queue, or (``allot.v1.query.queue.<alloc>``) one allocation's rows with
        their cluster-wide positions, ``total`` counting that allocation's."""
        now = wall_clock()
        try:
            scope = query_scope(msg.subject, s.QUERY_QUEUE, self.fold.tree)
        except ValidationError as e:
            await _refuse(msg, now, e)
            return
        explained = self._explain(now, stale_ok_s=STALE_OK_S)
        assert explained.entries is not None and explained.reasons is not None
        entries = explained.entries
        if scope is not None:
            entries = [e for e in entries if s.allocation_token(e.workload.allocation) == scope]
        rows = tuple(
            self._queue_row(e, explained.reasons.get(e.workload.id), now)
            for e in entries[: m.MAX_QUEUE_ROWS]
        )
        free = self._free_gpus()

        def snapshot(n: int) -> m.QueueSnapshot:
            return m.QueueSnapshot(
                at=now, epoch=self.epoch, free_gpus=free, rows=rows[:n], total=len(entries)
            )

        await msg.respond(encode_within(snapshot, len(rows), self._max_payload()))

    def _queue_row(self, e: QueueEntry, why: Why | None, now: float) -> m.QueueRow:
        w = e.workload
        est = estimated_start(why, now) if why is not None else None
        return m.QueueRow(
            position=e.position,
            workload_id=w.id,
            allocation=w.allocation,
            user=w.user,
            gpus=w.gpus,
            kind=w.kind,
            tier=TIER_NAMES[e.tier],  # type: ignore[arg-type]
            rank=self.rank_of.get(w.allocation or ""),
            fairshare=self.fairshare.get(w.allocation or ""),
            sort_metric=self._sort_metric(e),
            priority=w.priority,
            submitted_at=w.submit_time,
            why=_text(why.text) if why is not None else "",
            reason=why.code.value if why is not None else "",
            reason_numbers=_wire_numbers(why.numbers) if why is not None else {},
            est_start=None if est is None else min(max(est, 0.0), m.MAX_TIME),
        )

    async def _on_query_allocations(self, msg: Msg) -> None:
        """Per leaf of the budget tree: its effective share, entitlement (effective share x
        GPUs on healthy hosts, what the cycle's tiers use), the GPUs its allocated work
        holds now (including work under notice) and its allocated work still pending."""
        st = self.fold.state
        tree = self.fold.tree
        shares = self.fold.shares()
        healthy = st.healthy_gpus
        rows = []
        for leaf in tree.leaves() if tree is not None else ():
            share = min(1.0, max(0.0, shares.get(leaf, 0.0)))
            pending = [w for _, w in self.fold.queue.groups.get(leaf, ())]
            rows.append(
                m.AllocationRow(
                    allocation=leaf,
                    effective_share=share,
                    entitlement_gpus=share * healthy,
                    held_gpus=st.held.get(leaf, 0),
                    pending_workloads=len(pending),
                    pending_gpus=sum(w.gpus for w in pending),
                )
            )
        snap = m.AllocationsSnapshot(
            at=wall_clock(),
            healthy_gpus=healthy,
            total_gpus=sum(h.gpus for h in st.hosts),
            rows=tuple(rows),
        )
        await msg.respond(_ENC.encode(snap))

    async def _on_query_placement_stats(self, msg: Msg) -> None:
        """The cycle-duration histogram since this instance became leader; ``cycles`` and
        ``decisions`` count since it started."""
        h = self.cycle_durations
        stats = m.PlacementStats(
            at=wall_clock(),
            epoch=self.epoch,
            cycles=self.cycles,
            decisions=self.decisions,
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
        now = wall_clock()
        try:
            scope = query_scope(msg.subject, s.QUERY_PRIO, self.fold.tree)
        except ValidationError as e:
            await _refuse(msg, now, e)
            return
        snapshot = Snapshot(self.fold.state, self.fold.queue, self.fold.shares(), self.order)
        rows = priority_breakdown(
            snapshot, self.policy, now, fairshare=self.fairshare, rank=self.rank_of
        )
        if scope is not None:
            rows = [r for r in rows if s.allocation_token(r.allocation) == scope]
        wire = tuple(
            m.PrioRow(
                position=r.position,
                workload_id=r.workload_id,
                allocation=r.allocation,
                user=r.user,
                gpus=r.gpus,
                tier=r.tier,
                tier_name=r.tier_name,
                held=r.held,
                entitlement=max(0.0, r.entitlement),
                order_key=r.order_key,
                rank=r.rank,
                fairshare=r.fairshare,
                priority=r.priority,
                age_s=max(0.0, r.age_s),
            )
            for r in rows[: m.MAX_QUEUE_ROWS]
        )

        def prio_snapshot(n: int) -> m.PrioSnapshot:
            return m.PrioSnapshot(at=now, rows=wire[:n], total=len(rows))

        await msg.respond(encode_within(prio_snapshot, len(wire), self._max_payload()))

    def _max_payload(self) -> int:
        """The server's message size limit (its INFO), 1 MiB before we know it."""
        limit = self.nc.max_payload if self.nc is not None else 0
        return limit if limit > 0 else 1024 * 1024

    async def _on_query_hosts(self, msg: Msg) -> None:
        snapshot = m.HostsSnapshot(at=wall_clock(), hosts=host_rows(self.fold))
        await msg.respond(_ENC.encode(snapshot))

    async def _on_query_status(self, msg: Msg) -> None:
        now = wall_clock()
        try:
            query = codec.decode_as(m.StatusQuery, msg.data)
            scope = query_scope(msg.subject, s.QUERY_STATUS, self.fold.tree)
        except ValidationError as e:
            await _refuse(msg, now, e)
            return
        rec = self.fold.records.get(query.workload_id)
        if rec is not None and scope is not None:
            # Another allocation's workload is "unknown": a team learns nothing of it.
            rec = rec if s.allocation_token(rec.workload.allocation) == scope else None
        if rec is None:
            status = m.WorkloadStatus(workload_id=query.workload_id, state="unknown")
        else:
            if rec.run_started_at is None and rec.status != "pending" and not self._reads_starts:
                await self._read_start(rec)
            position = None
            if rec.status == "pending":
                position = next(
                    (e.position for e in self._queue_entries() if e.workload.id == rec.workload.id),
                    None,
                )
            status = workload_status(self.fold, rec, position)
        await msg.respond(_ENC.encode(status))

    async def _read_start(self, rec: WorkloadRecord) -> None:
        """The start of ``rec``'s last attempt, read from the log when asked (the follower
        skips starts, ``DECISION_INPUTS``): the last record on the workload's own
        ``started`` subject, kept in the fold once found."""
        assert self.js is not None
        w = rec.workload
        try:
            last = await self.js.get_last_msg("WORKLOADS", s.events(w.allocation, w.id, "started"))
            record = bus.decode_record(last.subject or "", last.data or b"")
        except (NotFoundError, ValidationError):
            return  # not started yet (or unreadable: shown as not started)
        except (nats.errors.Error, TimeoutError) as e:
            log.warning("start not read for status", workload=w.id, error=repr(e))
            return
        self.fold.apply(record)

    def stats(self) -> dict[str, Any]:
        return {
            "leader": self.leader,
            "epoch": self.epoch,
            "cycles": self.cycles,
            "decisions": self.decisions,
            "pending": len(self.fold.queue),
            "running": len(self.fold.state.running),
            "ignored_records": self.fold.ignored,
        }


def workload_status(fold: LogFold, rec: WorkloadRecord, position: int | None) -> m.WorkloadStatus:
    """``allot status``: where ``rec`` is now. A running workload shows its current attempt;
    an ended one (completed, failed, cancelled, preempted) its last attempt's start and
    hosts and how it ended, like ``sacct``; a pending one neither."""
    run = fold.state.running.get(rec.workload.id)
    ended = rec.status in TERMINAL
    shown = run is not None or ended  # a requeued workload's last run is not its present
    requeued = rec.status == "pending" and rec.attempt > 0
    return m.WorkloadStatus(
        workload_id=rec.workload.id,
        state=rec.status,
        allocation=rec.workload.allocation,
        user=rec.workload.user,
        gpus=rec.workload.gpus,
        attempt=rec.attempt,
        submitted_at=rec.workload.submit_time,
        started_at=rec.started_at if shown else None,
        run_started_at=rec.run_started_at if shown else None,
        protected_until=run.protected_until if run is not None else None,
        preempt_at=rec.preempt_at,
        assignment=(tuple(m.HostGpus(host=h, gpus=g) for h, g in rec.assignment) if shown else ()),
        position=position,
        ended_at=rec.ended_at if ended else None,
        exit_code=rec.exit_code if ended else None,
        reason=rec.end_reason if ended else "",
        cancelled_by=rec.ended_by if ended else None,
        requeued_at=rec.requeued_at if requeued else None,
        requeue_reason=rec.requeue_reason if requeued else "",
        command=rec.command,
        env_names=tuple(sorted(rec.env)),
    )


def host_rows(fold: LogFold) -> tuple[m.HostRow, ...]:
    """``allot hosts``: every host's state, free GPUs and work, and for a draining or
    drained one the drain that put it there (reason, operator, time; like ``sinfo -R``)."""
    st = fold.state
    rows: list[m.HostRow] = []
    for h in st.host_ids:
        host = st.host(h)
        drain = fold.drains.get(h) if host.state is not HostState.HEALTHY else None
        rows.append(
            m.HostRow(
                host=h,
                state=host.state.value,
                gpus=host.gpus,
                free_gpus=len(st.free[h]),
                workloads=tuple(sorted(st.on_host[h]))[:1024],
                drain_reason=drain.reason if drain is not None else "",
                drain_by=drain.by if drain is not None else None,
                drain_at=drain.at if drain is not None else None,
            )
        )
    return tuple(rows)


def _text(text: str) -> str:
    """Within the wire's text limit (a gang's host list can be long)."""
    if len(text) <= m.MAX_TEXT_LEN:
        return text
    return text[: m.MAX_TEXT_LEN - 3] + "..."


def _wire_numbers(numbers: Mapping[str, float | int | str]) -> dict[str, float | int | str]:
    """``QueueRow.reason_numbers``: at most 16 entries, strings within the text limit, and
    a non-finite float (none is expected) as text, since JSON has no infinity."""
    out: dict[str, float | int | str] = {}
    for name, value in list(numbers.items())[:MAX_REASON_NUMBERS]:
        if isinstance(value, str):
            out[name] = _text(value)
        elif isinstance(value, float) and not math.isfinite(value):
            out[name] = str(value)
        else:
            out[name] = value
    return out


def encode_within(build: Callable[[int], msgspec.Struct], n: int, limit: int) -> bytes:
    """``build(k)`` encoded for the largest ``k <= n`` tried whose encoding fits in ``limit``
    bytes: a listing answer carries its first rows and its ``total``, never more than one
    NATS message holds (rows with long reasons are ~600 bytes: 2,000 of them do not fit
    in 1 MiB). Shrinks ``k`` in proportion to the overshoot, with a 10% margin."""
    k = n
    while True:
        data = _ENC.encode(build(k))
        if len(data) <= limit or k == 0:
            return data
        k = min(k - 1, int(k * limit / len(data) * 0.9))


def query_scope(subject: str, query: str, tree: BudgetTree | None) -> str | None:
    """The allocation token of a per-allocation query subject (``<query>.<token>``), None
    for the cluster-wide one. A token that is neither ``~`` (unallocated work) nor a leaf
    of ``tree`` raises ``ValidationError`` naming ``allocation``: its answer would be
    empty, as that of an allocation with nothing pending."""
    if not subject.startswith(query + "."):
        return None
    token = subject[len(query) + 1 :]
    if token == s.UNALLOCATED or (tree is not None and tree.is_leaf(token)):
        return token
    if tree is None:
        raise ValidationError("allocation", f"no allocation {token!r}: no budget tree is set yet")
    known = ", ".join(tree.leaves()[:20])
    if token in tree.index.position:  # work is submitted to leaves only
        raise ValidationError(
            "allocation", f"{token!r} is an account, not an allocation (allocations: {known})"
        )
    raise ValidationError(
        "allocation", f"no allocation {token!r} in the budget tree (allocations: {known})"
    )


async def _refuse(msg: Msg, now: float, e: ValidationError) -> None:
    await msg.respond(_ENC.encode(m.CommandRejected(at=now, field=e.field, reason=e.reason)))


def _log_failure(task: asyncio.Task[int]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("publish failed", error=str(task.exception()))


def build_parser() -> argparse.ArgumentParser:
    ap = base_parser("python -m allot.services.placement", __doc__)
    ap.add_argument("--policy", choices=POLICIES, default="fairshare")
    ap.add_argument("--grace-s", type=int, default=300, help="notice to GPUs free (seconds)")
    ap.add_argument("--lease-ttl-s", type=float, default=3.0, help="leader lease TTL")
    ap.add_argument("--name", default=None, help="instance name (default host-pid)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging("placement")
    return run_main(
        lambda a: PlacementService(
            a.nats_url,
            policy=a.policy,
            grace_s=a.grace_s,
            lease_ttl_s=a.lease_ttl_s,
            name=a.name,
        ),
        build_parser(),
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
