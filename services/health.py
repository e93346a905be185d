"""The health service: registers hosts, drains the ones that go quiet or report failures,
and carries out operators' drain and undrain commands (``python -m allot.services.health``).

Inputs (core NATS, not captured by any stream):

* heartbeats ``allot.v1.host.<host>.heartbeat`` and health reports ``...<host>.health``,
  plain publishes from the agents;
* operator requests ``...<host>.drain.<login>`` (``DrainHost``) and
  ``...<host>.undrain.<login>`` (``UndrainHost``), or their bare forms without the login,
  answered with ``CommandAccepted`` or ``CommandRejected``.

The host's identity is the subject's fourth token (what NATS permissions grant an agent);
a payload naming another host is ignored (heartbeats, reports) or rejected (commands). A
command's ``operator`` must be the subject's login (``allot auth gen`` grants an operator
only its own), else it is rejected naming ``operator``.

Output: host records on ``allot.v1.host.<host>.state`` (HOSTS stream): ``HostRegistered`` on
a host's first heartbeat, ``HostDraining`` and ``HostHealthy``. The host states are a fold of
that stream (replayed at start, then followed, so ``HostDrained`` from placement is seen too).
What started a drain is kept with the state, because it decides what may end it:

* ``operator`` (``HostDraining.by`` set): only an undrain ends it;
* ``heartbeat`` (a reason starting with ``missed heartbeats``, or ``agent stopping``: the
  unhealthy report a stopping agent sends, so its requeued runs do not land back on a host
  nobody serves): a heartbeat ends it;
* ``health`` (any other drain by this service): a healthy report ends it.

Heartbeat receipt times live in memory only (they are not in the log), so after a restart
every known host gets one full timeout before it can be declared missing.

**Idle allocated GPUs** (``allot.eventlog.idle_watch``, the policy ``allot.core.idle``).
Agents report their GPUs' utilization once per interval (``HostUtilization``, request on
``allot.v1.host.<host>.util``; the host is the subject's, the times are checked against
this service's clock, refusals name the field). Each report of a host running allocated
work is recorded on ``allot.v1.usage.gpu.<host>`` (USAGE: ``HostUtilizationRecorded``,
each run's GPUs and its idle evidence), and a run whose GPUs all stayed below
``--idle-threshold-pct`` for ``--idle-after-s`` is flagged on
``allot.v1.usage.idle.<allocation>.<workload>`` (``WorkloadFlaggedIdle``, then
``WorkloadIdleCleared`` when it works again, ends, or stops being reported), which the
allocation's team may subscribe to; ``allot.v1.query.idle[.<allocation>]`` lists the runs
flagged now (``IdleSnapshot``). By default flag only: nothing is preempted for being idle
(decision 0050). With ``--idle-preempt`` each flag asks for preemption
(``WorkloadFlaggedIdle.preempt``): the placement leader, which follows the flags, gives
the run a notice (reason ``idle``, not requeued) once its minimum runtime has passed
(decision 0055); this service preempts nothing itself. For this the service also follows
WORKLOADS from the placements on (which run holds which GPUs; no submissions: a flag's
user is read from the log when it is raised, decision 0075) and the idle records, in the
background: the heartbeat duties above do not wait for that replay. After a restart, the
last record of each host and the open flags give back the evidence as it was (the log is
the source of truth). Run one health service per stack: two would each record and flag.

A drain for missed heartbeats is also what lets dispatch end the runs of a host whose agent
died: once the host has stayed silent a while, it records them lost in the agent's place
(``allot.eventlog.host_work.lost_run``), so their GPUs are freed and resumable work requeued.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec
import nats.errors
import structlog
from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from opentelemetry.sdk.trace import TracerProvider

from allot import bus
from allot.bus import runtime
from allot.bus.record_log import Follower, JetStreamLog, RecordLog
from allot.bus.replays import replayed
from allot.bus.request_server import raw_connection
from allot.bus.runtime import Delivery
from allot.bus.service_main import base_parser, positive_seconds, run_main
from allot.bus.tasks import every, stop_tasks
from allot.core.errors import ValidationError
from allot.core.idle import (
    DEFAULT_MAX_GAP_S,
    DEFAULT_THRESHOLD_PCT,
    DEFAULT_WINDOW_S,
    IdlePolicy,
)
from allot.eventlog.host_work import AGENT_STOPPING, MISSED_HEARTBEATS
from allot.eventlog.idle_watch import NOT_REGISTERED, IdleWatch, msg_id
from allot.proto import codec, subjects
from allot.proto import messages as m
from allot.proto.subjects import Kind

SERVICE = "health"
ECHO_TIMEOUT_S = 5.0
"""Longest wait for one of our records to come back from the HOSTS stream."""
IDLE_READ_EVERY_S = 0.5
"""The idle watch reads the log in batches this often: its windows are minutes long, and
records handed over one at a time cost several times more (decision 0057)."""
MISSED_PREFIX = MISSED_HEARTBEATS
"""Start of the reason of a drain for missed heartbeats (how a replay tells the cause, and
how dispatch tells a host whose runs nobody will report: ``allot.eventlog.host_work``)."""

log = structlog.get_logger("allot.health", service=SERVICE)  # lazy: configured in main


def idle_answer(snapshot: m.IdleSnapshot, limit: int) -> bytes:
    """``allot idle``'s answer: the first rows that fit in ``limit`` bytes and the total
    (thousands of runs flagged at once would not fit in one NATS message)."""
    rows = snapshot.rows

    def first(n: int) -> m.IdleSnapshot:
        return msgspec.structs.replace(snapshot, rows=rows[:n], total=len(rows))

    return codec.encode_within(first, len(rows), limit)


State = Literal["healthy", "draining", "drained"]
Cause = Literal["operator", "heartbeat", "health"]


@dataclass(slots=True)
class HostInfo:
    gpus: int
    state: State = "healthy"
    cause: Cause | None = None
    """Why the host is draining or drained; None while healthy."""


@dataclass(slots=True)
class HostBook:
    """Host states as a fold of the HOSTS stream (no I/O, no clock)."""

    hosts: dict[str, HostInfo] = field(default_factory=dict)

    def apply(self, record: msgspec.Struct) -> None:
        if isinstance(record, m.HostRegistered):
            info = self.hosts.get(record.host)
            if info is None:
                self.hosts[record.host] = HostInfo(gpus=record.gpus)
            else:  # a re-registration changes the size, never the state
                info.gpus = record.gpus
            return
        info = self.hosts.get(getattr(record, "host", ""))
        if info is None:
            return  # a state change of a host never registered: nothing to change
        if isinstance(record, m.HostDraining):
            info.state = "draining"
            info.cause = cause_of(record)
        elif isinstance(record, m.HostDrained):
            info.state = "drained"
        elif isinstance(record, m.HostHealthy):
            info.state = "healthy"
            info.cause = None


def cause_of(record: m.HostDraining) -> Cause:
    if record.by is not None:
        return "operator"
    if record.reason.startswith((MISSED_PREFIX, AGENT_STOPPING)):
        return "heartbeat"  # the agent's return (its heartbeat) ends it
    return "health"


def health_reason(report: m.HealthReport) -> str:
    failed = ", ".join(str(g) for g in report.failed_gpus)
    parts = [report.detail] if report.detail else []
    if failed:
        parts.append(f"failed GPUs {failed}")
    reason = "; ".join(parts) or "health check failed"
    return reason[: m.MAX_TEXT_LEN]


class HealthService:
    """See the module docstring. ``clock`` gives the records' times (wall clock); timeouts
    are measured on the monotonic clock so a wall-clock step cannot drain every host.
    ``broker`` (default: one for ``nats_url``) and ``record_log`` (default: HOSTS on the
    broker's connection, from ``on_started``) may be given, as unit tests give them."""

    def __init__(
        self,
        nats_url: str | None = None,
        *,
        broker: NatsBroker | None = None,
        record_log: RecordLog | None = None,
        timeout_s: float = 10.0,
        check_s: float = 1.0,
        provider: TracerProvider | None = None,
        clock: Callable[[], float] = runtime.wall_clock,
        idle_policy: IdlePolicy | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValidationError("timeout_s", f"must be positive, got {timeout_s!r}")
        if check_s <= 0:
            raise ValidationError("check_s", f"must be positive, got {check_s!r}")
        self.timeout_s = timeout_s
        self.check_s = check_s
        self.clock = clock
        self.book = HostBook()
        self.last_seen: dict[str, float] = {}
        """Host -> monotonic time of its last heartbeat (or of our start)."""
        self.ignored: dict[str, int] = {}
        """Why heartbeats and reports were ignored -> how many (host mismatch, bad body...)."""
        self.heartbeats = 0
        """Heartbeat messages handled so far (ignored ones included)."""
        self._warned_gpus: dict[str, int] = {}
        self._echoes: dict[msgspec.Struct, asyncio.Event] = {}
        """Records we published, set once the follower has applied them."""
        self._lock = asyncio.Lock()
        self.record_log = record_log
        self._follower: Follower | None = None
        self._checker: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()

        self.idle = IdleWatch(idle_policy or IdlePolicy())
        """Idle detection (see the module docstring), ready once ``idle_ready`` is set."""
        self.idle_ready = asyncio.Event()
        self.util_reports = 0
        """Utilization reports answered so far (refused ones included)."""
        self.util_rejected: dict[str, int] = {}
        """Field named by a refused utilization report -> how many."""
        self._idle_lock = asyncio.Lock()
        self._idle_follower: Follower | None = None
        self._flagged_seq = 0
        """The USAGE sequence of the last idle flag or clear this instance appended."""
        self._idle_tasks: list[asyncio.Task[None] | None] = []

        self.broker: NatsBroker = runtime.given_broker(broker, nats_url, SERVICE, provider)
        self._beats: Subscription | None = None
        """Heartbeats, read with nats-py (docs/decisions/0010-raw-nats-on-hot-subjects.md)."""
        self.broker.subscriber(subjects.ALL_HEALTH, no_reply=True)(self._report_handler)
        for drains in (subjects.ALL_DRAIN, subjects.ALL_DRAIN_AS):
            self.broker.subscriber(drains)(self._drain_handler)
        for undrains in (subjects.ALL_UNDRAIN, subjects.ALL_UNDRAIN_AS):
            self.broker.subscriber(undrains)(self._undrain_handler)
        self.broker.subscriber(subjects.ALL_HOST_UTIL)(self._util_handler)
        for query in (subjects.QUERY_IDLE, subjects.ALL_QUERY_IDLE):
            self.broker.subscriber(query)(self._idle_query_handler)

    # -- lifecycle ---------------------------------------------------------------------

    async def on_started(self) -> None:
        if self.record_log is None:
            js = self.broker.connection.jetstream()
            await bus.ensure_streams(js)
            self.record_log = JetStreamLog(js)
        self._follower = self.record_log.follower(self._on_record, streams=("HOSTS",))
        await self._follower.start()
        start = time.monotonic()
        for host in self.book.hosts:  # one full timeout of grace after a restart
            self.last_seen.setdefault(host, start)
        self._checker = asyncio.create_task(self._check_loop())
        nc = raw_connection(self.broker)
        if nc is not None:
            self._beats = await nc.subscribe(subjects.ALL_HEARTBEATS, cb=self._on_heartbeat)
            await bus.confirm_subscriptions(nc)
        # Idle detection replays WORKLOADS: in the background, so hosts are served at once.
        self._idle_tasks = [asyncio.create_task(self._start_idle())]
        log.info("started", hosts=len(self.book.hosts), timeout_s=self.timeout_s)

    async def on_stopping(self) -> None:
        # nats-py swallows a cancellation that lands inside a publish (its flush catches
        # CancelledError), so the check loop also stops on a flag.
        self._closing.set()
        if self._beats is not None:
            with contextlib.suppress(Exception):
                await self._beats.unsubscribe()
            self._beats = None
        if self._checker is not None:
            await stop_tasks([self._checker])
            self._checker = None
        await stop_tasks(self._idle_tasks)
        self._idle_tasks = []
        if self._idle_follower is not None:
            await self._idle_follower.stop()
            self._idle_follower = None
        if self._follower is not None:
            await self._follower.stop()
            self._follower = None
        for echo in self._echoes.values():  # no echo will come now: release their waiters
            echo.set()

    def _on_record(self, _subject: str, record: msgspec.Struct) -> None:
        # No lock here: a handler holds it while it waits for its own record's echo, and
        # applying one record is synchronous, so nothing interleaves with it.
        self.book.apply(record)
        echo = self._echoes.get(record)
        if echo is not None:
            echo.set()

    async def _publish(self, record: m.HostEvent, msg_id: str) -> None:
        """Append ``record`` and wait until the follower has applied it (caller holds the
        lock). The state is then always the fold of the stream in the stream's order, also
        when placement's ``HostDrained`` lands between our records."""
        assert self.record_log is not None, "publish before on_started"
        echo = self._echoes[record] = asyncio.Event()
        try:
            await self.record_log.append(subjects.host_state(record.host), record, msg_id)
            try:
                await asyncio.wait_for(echo.wait(), ECHO_TIMEOUT_S)
            except TimeoutError:
                # A publish deduplicated by msg id is never delivered again: the first one
                # is already in the stream (and in the fold).
                log.warning("own record not seen in the stream", host=record.host, msg_id=msg_id)
        finally:
            del self._echoes[record]
        log.info(type(record).__name__, host=record.host, **_fields(record))

    def _ignore(self, why: str, **kw: object) -> None:
        self.ignored[why] = self.ignored.get(why, 0) + 1
        log.warning("message ignored", why=why, **kw)

    # -- heartbeats and health reports -------------------------------------------------

    async def _on_heartbeat(self, msg: Msg) -> None:
        subject = msg.subject
        try:
            beat = codec.decode(Kind.HEARTBEAT, msg.data)
        except ValidationError as e:
            self._ignore("bad heartbeat", subject=subject, field=e.field, reason=e.reason)
        else:
            assert isinstance(beat, m.Heartbeat)
            await self.heartbeat(subjects.host_of(subject), beat)
        finally:
            self.heartbeats += 1

    async def heartbeat(self, subject_host: str, beat: m.Heartbeat) -> None:
        if beat.host != subject_host:
            self._ignore("host mismatch", subject_host=subject_host, payload_host=beat.host)
            return
        host = beat.host
        info = self.book.hosts.get(host)
        if (
            info is not None
            and info.state == "healthy"
            and beat.gpus == info.gpus
            and not self._lock.locked()
        ):
            # The common case, with nothing to publish: a known healthy host is alive.
            # Nothing else holds the lock, and this does not await, so it cannot land
            # inside a check or a state change.
            self.last_seen[host] = time.monotonic()
            return
        async with self._lock:
            self.last_seen[host] = time.monotonic()
            info = self.book.hosts.get(host)
            if info is None:
                # A new host starts healthy: registering it is all there is to do.
                await self._publish(
                    m.HostRegistered(host=host, gpus=beat.gpus, at=self.clock()),
                    msg_id=f"registered:{host}",
                )
                return
            if beat.gpus != info.gpus and self._warned_gpus.get(host) != beat.gpus:
                self._warned_gpus[host] = beat.gpus
                log.warning(
                    "heartbeat GPU count differs from registration (not re-registered in v1)",
                    host=host,
                    registered=info.gpus,
                    heartbeat=beat.gpus,
                )
            if info.state != "healthy" and info.cause == "heartbeat":
                await self._healthy(host)

    async def _report_handler(self, msg: Delivery) -> None:
        subject = msg.raw_message.subject
        try:
            report = codec.decode(Kind.HEALTH, msg.body)
        except ValidationError as e:
            self._ignore("bad health report", subject=subject, field=e.field, reason=e.reason)
            return
        assert isinstance(report, m.HealthReport)
        await self.health_report(subjects.host_of(subject), report)

    async def health_report(self, subject_host: str, report: m.HealthReport) -> None:
        if report.host != subject_host:
            self._ignore("host mismatch", subject_host=subject_host, payload_host=report.host)
            return
        host = report.host
        async with self._lock:
            info = self.book.hosts.get(host)
            if info is None:
                self._ignore("unregistered host", host=host)
                return
            if not report.healthy:
                # A failure outranks a missed-heartbeat drain (a heartbeat must not end it);
                # an operator's drain and an earlier failure stay as they are.
                if info.state == "healthy" or info.cause == "heartbeat":
                    at = self.clock()
                    await self._publish(
                        m.HostDraining(host=host, at=at, reason=health_reason(report)),
                        msg_id=f"draining:{host}:{at}",
                    )
            elif info.state != "healthy" and info.cause in ("health", "heartbeat"):
                await self._healthy(host)

    async def _healthy(self, host: str) -> None:
        at = self.clock()
        await self._publish(m.HostHealthy(host=host, at=at), msg_id=f"healthy:{host}:{at}")

    # -- missed heartbeats -------------------------------------------------------------

    async def _check_loop(self) -> None:
        await every(self.check_s, self._closing, self.check_missing, "heartbeat check failed")

    async def check_missing(self) -> None:
        now = time.monotonic()
        async with self._lock:
            for host, info in list(self.book.hosts.items()):
                silent = now - self.last_seen.setdefault(host, now)
                if info.state == "healthy" and silent > self.timeout_s:
                    at = self.clock()
                    await self._publish(
                        m.HostDraining(
                            host=host, at=at, reason=f"{MISSED_PREFIX} for {silent:.1f} s"
                        ),
                        msg_id=f"draining:{host}:{at}",
                    )

    # -- idle allocated GPUs ------------------------------------------------------------

    async def _start_idle(self) -> None:
        assert self.record_log is not None
        self._idle_follower = self.record_log.follower(
            self._on_idle_record,
            streams=("HOSTS", "WORKLOADS", "USAGE"),
            # Neither submissions nor runs' starts change anything here: a run's GPUs and
            # idle window count from its placement, which says its allocation and GPUs too
            # (``IdleWatch.apply``; decision 0075).
            subjects={"USAGE": subjects.ALL_IDLE, "WORKLOADS": subjects.RUNS_FROM_PLACEMENTS},
            every_s=IDLE_READ_EVERY_S,
        )
        await self._idle_follower.start()
        seeded = 0
        for host in sorted(self.idle.fold.state.host_ids):
            raw = await self.record_log.read("USAGE", subjects.usage_gpu(host))
            if raw is None or raw.subject is None or raw.data is None:
                continue
            try:
                last = bus.decode_record(raw.subject, raw.data)
            except ValidationError as e:
                log.warning("utilization record skipped", host=host, field=e.field)
                continue
            copy = replayed(last, raw.time)
            if copy is not None:  # decision 0085: the host's next report seeds it
                log.warning("utilization record skipped", host=host, reason=copy)
                continue
            if isinstance(last, m.HostUtilizationRecorded):
                self.idle.seed(last)
                seeded += 1
        self.idle.adopt_open_flags()
        self.idle_ready.set()
        log.info(
            "idle detection ready",
            hosts_seeded=seeded,
            flagged=len(self.idle.book.open_stretches()),
            threshold_pct=self.idle.policy.threshold_pct,
            window_s=self.idle.policy.window_s,
            preempt=self.idle.policy.preempt,
        )
        await every(self.check_s, self._closing, self.check_idle_ends, "idle end check failed")

    def _on_idle_record(self, _subject: str, record: msgspec.Struct) -> None:
        self.idle.apply(record)

    async def _util_handler(self, msg: Delivery) -> bytes:
        return codec.encode(await self.utilization(msg.raw_message.subject, msg.body))

    async def utilization(self, subject: str, body: bytes) -> m.CommandAccepted | m.CommandRejected:
        """Answer one ``HostUtilization``: record it, flag or clear what it shows."""
        self.util_reports += 1
        try:
            report = codec.decode(Kind.HOST_UTIL, body)
            assert isinstance(report, m.HostUtilization)
            host = subjects.host_of(subject)
            subjects.check_host(report.host, host)
            await self.idle_ready.wait()
            async with self._idle_lock:
                await self._read_own_flags()
                await self._read_registration(host)
                judged = self.idle.judge(host, report, self.clock())
                if judged.recorded is not None:
                    await self._append(
                        subjects.usage_gpu(host),
                        judged.recorded,
                        f"util:{host}:{report.sent_at!r}",
                    )
                for flag in judged.flags:
                    await self._append_idle(flag)
        except ValidationError as e:
            self.util_rejected[e.field] = self.util_rejected.get(e.field, 0) + 1
            # A host not registered yet: an agent starting before its first heartbeat was
            # heard (nothing runs there yet), not a fault.
            say = log.info if e.reason.endswith(NOT_REGISTERED) else log.warning
            say("utilization refused", subject=subject, field=e.field, reason=e.reason)
            return m.CommandRejected(at=self.clock(), field=e.field, reason=e.reason)
        runs = 0 if judged.recorded is None else len(judged.recorded.parts)
        return m.CommandAccepted(at=self.clock(), detail=f"{runs} allocated runs judged")

    async def check_idle_ends(self) -> None:
        """Clear the flags of runs that ended (their tracks go with them)."""
        async with self._idle_lock:
            for cleared in self.idle.ended(self.clock()):
                await self._append_idle(cleared)

    async def _append(self, subject: str, record: msgspec.Struct, msg_id: str) -> None:
        assert self.record_log is not None
        await self.record_log.append(subject, record, msg_id)

    async def _append_idle(self, record: m.WorkloadFlaggedIdle | m.WorkloadIdleCleared) -> None:
        assert self.record_log is not None
        if isinstance(record, m.WorkloadFlaggedIdle) and record.user is None:
            record = msgspec.structs.replace(record, user=await self._user_of(record))
        ack = await self.record_log.append(
            subjects.idle(record.allocation, record.workload_id), record, msg_id(record)
        )
        self._flagged_seq = max(self._flagged_seq, ack.seq)
        log.info(type(record).__name__, **msgspec.structs.asdict(record))

    async def _user_of(self, flag: m.WorkloadFlaggedIdle) -> str | None:
        """Who submitted the flagged run, from its submission in the log (the idle watch
        does not read submissions: ``subjects.RUNS_FROM_PLACEMENTS``); None if it cannot be
        read, even for want of the server: the flag, already judged, is logged anyway."""
        assert self.record_log is not None
        subject = subjects.events(flag.allocation or None, flag.workload_id, "submitted")
        try:
            raw = await self.record_log.read("WORKLOADS", subject, first=True)
            if raw is None or raw.data is None:
                raise ValidationError("workload_id", "its submission is not in the log")
            return codec.decode_as(m.WorkloadSubmitted, raw.data, own=True).user
        except (ValidationError, nats.errors.Error) as e:
            log.warning("flag's user unknown", workload=flag.workload_id, reason=str(e))
            return None

    async def _read_own_flags(self) -> None:
        """Fold the flags this instance appended before judging or answering from the idle
        watch (its follower takes the log every ``IDLE_READ_EVERY_S``)."""
        follower = self._idle_follower
        if follower is not None and follower.last_seq.get("USAGE", 0) < self._flagged_seq:
            await follower.wait_for("USAGE", self._flagged_seq, ECHO_TIMEOUT_S)

    async def _read_registration(self, host: str) -> None:
        """A host registered on its first heartbeat may report before the idle watch, which
        takes the log every ``IDLE_READ_EVERY_S``, has read the registration: let it read
        HOSTS as far as this instance has (not a refusal of a genuine new host)."""
        idle, main = self._idle_follower, self._follower
        if idle is None or main is None or host in self.idle.fold.state:
            return
        if host in self.book.hosts:
            await idle.wait_for("HOSTS", main.last_seq.get("HOSTS", 0), ECHO_TIMEOUT_S)

    async def _idle_query_handler(self, msg: Delivery) -> bytes:
        subject = msg.raw_message.subject
        allocation = None if subject == subjects.QUERY_IDLE else subject.rsplit(".", 1)[1]
        if not self.idle_ready.is_set():
            return codec.encode(
                m.CommandRejected(
                    at=self.clock(), field="service", reason="health is still reading the log"
                )
            )
        await self._read_own_flags()
        snapshot = self.idle.snapshot(allocation, self.clock())
        return idle_answer(snapshot, codec.answer_limit(self.broker.connection.max_payload))

    # -- operator commands -------------------------------------------------------------

    async def _drain_handler(self, msg: Delivery) -> bytes:
        return codec.encode(await self.command(Kind.DRAIN, msg.raw_message.subject, msg.body))

    async def _undrain_handler(self, msg: Delivery) -> bytes:
        return codec.encode(await self.command(Kind.UNDRAIN, msg.raw_message.subject, msg.body))

    async def command(
        self, kind: Kind, subject: str, body: bytes
    ) -> m.CommandAccepted | m.CommandRejected:
        """Answer one drain or undrain request; every failure is a ``CommandRejected``."""
        try:
            cmd = codec.decode(kind, body)
            assert isinstance(cmd, m.DrainHost | m.UndrainHost)
            subjects.check_login("operator", cmd.operator, subjects.login_of(subject))
            subjects.check_host(cmd.host, subjects.host_of(subject))
            async with self._lock:
                info = self.book.hosts.get(cmd.host)
                if info is None:
                    raise ValidationError("host", f"unknown host {cmd.host!r}")
                at = self.clock()
                if isinstance(cmd, m.DrainHost):
                    await self._publish(
                        m.HostDraining(host=cmd.host, at=at, reason=cmd.reason, by=cmd.operator),
                        msg_id=f"draining:{cmd.host}:{at}",
                    )
                    detail = f"{cmd.host} draining (by {cmd.operator})"
                elif info.state == "healthy":
                    detail = f"{cmd.host} is already healthy"
                else:
                    await self._publish(
                        m.HostHealthy(host=cmd.host, at=at), msg_id=f"healthy:{cmd.host}:{at}"
                    )
                    # Returned by hand: give it a full timeout before it can be missed again.
                    self.last_seen[cmd.host] = time.monotonic()
                    detail = f"{cmd.host} healthy again (by {cmd.operator})"
        except ValidationError as e:
            log.warning("command rejected", subject=subject, field=e.field, reason=e.reason)
            return m.CommandRejected(at=self.clock(), field=e.field, reason=e.reason)
        log.info("command accepted", subject=subject, detail=detail)
        return m.CommandAccepted(at=at, detail=detail)


def _fields(record: msgspec.Struct) -> dict[str, object]:
    return {k: v for k, v in msgspec.structs.asdict(record).items() if k != "host"}


def build(args: argparse.Namespace) -> HealthService:
    runtime.configure_logging(SERVICE)
    return HealthService(
        args.nats_url,
        timeout_s=args.timeout_s,
        check_s=args.check_s,
        provider=runtime.tracer_provider(SERVICE),
        idle_policy=idle_policy(args),
    )


def idle_policy(args: argparse.Namespace) -> IdlePolicy:
    """The idle policy of the command line; a bad value exits naming its option."""
    try:
        return IdlePolicy(
            threshold_pct=args.idle_threshold_pct,
            window_s=args.idle_after_s,
            max_gap_s=args.idle_gap_s,
            preempt=args.idle_preempt,
        )
    except ValidationError as e:
        option = {"threshold_pct": "--idle-threshold-pct", "window_s": "--idle-after-s"}
        raise SystemExit(f"{option.get(e.field, '--idle-gap-s')}: {e.reason}") from None


def parser() -> argparse.ArgumentParser:
    ap = base_parser("python -m allot.services.health", __doc__.splitlines()[0])
    ap.add_argument(
        "--timeout-s",
        type=positive_seconds,
        default=10.0,
        help="drain a host silent this long (seconds; default %(default)s)",
    )
    ap.add_argument(
        "--check-s",
        type=positive_seconds,
        default=1.0,
        help="how often to look for silent hosts (seconds; default %(default)s)",
    )
    ap.add_argument(
        "--idle-threshold-pct",
        type=float,
        default=DEFAULT_THRESHOLD_PCT,
        help="a GPU below this utilization is idle (percent; default %(default)s)",
    )
    ap.add_argument(
        "--idle-after-s",
        type=positive_seconds,
        default=DEFAULT_WINDOW_S,
        help="flag allocated work whose GPUs all stay idle this long (seconds; default "
        "%(default)s)",
    )
    ap.add_argument(
        "--idle-gap-s",
        type=positive_seconds,
        default=DEFAULT_MAX_GAP_S,
        help="longest silence between two utilization reports that still counts as "
        "continuous evidence (seconds; default %(default)s)",
    )
    ap.add_argument(
        "--idle-preempt",
        action="store_true",
        help="ask for the preemption of flagged work: the placement leader gives it a "
        "notice (reason idle, not requeued) once its minimum runtime has passed (default: "
        "flag only)",
    )
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(build, parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
