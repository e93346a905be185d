"""The checkpoint protocol on notice and restorable sessions (issue 40) on real NATS with
the real agent: a counter that saves its count on USR1 is preempted on a live stack
(``allot.ops.stack.Stack``: real placement, intake, dispatch) and resumes from the saved
count; one that ignores the signal is reported ``missed``, one that confirms after its
timeout ``late``; a session started with ``allot session start`` keeps its state, id and
submit time over two preemptions by the real leader (``allot session attach`` after each);
bad input is refused naming the field. The agent-level cases play the placement leader
(``test_agent.Log``)."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
import test_agent
from live_harness import allot, eventually, life, of_type, records, running_intake, seed
from nats.js import JetStreamContext
from test_agent import Events, Log, py, wait_file

from allot import bus
from allot.bus import service_main
from allot.core.errors import ValidationError
from allot.ops.stack import AgentSpec, Stack, StackConfig
from allot.proto import messages as m
from allot.sdk import Client, SubmitRejectedError
from allot.services.agent.service import Agent, AgentConfig
from allot.services.dispatch import DispatchService

pytestmark = pytest.mark.integration

# Counts; on USR1 saves its count and confirms, then exits 0. A later attempt starts from
# the saved count and finishes 20 counts on. Each attempt logs "<attempt> <what> <count>".
COUNTER = """
import os, pathlib, signal, sys, time
d = pathlib.Path(os.environ["ALLOT_CHECKPOINT_DIR"])
attempt = int(os.environ["ALLOT_ATTEMPT"])
saved = d / "count"
count = int(saved.read_text()) if saved.exists() else 0
log = pathlib.Path(sys.argv[1])
def note(what):
    with log.open("a") as f:
        f.write(f"{attempt} {what} {count}\\n")
note("start")
def save(*_):
    saved.write_text(str(count))
    (d / ".allot-checkpointed").write_text("ok")
    note("saved")
    sys.exit(0)
signal.signal(signal.SIGUSR1, save)
target = count + 20 if attempt > 1 else 10**9
while count < target:
    count += 1
    time.sleep(0.05)
note("done")
"""

# Ignores USR1 and SIGTERM: killed at the deadline.
DEAF = """
import pathlib, signal, sys, time
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(sys.argv[1]).write_text("ready")
while True:
    time.sleep(0.05)
"""

# On USR1 takes 2 s to checkpoint (its timeout is 1 s), riding out the SIGTERM.
SLOW = """
import os, pathlib, signal, sys, time
d = pathlib.Path(os.environ["ALLOT_CHECKPOINT_DIR"])
asked = []
signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(sys.argv[1]).write_text("ready")
while not asked:
    time.sleep(0.02)
time.sleep(2.0)
(d / ".allot-checkpointed").write_text("ok")
sys.exit(0)
"""

# A session: appends its attempt to a file in its state directory, then idles; prints
# what it found there when it started.
SESSION = """
import os, pathlib, sys, time
state = pathlib.Path(os.environ["ALLOT_SESSION_DIR"])
notes = state / "history.txt"
before = notes.read_text() if notes.exists() else ""
notes.write_text(before + os.environ["ALLOT_ATTEMPT"] + ",")
with open(sys.argv[1], "a") as f:
    f.write(f"{os.environ['ALLOT_ATTEMPT']}:{before}|")
while True:
    time.sleep(0.05)
