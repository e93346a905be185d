"""The host agent: runs what the placement leader put on its hosts and reports how it went.

``python -m allot.services.agent --host h01 --gpus 8`` runs one real host;
``--fake --hosts 1000 --gpus 8`` simulates hosts ``fake-0000``... in one process (demos and
load tests): a fake part "runs" for the submission's ``duration_s`` with a timer.

What it does, and why that way:

* **Heartbeats** on core NATS every ``--heartbeat-s`` for each host (the health service
  registers a host from its first one). Many fake hosts are spread over the interval in at
  most ``HEARTBEAT_SLOTS`` batches, so 1,000 hosts cost ~50 wake-ups a second, not 1,000.
* **State** is the same ``LogFold`` placement uses, fed by a ``LogFollower``. The agent acts
  only on records the fold *accepted*: a stale epoch's placement or a double booking is
  ignored here exactly as everywhere else.
* **Starting.** After the replay has caught up, an accepted ``WorkloadPlaced`` naming one of
  its hosts starts that host's part (real: ``record.command``, no shell, in its own process
  group, ``CUDA_VISIBLE_DEVICES`` = the host's GPUs). The *primary* host (the first of the
  assignment's hosts, sorted) reports ``WorkloadStarted`` and the terminal event; the other
  hosts of a gang only run their part and stop it when the log shows the workload ended.
* **Stopping.** A ``PreemptionNotice``: SIGTERM to every part now, SIGKILL at the grace
  deadline; a ``CancelRequested``: SIGTERM, SIGKILL after ``--kill-after-s``. The terminal
  event follows from the log's view when the part exits: cancel requested -> Cancelled,
  under notice -> Preempted (the notice's reason), else exit code 0 -> Completed, other ->
  Failed.
* **Restarts.** Catching up, the agent finds workloads running on its hosts that it has no
  process for. Those with a ``WorkloadStarted`` of the current attempt ran under an earlier
  agent process: they are reported ``WorkloadFailed("agent restarted; the process was
  lost")`` so the GPUs are freed (we cannot reattach). Those placed but never started (the
  placement landed while the agent was down or during its replay) are started now.

Every report is published with a ``Nats-Msg-Id`` (``started:<wid>:<attempt>``,
``ended:<wid>:<attempt>``) and retried until acknowledged, so a retry is stored once and a
report is not lost to a transient NATS error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from opentelemetry.sdk.trace import TracerProvider

from allot.core.errors import ValidationError
from allot.live import bus
from allot.live.gpu_exec import (
    Clock,
    FakePart,
    Part,
    ProcessPart,
    describe_exit,
    workload_env,
)
from allot.live.logfold import LogFold, WorkloadRecord
from allot.live.runtime import configure_logging, make_broker, tracer_provider, wall_clock
from allot.live.service_main import base_parser, run_main
from allot.proto import messages as m
from allot.proto import subjects
from allot.proto.messages import PreemptReason

log = structlog.get_logger("allot.agent", service="agent")

HEARTBEAT_SLOTS = 50
"""At most this many heartbeat batches per interval (fake mode with many hosts)."""
MAX_GPUS_PER_HOST = 1024
MAX_FAKE_HOSTS = 100_000
MAX_RUNNING_IN_HEARTBEAT = 1024
LIVE = frozenset({"running", "noticed"})
RESTART_LOST = "agent restarted; the process was lost"
NO_COMMAND = "the workload has no command (submit it with command=[program, args...])"

_PUBLISH_ERRORS = (nats.errors.Error, TimeoutError, OSError)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Validated at construction: a bad value raises ``ValidationError(field, reason)``."""

    nats_url: str
    hosts: tuple[str, ...]
    gpus: int = 8
    fake: bool = False
    heartbeat_s: float = 1.0
    fake_duration_s: float = 60.0
    kill_after_s: float = 10.0
    stop_grace_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.hosts:
            raise ValidationError("hosts", "name at least one host")
        for i, host in enumerate(self.hosts):
            subjects.validate_token(host, f"hosts[{i}]")
        if len(set(self.hosts)) != len(self.hosts):
            raise ValidationError("hosts", "a host is named twice")
        if isinstance(self.gpus, bool) or not 1 <= self.gpus <= MAX_GPUS_PER_HOST:
            raise ValidationError("gpus", f"must be 1..{MAX_GPUS_PER_HOST}, got {self.gpus!r}")
        for name in ("heartbeat_s", "fake_duration_s", "kill_after_s"):
            value = getattr(self, name)
            if not 0.0 < value <= 86_400.0:
                raise ValidationError(name, f"must be in (0, 86400] seconds, got {value!r}")
        if not 0.0 <= self.stop_grace_s <= 3600.0:
            raise ValidationError("stop_grace_s", f"must be in [0, 3600], got {self.stop_grace_s}")


