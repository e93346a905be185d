"""Placement: the one writer of scheduling decisions, calling the core's ``run_cycle``.

Every instance follows the log from the start (``LogFollower`` into a ``LogFold``: HOSTS,
then the budget tree, then WORKLOADS; and, with a follower of their own, the idle flags of
USAGE, fenced by attempt in the fold: docs/decisions/0055), so a standby is always warm.
One instance holds the leader lease and decides, each decision carrying its epoch
(``lease``).

The leader runs a cycle when the fold changed (a submission, an end, a host change, a new
budget tree or ranking) or at the core's ``next_wakeup``, and never while its previous
decisions have not come back through the log: the state a cycle sees is always the fold of
the log, the same state a standby or a restarted instance rebuilds. Decisions go out as
``WorkloadPlaced`` (agents start the work), ``PreemptionNotice`` (owners and agents; the
agent sends SIGTERM and SIGKILL at the grace deadline) and ``HostDrained`` (``records``).
Informational records (``WorkloadRequeued``, ``WorkloadCancelled`` of pending work) are
published by the leader as it sees the records that cause them; queue positions
(``WorkloadQueued``) go to ``allot.v1.queued.<alloc>.<workload>`` on core NATS, paced, not
to the log (``queued``). The leader answers queries on ``allot.v1.query.*`` (``queries``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Awaitable, Sequence
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from opentelemetry import context as otel_context
from opentelemetry import trace

from allot import bus
from allot.bus import group_commit
from allot.bus.replays import jetstream_delivery, replayed
from allot.bus.runtime import configure_logging, make_broker, tracer_provider, wall_clock
from allot.bus.service_main import add_short_lane_argument, base_parser, lane_hosts_of, run_main
from allot.bus.tasks import stop_tasks
from allot.core.cycle import run_cycle
from allot.core.model import DEFAULT_UNALLOCATED_GRACE_S
from allot.core.policy import DEFAULT_UNALLOCATED_SETTLE_S, POLICIES, make_policy
from allot.eventlog.last_ranking import LastRanking
from allot.eventlog.logfold import LogFold
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.services.placement.answers import queue_row
from allot.services.placement.histogram import CycleDurations
from allot.services.placement.lease import claim_epoch, hold_lease
from allot.services.placement.queries import STALE_OK_S, Queries
from allot.services.placement.queued import OwedPositions, queued
from allot.services.placement.records import Outgoing, cancelled, cycle_records, requeued

DECISION_INPUTS = s.RUNS_WITHOUT_STARTS
"""What of WORKLOADS the placement follower reads: everything but runs' starts, which
decide nothing (protection counts from the placement) and come in bursts ahead of the
submissions placement waits for in the same stream; ``allot status`` reads a run's start
when asked (``Queries._read_start``). Measured in
docs/decisions/0005-placement-on-the-workloads-stream.md."""

_RANKING = msgspec.json.Decoder(m.RankingUpdated)
ECHO_WAIT_S = 5.0
"""Longest wait for a cycle's own records to come back before the next cycle (tried again
after it: the next cycle must see them)."""

log = structlog.get_logger("allot.placement")
tracer = trace.get_tracer("allot.placement")


class PlacementService:
    def __init__(
        self,
        nats_url: str,
        *,
        policy: str = "fairshare",
        grace_s: int = 300,
        unallocated_grace_s: int = DEFAULT_UNALLOCATED_GRACE_S,
        unallocated_settle_s: float = DEFAULT_UNALLOCATED_SETTLE_S,
        short_lane: Sequence[str] = (),
        lease_ttl_s: float = bus.LEASE_TTL_S,
        name: str | None = None,
        tracing: bool = True,
    ) -> None:
        self.nats_url = nats_url
        self.policy = make_policy(policy, grace_s, unallocated_grace_s, unallocated_settle_s)
        self.policy.check_short_lane(short_lane, "--short-lane")
        self.lease_ttl_s = lease_ttl_s
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"[:64].replace(".", "-")
        provider = tracer_provider("placement") if tracing else None
        self.broker = make_broker(nats_url, "placement", provider)
        self.fold = LogFold(short_lane)
        self.nc: NatsClient | None = None
        self.js: JetStreamContext | None = None
        self._appends: group_commit.GroupCommit | None = None
        self.follower: bus.LogFollower | None = None
        self.idle_follower: bus.LogFollower | None = None
        """The idle flags (USAGE ``allot.v1.usage.idle.*.*``): a follower of their own, so
        the main one keeps its single USAGE filter (a server before 2.10 takes one)."""
        self.epoch = 0  # ours while leader; 0 otherwise
        self.leader = False
        self.ranking = LastRanking()
        self.cycles = 0
        self.cycle_durations = CycleDurations()
        self.queries = Queries(self)
        self.positions = OwedPositions()
        self.decisions = 0
        self.caught_up = False
        self._dirty = asyncio.Event()
        self._awaiting_seq = 0
        self._next_wakeup: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._query_subs: list[Subscription] = []
        self._ranking_sub: Subscription | None = None
        self.reads_starts = True
        """Whether the log follower reads runs' starts (a server before 2.10 cannot skip
        them); otherwise ``allot status`` reads a run's start when asked."""
        self.stopping = False
        self._lane_warned = False
        # Trace context of each pending workload's submission: the placement decision
        # continues that trace (submit -> intake -> place is one trace).
        self._trace_of: dict[str, otel_context.Context] = {}

    # ------------------------------------------------------------------ lifecycle
    async def on_started(self) -> None:
        self.nc, self.js = await bus.connect(self.nats_url, f"allot-placement-{self.name}")
        await bus.ensure_streams(self.js)
        # A cycle that places many (a backlog, a freed host) stores them as atomic batches.
        self._appends = await group_commit.for_stream(self.nc, self.js, "WORKLOADS")
        # Subscribed (on the server) before the last ranking is read: one published
        # between the two would otherwise be missed until the next.
        self._ranking_sub = await self.nc.subscribe(s.RANKING, cb=self._on_ranking)
        await bus.confirm_subscriptions(self.nc)
        await self._load_ranking()
        self.reads_starts = not bus.takes_several_filters(self.nc.connected_server_version)
        self.follower = bus.LogFollower(
            self.js,
            self._on_record,
            streams=("HOSTS", "USAGE", "WORKLOADS"),
            subjects={"USAGE": s.BUDGET_TREE}
            if self.reads_starts
            else {"USAGE": s.BUDGET_TREE, "WORKLOADS": DECISION_INPUTS},
        )
        await self.follower.start()
        self.idle_follower = bus.LogFollower(
            self.js, self._on_record, streams=("USAGE",), subjects={"USAGE": s.ALL_IDLE}
        )
        await self.idle_follower.start()
        self.caught_up = True
        log.info(
            "log replayed",
            hosts=len(self.fold.state.host_ids),
            pending=len(self.fold.queue),
            running=len(self.fold.state.running),
            idle_flagged=len(self.fold.idle_flags),
            epoch=self.fold.epoch,
        )
        self._check_lane()
        self._tasks = [
            asyncio.create_task(hold_lease(self.js, self, self.name, self.lease_ttl_s)),
            asyncio.create_task(self._cycle_loop()),
        ]

    async def on_stopping(self) -> None:
        self.stopping = True
        await stop_tasks(self._tasks)
        await self.step_down("stopping")
        for follower in (self.follower, self.idle_follower):
            if follower is not None:
                await follower.stop()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()

    # ------------------------------------------------------------------ the log
    def _on_record(self, _subject: str, record: msgspec.Struct) -> None:
        applied = self.fold.apply(record)
        if applied.changed and not self._own_decision(record):
            self._dirty.set()
        if isinstance(record, m.BudgetTreeSet):
            self._dirty.set()
        elif isinstance(record, m.HostRegistered) and self.caught_up:
            self._check_lane()
        if not (self.leader and self.caught_up and self.fold.epoch == self.epoch):
            return
        # Informational records that follow from what was just applied.
        if isinstance(record, m.WorkloadSubmitted) and applied.changed:
            self.positions.new.add(record.workload_id)
            if trace.get_current_span().get_span_context().is_valid:
                self._trace_of[record.workload_id] = otel_context.get_current()
        elif isinstance(record, m.WorkloadPreempted) and applied.requeued:
            rec = self.fold.records[record.workload_id]
            self._spawn_publish(requeued(rec, record.at, self.epoch))
            self.positions.new.add(rec.workload.id)
        elif isinstance(record, m.CancelRequested) and applied.changed:
            rec = self.fold.records[record.workload_id]
            self._trace_of.pop(rec.workload.id, None)
            if rec.status == "cancelled":  # it was pending: nobody else will say it ended
                self._spawn_publish(cancelled(rec, record))

    def _check_lane(self) -> None:
        """Warn once per instance when ``--short-lane`` names every host known: long allocated
        work then starts nowhere (hosts only join, so once one outside the lane has, it
        stays untrue)."""
        st = self.fold.state
        if not self._lane_warned and st.lane_holds_every_host:
            self._lane_warned = True
            log.warning(
                "the short lane holds every host: only short and unallocated work can start",
                hosts=len(st.host_ids),
                short_lane=len(st.short_lane),
            )

    def _own_decision(self, record: msgspec.Struct) -> bool:
        """A placement or notice of this leader's epoch: the cycle that decided it took it
        into account, so its echo wakes no cycle (nor does the simulator run one after its
        own decisions); the next event does, once the echo is in (``_cycle_loop``)."""
        return (
            self.leader
            and isinstance(record, m.WorkloadPlaced | m.PreemptionNotice)
            and record.epoch == self.epoch
        )

    async def _append(self, out: Outgoing[m.WorkloadPlaced], *, together: bool) -> int:
        """Append a decision; its stream sequence. ``together``: one of several placements of
        a cycle, committed as one atomic batch (``GroupCommit.append``)."""
        assert self._appends is not None and self.follower is not None
        # Every reader hands it over only once it has read HOSTS this far: the hosts it
        # names are registered there (``bus.HOSTS_SEQ_HEADER``).
        hosts_read = {bus.HOSTS_SEQ_HEADER: str(self.follower.last_seq.get("HOSTS", 0))}
        return (
            await self._appends.append(
                out.subject, out.record, out.msg_id, hosts_read, together=together
            )
        ).seq

    def _spawn_publish(self, out: Outgoing[Any]) -> None:
        assert self.js is not None
        task = asyncio.create_task(bus.publish(self.js, out.subject, out.record, out.msg_id))
        task.add_done_callback(_log_failure)

    async def _load_ranking(self) -> None:
        assert self.js is not None
        try:
            last = await self.js.get_last_msg("USAGE", s.RANKING)
        except NotFoundError:
            return
        with contextlib.suppress(msgspec.ValidationError, msgspec.DecodeError):
            ranking = _RANKING.decode(last.data or b"")
            copy = replayed(ranking, last.time)
            if copy is not None:  # the next one ranking publishes is used
                log.warning("last ranking skipped", seq=last.seq, reason=copy)
            elif self.ranking.version == 0:  # none delivered meanwhile (that one is newer)
                self._use_ranking(ranking)

    async def _on_ranking(self, msg: Msg) -> None:
        if jetstream_delivery(msg):  # a copy the log delivered here (decision 0085)
            log.warning("ranking skipped: a copy delivered from the log")
            return
        try:
            self._use_ranking(_RANKING.decode(msg.data))
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            log.warning("bad ranking message", error=str(e))
            return
        self._dirty.set()

    def _use_ranking(self, ranking: m.RankingUpdated) -> None:
        self.ranking = LastRanking.of(ranking, self.ranking.version + 1)

    # ------------------------------------------------------------------ leadership
    async def take_leadership(self, epoch: int) -> bool:
        """Lead as ``epoch`` once the log shows it (``claim_epoch``): answer queries, and
        owe a position to all pending work. False if the log shows a newer epoch."""
        assert self.js is not None and self.follower is not None and self.nc is not None
        seq = await claim_epoch(self.js, self.follower, self.fold, epoch, self.name)
        if seq is None:
            return False
        self.epoch = epoch
        # Leading before the awaits below: records read meanwhile are the leader's to
        # follow up (positions owed, requeues).
        self.leader = True
        self._awaiting_seq = seq
        self.positions.new = {w.id for w in self.fold.queue}
        self.cycle_durations = CycleDurations()
        for subject, handler in self.queries.handlers():
            self._query_subs.append(
                await self.nc.subscribe(subject, cb=bus.inbox_replies_only(handler))
            )
        log.info("leader", epoch=epoch, name=self.name)
        self._dirty.set()
        return True

    async def step_down(self, why: str) -> None:
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
        while not self.stopping:
            timeout = None
            if self._next_wakeup is not None:
                timeout = max(0.0, self._next_wakeup - wall_clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), timeout)
            self._dirty.clear()
            if not self.leader or self.fold.epoch != self.epoch or self.follower is None:
                continue
            if self.follower.last_seq.get("WORKLOADS", 0) < self._awaiting_seq:
                # Our last decisions are not back yet: wait for them here (their echo wakes
                # no cycle), keeping what woke us; the next cycle must see them.
                back = await self.follower.wait_for("WORKLOADS", self._awaiting_seq, ECHO_WAIT_S)
                if not back:
                    self._dirty.set()
                    continue
                if not self.leader or self.fold.epoch != self.epoch:
                    continue
            try:
                await self._cycle()
            except Exception:
                log.exception("cycle failed")
                await asyncio.sleep(0.5)
                self._dirty.set()

    async def _cycle(self) -> None:
        """Fetch (the fold's snapshot), decide (``run_cycle``), act (publish its records and
        wait for them to be stored), then send the positions owed."""
        assert self.js is not None
        started = time.perf_counter()
        now = wall_clock()
        snapshot = self.ranking.snapshot(self.fold)
        # The new pending work this cycle decides on. Work submitted while its decisions
        # are being appended is the next cycle's: its queue position would be computed (a
        # dry run over the whole queue) only to be overtaken by its placement a moment later.
        considered = set(self.positions.new)
        result = run_cycle(snapshot, self.policy, now)
        decided = time.perf_counter()
        self.cycles += 1
        self.queries.seed(now, result)
        self._next_wakeup = result.next_wakeup
        epoch = self.epoch  # ours when deciding, also if we step down while appending
        out = cycle_records(
            result, self.fold.records, self.ranking, now=now, epoch=epoch, cycle=self.cycles
        )
        publishes: list[Awaitable[int]] = [
            bus.publish(self.js, n.subject, n.record, n.msg_id) for n in out.notices
        ]
        # A cycle's placements go to the log as one atomic batch: one fsync for the cycle
        # instead of one each (docs/decisions/0005-placement-on-the-workloads-stream.md).
        together = len(out.placements) > 1
        for placed in out.placements:
            w = placed.record
            parent = self._trace_of.pop(w.workload_id, None)
            with tracer.start_as_current_span(
                "placement.decide",
                context=parent,
                attributes={
                    "allot.workload": w.workload_id,
                    "allot.allocation": w.allocation or "~",
                },
            ):
                # The task copies the current context now: its publish carries this span.
                publishes.append(asyncio.ensure_future(self._append(placed, together=together)))
            self.positions.new.discard(w.workload_id)
        append_wait_s = 0.0
        if out:
            appending = time.perf_counter()
            seqs = await asyncio.gather(*publishes)
            if out.drains:
                await asyncio.gather(
                    *(bus.publish(self.js, d.subject, d.record, d.msg_id) for d in out.drains)
                )
            append_wait_s = time.perf_counter() - appending
            self.decisions += len(out)
            if seqs:
                self._awaiting_seq = max(seqs)
            log.info(
                "cycle",
                epoch=epoch,
                placed=len(out.placements),
                noticed=len(out.notices),
                pending=len(self.fold.queue),
            )
        send, due = self.positions.take(now, considered, self.queries.explain_cost_s)
        if send:
            await self._publish_queued(now, send)
        elif due is not None:
            # Wake for the next batch of positions, sooner than the core's next wake-up (a
            # protection end may be hours away).
            self._next_wakeup = due if self._next_wakeup is None else min(self._next_wakeup, due)
        self.cycle_durations.observe(
            time.perf_counter() - started, decided - started, append_wait_s
        )

    async def _publish_queued(self, now: float, waiting: set[str]) -> None:
        """``WorkloadQueued`` for those of ``waiting`` still pending, in queue order."""
        assert self.nc is not None
        fresh = {wid for wid in waiting if wid in self.fold.queue}
        if not fresh:
            return
        explained = self.queries.explain(now, stale_ok_s=STALE_OK_S)
        assert explained.entries is not None and explained.reasons is not None
        for entry in explained.entries:
            w = entry.workload
            if w.id not in fresh:
                continue
            row = queue_row(entry, explained.reasons.get(w.id), now, self.ranking)
            await self.nc.publish(s.queued(w.allocation, w.id), bus.encode(queued(row, now)))

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