"""


def _stack(tmp_path: Path, nats_url: str, redis_url: str, root: Path) -> StackConfig:
    agent = AgentSpec("gpu01", gpus=8, fake=False, checkpoint_root=str(root))
    return StackConfig(
        run_dir=tmp_path / "run",
        nats_url=nats_url,
        redis_url=redis_url,
        redis_prefix=f"ck{uuid.uuid4().hex[:8]}",
        placements=1,
        grace_s=6,
        unallocated_settle_s=0.5,
        lease_ttl_s=1.0,
        rank_every_s=1.0,
        accrue_s=1.0,
        slot_s=1.0,
        heartbeat_timeout_s=10.0,
        agents=(agent,),
    )


async def test_a_counter_preempted_on_a_live_stack_checkpoints_and_resumes_from_its_count(
    fresh_log: str, redis_url: str, tmp_path: Path
) -> None:
    root, out = tmp_path / "checkpoints", tmp_path / "counter.log"
    with Stack(_stack(tmp_path, fresh_log, redis_url, root)):
        async with Client(fresh_log) as c:
            victim = await c.submit(
                client_id="counter",
                user="ann",
                allocation="nlp",
                gpus=8,
                min_runtime_s=3,
                command=[sys.executable, "-c", COUNTER, str(out)],
                checkpoint_signal="USR1",
                checkpoint_timeout_s=4,
            )
            wid = victim.workload_id
            await eventually(lambda: c.status(wid), lambda s: s.run_started_at is not None, 20)
            # ads holds nothing and is owed GPUs: once the counter's protection ends, it
            # is preempted for them.
            await c.submit(
                client_id="ads-1",
                user="bo",
                allocation="ads",
                gpus=2,
                min_runtime_s=60,
                command=[sys.executable, "-c", "import time; time.sleep(2)"],
            )
            final = await eventually(
                lambda: c.status(wid), lambda s: s.state == "completed", timeout=60
            )
            log = await records(c._nc.jetstream())  # type: ignore[union-attr]
    lines = [line.split() for line in out.read_text().splitlines()]
    saved = next(int(n) for a, what, n in lines if (a, what) == ("1", "saved"))
    resumed = next(int(n) for a, what, n in lines if (a, what) == ("2", "start"))
    assert saved > 0 and resumed == saved, lines
    assert ["2", "done", str(saved + 20)] in lines
    preempted = [r for r in log if isinstance(r, m.WorkloadPreempted) and r.workload_id == wid]
    assert len(preempted) == 1 and preempted[0].checkpoint == "done"
    p = preempted[0]
    assert p.checkpointed_at is not None and p.started_at is not None
    assert p.started_at <= p.checkpointed_at <= p.at
    # Lost: only the moment between the confirmation and the exit.
    assert p.lost_gpu_seconds == pytest.approx(8 * (p.at - p.checkpointed_at))
    assert p.lost_gpu_seconds < 8 * 1.0 < p.gpu_seconds
    assert (final.attempt, final.checkpoints[0].outcome) == (2, "done")
    assert final.checkpoint_dir == str(root / "nlp" / wid)


async def test_a_session_started_and_attached_with_the_cli_survives_two_real_preemptions(
    fresh_log: str, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``allot session start`` on a live stack; twice, ads (owed, holding nothing) submits
    work once the session's protection has ended, and placement preempts the session for
    it: its state directory is saved and restored at each new placement, it keeps its id
    and submit time, and ``allot session attach`` names where each attempt runs."""
    root, out = tmp_path / "checkpoints", tmp_path / "session.log"
    url = ["--nats-url", fresh_log]
    start = ["session", "start", *url, "--alloc", "nlp", "--user", "ann"]
    with Stack(_stack(tmp_path, fresh_log, redis_url, root)):
        # Bad input is refused naming the option, exit 2: by the CLI, and by intake (a
        # checkpoint timeout over the stack's 6 s grace period).
        for bad, option in (
            (["--gpus", "0"], "--gpus"),
            (["--gpus", "1", "--min-runtime", "0"], "--min-runtime"),
            (["--gpus", "1", "--checkpoint-signal", "BOGUS"], "--checkpoint-signal"),
            (["--gpus", "1", "--checkpoint-timeout", "10s"], "--checkpoint-timeout"),
        ):
            code, _, err = await allot(capsys, *start, *bad, "--command", "true")
            assert (code, err.startswith(f"allot session: {option}: ")) == (2, True), err
        for bad in (["--gpus", "1"], ["--gpus", "1", "--command", ""]):  # none; no program
            code, _, err = await allot(capsys, *start, *bad)
            assert (code, err.startswith("allot session: --command: ")) == (2, True), err

        command = ["--command", sys.executable, "-c", SESSION, str(out)]
        # 8 s of protection: each attempt's checks (attach, status, the log) end well before
        # any waiting ads work may preempt it (a displaced ads workload waits and preempts
        # again as soon as the protection ends).
        code, printed, err = await allot(
            capsys, *start, "--gpus", "8", "--min-runtime", "8s", "--json", *command
        )
        assert code == 0, err
        wid = json.loads(printed)["data"]["workload_id"]
        async with Client(fresh_log) as c:
            submitted: list[float] = []
            preemptors: list[str] = []
            for attempt in (1, 2, 3):
                status = await eventually(
                    lambda: c.status(wid),
                    lambda s, n=attempt: (
                        (s.attempt, s.state) == (n, "running")  # type: ignore[misc]
                        and s.run_started_at is not None
                    ),
                    timeout=30,
                )
                code, printed, err = await allot(capsys, "session", "attach", wid, *url)
                assert code == 0, err
                attached = dict(line.split(": ", 1) for line in printed.splitlines())
                assert attached["session"].strip() == wid
                assert attached["state"].strip() == "running"
                assert attached["host"].strip() == "gpu01"
                assert attached["attempt"].strip() == str(attempt)
                assert attached["state dir"].strip() == str(root / "nlp" / wid)
                assert len([k for k in attached if k.startswith("preempted ")]) == attempt - 1
                code, printed, err = await allot(capsys, "status", wid, *url, "--json")
                assert code == 0, err
                submitted.append(json.loads(printed)["data"]["submitted_at"])
                assert status.submitted_at == submitted[-1]
                if attempt < 3:
                    ads = await c.submit(
                        client_id=f"ads-{attempt}",
                        user="bo",
                        allocation="ads",
                        gpus=2,
                        min_runtime_s=60,
                        command=[sys.executable, "-c", "import time; time.sleep(2)"],
                    )
                    preemptors.append(ads.workload_id)
            # Attempt 3 found what attempts 1 and 2 wrote in ALLOT_SESSION_DIR.
            await eventually(lambda: _read(out), lambda text: text.count("|") == 3)
            assert out.read_text() == "1:|2:1,|3:1,2,|"
            assert (root / "nlp" / wid / "session-state" / "history.txt").read_text() == "1,2,"
            log = await records(c._nc.jetstream())  # type: ignore[union-attr]
    # One id, one submission, three placements; two real preemptions, each checkpointed.
    (sub,) = [r for r in of_type(log, m.WorkloadSubmitted) if r.workload_id == wid]
    assert submitted == [sub.at] * 3
    placed = [r.attempt for r in of_type(log, m.WorkloadPlaced) if r.workload_id == wid]
    assert placed == [1, 2, 3]
    notices = [r for r in of_type(log, m.PreemptionNotice) if r.workload_id == wid]
    assert [(n.attempt, n.requeue) for n in notices] == [(1, True), (2, True)]
    # For ads's work, which is below its entitlement and ranks better (the reason depends on
    # whether ranking has run since the ads work arrived; the second notice may name the
    # first ads workload when the session's return had displaced it and it waits again).
    assert all(n.preemptor_allocation == "ads" for n in notices), notices
    assert {n.preemptor for n in notices} <= set(preemptors), (notices, preemptors)
    assert {n.reason for n in notices} <= {"reclaimed-for-entitlement", "better-ranked"}
    preempted = [r for r in of_type(log, m.WorkloadPreempted) if r.workload_id == wid]
    assert [(p.attempt, p.checkpoint) for p in preempted] == [(1, "done"), (2, "done")]
    requeued = [r.attempt for r in of_type(log, m.WorkloadRequeued) if r.workload_id == wid]
    assert requeued == [1, 2]
    kinds = life(log, wid)
    assert kinds.count("WorkloadSubmitted") == 1
    order = [k for k in kinds if k in ("WorkloadPlaced", "WorkloadPreempted", "WorkloadRequeued")]
    assert order == ["WorkloadPlaced", "WorkloadPreempted", "WorkloadRequeued"] * 2 + [
        "WorkloadPlaced"
    ]