@dataclass(eq=False)
class Run:
    """One host's part of one attempt of a workload."""

    workload_id: str
    allocation: str | None
    attempt: int
    host: str
    gpus: tuple[int, ...]
    primary: bool
    log: Any
    part: Part | None = None
    stop_at: float | None = None
    """Wall-clock SIGKILL deadline of a stop asked for (kept if asked before the part exists)."""
    silent: bool = False
    """The log already ended this attempt: stop quietly, report nothing."""

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.workload_id, self.attempt, self.host)


class Agent:
    """A service (``allot.live.service_main.Service``) running one or many hosts."""

    def __init__(
        self,
        config: AgentConfig,
        provider: TracerProvider | None = None,
        clock: Clock = wall_clock,
    ) -> None:
        self.config = config
        self.broker = make_broker(config.nats_url, "agent", provider)
        self.fold = LogFold()
        self.caught_up = False
        self._clock = clock
        self._started_at: dict[tuple[str, int], float] = {}
        self._hosts = frozenset(config.hosts)
        self._runs: dict[tuple[str, int, str], Run] = {}
        self._by_workload: dict[str, dict[tuple[str, int, str], Run]] = {}
        self._by_host: dict[str, dict[tuple[str, int, str], Run]] = {}
        self._notice_reasons: dict[str, PreemptReason] = {}
        self._cancels: dict[str, m.CancelRequested] = {}
        self._started_in_replay: set[tuple[str, int]] = set()
        self._seq = 0
        self._nc: NatsClient | None = None
        self._js: JetStreamContext | None = None
        self._follower: bus.LogFollower | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self.log = log.bind(hosts=len(config.hosts), fake=config.fake)

    # ------------------------------------------------------------------ service protocol
    async def on_started(self) -> None:
        self._nc, self._js = await bus.connect(
            self.config.nats_url, f"allot-agent-{self.config.hosts[0]}"
        )
        # Agents may not create or change streams (allot auth gen grants them none): the
        # services create them.
        await bus.wait_for_streams(self._js)
        # Heartbeats first: the host is alive while it replays a long log.
        self._heartbeat_task = asyncio.create_task(self._heartbeats())
        self._follower = bus.LogFollower(self._js, self._on_record)
        await self._follower.start()
        self._catch_up()
        self.log.info("agent caught up", applied=self.fold.applied, epoch=self.fold.epoch)

    async def on_stopping(self) -> None:
        self._stopping = True
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat_task
        if self._follower is not None:
            await self._follower.stop()
        deadline = self._clock() + self.config.stop_grace_s
        for run in list(self._runs.values()):
            self._stop_run(run, deadline)
        pending = set(self._tasks)
        if pending:
            # The parts get the grace period, their reports a little more.
            _, still = await asyncio.wait(pending, timeout=self.config.stop_grace_s + 2.0)
            for task in still:
                task.cancel()
            for run in list(self._runs.values()):
                if run.part is not None:
                    run.part.kill()
            if still:
                await asyncio.wait(still, timeout=1.0)
        if self._nc is not None:
            with contextlib.suppress(*_PUBLISH_ERRORS):
                await self._nc.close()
        self.log.info("agent stopped")

    # ------------------------------------------------------------------ the log
    def _on_record(self, subject: str, record: msgspec.Struct) -> None:
        """Synchronous on purpose: it never waits, so records are applied in order and the
        catch-up switch cannot interleave with one."""
        result = self.fold.apply(record)
        wid: str | None = getattr(record, "workload_id", None)
        if wid is None:
            return
        if result.changed and isinstance(record, m.PreemptionNotice):
            self._notice_reasons[wid] = record.reason
        elif result.changed and isinstance(record, m.CancelRequested):
            self._cancels[wid] = record
        elif isinstance(record, m.WorkloadStarted) and not self.caught_up:
            rec = self.fold.records.get(wid)
            if rec is not None and rec.attempt == record.attempt and rec.status in LIVE:
                self._started_in_replay.add((wid, record.attempt))
        if self.caught_up:
            self._act(record, wid, result.changed, result.why)
        self._prune(wid)

    def _act(self, record: msgspec.Struct, wid: str, changed: bool, why: str) -> None:
        if isinstance(record, m.WorkloadPlaced):
            if changed:
                self._start_parts(wid)
            elif any(hg.host in self._hosts for hg in record.assignment):
                log.info(
                    "placement ignored",
                    workload=wid,
                    allocation=record.allocation,
                    attempt=record.attempt,
                    epoch=record.epoch,
                    why=why,
                )
        elif isinstance(record, m.PreemptionNotice) and changed:
            self._stop_workload(wid, record.grace_deadline)
        elif isinstance(record, m.CancelRequested) and changed:
            self._stop_workload(wid, self._clock() + self.config.kill_after_s)
        self._stop_if_ended(wid)

    def _catch_up(self) -> None:
        self.caught_up = True
        mine: set[str] = set()
        for host in self._hosts:
            mine.update(self.fold.workload_on(host))
        for wid in sorted(mine):
            rec = self.fold.records[wid]
            if (wid, rec.attempt) in self._started_in_replay:
                if self._primary_host(rec) in self._hosts:
                    log.warning("process lost in a restart", workload=wid, attempt=rec.attempt)
                    self._spawn(self._report_end(wid, rec.attempt, None, RESTART_LOST))
                else:
                    log.warning(
                        "gang part lost in a restart; the primary host reports",
                        workload=wid,
                        attempt=rec.attempt,
                    )
            else:
                self._start_parts(wid)
        self._started_in_replay.clear()

    def _prune(self, wid: str) -> None:
        rec = self.fold.records.get(wid)
        if rec is None or rec.status not in LIVE:
            self._notice_reasons.pop(wid, None)
            self._cancels.pop(wid, None)

    # ------------------------------------------------------------------ runs
    @staticmethod
    def _primary_host(rec: WorkloadRecord) -> str:
        return min(host for host, _ in rec.assignment)

    def _start_parts(self, wid: str) -> None:
        rec = self.fold.records[wid]
        primary = self._primary_host(rec)
        for host, gpus in rec.assignment:
            if host not in self._hosts:
                continue
            run = Run(
                workload_id=wid,
                allocation=rec.workload.allocation,
                attempt=rec.attempt,
                host=host,
                gpus=tuple(gpus),
                primary=host == primary,
                log=log.bind(
                    workload=wid,
                    allocation=rec.workload.allocation,
                    attempt=rec.attempt,
                    host=host,
                ),
            )
            if run.key in self._runs:
                continue
            self._runs[run.key] = run
            self._by_workload.setdefault(wid, {})[run.key] = run
            self._by_host.setdefault(host, {})[run.key] = run
            self._spawn(self._supervise(run))

    def _forget(self, run: Run) -> None:
        self._runs.pop(run.key, None)
        for index, name in ((self._by_workload, run.workload_id), (self._by_host, run.host)):
            runs = index.get(name)
            if runs is not None:
                runs.pop(run.key, None)
                if not runs:
                    del index[name]

    def _stop_workload(self, wid: str, kill_at: float) -> None:
        for run in list(self._by_workload.get(wid, {}).values()):
            run.log.info("stopping part", kill_at=kill_at)
            self._stop_run(run, kill_at)

    def _stop_run(self, run: Run, kill_at: float) -> None:
        run.stop_at = kill_at if run.stop_at is None else min(run.stop_at, kill_at)
        if run.part is not None:
            run.part.terminate(run.stop_at)

    def _stop_if_ended(self, wid: str) -> None:
        """Parts of an attempt the log has ended (a gang's secondaries after the primary's
        report, or any report we did not make) stop without reporting."""
        runs = self._by_workload.get(wid)
        if not runs:
            return
        rec = self.fold.records.get(wid)
        for run in list(runs.values()):
            ended = rec is None or rec.attempt != run.attempt or rec.status not in LIVE
            if ended and not run.silent:
                run.silent = True
                run.log.info("the log ended this attempt; stopping the part")
                self._stop_run(run, self._clock() + self.config.kill_after_s)

    async def _supervise(self, run: Run) -> None:
        try:
            rec = self.fold.records[run.workload_id]
            if self._stopping:
                return  # never started: a restarted agent starts it
            if rec.cancel_requested or rec.status == "noticed":
                # Stopped before it started (possible when catching up): nothing to run.
                if run.primary:
                    await self._report_end(
                        run.workload_id, run.attempt, None, "stopped before start"
                    )
                return
            part = await self._make_part(run, rec)
            if part is None:
                return
            run.part = part
            if run.stop_at is not None:
                part.terminate(run.stop_at)
            self._detail(run.log, "part started", pid=part.pid, gpus=list(run.gpus))
            if run.primary:
                await self._publish_started(run, rec, part.pid)
            code = await part.wait()
            self._detail(run.log, "part ended", exit=describe_exit(code))
            if run.primary and not run.silent:
                await self._report_end(run.workload_id, run.attempt, code, describe_exit(code))
        finally:
            self._forget(run)

    async def _make_part(self, run: Run, rec: WorkloadRecord) -> Part | None:
        if self.config.fake:
            return FakePart(rec.duration_s or self.config.fake_duration_s)
        if not rec.command:
            reason: str | None = NO_COMMAND
        else:
            env = workload_env(
                os.environ,
                gpus=run.gpus,
                workload_id=run.workload_id,
                allocation=run.allocation,
                attempt=run.attempt,
                nats_url=self.config.nats_url,
                host=run.host,
            )
            try:
                return await ProcessPart.spawn(rec.command, env, self._clock)
            except OSError as e:
                reason = f"cannot start {rec.command[0]!r}: {e.strerror or e}"
        run.log.error("part not started", reason=reason)
        if run.primary:
            await self._report_end(run.workload_id, run.attempt, None, reason)
        return None

    # ------------------------------------------------------------------ reports
    async def _publish_started(self, run: Run, rec: WorkloadRecord, pid: int | None) -> None:
        event = m.WorkloadStarted(
            workload_id=run.workload_id,
            allocation=run.allocation,
            at=self._clock(),
            host=run.host,
            pid=pid,
            attempt=run.attempt,
            gpus=rec.workload.gpus,
            allocated=rec.workload.allocated,
        )
        # The run is charged from this moment, by accounting (from this record) and in the
        # terminal record's ``started_at``: both must use the same start.
        self._started_at[(run.workload_id, run.attempt)] = event.at
        await self._publish(
            subjects.events(run.allocation, run.workload_id),
            event,
            f"started:{run.workload_id}:{run.attempt}",
        )

    async def _report_end(
        self, wid: str, attempt: int, code: int | None, detail: str | None
    ) -> None:
        """The terminal event of (wid, attempt), chosen from the log's view of it now."""
        rec = self.fold.records.get(wid)
        if rec is None or rec.attempt != attempt or rec.status not in LIVE:
            log.info("already ended in the log; not reporting", workload=wid, attempt=attempt)
            return
        w = rec.workload
        at = self._clock()
        started_at = self._started_at.pop((wid, attempt), None)
        if started_at is None:  # started by an earlier life of this agent
            started_at = rec.started_at if rec.started_at is not None else at
        gpu_seconds = w.gpus * max(0.0, at - started_at)
        exit_code = None if code is None else max(-255, min(255, code))
        event: msgspec.Struct
        if rec.cancel_requested:
            cancel = self._cancels.get(wid)
            event = m.WorkloadCancelled(
                workload_id=wid,
                allocation=w.allocation,
                at=at,
                by=cancel.by if cancel is not None else None,
                reason=(cancel.reason if cancel is not None and cancel.reason else "cancelled"),
                gpu_seconds=gpu_seconds,
                attempt=attempt,
                gpus=w.gpus,
                started_at=started_at,
                allocated=w.allocated,
            )
        elif rec.status == "noticed":
            event = m.WorkloadPreempted(
                workload_id=wid,
                allocation=w.allocation,
                at=at,
                reason=self._notice_reasons.get(wid, "better-ranked"),
                gpu_seconds=gpu_seconds,
                attempt=attempt,
                gpus=w.gpus,
                started_at=started_at,
                allocated=w.allocated,
            )
        elif code == 0 and not self._stopping:
            event = m.WorkloadCompleted(
                workload_id=wid,
                allocation=w.allocation,
                at=at,
                gpu_seconds=gpu_seconds,
                attempt=attempt,
                gpus=w.gpus,
                started_at=started_at,
                allocated=w.allocated,
            )
        else:
            reason = detail or "failed"
            if self._stopping and code is not None:
                reason = f"agent stopped; the process was terminated ({reason})"
            event = m.WorkloadFailed(
                workload_id=wid,
                allocation=w.allocation,
                at=at,
                exit_code=exit_code,
                reason=reason[: m.MAX_TEXT_LEN],
                gpu_seconds=gpu_seconds,
                attempt=attempt,
                gpus=w.gpus,
                started_at=started_at,
                allocated=w.allocated,
            )
        self._detail(
            log,
            "reporting",
            workload=wid,
            allocation=w.allocation,
            attempt=attempt,
            record=type(event).__name__,
            exit_code=exit_code,
        )
        await self._publish(subjects.events(w.allocation, wid), event, f"ended:{wid}:{attempt}")

    async def _publish(self, subject: str, record: msgspec.Struct, msg_id: str) -> None:
        """Retried until acknowledged (the msg id makes a retry harmless); given up only
        when the agent is stopping and NATS keeps failing."""
        assert self._js is not None
        delay, tries = 0.2, 0
        while True:
            tries += 1
            try:
                await bus.publish(self._js, subject, record, msg_id)
                return
            except _PUBLISH_ERRORS as e:
                if self._stopping and tries >= 3:
                    log.error("report lost: NATS unavailable while stopping", msg_id=msg_id)
                    return
                log.warning("publish failed; retrying", msg_id=msg_id, error=repr(e))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    # ------------------------------------------------------------------ heartbeats
    async def _heartbeats(self) -> None:
        hosts = self.config.hosts
        slots = min(len(hosts), HEARTBEAT_SLOTS)
        groups = [hosts[i::slots] for i in range(slots)]
        period = self.config.heartbeat_s
        loop = asyncio.get_running_loop()
        start, n = loop.time(), 0
        while True:
            for i, group in enumerate(groups):
                delay = start + (n + i / slots) * period - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self._beat(group)
            n += 1
            if loop.time() - (start + n * period) > period:
                start, n = loop.time(), 0  # far behind (a stalled loop): no burst to catch up

    async def _beat(self, hosts: Sequence[str]) -> None:
        assert self._nc is not None
        self._seq += 1
        try:
            for host in hosts:
                running = sorted({key[0] for key in self._by_host.get(host, {})})
                beat = m.Heartbeat(
                    host=host,
                    sent_at=self._clock(),
                    seq=self._seq,
                    gpus=self.config.gpus,
                    running=tuple(running[:MAX_RUNNING_IN_HEARTBEAT]),
                )
                await self._nc.publish(subjects.heartbeat(host), bus.encode(beat))
        except _PUBLISH_ERRORS as e:
            log.warning("heartbeat not sent", error=repr(e))

    def _detail(self, logger: Any, message: str, **fields: Any) -> None:
        """Per-part lines: info for a real host, debug for fake ones (thousands a minute)."""
        (logger.debug if self.config.fake else logger.info)(message, **fields)

    # ------------------------------------------------------------------ tasks
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("agent task failed", error=repr(task.exception()))


