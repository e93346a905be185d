"""The dispatch service: tells each host what to run and records what its agent reports
(``python -m allot.services.dispatch``).

Agents never read the log (NATS grants them only their own hosts' subjects), so this
service stands between them and it:

* **Work.** It replays then follows HOSTS and WORKLOADS into a ``LogFold`` (the same fold
  placement uses: a stale epoch's placement or a double booking is ignored here as
  everywhere), taking the records in batches every ``READ_EVERY_S``, and, whenever a
  record changes what a host runs, publishes that host's whole list on core NATS
  ``allot.v1.host.<host>.work`` (``HostWork``, see ``allot.eventlog.host_work``). After its
  replay it publishes every known host's list once, so a host learns what changed while
  this service was down. An agent asks for its list with ``allot.v1.host.<host>.sync``
  when it starts and every few seconds after.
* **Reports.** ``allot.v1.host.<host>.report`` (``PartReport``, request/reply): the host is
  the subject's fourth token (what NATS lets the agent publish), and only the primary host
  of the workload's current attempt may report its start; a gang's other host may report
  only the end of its own part, which ends the attempt (``allot.eventlog.host_work``). Its
  times are checked against the log and this service's clock, since the record charges
  the team ``gpus x (at - started_at)``: nothing ahead of the clock or before the
  placement, no end before its start, no run longer than the time since its placement
  (``check_report_times``, each within ``CLOCK_SKEW_S``). The report becomes
  ``WorkloadStarted`` or the terminal record, appended with the
  ``Nats-Msg-Id`` the agents used before (``started:<wid>:<attempt>``,
  ``ended:<wid>:<attempt>``), and answered once stored; a backlog of them is committed as
  atomic batches (``allot.bus.group_commit``).
  ``allot.v1.hosts.report`` (``PartReports``) carries many hosts' reports at once, from an
  agent that speaks for every host (a fake agent simulating a cluster; only service users
  may send it): each item is judged as if it came alone on its host's subject, and the
  answer (``PartReportsAnswered``) lists each item's answer in order.

* **Runs lost with their host.** An agent killed for good (``kill -9``, a dead machine)
  reports nothing: health drains its host for missed heartbeats, and nobody would ever end
  its runs (placement notices them only when their minimum runtime ends, up to 8 h). Every
  ``LOST_CHECK_S`` this service asks ``DispatchBook.lost``
  (``allot.eventlog.host_work.lost_run``: the host drained for missed heartbeats
  ``--lost-after-s`` ago and not healthy since, nothing heard from the host, report or
  sync, for as long; noticed or not) and appends, in the agent's place, the record its
  ``lost`` report would cause: preempted (the notice's reason, else ``host-drain``), so the
  fold frees the GPUs and requeues resumable work. Its msg id is the agent's own
  (``ended:<wid>:<attempt>``), so an agent that reports after all, or another dispatch
  instance deciding the same, adds nothing; a late report is answered "already in the
  log". The host stays draining or drained until an operator undrains it or its agent
  returns (which first kills what its predecessor left running).

Several instances may run (reports are shared in the queue group ``dispatch``); each
publishes the same lists, which agents take once by ``seq``. Each knows only the syncs and
reports it answered itself, so with several instances "nothing heard" rests mostly on
health's drain.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Sequence
from typing import TypeVar

import msgspec
import nats.errors
import structlog
from faststream.nats import NatsBroker
from nats.aio.client import Client as NatsClient
from opentelemetry.sdk.trace import TracerProvider

from allot import bus
from allot.bus import group_commit, runtime
from allot.bus.record_log import Follower, JetStreamLog, RecordLog
from allot.bus.request_server import Handler, RequestServer, raw_connection
from allot.bus.service_main import base_parser, positive_seconds, run_main
from allot.bus.tasks import every, stop_tasks
from allot.core.errors import ValidationError
from allot.eventlog.host_work import LOST_AFTER_S, DispatchBook, primary_host
from allot.proto import codec, subjects
from allot.proto import messages as m
from allot.proto.subjects import Kind

SERVICE = "dispatch"
CATCH_UP_TIMEOUT_S = 5.0
"""Longest wait to read the log to its end before refusing an unknown workload."""
READ_EVERY_S: float | None = 0.05
"""The log taken in batches this often (decision 0057: half of dispatch's CPU, and of its
agents'); a run starts up to that much later. None: records pushed one at a time."""
REPORT_WORKERS = 512
"""Reports handled at once (each waits for its JetStream ack: fsync on every write)."""
REPORT_BATCH_WORKERS = 16
"""``PartReports`` handled at once (each holds up to ``m.MAX_REPORTS`` reports)."""
SYNC_WORKERS = 64
"""``HostSync`` requests answered at once (an answer is a fold read: no wait inside)."""
LOST_CHECK_S = 1.0
"""How often to look for runs lost with their silent hosts (a scan of those hosts' runs)."""
REPORT_BATCH_THRESHOLD = 1
REPORT_BATCH_LINGER_S = 0.25
"""While one report's append is in flight, the next wait up to 250 ms to be committed
together (``allot.bus.group_commit``): fewer, larger batches leave WORKLOADS' one writer
more time for the appends a submitter waits on. The price: a run's start and end reach the
log up to 250 ms late (GPUs freed that much later; runs last minutes to hours). A lone
report is appended at once. Why 250 ms: docs/decisions/0015."""

_T = TypeVar("_T", bound=msgspec.Struct)

log = structlog.get_logger("allot.dispatch", service=SERVICE)  # lazy: configured in main

_PUBLISH_ERRORS = (nats.errors.Error, TimeoutError, OSError)


class DispatchService:
    """See the module docstring. ``broker`` (default: one for ``nats_url``) and
    ``record_log`` (default: the log on the broker's connection, from ``on_started``) may
    be given, as unit tests give them."""

    def __init__(
        self,
        nats_url: str | None = None,
        *,
        broker: NatsBroker | None = None,
        record_log: RecordLog | None = None,
        provider: TracerProvider | None = None,
        clock: Callable[[], float] = runtime.wall_clock,
        lost_after_s: float = LOST_AFTER_S,
        lost_check_s: float = LOST_CHECK_S,
    ) -> None:
        if lost_after_s <= 0:
            raise ValidationError("lost_after_s", f"must be positive, got {lost_after_s!r}")
        if lost_check_s <= 0:
            raise ValidationError("lost_check_s", f"must be positive, got {lost_check_s!r}")
        self.clock = clock
        self.lost_after_s = lost_after_s
        self.lost_check_s = lost_check_s
        self.book = DispatchBook()
        self.heard: dict[str, float] = {}
        """Host -> wall-clock time of its agent's last report or sync this instance had."""
        self.lost_recorded = 0
        """Runs recorded lost with their silent hosts so far."""
        self._lost_sent: set[tuple[str, int]] = set()
        self.rejected: dict[str, int] = {}
        """Field named by a rejected report -> how many (the security tests read it)."""
        self.published = 0
        """``HostWork`` lists sent so far."""
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._ready = asyncio.Event()
        """Set once the log is replayed: until then no list is sent and no report judged (a
        partial fold would list too little and refuse reports of work it has not read)."""
        self.record_log = record_log
        """Where the reports' records go; built in ``on_started`` when not given: WORKLOADS
        through a group commit, so a backlog of them is stored as atomic batches."""
        self._follower: Follower | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._lost_checker: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._wrote = 0
        """The WORKLOADS sequence of the last record this instance appended."""

        self._provider = provider
        self.broker: NatsBroker = runtime.given_broker(broker, nats_url, SERVICE, provider)
        self._reports: RequestServer | None = None
        """Reports, one per workload step, served with nats-py as the ``PartReports`` and
        the syncs are (docs/decisions/0010-raw-nats-on-hot-subjects.md)."""
        self._report_batches: RequestServer | None = None
        """``PartReports``: many hosts' reports in one request (a fake agent's)."""
        self._syncs: RequestServer | None = None
        """Agents' ``HostSync`` (every host every ``--resync-s``: 33 a second from 1,000)."""

    # -- lifecycle ---------------------------------------------------------------------

    async def on_started(self) -> None:
        nc = raw_connection(self.broker)
        if nc is not None:
            # Taken from now on; each waits in ``report`` until the log is replayed.
            self._reports = await self._serve(
                nc, subjects.ALL_HOST_REPORT, self._report_handler, REPORT_WORKERS
            )
            self._report_batches = await self._serve(
                nc, subjects.HOSTS_REPORT, self._batch_handler, REPORT_BATCH_WORKERS
            )
            self._syncs = await self._serve(
                nc, subjects.ALL_HOST_SYNC, self._sync_handler, SYNC_WORKERS
            )
        if self.record_log is None:
            js = self.broker.connection.jetstream()
            await bus.ensure_streams(js)
            appends = await group_commit.for_stream(
                self.broker.connection,
                js,
                "WORKLOADS",
                threshold=REPORT_BATCH_THRESHOLD,
                linger_s=REPORT_BATCH_LINGER_S,
            )
            self.record_log = JetStreamLog(js, appends)
        self._follower = self.record_log.follower(self._on_record, every_s=READ_EVERY_S)
        await self._follower.start()
        self._ready.set()
        # Every host's list once: what changed while we were down reaches its agent now.
        self._dirty.update(self.book.fold.state.host_ids)
        self._wake.set()
        if nc is not None:
            self._flusher = asyncio.create_task(self._flush_loop(nc))
        self._lost_checker = asyncio.create_task(self._lost_loop())
        log.info(
            "started",
            hosts=len(self._dirty),
            running=len(self.book.listed_on),
            seq=self.seq,
        )

    async def _serve(
        self, nc: NatsClient, subject: str, handler: Handler, workers: int
    ) -> RequestServer:
        server = RequestServer(
            nc,
            subject,
            SERVICE,
            handler,
            max_in_flight=workers,
            provider=self._provider,
        )
        await server.start()
        return server

    async def on_stopping(self) -> None:
        for server in (self._reports, self._report_batches, self._syncs):
            if server is not None:
                await server.stop()
        self._reports = self._report_batches = self._syncs = None
        self._closing.set()
        self._wake.set()
        await stop_tasks([self._flusher, self._lost_checker], timeout=2.0)
        self._flusher = self._lost_checker = None
        if self._follower is not None:
            await self._follower.stop()
            self._follower = None

    @property
    def seq(self) -> int:
        return self._follower.last_seq.get("WORKLOADS", 0) if self._follower else 0

    def _on_record(self, _subject: str, record: msgspec.Struct) -> None:
        hosts = self.book.apply(record)
        if hosts:
            self._dirty.update(hosts)
            if self._ready.is_set():
                self._wake.set()

    # -- work lists ----------------------------------------------------------------------

    async def _flush_loop(self, nc: NatsClient) -> None:
        while not self._closing.is_set():
            await self._wake.wait()
            self._wake.clear()
            if self._closing.is_set():
                return
            # Let a burst of records land first: one list per host per burst, not per record.
            await asyncio.sleep(0)
            await self._read_own_records()  # no list says a part reported ended still runs
            hosts, self._dirty = self._dirty, set()
            at, seq = self.clock(), self.seq
            try:
                for host in sorted(hosts):
                    data = self.book.encoded_work(host, seq, at)
                    try:
                        await nc.publish(subjects.host_work(host), data)
                    except nats.errors.MaxPayloadError:  # this host's alone: the others go
                        log.warning("work list too large to send", host=host, size=len(data))
                        continue
                    self.published += 1
            except _PUBLISH_ERRORS as e:  # the agents' periodic sync covers a lost list
                log.warning("work list not sent", error=repr(e), hosts=len(hosts))

    async def _sync_handler(self, subject: str, body: bytes) -> bytes:
        await self._ready.wait()  # the agent's request times out and is asked again
        host = subjects.host_of(subject)
        req = self._decode(Kind.HOST_SYNC, m.HostSync, subject, body)
        if isinstance(req, m.CommandRejected):
            return codec.encode(req)
        try:
            subjects.check_host(req.host, host)
        except ValidationError as e:
            return codec.encode(self._reject(subject, e))
        self.heard[host] = self.clock()
        await self._read_own_records()
        return self.book.encoded_work(host, self.seq, self.clock())

    # -- reports -------------------------------------------------------------------------

    async def _report_handler(self, subject: str, body: bytes) -> bytes:
        return codec.encode(await self.report(subject, body))

    async def report(self, subject: str, body: bytes) -> m.CommandAccepted | m.CommandRejected:
        """Answer one ``PartReport``; every refusal is a ``CommandRejected`` naming the field."""
        await self._ready.wait()
        report = self._decode(Kind.HOST_REPORT, m.PartReport, subject, body)
        if isinstance(report, m.CommandRejected):
            return report
        await self._read_own_records()  # an end judged against its run's start
        return await self._judge(subject, subjects.host_of(subject), report)

    def _decode(
        self, kind: Kind, cls: type[_T], subject: str, body: bytes
    ) -> _T | m.CommandRejected:
        """``body`` as ``cls``, or the refusal naming the field (counted and logged).
        ``PartReports`` skip the scan for a key repeated in one object (``codec``'s
        ``own``): only service users are granted their subject, as for log records."""
        try:
            msg = codec.decode(kind, body, own=kind is Kind.HOSTS_REPORT)
            assert isinstance(msg, cls)
            return msg
        except ValidationError as e:
            return self._reject(subject, e)

    async def _batch_handler(self, subject: str, body: bytes) -> bytes:
        return codec.encode(await self.report_batch(subject, body))

    async def report_batch(
        self, subject: str, body: bytes
    ) -> m.PartReportsAnswered | m.CommandRejected:
        """Answer a ``PartReports``: each item as ``report`` would answer it alone on its own
        host's subject (the sender may speak for every host), in order. Items are judged
        concurrently, so their appends share group commits. If an append gets no answer
        from NATS the whole batch goes unanswered: the agent sends it again, and items
        already stored are answered from the log (their msg ids dedupe the rest)."""
        await self._ready.wait()
        batch = self._decode(Kind.HOSTS_REPORT, m.PartReports, subject, body)
        if isinstance(batch, m.CommandRejected):
            return batch
        await self._read_own_records()
        answers = await asyncio.gather(
            *(
                self._judge(subject, r.host, r, where=f"reports[{i}].")
                for i, r in enumerate(batch.reports)
            )
        )
        return m.PartReportsAnswered(at=self.clock(), answers=tuple(answers))

    async def _judge(
        self, subject: str, host: str, report: m.PartReport, *, where: str = ""
    ) -> m.CommandAccepted | m.CommandRejected:
        """``report`` from ``host`` (its subject's, or a batch item's own): append the record
        it causes and answer once stored. ``where`` prefixes a refused field's name (the
        item of a batch)."""
        self.heard[host] = self.clock()
        try:
            try:
                record = self.book.record_for(host, report, now=self.clock())
            except ValidationError as e:
                if e.field not in ("workload_id", "attempt"):
                    raise
                # Another dispatch instance may have sent the list: read the log to its
                # end before refusing a workload or attempt we have not seen.
                await self._catch_up()
                record = self.book.record_for(host, report, now=self.clock())
        except ValidationError as e:
            return self._reject(subject, ValidationError(where + e.field, e.reason))
        if record is None:
            return m.CommandAccepted(at=self.clock(), detail="already in the log")
        assert self.record_log is not None
        kind = "started" if isinstance(record, m.WorkloadStarted) else "ended"
        msg_id = f"{kind}:{report.workload_id}:{report.attempt}"
        allocation = getattr(record, "allocation", None)
        # Answered once stored, not once folded back: a retry is deduplicated by its msg id
        # (and refused by every fold), and the agent never starts a part it has had twice,
        # so nothing needs this instance's fold to be ahead of the reply.
        ack = await self.record_log.append(bus.event_subject(allocation, record), record, msg_id)
        self._wrote = max(self._wrote, ack.seq)
        if ack.duplicate:  # stored before, not yet read back into this instance's fold
            return m.CommandAccepted(at=self.clock(), detail="already in the log")
        log.debug(
            type(record).__name__,
            workload=report.workload_id,
            allocation=allocation,
            attempt=report.attempt,
            host=report.host,
        )
        return m.CommandAccepted(at=self.clock(), detail=type(record).__name__)

    # -- runs lost with their hosts ------------------------------------------------------

    async def _lost_loop(self) -> None:
        await every(self.lost_check_s, self._closing, self.record_lost, "lost runs not recorded")

    async def record_lost(self) -> int:
        """Append the end of every run lost with its silent host now; return how many."""
        assert self.record_log is not None
        now = self.clock()
        records = self.book.lost(now, self.heard, margin_s=self.lost_after_s)
        appended = 0
        for record in records:
            wid: str = getattr(record, "workload_id", "")
            attempt: int = getattr(record, "attempt", 0)
            if (wid, attempt) in self._lost_sent:
                continue  # appended; its echo has not reached the fold yet
            allocation = getattr(record, "allocation", None)
            ack = await self.record_log.append(
                bus.event_subject(allocation, record), record, f"ended:{wid}:{attempt}"
            )
            self._wrote = max(self._wrote, ack.seq)
            self._lost_sent.add((wid, attempt))
            appended += 1
            self.lost_recorded += 1
            log.warning(
                "run lost with its host",
                workload=wid,
                allocation=allocation,
                attempt=attempt,
                record=type(record).__name__,
                host=self._host_of(wid),  # the primary, silent since its drain
            )
        if len(self._lost_sent) > 4096:
            self._lost_sent = {k for k in self._lost_sent if self._still_live(*k)}
        return appended

    def _host_of(self, wid: str) -> str:
        rec = self.book.fold.records.get(wid)
        return primary_host(rec) if rec is not None and rec.assignment else ""

    def _still_live(self, wid: str, attempt: int) -> bool:
        rec = self.book.fold.records.get(wid)
        return rec is not None and rec.attempt == attempt and rec.status in ("running", "noticed")

    async def _read_own_records(self) -> None:
        """Fold what this instance appended before answering from the fold: a restarted
        agent told a part it reported started is still to start would start it again. The
        follower may take the log in batches (``READ_EVERY_S``), so without this its own records
        come back up to that much later; with it, at once (one request)."""
        assert self._follower is not None
        if self._follower.last_seq.get("WORKLOADS", 0) < self._wrote:
            await self._follower.wait_for("WORKLOADS", self._wrote, CATCH_UP_TIMEOUT_S)

    async def _catch_up(self) -> None:
        assert self._follower is not None
        await self._follower.catch_up("WORKLOADS", CATCH_UP_TIMEOUT_S)

    def _reject(self, subject: str, e: ValidationError) -> m.CommandRejected:
        """Count and log a refusal; the answer that names its field."""
        self.rejected[e.field] = self.rejected.get(e.field, 0) + 1
        log.warning("report rejected", subject=subject, field=e.field, reason=e.reason)
        return m.CommandRejected(at=self.clock(), field=e.field, reason=e.reason)


def build(args: argparse.Namespace) -> DispatchService:
    runtime.configure_logging(SERVICE)
    return DispatchService(
        args.nats_url,
        provider=runtime.tracer_provider(SERVICE),
        lost_after_s=args.lost_after_s,
    )


def parser() -> argparse.ArgumentParser:
    ap = base_parser("python -m allot.services.dispatch", __doc__.splitlines()[0])
    ap.add_argument(
        "--lost-after-s",
        type=positive_seconds,
        default=LOST_AFTER_S,
        help="record a run lost this long after its host was drained for missed heartbeats "
        "when nothing was heard from the host since (seconds; default %(default)s)",
    )
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(build, parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
