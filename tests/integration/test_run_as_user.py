"""``--run-as-user`` on real NATS with the real dispatch service and agent: a part runs as
its submission's user's OS account (``nobody`` here: every Linux has it) and reads none of
the agent's files; its output file and checkpoint directory are that account's; a link the
workload planted where the agent writes the notice is not followed as root; a user with no
account, or root, is refused before the part starts, the reason naming ``user``. The test
plays the placement leader (``test_agent.Log``). Needs root, as the option does."""

from __future__ import annotations

import asyncio
import os
import pwd
from pathlib import Path
from typing import Any

import pytest
import test_agent
from nats.js import JetStreamContext
from test_agent import AgentFactory, Events, wait_file
from test_checkpoint import submitted

from allot.proto import messages as m
from allot.proto.checkpoint_rules import NOTICE_FILE
from allot.services.agent import checkpoint
from allot.services.agent.service import Agent

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="--run-as-user needs the agent to be root"),
]
# The agent tests' fixtures: a fresh log's JetStream, its events, dispatch and agents.
js = test_agent.js
events = test_agent.events
dispatch = test_agent.dispatch
run_agent = test_agent.run_agent
NOBODY = pwd.getpwnam("nobody")


def _file(path: Path, text: str, mode: int) -> Path:
    """``path`` holding ``text``, with exactly ``mode`` (the part, as ``nobody``, may need
    to write it; the umask applies to ``write_text``)."""
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture
async def agent(run_agent: AgentFactory, open_dir: Path) -> Agent:
    agent: Agent = await run_agent(
        "h01",
        output_dir=open_dir / "out",
        checkpoint_root=open_dir / "root",
        run_as_user=True,
    )
    return agent


def _sh(script: str, *args: str | Path) -> tuple[str, ...]:
    return ("/bin/sh", "-c", script, "sh", *(str(a) for a in args))


async def test_a_part_runs_as_its_users_account_and_reads_none_of_the_agents_files(
    js: JetStreamContext, events: Events, agent: Agent, open_dir: Path
) -> None:
    secret = _file(open_dir / "agent.env", "ALLOT_NATS_PASSWORD=s3cret-of-the-agent", 0o600)
    script = 'id -u; id -G; echo "home=$HOME user=$USER"; cat "$1" 2>/dev/null || echo refused'
    log = await submitted(js, "as-nobody", user="nobody", command=_sh(script, secret))
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
    precious = _file(open_dir / "precious", "root's file", 0o644)
    ready = _file(open_dir / "ready", "", 0o666)
    # Plants a link where the notice goes, then on USR1 confirms its checkpoint and exits.
    script = (
        'd="$ALLOT_CHECKPOINT_DIR"; ln -s "$1" "$d/.allot-checkpoint-requested"; '
        "trap 'touch \"$d/.allot-checkpointed\"; exit 0' USR1; "
        'stat -c "%u %a" "$d" > "$2"; while :; do sleep 0.05; done'
    )
    log = await submitted(
        js,
        "planted",
        user="nobody",
        command=_sh(script, precious, ready),
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
    log = await submitted(
        js, "ghost", user="no-such-account-here", command=_sh('touch "$1"', touched)
    )
    await log.place("ghost", {"h01": (2,)})
    failed = await events.wait(m.WorkloadFailed, "ghost")
    assert failed.reason.startswith("user: 'no-such-account-here' has no account"), failed.reason
    await submitted(js, "as-root", user="root", command=_sh('touch "$1"', touched))
    await log.place("as-root", {"h01": (3,)})
    failed = await events.wait(m.WorkloadFailed, "as-root")
    assert failed.reason.startswith("user: 'root' is uid 0, below"), failed.reason
    assert not touched.exists()


async def test_a_part_whose_notice_writer_never_returns_is_still_killed_at_its_deadline(
    js: JetStreamContext,
    events: Events,
    agent: Agent,
    open_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A workload of the account may hold the helper that writes its notice (stop it,
    trace it so it cannot be reaped): played here by a writer that never returns. The
    SIGKILL of the deadline is armed before it runs."""

    async def held(*args: Any, **kw: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(checkpoint, "write_notice", held)
    ready = _file(open_dir / "ready", "", 0o666)
    script = "trap '' USR1 TERM; echo up > \"$1\"; while :; do sleep 0.05; done"
    log = await submitted(
        js,
        "held",
        user="nobody",
        command=_sh(script, ready),
        checkpoint_signal="USR1",
        checkpoint_timeout_s=1.0,
    )
    await log.place("held", {"h01": (2,)})
    await events.wait(m.WorkloadStarted, "held")
    await wait_file(ready)
    notice = await log.notice("held", grace_s=2.0)
    preempted = await events.wait(m.WorkloadPreempted, "held", timeout=15)
    assert preempted.checkpoint == "missed"
    assert preempted.at < notice.grace_deadline + 2.0  # killed at its deadline