# ---------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    ap = base_parser("allot-agent", "Run the workloads placed on this host (or on fake hosts).")
    ap.add_argument("--host", help="this host's name (real mode)")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs per host (default %(default)s)")
    ap.add_argument("--fake", action="store_true", help="simulate hosts; parts run as timers")
    ap.add_argument("--hosts", type=int, default=1, help="fake mode: how many hosts")
    ap.add_argument("--host-prefix", default="fake", help="fake mode: host name prefix")
    ap.add_argument("--heartbeat-s", type=float, default=1.0)
    ap.add_argument("--fake-duration-s", type=float, default=60.0, help="when duration_s is unset")
    ap.add_argument(
        "--kill-after-s",
        type=float,
        default=10.0,
        help="SIGKILL this long after a cancel's SIGTERM",
    )
    ap.add_argument(
        "--stop-grace-s", type=float, default=5.0, help="on stop, SIGKILL children after this"
    )
    return ap


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    """Raises ``ValidationError`` naming the command-line option at fault."""
    if args.fake:
        if args.host is not None:
            raise ValidationError("--host", "is for real mode; fake mode names hosts <prefix>-NNNN")
        if not 1 <= args.hosts <= MAX_FAKE_HOSTS:
            raise ValidationError("--hosts", f"must be 1..{MAX_FAKE_HOSTS}, got {args.hosts}")
        hosts = tuple(f"{args.host_prefix}-{i:04d}" for i in range(args.hosts))
    else:
        if args.host is None:
            raise ValidationError("--host", "is required (or use --fake)")
        hosts = (args.host,)
    try:
        return AgentConfig(
            nats_url=args.nats_url,
            hosts=hosts,
            gpus=args.gpus,
            fake=args.fake,
            heartbeat_s=args.heartbeat_s,
            fake_duration_s=args.fake_duration_s,
            kill_after_s=args.kill_after_s,
            stop_grace_s=args.stop_grace_s,
        )
    except ValidationError as e:
        if e.field.startswith("hosts"):
            option = "--host-prefix" if args.fake else "--host"
        else:
            option = "--" + e.field.replace("_", "-")
        raise ValidationError(option, e.reason) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()

    def build(args: argparse.Namespace) -> Agent:
        try:
            config = config_from_args(args)
        except ValidationError as e:
            parser.error(f"{e.field}: {e.reason}")
        configure_logging("agent")
        return Agent(config, provider=tracer_provider("agent"))

    return run_main(build, parser, argv)


if __name__ == "__main__":
    raise SystemExit(main())
