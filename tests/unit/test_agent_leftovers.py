"""``allot.services.agent.gpu_exec.LeftoverSweep`` and ``Part.stopped`` with real processes: what a
restarted agent kills (an earlier agent's parts, all of their session) and what it never
touches (another part, another host, a process whose pid was reused)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from allot.core.errors import ValidationError
from allot.services.agent import gpu_exec
from allot.services.agent import service as agent_module
from allot.services.agent.gpu_exec import FakePart, LeftoverSweep, ProcessPart, workload_env
from process_probe import running, session

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


@pytest.fixture
def dead_agent() -> str:
    """The marker of an agent process that has exited (a killed agent's)."""
    agent = subprocess.Popen(["sleep", "30"])
    marker = gpu_exec.agent_marker(agent.pid)
    agent.kill()
    agent.wait()
    assert marker
    return marker


@pytest.fixture
def spawn(dead_agent: str) -> Iterator[object]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        wid: str, attempt: int, host: str, command: list[str], agent: str = dead_agent
    ) -> subprocess.Popen[bytes]:
        env = workload_env(
            os.environ,
            gpus=(0,),
            workload_id=wid,
            allocation="nlp",
            attempt=attempt,
            nats_url="nats://127.0.0.1:4222",
            host=host,
            agent=agent,
        )
        proc = subprocess.Popen(command, env=env, start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        for pid in session(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


def _until_gone(sweep: LeftoverSweep) -> int:
    rounds = 0
    while sweep():
        rounds += 1
        assert rounds < 200, "still alive after 200 sweeps"
        time.sleep(0.02)
    return rounds


def _wait_members(sid: int, n: int) -> list[int]:
    deadline = time.monotonic() + 5.0
    while len(members := session(sid)) < n:
        assert time.monotonic() < deadline, f"session {sid}: {members}"
        time.sleep(0.02)
    return members


def test_a_sweep_kills_an_earlier_agents_part_with_its_wholesession(spawn) -> None:  # type: ignore[no-untyped-def]
    # The launcher forks a child that drops the environment (env -i): found by its session.
    old = spawn("w1", 1, "h01", ["sh", "-c", "env -i sleep 300 & exec sleep 301"])
    other_part = spawn("w2", 1, "h01", ["sleep", "302"])
    other_host = spawn("w1", 1, "h02", ["sleep", "303"])
    members = _wait_members(old.pid, 2)

    sweep = LeftoverSweep(lambda wid, attempt, host: (wid, attempt, host) == ("w1", 1, "h01"))
    assert _until_gone(sweep) >= 1
    old.wait(timeout=5)
    assert not [pid for pid in members if running(pid)]
    assert running(other_part.pid) and running(other_host.pid)
    assert sweep() == 0


def test_a_sweep_never_signals_a_process_whose_pid_now_names_another(spawn) -> None:  # type: ignore[no-untyped-def]
    proc = spawn("w1", 1, "h01", ["sleep", "300"])
    stat = gpu_exec._read_stat(proc.pid)
    assert stat is not None
    # The same pid, started at another time: another process (the pid was reused).
    reused = gpu_exec._Proc(pid=proc.pid, sid=stat.sid, started=stat.started + 1)
    assert not gpu_exec._kill_if_same(reused)
    assert running(proc.pid)
    assert gpu_exec._kill_if_same(stat)
    proc.wait(timeout=5)


def test_the_agent_and_unmarked_processes_are_left_alone(spawn) -> None:  # type: ignore[no-untyped-def]
    plain = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert LeftoverSweep(lambda *_: True)() == 0  # nothing marked runs
        assert running(plain.pid) and running(os.getpid())
    finally:
        plain.kill()
        plain.wait()


def test_a_live_agents_parts_and_parts_without_an_agent_are_never_leftovers(spawn) -> None:  # type: ignore[no-untyped-def]
    """A second agent started for a host name in use, or another cluster's agent with the
    same host names, must not kill the parts of an agent that still runs (found
    2026-12-03: the sweep matched on the host marker alone and failed live work)."""
    live = spawn("w1", 1, "h01", ["sleep", "300"], agent=gpu_exec.agent_marker())
    foreign = spawn("w9", 1, "h01", ["sleep", "301"], agent="")  # no agent marker at all
    left = spawn("w2", 1, "h01", ["sleep", "302"])  # its agent is gone
    assert _until_gone(LeftoverSweep(lambda *_: True)) >= 1
    left.wait(timeout=5)
    assert running(live.pid) and running(foreign.pid)


async def test_stopped_tells_an_end_the_stopper_caused_from_one_of_its_own() -> None:
    env = dict(os.environ)
    part = await ProcessPart.spawn(["sleep", "30"], env, time.time)
    part.terminate(time.time() + 5)
    assert await part.wait() == -signal.SIGTERM
    assert part.stopped

    done = await ProcessPart.spawn(["true"], env, time.time)
    await asyncio.sleep(0.3)  # it has exited (the loop may not know yet)
    done.terminate(time.time() + 5)
    assert await done.wait() == 0
    assert not done.stopped

    fake = FakePart(0.01)
    assert await fake.wait() == 0
    fake.terminate(0.0)
    assert not fake.stopped
    fake = FakePart(30.0)
    fake.terminate(0.0)
    assert await fake.wait() == -signal.SIGTERM
    assert fake.stopped


def test_a_second_real_agent_for_a_host_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """It would start the host's work list again: two copies of each run on its GPUs."""
    monkeypatch.setattr(agent_module, "HOST_LOCKS", tmp_path)
    config = agent_module.AgentConfig(nats_url="nats://127.0.0.1:1", hosts=("h01",))
    first = agent_module.Agent(config)
    first._lock_hosts()
    second = agent_module.Agent(config)
    with pytest.raises(ValidationError) as err:
        second._lock_hosts()
    assert err.value.field == "--host" and f"(pid {os.getpid()})" in err.value.reason
    for fd in first._host_locks:  # the first stops: the host is free again
        os.close(fd)
    second._lock_hosts()
    assert len(second._host_locks) == 1
    os.close(second._host_locks[0])


async def test_a_stop_asked_again_sends_no_second_sigterm(tmp_path: Path) -> None:
    """The agent asks again each time a work list is re-applied during the grace period."""
    seen = tmp_path / "terms"
    script = f"trap 'echo term >> {seen}' TERM; while :; do sleep 0.05; done"
    part = await ProcessPart.spawn(["sh", "-c", script], dict(os.environ), time.time)
    await asyncio.sleep(0.3)  # the trap is set
    part.terminate(time.time() + 30)
    for _ in range(3):
        await asyncio.sleep(0.2)
        part.terminate(time.time() + 30)  # the same stop, asked again: nothing sent
    part.terminate(time.time() + 0.5)  # an earlier deadline (a cancel): SIGKILL sooner only
    assert await asyncio.wait_for(part.wait(), 5) == -signal.SIGKILL
    assert seen.read_text().splitlines() == ["term"]


async def test_a_notices_deadline_holds_without_a_sigterm_and_a_later_stop_keeps_it(
    tmp_path: Path,
) -> None:
    """``kill_by``: the SIGKILL of a notice's deadline, armed before the notice's own steps
    (which a workload may hold up); the SIGTERM that follows is sent once, the deadline kept."""
    seen = tmp_path / "terms"
    script = f"trap 'echo term >> {seen}' TERM; while :; do sleep 0.05; done"
    part = await ProcessPart.spawn(["sh", "-c", script], dict(os.environ), time.time)
    await asyncio.sleep(0.3)  # the trap is set
    part.kill_by(time.time() + 1.0)
    await asyncio.sleep(0.3)
    assert not seen.exists()  # nothing sent yet
    part.terminate(time.time() + 30)  # a later deadline moves nothing
    assert await asyncio.wait_for(part.wait(), 10) == -signal.SIGKILL
    assert seen.read_text().splitlines() == ["term"]