async def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


# ---------------------------------------------------------------------- agent level
js = test_agent.js  # the agent tests' fixtures: a fresh log's JetStream, its events
events = test_agent.events


@pytest.fixture
async def agent(fresh_log: str, tmp_path: Path) -> AsyncIterator[Agent]:
    dispatch = DispatchService(fresh_log)
    await service_main.start(dispatch)
    config = AgentConfig(
        nats_url=fresh_log,
        hosts=("h01",),
        gpus=4,
        heartbeat_s=0.2,
        kill_after_s=1.0,
        stop_grace_s=1.0,
        checkpoint_root=tmp_path / "root",
        checkpoint_allow=(tmp_path / "shared",),
    )
    a = Agent(config)
    await service_main.start(a)
    yield a
    await service_main.stop(a)
    await service_main.stop(dispatch)


async def submitted(
    js: JetStreamContext, wid: str, command: tuple[str, ...], user: str = "alice", **kw: Any
) -> Log:
    log = Log(js)
    await log.host("h01", 4)
    await log.leader(1)
    rec = m.WorkloadSubmitted(
        workload_id=wid,
        client_id=wid,
        user=user,
        gpus=1,
        allocation="nlp",
        min_runtime_s=60,
        command=command,
        at=time.time(),
        **kw,
    )
    await bus.publish(js, bus.event_subject("nlp", rec), rec)
    return log


