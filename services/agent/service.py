"""The host agent: runs what the placement leader put on its hosts and reports how it went.

``python -P -m allot.services.agent --host h01 --gpus 8`` runs one real host (``-P``: its
workloads write to its working directory, which must not be on its import path);
``--fake --hosts 1000 --gpus 8`` simulates hosts ``fake-0000``... in one process (demos and
load tests): a fake part "runs" for the submission's ``duration_s`` with a timer.

An agent speaks and hears only for its own hosts (NATS permissions grant it nothing else,
see ``allot.ops.auth_gen``); it never reads the log. What it does, and why that way:

* **Its login stays its own.** Workloads run as the agent's user, which could read the
  agent's environment (its NATS password) and memory through ``/proc``: the process makes
  itself non-dumpable first thing (``process_guard``), and a part's environment holds
  none of the agent's credentials (``gpu_exec.workload_env``). Limits: docs/security.md.
  Started as root with ``--run-as-user``, it runs each part as its submission's user's
  OS account instead (``accounts``), and does its file work for the part as that account.
* **Heartbeats** on core NATS every ``--heartbeat-s`` for each host (the health service
  registers a host from its first one). Many fake hosts are spread over the interval in at
  most ``SLOTS`` batches, so 1,000 hosts cost ~50 wake-ups a second, not 1,000.
* **Work.** The dispatch service (``allot.services.dispatch``) sends each host its whole list
  of parts on ``allot.v1.host.<host>.work`` whenever the log changes it; the agent also asks
  for it (``...<host>.sync``) when it starts and every ``--resync-s``, so a lost message only
  delays. A list older (by log position) than one already applied is ignored. The agent
  reconciles: a listed part it does not run starts (real: the task's command, no shell, in
  its own process group, ``CUDA_VISIBLE_DEVICES`` = the host's GPUs, ``ALLOT_HOSTS`` and
  ``ALLOT_HOST_RANK`` from the task's hosts; a part with no command but a
  ``duration_s`` holds its GPUs that long and completes, as ``salloc --time`` does, and
  one with neither fails); a part listed with a
  stop gets SIGTERM now and SIGKILL at the grace deadline (notice) or after
  ``--kill-after-s`` (cancel); a part no longer listed has ended in the log and stops
  quietly (a gang's other hosts after the end's report).
* **Reports.** The *primary* host (the first of the assignment's hosts, sorted) reports the
  start and how the process ended (``PartReport`` on ``...<host>.report``); dispatch checks
  the host and appends the log record, choosing it from the log's view (cancelled,
  preempted, completed or failed). A gang's other hosts report only an end of their own
  part that ends the whole attempt: one lost in a restart, one that failed (exited
  non-zero) or that the agent's own stop ended; a clean exit is left to the primary.
  Dispatch then stops the attempt's other parts, the primary's included. A report is
  retried until answered. With ``--batch-reports`` (fake mode, connected as a service
  user or to a server without users) the reports of every simulated host within 50 ms go
  as one ``PartReports`` request on ``allot.v1.hosts.report`` (``report_batch``): at 500
  runs a second that is about 20 requests a second instead of 1,000.
* **GPU utilization** (``gpu_util``): every ``--util-every-s`` each host's per-GPU mean
  utilization over the interval goes as one ``HostUtilization`` request on
  ``allot.v1.host.<host>.util`` (answered by the health service, which flags allocated work
  whose GPUs stay idle). A real host reads NVML every few seconds (none without a GPU
  driver: the agent says so once and reports nothing); a fake host reports what its parts'
  ``ALLOT_FAKE_UTIL`` asks (``idle``, ``busy``, a percent). An unanswered report is not
  sent again: the next interval's says more.
* **Restarts.** A listed part that the log shows started but this process does not run ran
  under an earlier agent process (we cannot reattach). Its processes may still run: parts
  live in sessions of their own, so a ``kill -9`` of the agent leaves them behind. As
  slurmd does on restart, a real agent first SIGKILLs every process an earlier agent
  started on its hosts (``gpu_exec.LeftoverSweep``: found by the part named in their
  environment, never by a pid that may have been reused; with ``--cgroup-root``, then by
  the part's cgroup, ``part_cgroup``), and reports such a part ``lost``
  only once none of its processes is left, so its GPUs are never handed out while it still
  holds them. Dispatch records a lost part as preempted (``host-drain``: a node failure,
  which Slurm requeues), so resumable work is requeued. One placed but never started
  (placed while the agent was down) starts now. An agent that stays dead does not hold
  its runs forever: once health has drained its host for missed heartbeats and the host
  stayed silent for ``--lost-after-s``, dispatch records its runs lost in its place
  (``allot.eventlog.host_work.lost_run``); the sweep above ends what is left of it when the
  agent comes back.
* **Stopping** (SIGTERM to the agent): a real agent first takes its hosts out of service
  (an unhealthy ``HealthReport``, detail ``agent stopping``, which the health service
  turns into a drain that the agent's next heartbeat ends) and holds its reports for
  ``STOP_SETTLE_S``, so the runs they requeue are not placed straight back on a host no
  agent serves. Then every part gets SIGTERM, SIGKILL after
  ``--stop-grace-s``; a part the stop ended is reported with ``stopping`` set, which
  dispatch records as a preemption (``host-drain``: a planned host shutdown), so resumable
  work is requeued. A part that had exited on its own keeps its own outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client as NatsClient
from opentelemetry.sdk.trace import TracerProvider

from allot import bus
from allot.adapters import pid_lock
from allot.auth.client import nats_url_from_env
from allot.bus.runtime import configure_logging, make_broker, tracer_provider, wall_clock
from allot.bus.service_main import DEFAULT_NATS_URL, base_parser, run_main
from allot.bus.tasks import stop_tasks
from allot.core.errors import ValidationError
from allot.eventlog.host_work import AGENT_STOPPING, RESTART_LOST, STOPPED_BEFORE_START
from allot.eventlog.idle_watch import NOT_REGISTERED
from allot.proto import codec, subjects
from allot.proto import messages as m
from allot.services.agent import accounts, checkpoint, part_cgroup
from allot.services.agent.gpu_exec import (
    Clock,
    FakePart,
    LeftoverSweep,
    Part,
    ProcessPart,
    agent_marker,
    describe_exit,
    without_userinfo,
    workload_env,
)
from allot.services.agent.gpu_util import SAMPLE_S, NvmlGpus, UtilMeans, fake_util
from allot.services.agent.part_cgroup import PartCgroup
from allot.services.agent.part_names import part_name
from allot.services.agent.process_guard import forbid_inspection
from allot.services.agent.report_batch import ReportBatcher
from allot.services.agent.safe_paths import open_output, untrusted_root
from allot.sim.output_files import make_out_dir

log = structlog.get_logger("allot.agent", service="agent")

SLOTS = 50
"""At most this many batches per heartbeat or resync interval (many fake hosts)."""
MAX_GPUS_PER_HOST = 1024
MAX_FAKE_HOSTS = 100_000
MAX_RUNNING_IN_HEARTBEAT = 1024
NO_COMMAND = "the workload has no command (submit it with command=[program, args...])"
REQUEST_TIMEOUT_S = 5.0
CHECKPOINT_POLL_S = 0.1
"""How often a part under notice is checked for its checkpoint's confirmation."""
STOP_SETTLE_S = 0.5
"""How long a stopping real agent holds the reports of the runs it stops after asking health
to take its hosts out of service (a core NATS publish, then a HOSTS record that placement
must read before the requeued runs are placed again); the parts get SIGTERM meanwhile."""
HOST_LOCKS = Path(tempfile.gettempdir()) / "allot-agents"
"""Where real agents lock their hosts (``_lock_hosts``)."""
LEFTOVER_WAIT_S = 10.0
"""How long a starting agent waits for an earlier agent's processes to die before it goes
on (a part still holding on is reported lost only once it is gone, however long)."""
LEFTOVER_WARN_S = 30.0
DONE_TTL_S = 600.0
"""How long a finished part is remembered, so a list sent before its end cannot start it
again (lists are ordered by log position, but a part's own report is not)."""
__all__ = ["NO_COMMAND", "RESTART_LOST", "Agent", "AgentConfig"]