def _log_failure(task: asyncio.Task[int]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("publish failed", error=str(task.exception()))


def build_parser() -> argparse.ArgumentParser:
    ap = base_parser("python -m allot.services.placement", __doc__)
    ap.add_argument("--policy", choices=POLICIES, default="fairshare")
    ap.add_argument("--grace-s", type=int, default=300, help="notice to GPUs free (seconds)")
    ap.add_argument(
        "--unallocated-grace-s",
        type=int,
        default=DEFAULT_UNALLOCATED_GRACE_S,
        help="the same for unallocated victims (seconds, at most --grace-s)",
    )
    ap.add_argument(
        "--unallocated-settle-s",
        type=float,
        default=DEFAULT_UNALLOCATED_SETTLE_S,
        help="GPUs that came free less than this ago go to allocated work only (seconds)",
    )
    add_short_lane_argument(
        ap,
        "comma-separated host ids forming the short lane: there only unallocated work and "
        "allocated work of at most 2 GPUs protected for at most 15 min start (Fair Tree)",
    )
    ap.add_argument("--lease-ttl-s", type=float, default=bus.LEASE_TTL_S, help="leader lease TTL")
    ap.add_argument("--name", default=None, help="instance name (default host-pid)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging("placement")
    return run_main(
        lambda a: PlacementService(
            a.nats_url,
            policy=a.policy,
            grace_s=a.grace_s,
            unallocated_grace_s=a.unallocated_grace_s,
            unallocated_settle_s=a.unallocated_settle_s,
            short_lane=lane_hosts_of(a),
            lease_ttl_s=a.lease_ttl_s,
            name=a.name,
        ),
        build_parser(),
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