async def test_a_workload_ignoring_the_signal_is_killed_at_the_deadline_and_reported_missed(
    js: JetStreamContext, events: Events, agent: Agent, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    log = await submitted(
        js, "deaf", py(DEAF, ready), checkpoint_signal="USR1", checkpoint_timeout_s=0.5
    )
    await log.place("deaf", {"h01": (0,)})
    started = await events.wait(m.WorkloadStarted, "deaf")
    await wait_file(ready)
    notice = await log.notice("deaf", grace_s=1.5)
    preempted = await events.wait(m.WorkloadPreempted, "deaf", timeout=10)
    assert preempted.checkpoint == "missed"
    assert preempted.at >= notice.grace_deadline - 0.05  # killed at the deadline
    assert preempted.checkpointed_at is None
    assert started.at is not None
    assert preempted.lost_gpu_seconds == pytest.approx(preempted.gpu_seconds)  # all of it


async def test_a_checkpoint_confirmed_after_its_timeout_but_before_the_kill_is_late(
    js: JetStreamContext, events: Events, agent: Agent, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    log = await submitted(
        js, "slow", py(SLOW, ready), checkpoint_signal="USR1", checkpoint_timeout_s=1.0
    )
    await log.place("slow", {"h01": (1,)})
    await events.wait(m.WorkloadStarted, "slow")
    await wait_file(ready)
    notice = await log.notice("slow", grace_s=5.0)
    preempted = await events.wait(m.WorkloadPreempted, "slow", timeout=10)
    assert preempted.checkpoint == "late"
    assert preempted.checkpointed_at is not None
    assert notice.at + 1.0 < preempted.checkpointed_at < notice.grace_deadline


async def test_a_checkpoint_dir_outside_the_agents_roots_is_refused_naming_the_field(
    js: JetStreamContext, events: Events, agent: Agent, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    log = await submitted(js, "stray", py("pass"), checkpoint_dir=str(outside))
    await log.place("stray", {"h01": (2,)})
    failed = await events.wait(m.WorkloadFailed, "stray")
    assert failed.reason.startswith("checkpoint_dir: "), failed.reason
    assert "outside the roots this agent allows" in failed.reason
    assert not outside.exists()
    # Inside an allowed root it runs, and gets that directory.
    inside = tmp_path / "shared" / "team" / "run1"
    out = tmp_path / "env.txt"
    await submitted(
        js,
        "kept",
        py("import os,sys; open(sys.argv[1],'w').write(os.environ['ALLOT_CHECKPOINT_DIR'])", out),
        checkpoint_dir=str(inside),
    )
    await log.place("kept", {"h01": (3,)})
    await events.wait(m.WorkloadCompleted, "kept")
    assert out.read_text() == str(inside)


# ---------------------------------------------------------------------- refusals
async def test_bad_checkpoint_input_is_refused_naming_the_field(fresh_log: str) -> None:
    nc = await nats.connect(fresh_log)
    await seed(nc.jetstream(), {"h01": 8})
    await nc.close()
    async with running_intake(fresh_log), Client(fresh_log) as c:
        base: dict[str, Any] = {
            "user": "ann", "allocation": "nlp", "gpus": 1, "min_runtime_s": 60,
            "command": ["true"],
        }  # fmt: skip
        with pytest.raises(SubmitRejectedError) as longer:
            await c.submit(client_id="t1", checkpoint_timeout_s=301, **base)  # grace: 300
        assert longer.value.field == "checkpoint_timeout_s"
        assert "grace period" in longer.value.reason
        with pytest.raises(ValidationError) as unknown:
            await c.submit(client_id="t2", checkpoint_signal="BOGUS", **base)
        assert unknown.value.field == "checkpoint_signal"
        with pytest.raises(ValidationError) as relative:
            await c.submit(client_id="t3", checkpoint_dir="/data/../etc", **base)
        assert relative.value.field == "checkpoint_dir"
        accepted = await c.submit(client_id="t4", checkpoint_signal="SIGUSR1", **base)
        assert not accepted.duplicate
    # What intake itself refuses (a client that skips the SDK's checks).
    async with running_intake(fresh_log):
        nc = await nats.connect(fresh_log)
        try:
            for field, value in (("checkpoint_signal", "KILL"), ("checkpoint_dir", "rel/x")):
                body = (
                    '{"type":"SubmitWorkload","client_id":"raw","user":"ann","gpus":1,'
                    f'"allocation":"nlp","{field}":"{value}"}}'
                ).encode()
                reply = await nc.request("allot.v1.submit.nlp.ann", body, timeout=5)
                assert b'"WorkloadRejected"' in reply.data and field.encode() in reply.data
        finally:
            await nc.close()