_PUBLISH_ERRORS = (nats.errors.Error, TimeoutError, OSError)
_ANSWER = msgspec.json.Decoder(m.CommandAccepted | m.CommandRejected)


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
    resync_s: float = 30.0
    util_every_s: float = 30.0
    """How often each host's GPU utilization is reported (``gpu_util``)."""
    batch_reports: bool = False
    """Send the reports of all hosts as ``PartReports`` (fake mode only; see the module)."""
    output_dir: Path | None = None
    """Real mode: each part's stdout and stderr go to
    ``<output_dir>/<workload>.<attempt>.<host>.out`` (appended; Slurm's ``slurm-%j.out``),
    instead of the agent's own output."""
    checkpoint_root: Path | None = None
    """Real mode: where the agent keeps checkpoint directories it manages (``checkpoint``;
    shared storage in a real cluster: the next attempt may land on any host)."""
    checkpoint_allow: tuple[Path, ...] = ()
    """Real mode: roots inside which a workload may name its own ``checkpoint_dir``."""
    run_as_user: bool = False
    """Real mode, as root: each part runs as its submission's user (``accounts``)."""
    run_as_min_uid: int = accounts.DEFAULT_MIN_UID
    """The lowest uid ``run_as_user`` runs a part as (root and system accounts: never)."""
    session_root: Path | None = None
    """Real mode: where sessions' live state directories are kept (None:
    ``checkpoint.SESSION_SCRATCH``, in the shared temporary directory)."""
    pass_env: tuple[str, ...] = ()
    """With ``run_as_user``: variables of the agent's environment a part inherits beyond
    ``accounts.PASSED_ENV`` (without the option a part inherits all but ``ALLOT_*``)."""
    cgroup_root: Path | None = None
    """Real mode: a cgroup v2 directory under which each part gets a cgroup of its own
    (``part_cgroup``): what leaves the part's session still ends with it."""

    def __post_init__(self) -> None:
        if self.batch_reports and not self.fake:
            raise ValidationError(
                "batch_reports",
                "is for fake mode: a real agent speaks for its own host, and the batch "
                "subject is granted to service users only",
            )
        if self.output_dir is not None:
            if self.fake:
                raise ValidationError("output_dir", "is for real mode: fake parts print nothing")
            make_out_dir(self.output_dir, "output_dir")
        for name, roots in (
            ("checkpoint_root", () if self.checkpoint_root is None else (self.checkpoint_root,)),
            ("session_root", () if self.session_root is None else (self.session_root,)),
            ("checkpoint_allow", self.checkpoint_allow),
        ):
            for root in roots:
                if self.fake:
                    raise ValidationError(name, "is for real mode: fake parts write nothing")
                if not root.is_absolute():
                    raise ValidationError(name, f"{root} is not an absolute path")
        if self.run_as_user:
            if self.fake:
                raise ValidationError("run_as_user", "is for real mode: fake parts run nothing")
            if not accounts.can_switch():
                raise ValidationError(
                    "run_as_user",
                    f"needs the agent to run as root (it switches to each part's user); it "
                    f"runs as uid {os.geteuid()}",
                )
            if self.output_dir is None:
                raise ValidationError(
                    "output_dir",
                    "is required with run_as_user: a part run as its user must not write "
                    "into the agent's own output (it could truncate the agent's log)",
                )
            for name, top in (
                ("checkpoint_root", self.checkpoint_root),
                ("session_root", self.session_root),
            ):
                why = None if top is None else untrusted_root(top)
                if why is not None:
                    raise ValidationError(name, f"with run_as_user: {why}")
        for i, name in enumerate(self.pass_env):
            if not self.run_as_user:
                raise ValidationError(
                    "pass_env",
                    "is for run_as_user: without it a part inherits the agent's whole "
                    "environment but ALLOT_*",
                )
            if not name or "=" in name or "\0" in name:
                raise ValidationError(f"pass_env[{i}]", f"{name!r} is no variable name")
            if name.startswith("ALLOT_"):
                raise ValidationError(
                    f"pass_env[{i}]", f"{name}: the agent's ALLOT_* variables are never passed on"
                )
        if self.cgroup_root is not None:
            if self.fake:
                raise ValidationError("cgroup_root", "is for real mode: fake parts run nothing")
            why = part_cgroup.check_root(self.cgroup_root)
            if why is not None:
                raise ValidationError("cgroup_root", why)
        if isinstance(self.run_as_min_uid, bool) or not 1 <= self.run_as_min_uid <= 2**31 - 2:
            raise ValidationError(
                "run_as_min_uid", f"must be 1..{2**31 - 2}, got {self.run_as_min_uid!r}"
            )
        if not self.hosts:
            raise ValidationError("hosts", "name at least one host")
        for i, host in enumerate(self.hosts):
            subjects.validate_token(host, f"hosts[{i}]")
        if len(set(self.hosts)) != len(self.hosts):
            raise ValidationError("hosts", "a host is named twice")
        if isinstance(self.gpus, bool) or not 1 <= self.gpus <= MAX_GPUS_PER_HOST:
            raise ValidationError("gpus", f"must be 1..{MAX_GPUS_PER_HOST}, got {self.gpus!r}")
        for name in ("heartbeat_s", "fake_duration_s", "kill_after_s", "resync_s", "util_every_s"):
            value = getattr(self, name)
            if not 0.0 < value <= 86_400.0:
                raise ValidationError(name, f"must be in (0, 86400] seconds, got {value!r}")
        if not 0.0 <= self.stop_grace_s <= 3600.0:
            raise ValidationError("stop_grace_s", f"must be in [0, 3600], got {self.stop_grace_s}")


