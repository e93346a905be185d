"""``--run-as-user`` on real NATS with the real dispatch service and agent: a part runs as
its submission's user's OS account (``nobody`` here: every Linux has it) and reads none of
the agent's files; its output file and checkpoint directory are that account's; a link the
workload planted where the agent writes the notice is not followed as root; a user with no
account, or root, is refused before the part starts, the reason naming ``user``. The test
plays the placement leader (``test_agent.Log``). Needs root, as the option does."""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import test_agent
from nats.js import JetStreamContext
from test_agent import Events, Log, wait_file

from allot import bus
from allot.bus import service_main
from allot.proto import messages as m
from allot.proto.checkpoint_rules import NOTICE_FILE
from allot.services.agent.service import Agent, AgentConfig
from allot.services.dispatch import DispatchService

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="--run-as-user needs the agent to be root"),
]
js = test_agent.js  # the agent tests' fixtures: a fresh log's JetStream, its events
events = test_agent.events
NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
async def agent(fresh_log: str, open_dir: Path) -> AsyncIterator[Agent]:
    dispatch = DispatchService(fresh_log)
    await service_main.start(dispatch)
    config = AgentConfig(
        nats_url=fresh_log,
        hosts=("h01",),
        gpus=4,
        heartbeat_s=0.2,
        kill_after_s=1.0,
        stop_grace_s=1.0,
        output_dir=open_dir / "out",
        checkpoint_root=open_dir / "root",
        run_as_user=True,
    )
    a = Agent(config)
    await service_main.start(a)
    yield a
    await service_main.stop(a)
    await service_main.stop(dispatch)


async def _submitted(
    js: JetStreamContext, wid: str, user: str, command: tuple[str, ...], **kw: Any
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


def _sh(script: str, *args: str | Path) -> tuple[str, ...]:
    return ("/bin/sh", "-c", script, "sh", *(str(a) for a in args))


async def test_a_part_runs_as_its_users_account_and_reads_none_of_the_agents_files(
    js: JetStreamContext, events: Events, agent: Agent, open_dir: Path
) -> None:
    secret = open_dir / "agent.env"
    secret.write_text("ALLOT_NATS_PASSWORD=s3cret-of-the-agent")
    secret.chmod(0o600)
    script = 'id -u; id -G; echo "home=$HOME user=$USER"; cat "$1" 2>/dev/null || echo refused'
    log = await _submitted(js, "as-nobody", "nobody", _sh(script, secret))
    await log.place("as-nobody", {"h01": (0,)})
    await events.wait(m.WorkloadCompleted, "as-nobody")  # it exited 0
    out = open_dir / "out" / "as-nobody.1.h01.out"
    assert out.stat().st_uid == NOBODY.pw_uid  # its output is its own
    lines = out.read_text().splitlines()
    assert lines[0] == str(NOBODY.pw_uid)
    assert "0" not in lines[1].split()  # none of root's groups
    assert lines[2].endswith("user=nobody")
    assert lines[3] == "refused"
    assert "s3cret" not in out.read_text()


async def test_the_checkpoint_dir_is_the_accounts_and_a_planted_link_is_not_followed(
    js: JetStreamContext, events: Events, agent: Agent, open_dir: Path
) -> None:
    precious = open_dir / "precious"
    precious.write_text("root's file")
    precious.chmod(0o644)
    ready = open_dir / "ready"
    ready.write_text("")
    ready.chmod(0o666)
    # Plants a link where the notice goes, then on USR1 confirms its checkpoint and exits.
    script = (
        'd="$ALLOT_CHECKPOINT_DIR"; ln -s "$1" "$d/.allot-checkpoint-requested"; '
        "trap 'touch \"$d/.allot-checkpointed\"; exit 0' USR1; "
        'stat -c "%u %a" "$d" > "$2"; while :; do sleep 0.05; done'
    )
    log = await _submitted(
        js,
        "planted",
        "nobody",
        _sh(script, precious, ready),
        checkpoint_signal="USR1",
        checkpoint_timeout_s=2.0,
    )
    await log.place("planted", {"h01": (1,)})
    await events.wait(m.WorkloadStarted, "planted")
    assert await wait_file(ready) == f"{NOBODY.pw_uid} 700\n"
    await log.notice("planted", grace_s=5.0)
    preempted = await events.wait(m.WorkloadPreempted, "planted", timeout=10)
    assert preempted.checkpoint == "done"
    assert precious.read_text() == "root's file"  # the notice did not go through the link
    directory = open_dir / "root" / "nlp" / "planted"
    assert (directory / NOTICE_FILE).is_symlink()


async def test_a_user_without_an_account_or_root_is_refused_naming_user(
    js: JetStreamContext, events: Events, agent: Agent, open_dir: Path
) -> None:
    touched = open_dir / "ran"
    log = await _submitted(js, "ghost", "no-such-account-here", _sh('touch "$1"', touched))
    await log.place("ghost", {"h01": (2,)})
    failed = await events.wait(m.WorkloadFailed, "ghost")
    assert failed.reason.startswith("user: 'no-such-account-here' has no account"), failed.reason
    await _submitted(js, "as-root", "root", _sh('touch "$1"', touched))
    await log.place("as-root", {"h01": (3,)})
    failed = await events.wait(m.WorkloadFailed, "as-root")
    assert failed.reason.startswith("user: 'root' is uid 0, below"), failed.reason
    assert not touched.exists()


async def test_a_fifo_at_the_notice_path_does_not_save_a_part_from_its_deadline(
    js: JetStreamContext, events: Events, agent: Agent, open_dir: Path
) -> None:
    ready = open_dir / "ready"
    ready.write_text("")
    ready.chmod(0o666)
    # Holds the agent's notice writer on a FIFO and ignores the signals it may ignore.
    script = (
        'mkfifo "$ALLOT_CHECKPOINT_DIR/.allot-checkpoint-requested"; '
        "trap '' USR1 TERM; echo up > \"$1\"; while :; do sleep 0.05; done"
    )
    log = await _submitted(
        js, "fifo", "nobody", _sh(script, ready), checkpoint_signal="USR1", checkpoint_timeout_s=1.0
    )
    await log.place("fifo", {"h01": (2,)})
    await events.wait(m.WorkloadStarted, "fifo")
    await wait_file(ready)
    notice = await log.notice("fifo", grace_s=2.0)
    preempted = await events.wait(m.WorkloadPreempted, "fifo", timeout=15)
    assert preempted.checkpoint == "missed"
    assert preempted.at < notice.grace_deadline + 5.0  # killed at its deadline, not later
