"""The host agent and the dispatch service against a real NATS server: the test plays the
placement leader by publishing log records itself and reads what the agent's reports became
back from the WORKLOADS stream (the agent reads no log: dispatch sends it its hosts' work).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from allot import bus
from allot.bus import service_main
from allot.core.errors import ValidationError
from allot.eventlog.logfold import LogFold
from allot.proto import messages as m
from allot.proto import subjects
from allot.services import dispatch as dispatch_module
from allot.services.agent.service import NO_COMMAND, Agent, AgentConfig
from allot.services.dispatch import DispatchService
from process_probe import running, session

pytestmark = pytest.mark.integration

T = TypeVar("T", bound=msgspec.Struct)


class Events:
    """Everything on the workload event subjects, collected by an ordered consumer."""

    def __init__(self) -> None:
        self.records: list[msgspec.Struct] = []
        self._sub: Any = None

    async def start(self, js: JetStreamContext) -> None:
        async def on_msg(msg: Any) -> None:
            self.records.append(bus.decode_record(msg.subject, msg.data))

        self._sub = await js.subscribe(
            subjects.ALL_EVENTS,
            stream="WORKLOADS",
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
            cb=on_msg,
        )

    def of(self, kind: type[T], wid: str) -> list[T]:
        return [r for r in self.records if isinstance(r, kind) and r.workload_id == wid]  # type: ignore[attr-defined]

    async def wait(self, kind: type[T], wid: str, timeout: float = 10.0) -> T:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.of(kind, wid)
            if found:
                return found[0]
            await asyncio.sleep(0.02)
        seen = [(type(r).__name__, getattr(r, "workload_id", "")) for r in self.records]
        raise AssertionError(f"no {kind.__name__} for {wid} within {timeout} s; saw {seen}")


class Log:
    """The test's side of the log: publishes what intake, health and placement would."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js

    async def host(self, host: str, gpus: int) -> None:
        rec = m.HostRegistered(host=host, gpus=gpus, at=time.time())
        await bus.publish(self.js, subjects.host_state(host), rec)

    async def leader(self, epoch: int) -> None:
        rec = m.LeaderElected(epoch=epoch, leader="test", at=time.time())
        await bus.publish(self.js, subjects.LEADER, rec)

    async def submit(
        self,
        wid: str,
        command: tuple[str, ...] = (),
        *,
        gpus: int = 1,
        allocation: str | None = "nlp",
        min_runtime_s: int = 60,
        duration_s: float | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        rec = m.WorkloadSubmitted(
            workload_id=wid,
            client_id=wid,
            user="alice",
            gpus=gpus,
            allocation=allocation,
            min_runtime_s=min_runtime_s,
            command=command,
            env=env or {},
            duration_s=duration_s,
            at=time.time(),
        )
        await bus.publish(self.js, bus.event_subject(allocation, rec), rec)

    async def place(
        self,
        wid: str,
        assignment: dict[str, tuple[int, ...]],
        *,
        allocation: str | None = "nlp",
        epoch: int = 1,
        attempt: int = 1,
        at: float | None = None,
    ) -> m.WorkloadPlaced:
        rec = m.WorkloadPlaced(
            workload_id=wid,
            allocation=allocation,
            at=time.time() if at is None else at,
            gpus=sum(len(g) for g in assignment.values()),
            assignment=tuple(m.HostGpus(host=h, gpus=g) for h, g in assignment.items()),
            min_runtime_s=60 if allocation else 0,
            attempt=attempt,
            epoch=epoch,
        )
        await bus.publish(self.js, bus.event_subject(allocation, rec), rec)
        return rec

    async def notice(self, wid: str, grace_s: float, gpus: int = 1) -> m.PreemptionNotice:
        now = time.time()
        rec = m.PreemptionNotice(
            workload_id=wid,
            allocation="nlp",
            at=now,
            reason="better-ranked",
            grace_deadline=now + grace_s,
            requeue=True,
            gpus=gpus,
            attempt=1,
            epoch=1,
        )
        await bus.publish(self.js, subjects.preempt("nlp", wid), rec)
        return rec


@pytest.fixture
async def js(fresh_log: str) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(fresh_log)
    jsc = nc.jetstream()
    await bus.ensure_streams(jsc)
    yield jsc
    await nc.close()


@pytest.fixture
async def events(js: JetStreamContext) -> Events:
    ev = Events()
    await ev.start(js)
    return ev


AgentFactory = Callable[..., Any]


@pytest.fixture
async def dispatch(fresh_log: str) -> AsyncIterator[DispatchService]:
    service = DispatchService(fresh_log)
    await service_main.start(service)
    yield service
    await service_main.stop(service)


@pytest.fixture
async def run_agent(fresh_log: str, dispatch: DispatchService) -> AsyncIterator[AgentFactory]:
    agents: list[Agent] = []

    async def start(*hosts: str, gpus: int = 4, fake: bool = False, **kw: Any) -> Agent:
        config = AgentConfig(
            nats_url=fresh_log,
            hosts=hosts,
            gpus=gpus,
            fake=fake,
            heartbeat_s=kw.pop("heartbeat_s", 0.2),
            kill_after_s=kw.pop("kill_after_s", 1.0),
            stop_grace_s=kw.pop("stop_grace_s", 1.0),
            **kw,
        )
        agent = Agent(config)
        await service_main.start(agent)
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        await service_main.stop(agent)


def py(source: str, *args: str | Path) -> tuple[str, ...]:
    return (sys.executable, "-c", source, *(str(a) for a in args))


async def wait_file(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} was not written within {timeout} s")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


WRITE_ENV = (
    "import os, sys\n"
    "keys = ('CUDA_VISIBLE_DEVICES', 'ALLOT_WORKLOAD_ID', 'ALLOT_ALLOCATION', 'ALLOT_ATTEMPT',"
    " 'ALLOT_NATS_URL', 'TEAM_TAG')\n"
    "open(sys.argv[1], 'w').write('|'.join(os.environ.get(k, '-') for k in keys))\n"
)

ON_TERM = (
    "import pathlib, signal, sys, time\n"
    "def on_term(*_):\n"
    "    pathlib.Path(sys.argv[1]).write_text('term')\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "pathlib.Path(sys.argv[2]).write_text('ready')\n"
    "while True:\n"
    "    time.sleep(0.05)\n"
)

IGNORE_TERM = (
    "import pathlib, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "pathlib.Path(sys.argv[1]).write_text('ready')\n"
    "while True:\n"
    "    time.sleep(0.05)\n"
)


async def test_runs_a_placed_command_and_reports_completion(
    js: JetStreamContext, events: Events, run_agent: AgentFactory, tmp_path: Path, fresh_log: str
) -> None:
    log = Log(js)
    await run_agent("h01", gpus=4)
    await log.host("h01", 4)
    await log.leader(1)
    out = tmp_path / "env.txt"
    await log.submit("w1", py(WRITE_ENV, out), gpus=2, env={"TEAM_TAG": "t=42 x"})
    placed = await log.place("w1", {"h01": (2, 3)})

    started = await events.wait(m.WorkloadStarted, "w1")
    done = await events.wait(m.WorkloadCompleted, "w1")

    assert (started.host, started.attempt, started.gpus, started.allocated) == ("h01", 1, 2, True)
    assert started.pid is not None and started.pid > 1
    assert started.allocation == "nlp"
    assert (done.attempt, done.gpus, done.allocated) == (1, 2, True)
    # Charged from the agent's own start (what accounting charges from), not the placement.
    assert done.started_at == started.at >= placed.at
    assert done.gpu_seconds == pytest.approx(2 * (done.at - started.at))
    assert out.read_text() == f"2,3|w1|nlp|1|{fresh_log}|t=42 x"  # the submission's env too
    assert not events.of(m.WorkloadFailed, "w1")


async def test_a_work_list_larger_than_a_command_reaches_the_agent(
    js: JetStreamContext, events: Events, run_agent: AgentFactory, tmp_path: Path
) -> None:
    """Two parts whose commands and environments take ~45 KiB each: the host's work list
    (~90 KiB) is over a command's 64 KiB limit. The agent refused it as "bad work list"
    and ran neither (nor any later change to that host, cancels included)."""
    log = Log(js)
    await run_agent("h01", gpus=4)
    await log.host("h01", 4)
    await log.leader(1)
    pad = tuple("x" * 4000 for _ in range(9))  # arguments the script ignores
    env = {f"V{i}": "y" * 1000 for i in range(8)}
    outs = [tmp_path / f"env{i}.txt" for i in range(2)]
    for i, out in enumerate(outs):
        await log.submit(f"big{i}", (*py(WRITE_ENV, out), *pad), env=env)
    for i in range(2):
        await log.place(f"big{i}", {"h01": (i,)})
    for i in range(2):
        await events.wait(m.WorkloadCompleted, f"big{i}")
    assert [o.read_text().split("|")[1] for o in outs] == ["big0", "big1"]


async def test_a_host_whose_parts_exceed_one_message_runs_them_all(
    js: JetStreamContext, events: Events, run_agent: AgentFactory
) -> None:
    """Forty parts of ~56 KiB each on one host: its whole list (~2.2 MiB) is over NATS's
    1 MiB, which dispatch could not send at all (no part ran). Now parts never sent are
    held back and sent as earlier ones start; every part runs and completes, none stopped
    as held back (a part the agent may have started is never held back: the unit test
    ``test_a_list_too_large_for_one_message_holds_back_parts_still_to_start``)."""
    log = Log(js)
    await run_agent("big", gpus=40, fake=True)
    await log.host("big", 40)
    await log.leader(1)
    pad = tuple("x" * 4000 for _ in range(10))
    env = {f"V{i}": "y" * 4000 for i in range(4)}
    wids = [f"big{i:02d}" for i in range(40)]
    for wid in wids:
        await log.submit(wid, ("true", *pad), env=env, duration_s=1.0)
    # Placed last first: each new part sorts before those already sent (the list's order).
    for i, wid in reversed(list(enumerate(wids))):
        await log.place(wid, {"big": (i,)})
    for wid in wids:
        await events.wait(m.WorkloadCompleted, wid, timeout=60.0)
    ended_otherwise = (m.WorkloadFailed, m.WorkloadPreempted, m.WorkloadCancelled)
    assert not [(k.__name__, w) for k in ended_otherwise for w in wids if events.of(k, w)]


async def test_notice_sends_sigterm_and_reports_preempted(
    js: JetStreamContext, events: Events, run_agent: AgentFactory, tmp_path: Path
) -> None:
    log = Log(js)
    await run_agent("h01")
    await log.host("h01", 4)
    await log.leader(1)
    marker, ready = tmp_path / "term", tmp_path / "ready"
    await log.submit("w2", py(ON_TERM, marker, ready))
    await log.place("w2", {"h01": (0,)})
    await events.wait(m.WorkloadStarted, "w2")
    await wait_file(ready)

    notice = await log.notice("w2", grace_s=5.0)
    preempted = await events.wait(m.WorkloadPreempted, "w2")

    assert marker.read_text() == "term"
    assert preempted.reason == "better-ranked"
    assert preempted.at < notice.grace_deadline  # SIGTERM came at once, not at the deadline
    assert (preempted.attempt, preempted.gpus) == (1, 1)
    assert not events.of(m.WorkloadCompleted, "w2")


async def test_process_ignoring_sigterm_is_killed_at_the_grace_deadline(
    js: JetStreamContext, events: Events, run_agent: AgentFactory, tmp_path: Path
) -> None:
    log = Log(js)
    await run_agent("h01")
    await log.host("h01", 4)
    await log.leader(1)
    ready = tmp_path / "ready"
    await log.submit("w3", py(IGNORE_TERM, ready))
    await log.place("w3", {"h01": (1,)})
    started = await events.wait(m.WorkloadStarted, "w3")
    await wait_file(ready)
    assert started.pid is not None

    notice = await log.notice("w3", grace_s=3.0)
    await asyncio.sleep(1.0)  # well before the deadline
    assert alive(started.pid), "it ignores SIGTERM: it must still run before the deadline"
    preempted = await events.wait(m.WorkloadPreempted, "w3", timeout=10.0)

    assert preempted.at >= notice.grace_deadline - 0.05
    assert not alive(started.pid)


async def test_stale_epoch_placement_is_not_run(
    js: JetStreamContext, events: Events, run_agent: AgentFactory, tmp_path: Path
) -> None:
    log = Log(js)
    await run_agent("h01")
    await log.host("h01", 4)
    await log.leader(1)
    stale_out, ok_out = tmp_path / "stale", tmp_path / "ok"
    await log.submit("stale", py(WRITE_ENV, stale_out))
    await log.submit("fresh", py(WRITE_ENV, ok_out))
    await log.place("stale", {"h01": (0,)}, epoch=0)  # an old leader's decision
    await log.place("fresh", {"h01": (1,)}, epoch=1)

    # The agent handles records in order: once "fresh" is done, "stale" was seen and skipped.
    await events.wait(m.WorkloadCompleted, "fresh")
    assert ok_out.read_text().startswith("1|fresh|")
    assert not events.of(m.WorkloadStarted, "stale")
    assert not stale_out.exists()


async def test_cancel_stops_the_process_and_reports_cancelled(
    js: JetStreamContext, events: Events, run_agent: AgentFactory, tmp_path: Path
) -> None:
    log = Log(js)
    await run_agent("h01")
    await log.host("h01", 4)
    await log.leader(1)
    marker, ready = tmp_path / "term", tmp_path / "ready"
    await log.submit("w4", py(ON_TERM, marker, ready))
    await log.place("w4", {"h01": (0,)})
    await events.wait(m.WorkloadStarted, "w4")
    await wait_file(ready)

    cancel = m.CancelRequested(
        workload_id="w4", allocation="nlp", by="bob", reason="wrong config", at=time.time()
    )
    await bus.publish(js, bus.event_subject("nlp", cancel), cancel)
    cancelled = await events.wait(m.WorkloadCancelled, "w4")

    assert marker.read_text() == "term"
    assert (cancelled.by, cancelled.reason, cancelled.attempt) == ("bob", "wrong config", 1)


async def test_output_dir_holds_each_parts_stdout_and_stderr(
    js: JetStreamContext, events: Events, run_agent: AgentFactory, tmp_path: Path
) -> None:
    """``--output-dir``: one file per workload attempt and host (Slurm's slurm-%j.out),
    stdout and stderr together; an output file that cannot be opened fails the part with a
    reason instead of running it with its output lost."""
    log = Log(js)
    out = tmp_path / "out"
    agent = await run_agent("h01", output_dir=out)
    await log.host("h01", 4)
    await log.leader(1)
    say = "import os, sys; print('gpus', os.environ['CUDA_VISIBLE_DEVICES']); sys.exit('oops')"
    await log.submit("w9", py(say), gpus=2)
    await log.place("w9", {"h01": (1, 2)})
    failed = await events.wait(m.WorkloadFailed, "w9")
    assert failed.exit_code == 1
    path = agent.output_path("w9", 1, "h01")
    assert path == out / "w9.1.h01.out"
    assert path.read_text().splitlines() == ["gpus 1,2", "oops"]  # stdout, then stderr

    (out / "w10.1.h01.out").mkdir()  # not a file: cannot be opened for writing
    await log.submit("w10", py(say))
    await log.place("w10", {"h01": (0,)})
    refused = await events.wait(m.WorkloadFailed, "w10")
    assert refused.reason is not None and "cannot open its output file" in refused.reason
    assert not events.of(m.WorkloadStarted, "w10")


async def test_empty_command_fails_with_a_reason(
    js: JetStreamContext, events: Events, run_agent: AgentFactory
) -> None:
    log = Log(js)
    await run_agent("h01")
    await log.host("h01", 4)
    await log.leader(1)
    await log.submit("w5", ())
    await log.place("w5", {"h01": (0,)})

    failed = await events.wait(m.WorkloadFailed, "w5")
    assert failed.reason == NO_COMMAND
    assert failed.exit_code is None
    assert not events.of(m.WorkloadStarted, "w5")


async def test_a_command_less_run_with_a_duration_holds_its_gpus_then_completes(
    js: JetStreamContext, events: Events, run_agent: AgentFactory
) -> None:
    """As on a fake host (and as ``salloc --time``): no command, a duration of 0.5 s."""
    log = Log(js)
    await run_agent("h01")
    await log.host("h01", 4)
    await log.leader(1)
    await log.submit("w8", (), duration_s=0.5)
    await log.place("w8", {"h01": (0,)})

    done = await events.wait(m.WorkloadCompleted, "w8")
    started = events.of(m.WorkloadStarted, "w8")
    assert started and done.at - started[0].at >= 0.45
    assert not events.of(m.WorkloadFailed, "w8")


async def test_nonzero_exit_is_reported_failed_with_its_code(
    js: JetStreamContext, events: Events, run_agent: AgentFactory
) -> None:
    log = Log(js)
    await run_agent("h01")
    await log.host("h01", 4)
    await log.leader(1)
    await log.submit("w6", py("raise SystemExit(3)"))
    await log.place("w6", {"h01": (0,)})

    failed = await events.wait(m.WorkloadFailed, "w6")
    assert (failed.exit_code, failed.reason) == (3, "exited with code 3")


async def test_restart_reports_lost_processes_and_starts_unstarted_placements(
    js: JetStreamContext, events: Events, run_agent: AgentFactory, tmp_path: Path
) -> None:
    log = Log(js)
    await log.host("h01", 4)
    await log.leader(1)
    # "lost" ran under an earlier agent process; "waiting" was placed while no agent ran.
    await log.submit("lost", py("import time; time.sleep(60)"))
    placed = await log.place("lost", {"h01": (0,)})
    earlier = m.WorkloadStarted(
        workload_id="lost", allocation="nlp", at=placed.at, host="h01", pid=99999, gpus=1
    )
    await bus.publish(js, bus.event_subject("nlp", earlier), earlier)
    out = tmp_path / "env"
    await log.submit("waiting", py(WRITE_ENV, out))
    await log.place("waiting", {"h01": (1,)})

    await run_agent("h01")

    # Lost in a restart (a node failure): preempted as a drain, so it is requeued.
    lost = await events.wait(m.WorkloadPreempted, "lost")
    assert lost.reason == "host-drain"
    assert lost.started_at == placed.at
    assert not events.of(m.WorkloadFailed, "lost")
    await events.wait(m.WorkloadCompleted, "waiting")
    assert out.read_text().startswith("1|waiting|")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
async def test_a_restarted_agent_kills_what_its_killed_predecessor_left_before_freeing_gpus(
    js: JetStreamContext,
    events: Events,
    run_agent: AgentFactory,  # also starts dispatch, which the first agent needs too
    fresh_log: str,
    tmp_path: Path,
) -> None:
    """slurmd's rule: ``kill -9`` of the agent leaves its part running (its own session);
    the restarted agent must end it, launcher and children, before the log frees its GPUs,
    or the GPUs would be handed to other work while the old run still holds them."""
    log = Log(js)
    await log.host("h01", 2)
    await log.leader(1)
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "allot.services.agent",
        "--host",
        "h01",
        "--gpus",
        "2",
        "--nats-url",
        fresh_log,
        "--heartbeat-s",
        "0.2",
        env={**os.environ, "ALLOT_OTEL_EXPORTER": "none"},
        stdout=(tmp_path / "agent.log").open("wb"),
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        # A launcher with a child of its own, as a training script with data loaders.
        await log.submit("old", ("sh", "-c", "sleep 300 & exec sleep 301"), gpus=2)
        await log.place("old", {"h01": (0, 1)})
        started = await events.wait(m.WorkloadStarted, "old", timeout=20.0)
        assert started.pid is not None
        members = await _members(started.pid, 2)
    finally:
        agent.kill()  # SIGKILL: no chance to stop its parts
        await agent.wait()
    await asyncio.sleep(0.3)
    assert all(running(pid) for pid in members), "the part outlives a kill -9 of its agent"

    await run_agent("h01", gpus=2)
    lost = await events.wait(m.WorkloadPreempted, "old")

    # The log frees the GPUs only now, and nothing of the old attempt runs any more.
    assert lost.reason == "host-drain"
    assert [pid for pid in members if running(pid)] == []
    assert session(started.pid) == []


async def _members(sid: int, n: int, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(found := session(sid)) < n:
        assert time.monotonic() < deadline, f"session {sid} has {found}"
        await asyncio.sleep(0.02)
    return found


async def test_an_agent_stop_requeues_what_it_stopped_and_keeps_what_ended_on_its_own(
    js: JetStreamContext, events: Events, dispatch: DispatchService, tmp_path: Path, fresh_log: str
) -> None:
    """A planned host shutdown (SIGTERM to the agent) is a drain: the part it stops is
    preempted, so its resumable work is requeued, not failed; a part that had already
    exited keeps its own outcome."""
    log = Log(js)
    agent = Agent(
        AgentConfig(nats_url=fresh_log, hosts=("h01",), gpus=4, heartbeat_s=0.2, stop_grace_s=2.0)
    )
    await service_main.start(agent)
    stopped = False
    try:
        await log.host("h01", 4)
        await log.leader(1)
        marker, ready = tmp_path / "term", tmp_path / "ready"
        await log.submit("train", py(ON_TERM, marker, ready))
        await log.place("train", {"h01": (0,)})
        await log.submit("broken", py("raise SystemExit(3)"))
        await log.place("broken", {"h01": (1,)})
        await events.wait(m.WorkloadStarted, "train")
        await wait_file(ready)
        failed = await events.wait(m.WorkloadFailed, "broken")

        await service_main.stop(agent)
        stopped = True

        preempted = await events.wait(m.WorkloadPreempted, "train")
        assert marker.read_text() == "term"  # it had its SIGTERM (time to checkpoint)
        assert (preempted.reason, preempted.attempt) == ("host-drain", 1)
        assert not events.of(m.WorkloadFailed, "train")
        assert not events.of(m.WorkloadCompleted, "train")
        assert (failed.exit_code, failed.reason) == (3, "exited with code 3")
        # The log's own view: the resumable run is pending again (placement requeues it).
        fold = LogFold()
        fold.apply(m.HostRegistered(host="h01", gpus=4, at=time.time()))
        fold.apply(m.LeaderElected(epoch=1, leader="test", at=time.time()))
        for record in events.records:
            fold.apply(record)
        assert fold.records["train"].status == "pending"
        assert "train" in fold.queue
    finally:
        if not stopped:
            await service_main.stop(agent)


GANG = {"h02": (0, 1), "h01": (2, 3)}
"""A 4-GPU gang's assignment: h01 (sorted first) is the primary, though listed second."""


async def _gang_hosts(js: JetStreamContext, run_agent: AgentFactory) -> Log:
    """Agents for h01 and h02 (4 GPUs each), both hosts registered, a leader elected."""
    log = Log(js)
    await run_agent("h01")
    await run_agent("h02")
    for host in ("h01", "h02"):
        await log.host(host, 4)
    await log.leader(1)
    return log


async def test_gang_primary_reports_and_secondary_stops_when_the_log_ends_it(
    js: JetStreamContext, events: Events, run_agent: AgentFactory, tmp_path: Path
) -> None:
    log = await _gang_hosts(js, run_agent)
    # Each part writes its GPUs; the primary (h01) finishes, the secondary would run forever.
    gang = (
        "import os, pathlib, signal, sys, time\n"
        "d = pathlib.Path(sys.argv[1]); host = os.environ['ALLOT_HOST']\n"
        "def on_term(*_):\n"
        "    (d / (host + '.term')).write_text('term'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "(d / host).write_text(os.environ['CUDA_VISIBLE_DEVICES'])\n"
        "if host == 'h01':\n"
        "    while not (d / 'h02').exists(): time.sleep(0.02)\n"
        "    sys.exit(0)\n"
        "while True: time.sleep(0.05)\n"
    )
    await log.submit("g1", py(gang, tmp_path), gpus=4)
    await log.place("g1", GANG)

    done = await events.wait(m.WorkloadCompleted, "g1")
    assert await wait_file(tmp_path / "h02.term") == "term"
    assert (tmp_path / "h01").read_text() == "2,3"
    assert (tmp_path / "h02").read_text() == "0,1"
    assert [s.host for s in events.of(m.WorkloadStarted, "g1")] == ["h01"]
    assert done.gpus == 4
    await asyncio.sleep(0.2)  # a second (wrong) report by the secondary would land by now
    assert len(events.of(m.WorkloadCompleted, "g1")) == 1
    assert not events.of(m.WorkloadFailed, "g1")


async def test_a_gangs_parts_see_the_same_hosts_and_their_own_ranks(
    js: JetStreamContext, events: Events, run_agent: AgentFactory, tmp_path: Path
) -> None:
    """The rendezvous variables of a 2-host gang: the same ``ALLOT_HOSTS`` (primary first)
    on both parts, ranks 0 (the primary) and 1, ``ALLOT_NUM_HOSTS`` 2."""
    log = await _gang_hosts(js, run_agent)
    gang = (
        "import os, pathlib, sys, time\n"
        "d = pathlib.Path(sys.argv[1]); host = os.environ['ALLOT_HOST']\n"
        "keys = ('ALLOT_HOSTS', 'ALLOT_HOST_RANK', 'ALLOT_NUM_HOSTS')\n"
        "(d / host).write_text('|'.join(os.environ.get(k, '-') for k in keys))\n"
        "while not all((d / h).exists() for h in ('h01', 'h02')): time.sleep(0.02)\n"
    )
    await log.submit("g2", py(gang, tmp_path), gpus=4)
    await log.place("g2", GANG)

    await events.wait(m.WorkloadCompleted, "g2")
    assert (tmp_path / "h01").read_text() == "h01,h02|0|2"
    assert (tmp_path / "h02").read_text() == "h01,h02|1|2"


async def test_fake_hosts_heartbeat_and_complete_a_fake_run(
    js: JetStreamContext, events: Events, run_agent: AgentFactory, fresh_log: str
) -> None:
    nc = await nats.connect(fresh_log)
    beats: list[m.Heartbeat] = []

    async def on_beat(msg: Any) -> None:
        beats.append(msgspec.json.decode(msg.data, type=m.Heartbeat))

    await nc.subscribe(subjects.ALL_HEARTBEATS, cb=on_beat)
    try:
        hosts = ("fake-0000", "fake-0001", "fake-0002")
        await run_agent(*hosts, gpus=4, fake=True, heartbeat_s=0.1)
        deadline = time.monotonic() + 5.0
        while {b.host for b in beats} != set(hosts) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert {b.host for b in beats} == set(hosts)
        assert all(b.gpus == 4 for b in beats)

        log = Log(js)
        for host in hosts:
            await log.host(host, 4)
        await log.leader(1)
        await log.submit("fake1", gpus=8, duration_s=0.2)
        placed = await log.place("fake1", {"fake-0002": (0, 1, 2, 3), "fake-0001": (0, 1, 2, 3)})

        started = await events.wait(m.WorkloadStarted, "fake1")
        done = await events.wait(m.WorkloadCompleted, "fake1")
        assert (started.host, started.pid, started.gpus) == ("fake-0001", None, 8)
        assert done.at - done.started_at >= 0.2  # type: ignore[operator]
        assert done.started_at == started.at >= placed.at
        assert done.gpu_seconds == pytest.approx(8 * (done.at - started.at))
        assert len(events.of(m.WorkloadStarted, "fake1")) == 1
        seqs = [b.seq for b in beats if b.host == "fake-0000"]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    finally:
        await nc.close()


async def test_fake_agent_batches_its_hosts_reports(
    js: JetStreamContext, events: Events, run_agent: AgentFactory, fresh_log: str
) -> None:
    nc = await nats.connect(fresh_log)
    singles: list[str] = []

    async def on_single(msg: Any) -> None:
        singles.append(msg.subject)

    await nc.subscribe(subjects.ALL_HOST_REPORT, cb=on_single)
    try:
        hosts = tuple(f"fake-{i:04d}" for i in range(6))
        agent = await run_agent(*hosts, gpus=4, fake=True, batch_reports=True)
        log = Log(js)
        for host in hosts:
            await log.host(host, 4)
        await log.leader(1)
        for i in range(len(hosts)):
            await log.submit(f"b{i}", gpus=1, duration_s=0.3)
        for i, host in enumerate(hosts):
            await log.place(f"b{i}", {host: (0,)})

        for i, host in enumerate(hosts):
            started = await events.wait(m.WorkloadStarted, f"b{i}")
            done = await events.wait(m.WorkloadCompleted, f"b{i}")
            assert started.host == host
            assert done.started_at == started.at
            assert done.at - started.at >= 0.3
        for i in range(len(hosts)):
            assert len(events.of(m.WorkloadStarted, f"b{i}")) == 1
            assert len(events.of(m.WorkloadCompleted, f"b{i}")) == 1
        assert agent._batcher is not None
        # 12 reports (6 starts, 6 ends) in fewer requests, and none host by host.
        assert 2 <= agent._batcher.batches < 12
        assert singles == []
        assert agent.rejected == 0
    finally:
        await nc.close()


async def test_dispatch_answers_a_sync_with_the_records_it_appended_itself(
    js: JetStreamContext, fresh_log: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dispatch takes the log in batches; what it appended itself is in its fold before it
    answers from it: a host syncing right after its part's start was stored is told the
    part started (an agent restarted in that moment would otherwise start it again).
    Batches every 30 s here, so only the read of its own records can show it."""
    monkeypatch.setattr(dispatch_module, "READ_EVERY_S", 30.0)
    log = Log(js)
    await log.host("h01", 4)
    await log.leader(1)
    await log.submit("s1", gpus=1)
    await log.place("s1", {"h01": (0,)})
    service = DispatchService(fresh_log)
    await service_main.start(service)
    nc = await nats.connect(fresh_log)
    try:
        report = m.PartReport(
            host="h01", workload_id="s1", attempt=1, event="started", at=time.time()
        )
        reply = await nc.request(
            subjects.host_report("h01"), msgspec.json.encode(report), timeout=10
        )
        assert msgspec.json.decode(reply.data, type=m.CommandAccepted).detail == "WorkloadStarted"
        reply = await nc.request(
            subjects.host_sync("h01"), msgspec.json.encode(m.HostSync(host="h01")), timeout=10
        )
        work = msgspec.json.decode(reply.data, type=m.HostWork)
        assert [(task.workload_id, task.started) for task in work.tasks] == [("s1", True)]
    finally:
        await nc.close()
        await service_main.stop(service)


async def test_dispatch_answers_each_report_of_a_batch_on_its_own(
    js: JetStreamContext, events: Events, dispatch: DispatchService, fresh_log: str
) -> None:
    log = Log(js)
    for host in ("h01", "h02"):
        await log.host(host, 4)
    await log.leader(1)
    await log.submit("g1", gpus=1)
    await log.place("g1", {"h01": (0,)})
    await log.submit("g2", gpus=1)
    await log.place("g2", {"h02": (1,)})
    nc = await nats.connect(fresh_log)
    try:

        def report(host: str, wid: str) -> m.PartReport:
            return m.PartReport(
                host=host, workload_id=wid, attempt=1, event="started", at=time.time()
            )

        batch = m.PartReports(
            reports=(
                report("h01", "g1"),
                report("h01", "g2"),  # g2 runs on h02: h01 may not report it
                report("h02", "nope"),
                report("h02", "g2"),
            )
        )
        reply = await nc.request(subjects.HOSTS_REPORT, msgspec.json.encode(batch), timeout=10)
        answer = msgspec.json.decode(reply.data, type=m.PartReportsAnswered)
        kinds = [type(a).__name__ for a in answer.answers]
        assert kinds == ["CommandAccepted", "CommandRejected", "CommandRejected", "CommandAccepted"]
        refused = [a for a in answer.answers if isinstance(a, m.CommandRejected)]
        assert [r.field for r in refused] == ["reports[1].host", "reports[2].workload_id"]
        assert "has no part of" in refused[0].reason
        assert (await events.wait(m.WorkloadStarted, "g1")).host == "h01"
        assert (await events.wait(m.WorkloadStarted, "g2")).host == "h02"

        # The same batch again: stored once, each answered from the log.
        reply = await nc.request(subjects.HOSTS_REPORT, msgspec.json.encode(batch), timeout=10)
        again = msgspec.json.decode(reply.data, type=m.PartReportsAnswered)
        assert [getattr(a, "detail", "") for a in again.answers][::3] == [
            "already in the log",
            "already in the log",
        ]
        await asyncio.sleep(0.3)
        assert len(events.of(m.WorkloadStarted, "g1")) == 1

        # A body that is not a batch is refused as a whole, naming the field; dispatch goes on.
        for body, field in (
            (b'{"type":"PartReports","reports":[]}', "reports"),
            (b'{"type":"PartReports","reports":[{"host":"h01"}]}', "reports[0].workload_id"),
            (b"{not json", "body"),
        ):
            reply = await nc.request(subjects.HOSTS_REPORT, body, timeout=10)
            rejected = msgspec.json.decode(reply.data, type=m.CommandRejected)
            assert rejected.field == field, (body, rejected)
        reply = await nc.request(
            subjects.HOSTS_REPORT,
            msgspec.json.encode(m.PartReports(reports=(report("h01", "g1"),))),
            timeout=10,
        )
        assert isinstance(
            msgspec.json.decode(reply.data, type=m.PartReportsAnswered).answers[0],
            m.CommandAccepted,
        )
    finally:
        await nc.close()


async def test_dispatch_refuses_report_times_the_log_and_its_clock_contradict(
    js: JetStreamContext, events: Events, dispatch: DispatchService, fresh_log: str
) -> None:
    """A run placed 3 days ago: its agent's reports may not charge more than those 3 days,
    alone on the host's subject or as items of a batch; the true ones are charged exactly."""
    log = Log(js)
    await log.host("h01", 4)
    await log.leader(1)
    await log.submit("w", gpus=2)
    placed = (await log.place("w", {"h01": (0, 1)}, at=time.time() - 3 * 86_400)).at
    days_30 = 30 * 86_400
    nc = await nats.connect(fresh_log)
    try:

        def report(event: m.PartEvent, at: float, **kw: Any) -> m.PartReport:
            return m.PartReport(host="h01", workload_id="w", attempt=1, event=event, at=at, **kw)

        def end(at: float, started_at: float) -> m.PartReport:
            return report("exited", at, exit_code=0, started_at=started_at)

        now = time.time()
        lies = [
            (report("started", placed - days_30), "at"),
            (report("started", now + days_30), "at"),
            (end(now + days_30, placed + 10), "at"),
            (end(m.MAX_TIME, placed + 10), "at"),
            (end(now, placed - days_30), "started_at"),
            (end(now, now + days_30), "started_at"),
            (end(placed + 100, placed + 200), "at"),
        ]
        before = (await js.stream_info("WORKLOADS")).state.messages
        for lie, field in lies:
            reply = await nc.request(
                subjects.host_report("h01"), msgspec.json.encode(lie), timeout=10
            )
            rejected = msgspec.json.decode(reply.data, type=m.CommandRejected)
            assert rejected.field == field, (lie, rejected)
        batch = m.PartReports(reports=tuple(lie for lie, _ in lies))
        reply = await nc.request(subjects.HOSTS_REPORT, msgspec.json.encode(batch), timeout=10)
        answers = msgspec.json.decode(reply.data, type=m.PartReportsAnswered).answers
        assert [getattr(a, "field", None) for a in answers] == [
            f"reports[{i}].{field}" for i, (_, field) in enumerate(lies)
        ]
        await asyncio.sleep(0.3)
        assert (await js.stream_info("WORKLOADS")).state.messages == before

        # The truth: started 10 s after its placement, ended now.
        start = report("started", placed + 10)
        reply = await nc.request(
            subjects.host_report("h01"), msgspec.json.encode(start), timeout=10
        )
        assert isinstance(
            msgspec.json.decode(reply.data, type=m.CommandAccepted), m.CommandAccepted
        )
        await events.wait(m.WorkloadStarted, "w")
        now = time.time()
        reply = await nc.request(
            subjects.host_report("h01"), msgspec.json.encode(end(now, placed + 10)), timeout=10
        )
        assert isinstance(
            msgspec.json.decode(reply.data, type=m.CommandAccepted), m.CommandAccepted
        )
        done = await events.wait(m.WorkloadCompleted, "w")
        assert done.gpu_seconds == pytest.approx(2 * (now - (placed + 10)))
        assert done.gpu_seconds <= 2 * (time.time() - placed)  # its wall time: 3 days
    finally:
        await nc.close()


def test_batched_reports_are_for_fake_agents_only() -> None:
    with pytest.raises(ValidationError) as e:
        AgentConfig(nats_url="nats://x", hosts=("h01",), batch_reports=True)
    assert e.value.field == "batch_reports"
    assert "fake mode" in e.value.reason


def test_output_dir_is_for_real_agents_and_must_be_creatable(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as e:
        AgentConfig(nats_url="nats://x", hosts=("h01",), fake=True, output_dir=tmp_path)
    assert e.value.field == "output_dir" and "real mode" in e.value.reason
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValidationError) as e:
        AgentConfig(nats_url="nats://x", hosts=("h01",), output_dir=blocker / "out")
    assert e.value.field == "output_dir" and str(blocker / "out") in e.value.reason


GANG_WAITS = (
    "import os, pathlib, signal, sys, time\n"
    "d = pathlib.Path(sys.argv[1]); host = os.environ['ALLOT_HOST']\n"
    "def on_term(*_):\n"
    "    (d / (host + '.term')).write_text('term'); sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "(d / host).write_text(os.environ['ALLOT_ATTEMPT'])\n"
    "if host == 'h02' and len(sys.argv) > 2:\n"
    "    while not (d / 'h01').exists(): time.sleep(0.02)\n"
    "    raise SystemExit(int(sys.argv[2]))\n"
    "while True: time.sleep(0.05)\n"
)
"""A gang part that runs until SIGTERM (writing ``<host>.term``); the secondary (h02)
exits with ``argv[2]``, when given, once the primary's part runs."""


async def test_a_gangs_secondary_part_that_fails_fails_the_workload_and_stops_the_primary(
    js: JetStreamContext, events: Events, run_agent: AgentFactory, tmp_path: Path
) -> None:
    log = await _gang_hosts(js, run_agent)
    await log.submit("g3", py(GANG_WAITS, tmp_path, "7"), gpus=4)
    await log.place("g3", GANG)

    failed = await events.wait(m.WorkloadFailed, "g3")
    assert (failed.exit_code, failed.gpus) == (7, 4)
    # The primary's part is stopped by its agent: the log no longer lists it.
    assert await wait_file(tmp_path / "h01.term") == "term"
    await asyncio.sleep(0.3)  # the primary's part ended quietly: no second end
    assert len(events.of(m.WorkloadFailed, "g3")) == 1
    assert not events.of(m.WorkloadCompleted, "g3")
    assert not events.of(m.WorkloadPreempted, "g3")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
async def test_a_gangs_secondary_part_lost_in_a_restart_requeues_the_attempt(
    js: JetStreamContext,
    events: Events,
    run_agent: AgentFactory,
    fresh_log: str,
    tmp_path: Path,
) -> None:
    log = Log(js)
    await run_agent("h01")
    for host in ("h01", "h02"):
        await log.host(host, 4)
    await log.leader(1)
    secondary = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "allot.services.agent", "--host", "h02", "--gpus", "4"),
        *("--nats-url", fresh_log, "--heartbeat-s", "0.2"),
        env={**os.environ, "ALLOT_OTEL_EXPORTER": "none"},
        stdout=(tmp_path / "agent.log").open("wb"),
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        # Up and in step with the log before the placement (else its part is "lost").
        deadline = time.monotonic() + 20.0
        while b"agent started" not in (tmp_path / "agent.log").read_bytes():
            assert time.monotonic() < deadline, "the agent of h02 did not start"
            await asyncio.sleep(0.05)
        await log.submit("g4", py(GANG_WAITS, tmp_path), gpus=4)
        await log.place("g4", GANG)
        await events.wait(m.WorkloadStarted, "g4", timeout=20.0)
        assert await wait_file(tmp_path / "h02", timeout=20.0) == "1"
    finally:
        secondary.kill()  # SIGKILL: its part is left behind
        await secondary.wait()

    await run_agent("h02")  # kills what is left, reports the part lost
    lost = await events.wait(m.WorkloadPreempted, "g4")
    assert (lost.reason, lost.attempt, lost.gpus) == ("host-drain", 1, 4)
    assert await wait_file(tmp_path / "h01.term") == "term"  # the primary's part stopped
    fold = LogFold()
    fold.apply(m.LeaderElected(epoch=1, leader="test", at=time.time()))
    for host in ("h01", "h02"):
        fold.apply(m.HostRegistered(host=host, gpus=4, at=time.time()))
    for record in events.records:
        fold.apply(record)
    assert fold.records["g4"].status == "pending"  # resumable: requeued, GPUs free
    assert fold.workload_on("h01") == fold.workload_on("h02") == set()