@dataclass(eq=False)
class Run:
    """One host's part of one attempt of a workload."""

    task: m.HostTask
    host: str
    log: Any
    part: Part | None = None
    stop_at: float | None = None
    """Wall-clock SIGKILL deadline of a stop asked for (kept if asked before the part exists)."""
    silent: bool = False
    """The log already ended this attempt: stop quietly, report nothing."""
    started_at: float | None = None
    """When this agent reported the start (the terminal report repeats it)."""
    shutdown: bool = False
    """Stopped because the agent is stopping (a planned host shutdown)."""
    checkpoints: Path | None = None
    """``ALLOT_CHECKPOINT_DIR`` (the checkpoint protocol; ``checkpoint``)."""
    session: Path | None = None
    """A session's live state directory (``ALLOT_SESSION_DIR``)."""
    began_at: float | None = None
    """When this process started the part (any host; ``started_at``: the primary's report)."""
    noticed_at: float | None = None
    """When the notice was delivered to the part (checkpoint protocol)."""
    confirm_by: float | None = None
    terminated_at: float | None = None
    account: accounts.Account | None = None
    """The OS account the part runs as (``--run-as-user``; None: the agent's)."""

    @property
    def workload_id(self) -> str:
        return self.task.workload_id

    @property
    def attempt(self) -> int:
        return self.task.attempt

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.task.workload_id, self.task.attempt, self.host)


class Agent:
    """A service (``allot.bus.service_main.Service``) running one or many hosts."""

    def __init__(
        self,
        config: AgentConfig,
        provider: TracerProvider | None = None,
        clock: Clock = wall_clock,
    ) -> None:
        self.config = config
        self.broker = make_broker(config.nats_url, "agent", provider)
        self.rejected = 0
        """Reports dispatch refused (a bug or a hostile list; never retried)."""
        self._clock = clock
        self._hosts = frozenset(config.hosts)
        self._runs: dict[tuple[str, int, str], Run] = {}
        self._by_host: dict[str, dict[tuple[str, int, str], Run]] = {}
        self._seq_of: dict[str, int] = {}
        """Host -> log position of the last list applied."""
        self._done: dict[tuple[str, int, str], float] = {}
        """Parts this process has had (key -> monotonic end), never started twice."""
        self._beat_seq = 0
        self._nc: NatsClient | None = None
        self._batcher: ReportBatcher | None = None
        self._loops: list[asyncio.Task[None]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._marker = agent_marker()
        """This process as the parts it starts name it (``gpu_exec.AGENT_MARKER``)."""
        self._host_locks: list[int] = []
        self.util_rejected = 0
        """Utilization reports the health service refused (logged with the field)."""
        self._gpus: NvmlGpus | None = None
        self._means: dict[str, UtilMeans] = {}
        self._hold_reports_until = 0.0
        """Monotonic time before which a stopping agent's reports wait (``STOP_SETTLE_S``)."""
        self.log = log.bind(hosts=len(config.hosts), fake=config.fake)

    # ------------------------------------------------------------------ service protocol
    async def on_started(self) -> None:
        if not self.config.fake:
            self._lock_hosts()
            # Before any work is taken: whatever runs as a part of these hosts now, started
            # by an agent process that is gone, is left over from it (see the module
            # docstring, "Restarts").
            await self._end_leftovers(
                LeftoverSweep(lambda _w, _a, host: host in self._hosts), LEFTOVER_WAIT_S
            )
            await self._end_leftover_cgroups(lambda _w, _a, host: host in self._hosts)
        url = self.config.nats_url
        self._nc, _ = await bus.connect(url, f"allot-agent-{self.config.hosts[0]}")
        if self.config.batch_reports:
            self._batcher = ReportBatcher(self._nc, timeout_s=REQUEST_TIMEOUT_S)
            self._batcher.start()
        for host in self.config.hosts:
            await self._nc.subscribe(subjects.host_work(host), cb=self._on_work_msg)
        # Heartbeats first: the health service registers the hosts from them.
        self._loops.append(asyncio.create_task(self._every(self.config.heartbeat_s, self._beat)))
        await self._sync_all()
        self._loops.append(asyncio.create_task(self._every(self.config.resync_s, self._sync)))
        self._start_util()
        self.log.info("agent started", synced=self.synced, running=len(self._runs))

    async def on_stopping(self) -> None:
        self._stopping = True
        await stop_tasks(self._loops)
        if not self.config.fake:
            await self._out_of_service()
        deadline = self._clock() + self.config.stop_grace_s
        for run in list(self._runs.values()):
            run.shutdown = True
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
        if self._batcher is not None:
            await self._batcher.stop()
        if self._nc is not None:
            with contextlib.suppress(*_PUBLISH_ERRORS):
                await self._nc.close()
        if self._gpus is not None:
            self._gpus.close()
            self._gpus = None
        self._unlock_hosts()
        self.log.info("agent stopped")

    async def _out_of_service(self) -> None:
        """Ask health to drain every host (no heartbeat follows) before any stopped run is
        reported: its requeued attempt must not land back here, where nothing will run it."""
        if self._nc is None:
            return
        self._hold_reports_until = time.monotonic() + STOP_SETTLE_S
        try:
            for host in self.config.hosts:
                report = m.HealthReport(
                    host=host, sent_at=self._clock(), healthy=False, detail=AGENT_STOPPING
                )
                await self._nc.publish(subjects.health(host), codec.encode(report))
            await self._nc.flush(timeout=int(REQUEST_TIMEOUT_S))
        except _PUBLISH_ERRORS as e:
            self.log.warning("hosts not taken out of service", error=repr(e))
            return
        self.log.info(
            "hosts taken out of service before reporting the runs the stop ends",
            reason=AGENT_STOPPING,
            running=len(self._runs),
        )

    def _unlock_hosts(self) -> None:
        for fd in self._host_locks:
            os.close(fd)
        self._host_locks.clear()

    def _lock_hosts(self) -> None:
        """One real agent per host on a machine: a second one would start the host's work
        list again (two copies of each run on the same GPUs). The locks live in the
        system's temporary folder, so they hold across clusters too: two clusters' hosts
        of one name on one machine would share its GPUs."""
        for host in self.config.hosts:
            try:
                self._host_locks.append(pid_lock.acquire(HOST_LOCKS / f"{host}.lock"))
            except pid_lock.LockHeldError as held:
                self._unlock_hosts()
                raise ValidationError(
                    "--host",
                    f"another agent runs for host {host} on this machine (pid {held.holder}): "
                    "two would start its work twice",
                ) from None

    # ------------------------------------------------------------------ work lists
    async def _sync_all(self) -> None:
        """Ask for every host's list (at most 64 requests in flight)."""
        gate = asyncio.Semaphore(64)

        async def one(host: str) -> None:
            async with gate:
                await self._sync_host(host)

        await asyncio.gather(*(one(h) for h in self.config.hosts))

    async def _sync(self, hosts: Sequence[str]) -> None:
        for host in hosts:
            await self._sync_host(host)

    @property
    def synced(self) -> bool:
        """Every host's list has been applied once (the agent is in step with the log)."""
        return len(self._seq_of) == len(self._hosts)

    async def _sync_host(self, host: str) -> None:
        assert self._nc is not None
        body = codec.encode(m.HostSync(host=host))
        try:
            reply = await self._nc.request(subjects.host_sync(host), body, REQUEST_TIMEOUT_S)
            work = codec.decode_as(m.HostWork, reply.data, own=True)
        except _PUBLISH_ERRORS as e:  # dispatch not up yet: the next resync tries again
            self.log.debug("sync failed", host=host, error=repr(e))
            return
        except ValidationError as e:
            self.log.warning("sync refused", host=host, field=e.field, reason=e.reason)
            return
        self._apply_work(host, work)

    async def _on_work_msg(self, msg: Any) -> None:
        host = subjects.host_of(msg.subject)
        try:
            work = codec.decode_as(m.HostWork, msg.data, own=True)
        except ValidationError as e:
            self.log.warning("bad work list", host=host, field=e.field, reason=e.reason)
            return
        self._apply_work(host, work)

    def _apply_work(self, host: str, work: m.HostWork) -> None:
        """Reconcile ``host``'s parts with its list (synchronous: lists apply in order)."""
        if host not in self._hosts or work.host != host:
            self.log.warning("work list for another host ignored", host=host, listed=work.host)
            return
        if work.seq < self._seq_of.get(host, -1) or self._stopping:
            return
        self._seq_of[host] = work.seq
        self._forget_done()
        listed: set[tuple[str, int, str]] = set()
        for task in work.tasks:
            key = (task.workload_id, task.attempt, host)
            listed.add(key)
            run = self._runs.get(key)
            if run is not None:
                if task.stop == "notice" and task.kill_at is not None:
                    self._stop_run(run, task.kill_at, notice=True)
                elif task.stop == "cancel":
                    self._stop_run(run, self._clock() + self.config.kill_after_s)
                continue
            if key in self._done:
                continue
            self._done[key] = time.monotonic()
            self._new_part(host, task)
        for key, run in list(self._by_host.get(host, {}).items()):
            if key not in listed and not run.silent:
                run.silent = True
                run.log.info("the log ended this attempt; stopping the part")
                self._stop_run(run, self._clock() + self.config.kill_after_s)

    def _new_part(self, host: str, task: m.HostTask) -> None:
        bound = log.bind(
            workload=task.workload_id, allocation=task.allocation, attempt=task.attempt, host=host
        )
        if task.started:
            self._spawn(self._lost(host, task, bound))
            return
        if task.stop is not None:
            # Stopped before it started (placed while the agent was down): nothing to run.
            if task.primary:
                self._spawn(self._report(host, task, "not-started", detail=STOPPED_BEFORE_START))
            return
        run = Run(task=task, host=host, log=bound)
        self._runs[run.key] = run
        self._by_host.setdefault(host, {})[run.key] = run
        self._spawn(self._supervise(run))

    async def _lost(self, host: str, task: m.HostTask, bound: Any) -> None:
        """A part an earlier agent process ran: end what is left of it, then report it lost,
        which ends the attempt (a gang's too) and frees its GPUs in the log."""
        if task.primary:
            bound.warning("process lost in a restart")
        else:
            bound.warning("gang part lost in a restart; reporting it ends the attempt")
        if not self.config.fake:
            key = (task.workload_id, task.attempt, host)
            await self._end_leftovers(LeftoverSweep(lambda *part: part == key), None, bound)
            await self._end_leftover_cgroups(lambda *part: part == key, bound, for_good=True)
        await self._report(host, task, "lost")

    async def _end_leftovers(
        self, sweep: LeftoverSweep, timeout: float | None, bound: Any = None
    ) -> None:
        """Call ``sweep`` until it finds nothing alive (or ``timeout`` seconds passed)."""
        logger = bound or self.log
        if not sweep.supported:
            logger.warning("no /proc: processes of an earlier agent process are not ended")
            return
        loop = asyncio.get_running_loop()
        start = warned = loop.time()
        delay, first = 0.02, True
        while killed := await asyncio.to_thread(sweep):
            now = loop.time()
            if first:
                logger.warning("killing processes an earlier agent process left", count=killed)
                first = False
            elif timeout is not None and now - start >= timeout:
                logger.error("processes of an earlier agent process survive SIGKILL", count=killed)
                return
            elif now - warned >= LEFTOVER_WARN_S:
                warned = now
                logger.error("processes of an earlier agent process still alive", count=killed)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _end_leftover_cgroups(
        self,
        is_leftover: Callable[[str, int, str], bool],
        bound: Any = None,
        *,
        for_good: bool = False,
    ) -> None:
        """End the parts' cgroups (``cgroup_root``) an earlier agent process left: whatever
        escaped both its part's session and its markers (``env -i`` after ``setsid``).
        ``for_good``: wait until they are gone however long (a part reported lost only
        then); else one bounded try each (at start: what survives holds only its own
        part, which is reported lost once gone)."""
        if self.config.cgroup_root is None:
            return
        logger = bound or self.log
        for cgroup in part_cgroup.leftovers(self.config.cgroup_root, is_leftover):
            if cgroup.populated():
                logger.warning(
                    "killing a part's cgroup an earlier agent process left", cgroup=str(cgroup.path)
                )
            if for_good:
                await cgroup.end_for_good(logger)
            elif not await cgroup.end():
                logger.error("a leftover part's cgroup does not empty", cgroup=str(cgroup.path))

    def _forget_done(self) -> None:
        """Drop parts finished over ``DONE_TTL_S`` ago (insertion order is end order, so
        the scan stops at the first younger one)."""
        cutoff = time.monotonic() - DONE_TTL_S
        while self._done:
            key, ended = next(iter(self._done.items()))
            if ended >= cutoff:
                break
            del self._done[key]

    # ------------------------------------------------------------------ runs
    def _forget(self, run: Run) -> None:
        self._runs.pop(run.key, None)
        self._done.pop(run.key, None)  # re-inserted last: the dict stays in end order
        self._done[run.key] = time.monotonic()
        runs = self._by_host.get(run.host)
        if runs is not None:
            runs.pop(run.key, None)
            if not runs:
                del self._by_host[run.host]

    def _stop_run(self, run: Run, kill_at: float, *, notice: bool = False) -> None:
        if run.stop_at is None:
            run.log.info("stopping part", kill_at=kill_at)
        run.stop_at = kill_at if run.stop_at is None else min(run.stop_at, kill_at)
        if run.part is None:
            return
        if notice and run.task.checkpoint and run.noticed_at is None:
            if self.config.fake:
                run.noticed_at = self._clock()  # a fake part checkpoints at once
                self._terminate(run)
            else:
                self._notice(run)
        elif run.noticed_at is None or not notice:  # a cancel cuts a checkpoint short
            self._terminate(run)

    def _terminate(self, run: Run) -> None:
        assert run.part is not None and run.stop_at is not None
        if run.terminated_at is None:
            run.terminated_at = self._clock()
        run.part.terminate(run.stop_at)

    def _notice(self, run: Run) -> None:
        """The checkpoint protocol's notice (``checkpoint``): the SIGKILL deadline now, then
        the notice file and signal, SIGTERM at the confirmation or the timeout
        (``_await_checkpoint``)."""
        assert run.part is not None and run.stop_at is not None
        task, now = run.task, self._clock()
        run.noticed_at = now
        timeout = task.checkpoint_timeout_s
        if timeout is None:
            # A session told by file alone has nothing to wait for (its state is saved
            # after it ends); otherwise the checkpoint may take the whole grace period.
            timeout = 0.0 if task.session and task.checkpoint_signal is None else run.stop_at - now
        run.confirm_by = min(now + timeout, run.stop_at)
        run.part.kill_by(run.stop_at)  # whatever the notice's steps below meet
        self._spawn(self._await_checkpoint(run))

    async def _await_checkpoint(self, run: Run) -> None:
        """The notice file, then the signal; SIGTERM once the part confirms its checkpoint,
        or at ``confirm_by``."""
        assert run.part is not None and run.stop_at is not None
        assert run.noticed_at is not None and run.confirm_by is not None
        task = run.task
        if run.checkpoints is not None:
            # Bounded by the kill deadline: a workload may hold its account's writer (a FIFO,
            # SIGSTOP), never its own SIGKILL.
            await checkpoint.write_notice(
                run.checkpoints, run.stop_at, run.account, max(0.0, run.stop_at - self._clock())
            )
        if task.checkpoint_signal is not None and run.terminated_at is None:
            run.part.send_signal(signal.Signals[f"SIG{task.checkpoint_signal}"])
        run.log.info("checkpoint asked", signal=task.checkpoint_signal, confirm_by=run.confirm_by)
        while run.terminated_at is None and run.key in self._runs:
            now = self._clock()
            confirmed = checkpoint.confirmed_at(run.checkpoints)
            if now >= run.confirm_by or (confirmed is not None and confirmed >= run.noticed_at):
                self._terminate(run)
                return
            await asyncio.sleep(min(CHECKPOINT_POLL_S, max(0.0, run.confirm_by - now)))

    async def _supervise(self, run: Run) -> None:
        try:
            if self._stopping:
                return  # never started: a restarted agent starts it
            part = await self._make_part(run)
            if part is None:
                return
            run.part = part
            if run.stop_at is not None:
                self._terminate(run)
            self._detail(run.log, "part started", pid=part.pid, gpus=list(run.task.gpus))
            run.began_at = self._clock()
            if run.task.primary:
                run.started_at = run.began_at
                await self._report(run.host, run.task, "started", pid=part.pid, run=run)
            code = await part.wait()
            self._detail(run.log, "part ended", exit=describe_exit(code))
            ended = await self._checkpoint_outcome(run, code)
            stopping = run.shutdown and part.stopped
            # A gang's other part reports only an end that ends the attempt (see the
            # module): a clean exit is the primary's to report.
            if not run.silent and (run.task.primary or code != 0 or stopping):
                await self._report(
                    run.host,
                    run.task,
                    "exited",
                    exit_code=max(-255, min(255, code)),
                    detail=describe_exit(code),
                    run=run,
                    # Ended by the agent's own stop, not on its own (dispatch requeues it).
                    stopping=stopping,
                    ended=ended,
                )
        finally:
            self._forget(run)
            if run.session is not None:
                # Off the loop: the workload chose how large a tree it left there.
                await asyncio.to_thread(shutil.rmtree, run.session, ignore_errors=True)

    async def _checkpoint_outcome(self, run: Run, code: int) -> checkpoint.Outcome | None:
        """What the ended part's report says of its checkpoint (None: no protocol). A
        session's state is saved here, after its process ended and before the report that
        lets the next attempt start."""
        if not run.task.checkpoint:
            return None
        exited_at = self._clock()
        assert run.began_at is not None
        if self.config.fake:  # a fake checkpoint is instant
            noticed = run.noticed_at
            return checkpoint.Outcome("done" if noticed else None, noticed)
        if run.session is not None and run.checkpoints is not None:
            if run.noticed_at is None:
                return checkpoint.Outcome(None, None)
            try:
                await checkpoint.save_session(run.session, run.checkpoints, run.account)
            except OSError as e:
                run.log.error("session state not saved", error=repr(e))
                return checkpoint.Outcome("missed", None)
            run.log.info("session state saved", to=str(run.checkpoints))
            return checkpoint.Outcome("done", exited_at)
        return checkpoint.outcome(
            started_at=run.began_at,
            noticed_at=run.noticed_at,
            confirm_by=run.confirm_by,
            confirmed=checkpoint.confirmed_at(run.checkpoints),
            exit_code=code,
            exited_at=exited_at,
            terminated_at=run.terminated_at,
        )

    def output_path(self, workload_id: str, attempt: int, host: str) -> Path | None:
        """Where a part's output goes (``AgentConfig.output_dir``); None: inherited."""
        if self.config.output_dir is None:
            return None
        return self.config.output_dir / f"{part_name(workload_id, attempt, host)}.out"

    async def _make_part(self, run: Run) -> Part | None:
        task = run.task
        if self.config.fake:
            return FakePart(task.duration_s or self.config.fake_duration_s)
        if not task.command and task.duration_s:
            # No command, a duration: its GPUs are held that long and the run completes, as
            # on a fake host and as Slurm's ``salloc --time`` holds an allocation. Failing it
            # here would come after placement, which may have preempted others for it.
            return FakePart(task.duration_s)
        reason: str | None = None
        if self.config.run_as_user:
            try:
                # Off the loop: the lookup may ask a directory service (LDAP, SSSD).
                run.account = await asyncio.to_thread(
                    accounts.account_of, task.user, self.config.run_as_min_uid
                )
            except ValidationError as e:
                reason = f"{e.field}: {e.reason}"
        if task.checkpoint and reason is None:
            try:
                run.checkpoints = await checkpoint.checkpoint_dir(
                    task, self.config.checkpoint_root, self.config.checkpoint_allow, run.account
                )
                if task.session:
                    run.session = checkpoint.session_dir(task, run.host, self.config.session_root)
                    restored = await checkpoint.restore_session(
                        run.checkpoints, run.session, run.account
                    )
                    run.log.info("session state", restored=restored, at=str(run.session))
            except ValidationError as e:
                reason = f"{e.field}: {e.reason}"
            except OSError as e:
                reason = f"checkpoint_dir: session state not restored: {e.strerror or e}"
        if reason is not None:
            pass
        elif not task.command:
            reason = NO_COMMAND
        else:
            env = workload_env(
                os.environ
                if run.account is None
                else run.account.base_env(os.environ, self.config.pass_env),
                gpus=task.gpus,
                workload_id=task.workload_id,
                allocation=task.allocation,
                attempt=task.attempt,
                nats_url=self.config.nats_url,
                host=run.host,
                hosts=task.hosts,
                agent=self._marker,
                extra=task.env,
                checkpoint_dir="" if run.checkpoints is None else str(run.checkpoints),
                session_dir="" if run.session is None else str(run.session),
            )
            output = self.output_path(task.workload_id, task.attempt, run.host)
            try:
                sink = None if output is None else open_output(output, run.account)
            except OSError as e:
                reason = f"cannot open its output file {output}: {e.strerror or e}"
            else:
                try:
                    started = await self._start_process(run, env, sink)
                finally:
                    if sink is not None:
                        sink.close()  # the child holds its own descriptor
                if not isinstance(started, str):
                    return started
                reason = started
        run.log.error("part not started", reason=reason)
        # A gang's other part too: the attempt cannot run without it.
        await self._report(run.host, task, "not-started", detail=reason or "")
        return None

    async def _start_process(
        self, run: Run, env: dict[str, str], sink: IO[bytes] | None
    ) -> ProcessPart | str:
        """The part's process, started (in a cgroup of its own with ``cgroup_root``), or
        why it could not start."""
        task, root = run.task, self.config.cgroup_root
        try:
            cgroup = None if root is None else PartCgroup.make(root, *run.key)
        except OSError as e:
            return f"cannot make its cgroup under {root}: {e.strerror or e}"
        try:
            return await ProcessPart.spawn(
                task.command, env, self._clock, output=sink, account=run.account, cgroup=cgroup
            )
        except OSError as e:
            reason = f"cannot start {task.command[0]!r}: {e.strerror or e}"
        except subprocess.SubprocessError:
            reason = f"cannot start {task.command[0]!r}: it could not enter its cgroup"
        except asyncio.CancelledError:
            if cgroup is not None:
                cgroup.kill()  # a child forked before the cancel: asyncio ends it alone
            raise
        if cgroup is not None:
            await cgroup.end()
        return reason

    # ------------------------------------------------------------------ reports
    async def _report(
        self,
        host: str,
        task: m.HostTask,
        event: m.PartEvent,
        *,
        pid: int | None = None,
        exit_code: int | None = None,
        detail: str = "",
        run: Run | None = None,
        stopping: bool = False,
        ended: checkpoint.Outcome | None = None,
    ) -> None:
        """Sent until dispatch answers; a refusal is final (logged and counted). Given up
        only when the agent is stopping and NATS keeps failing."""
        assert self._nc is not None
        report = m.PartReport(
            host=host,
            workload_id=task.workload_id,
            attempt=task.attempt,
            event=event,
            at=run.started_at if event == "started" and run and run.started_at else self._clock(),
            started_at=run.started_at if run is not None and event != "started" else None,
            pid=pid,
            exit_code=exit_code,
            detail=detail[: m.MAX_TEXT_LEN],
            stopping=stopping,
            checkpoint=None if ended is None else ended.outcome,
            checkpointed_at=None if ended is None else ended.checkpointed_at,
            checkpoint_dir=(
                str(run.checkpoints)
                if event == "started" and run is not None and run.checkpoints is not None
                else None
            ),
        )
        self._detail(log, "reporting", workload=task.workload_id, part_event=event, host=host)
        body = codec.encode(report)
        hold = self._hold_reports_until - time.monotonic()
        if hold > 0:  # a stopping agent's hosts are being taken out of service first
            await asyncio.sleep(hold)
        delay, tries = 0.2, 0
        while True:
            tries += 1
            try:
                if self._batcher is not None:
                    answer = await self._batcher.send(report)
                else:
                    reply = await self._nc.request(
                        subjects.host_report(host), body, REQUEST_TIMEOUT_S
                    )
                    answer = _ANSWER.decode(reply.data)
            except (*_PUBLISH_ERRORS, msgspec.DecodeError) as e:
                if self._stopping and tries >= 3:
                    log.error("report lost: dispatch unavailable while stopping", report=event)
                    return
                log.warning(
                    "report not answered; retrying", workload=task.workload_id, error=repr(e)
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if isinstance(answer, m.CommandRejected):
                self.rejected += 1
                log.error(
                    "report refused",
                    workload=task.workload_id,
                    field=answer.field,
                    reason=answer.reason,
                )
            return

    # ------------------------------------------------------------------ periodic work
    async def _every(
        self,
        period: float,
        action: Callable[[Sequence[str]], Awaitable[None]],
        *,
        first_after_period: bool = False,
    ) -> None:
        """Run ``action`` over every host once per ``period``, in at most ``SLOTS`` batches
        spread over it; ``first_after_period``: the first round one period from now."""
        hosts = self.config.hosts
        slots = min(len(hosts), SLOTS)
        groups = [hosts[i::slots] for i in range(slots)]
        loop = asyncio.get_running_loop()
        start, n = loop.time(), 1 if first_after_period else 0
        while True:
            for i, group in enumerate(groups):
                delay = start + (n + i / slots) * period - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await action(group)
            n += 1
            if loop.time() - (start + n * period) > period:
                start, n = loop.time(), 0  # far behind (a stalled loop): no burst to catch up

    async def _beat(self, hosts: Sequence[str]) -> None:
        assert self._nc is not None
        self._beat_seq += 1
        try:
            for host in hosts:
                running = sorted({key[0] for key in self._by_host.get(host, {})})
                beat = m.Heartbeat(
                    host=host,
                    sent_at=self._clock(),
                    seq=self._beat_seq,
                    gpus=self.config.gpus,
                    running=tuple(running[:MAX_RUNNING_IN_HEARTBEAT]),
                )
                await self._nc.publish(subjects.heartbeat(host), bus.encode(beat))
        except _PUBLISH_ERRORS as e:
            log.warning("heartbeat not sent", error=repr(e))

    # ------------------------------------------------------------------ GPU utilization
    def _start_util(self) -> None:
        every = self.config.util_every_s
        if not self.config.fake:
            self._gpus, why = NvmlGpus.open(self.config.gpus)
            if self._gpus is None:
                self.log.info("GPU utilization not reported", reason=why)
                return
            now = self._clock()
            self._means = {h: UtilMeans(self.config.gpus, now) for h in self.config.hosts}
            sample = min(SAMPLE_S, every)
            self._loops.append(asyncio.create_task(self._every(sample, self._read_gpus)))
            self.log.info("GPU utilization read through NVML", every_s=every)
        else:
            now = self._clock()
            self._means = {h: UtilMeans(self.config.gpus, now) for h in self.config.hosts}
        # A report covers the interval since the last: the first after one whole interval
        # (one at start measured nothing, and beat health's registration of a new host
        # from its first heartbeat: refused as "not a registered host").
        report = self._every(every, self._report_util, first_after_period=True)
        self._loops.append(asyncio.create_task(report))

    async def _read_gpus(self, hosts: Sequence[str]) -> None:
        assert self._gpus is not None
        reading = await asyncio.to_thread(self._gpus.read)
        for host in hosts:
            self._means[host].add(reading)

    def utilization(self, host: str) -> m.HostUtilization:
        """``host``'s report now: NVML's means since the last one, or the fake profiles."""
        now = self._clock()
        means = self._means[host]
        if self.config.fake:
            runs = self._by_host.get(host, {}).values()
            means.add(fake_util(self.config.gpus, ((r.task.gpus, r.task.env) for r in runs)))
        since, util = means.take(now)
        if since >= now:  # a clock that did not move (or went back): a sliver of an interval
            since = now - 1e-3
        return m.HostUtilization(host=host, since=since, sent_at=now, util=util)

    async def _report_util(self, hosts: Sequence[str]) -> None:
        assert self._nc is not None
        await asyncio.gather(*(self._send_util(h) for h in hosts))

    async def _send_util(self, host: str) -> None:
        assert self._nc is not None
        report = self.utilization(host)
        try:
            reply = await self._nc.request(
                subjects.host_util(host), codec.encode(report), REQUEST_TIMEOUT_S
            )
            answer = _ANSWER.decode(reply.data)
        except (*_PUBLISH_ERRORS, msgspec.DecodeError) as e:
            log.debug("utilization not answered", host=host, error=repr(e))
            return
        if isinstance(answer, m.CommandRejected):
            if answer.field == "host" and answer.reason.endswith(NOT_REGISTERED):
                # Health registers a host on its first heartbeat it hears (a stack starting:
                # health may come up after the agent's first ones); nothing can run on a
                # host before, so this interval had nothing to judge.
                log.info("utilization not taken: host not registered yet", host=host)
                return
            self.util_rejected += 1
            log.error("utilization refused", host=host, field=answer.field, reason=answer.reason)

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
    ap.add_argument(
        "--resync-s",
        type=float,
        default=30.0,
        help="ask dispatch for each host's whole work list this often (default %(default)s)",
    )
    ap.add_argument(
        "--util-every-s",
        type=float,
        default=30.0,
        help="report each host's GPU utilization this often (default %(default)s; NVML on a "
        "real host, ALLOT_FAKE_UTIL on a fake one)",
    )
    ap.add_argument(
        "--output-dir",
        type=Path,
        help="real mode: write each workload's stdout and stderr to "
        "DIR/<workload>.<attempt>.<host>.out (default: this agent's own output)",
    )
    ap.add_argument(
        "--checkpoint-root",
        type=Path,
        help="real mode: keep workloads' checkpoint directories under DIR/<allocation>/"
        "<workload> (shared storage: a requeued attempt may land on any host)",
    )
    ap.add_argument(
        "--checkpoint-allow",
        type=Path,
        action="append",
        default=[],
        help="real mode: a root inside which a workload may name its own checkpoint_dir "
        "(repeatable; none by default)",
    )
    ap.add_argument(
        "--run-as-user",
        action="store_true",
        help="real mode, as root, with --output-dir: run each workload as the OS account of "
        "its submission's user (refused when the host has none, or below --run-as-min-uid)",
    )
    ap.add_argument(
        "--run-as-min-uid",
        type=int,
        default=accounts.DEFAULT_MIN_UID,
        help="with --run-as-user: the lowest uid a workload runs as (default %(default)s)",
    )
    ap.add_argument(
        "--session-root",
        type=Path,
        help="real mode: keep sessions' live state in DIR/<workload>.<attempt>.<host> "
        "(default: $TMPDIR/allot-sessions; with --run-as-user, give a directory of root's: "
        "in a shared /tmp any account could make the default first)",
    )
    ap.add_argument(
        "--pass-env",
        metavar="NAME",
        action="append",
        default=[],
        help="with --run-as-user: a variable of the agent's environment workloads inherit "
        "besides PATH, LANG and TZ (repeatable; e.g. LD_LIBRARY_PATH)",
    )
    ap.add_argument(
        "--cgroup-root",
        type=Path,
        help="real mode: a cgroup v2 directory of the agent's own (e.g. one systemd delegates) "
        "under which each workload gets a cgroup, so that what leaves its session still ends "
        "with it (default: none; the process group alone)",
    )
    ap.add_argument(
        "--batch-reports",
        action="store_true",
        help="fake mode: send every host's reports in batches on allot.v1.hosts.report "
        "(needs a service user, or a server without users)",
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
            resync_s=args.resync_s,
            util_every_s=args.util_every_s,
            batch_reports=args.batch_reports,
            output_dir=args.output_dir,
            checkpoint_root=args.checkpoint_root,
            checkpoint_allow=tuple(args.checkpoint_allow),
            run_as_user=args.run_as_user,
            run_as_min_uid=args.run_as_min_uid,
            session_root=args.session_root,
            pass_env=tuple(args.pass_env),
            cgroup_root=args.cgroup_root,
        )
    except ValidationError as e:
        if e.field.startswith("hosts"):
            option = "--host-prefix" if args.fake else "--host"
        else:
            option = _option(e.field.partition("[")[0])
        # The reason may name other settings too (``run_as_user``): as options, here.
        reason = _SETTING.sub(lambda found: _option(found.group()), e.reason)
        raise ValidationError(option, reason) from None


_SETTING = re.compile(
    # A setting's name as a word of the sentence, not inside a path or a value.
    r"(?<![\w/.~-])(?:"
    + "|".join(f.name for f in dataclasses.fields(AgentConfig) if "_" in f.name)
    + r")(?![\w/.-])"
)


def _option(setting: str) -> str:
    return "--" + setting.replace("_", "-")


def password_on_command_line(url: str, environ: Mapping[str, str]) -> bool:
    """Whether ``url`` (``--nats-url``) carries a password or token that the environment
    did not give: one on the command line, which every process on the host can read in
    ``/proc/<pid>/cmdline`` (non-dumpable or not)."""
    return url != nats_url_from_env(environ, DEFAULT_NATS_URL) and without_userinfo(url) != url


def main(argv: Sequence[str] | None = None) -> int:
    # Before anything else (``__main__`` already did, earlier still; it is idempotent).
    unguarded = forbid_inspection()
    parser = build_parser()

    def build(args: argparse.Namespace) -> Agent:
        try:
            config = config_from_args(args)
        except ValidationError as e:
            parser.error(f"{e.field}: {e.reason}")
        configure_logging("agent")
        if unguarded is None:
            log.info("agent process made non-dumpable: its workloads cannot read its memory")
        else:
            log.warning(
                "agent process left dumpable: its workloads, running as the same user, may "
                "read its environment and memory (its NATS login)",
                reason=unguarded,
            )
        if password_on_command_line(config.nats_url, os.environ):
            log.warning(
                "the NATS password is on the agent's command line (--nats-url), which every "
                "process on the host can read; give it in ALLOT_NATS_PASSWORD or "
                "ALLOT_NATS_URL instead"
            )
        return Agent(config, provider=tracer_provider("agent"))

    return run_main(build, parser, argv)


if __name__ == "__main__":
    raise SystemExit(main())
