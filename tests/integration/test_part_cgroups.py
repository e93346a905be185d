"""``--cgroup-root`` and ``--pass-env`` on real NATS with the real dispatch service and agent
(run as root with ``--run-as-user``, as a multi-user host would): a preempted workload's
process that left its session, its markers and its environment (``setsid``, ``env -i``)
ends with it before the preemption is in the log, and the workload saw a login's
environment, not the agent's. The test plays the placement leader (``test_agent.Log``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import test_agent
from nats.js import JetStreamContext
from test_agent import AgentFactory, Events, wait_file
from test_checkpoint import submitted

from allot.proto import messages as m
from allot.services.agent.service import Agent
from process_probe import running

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="--run-as-user needs the agent to be root"),
]
js = test_agent.js
events = test_agent.events
dispatch = test_agent.dispatch
run_agent = test_agent.run_agent


@pytest.fixture
async def agent(
    run_agent: AgentFactory, open_dir: Path, cgroup_root: Path, monkeypatch: pytest.MonkeyPatch
) -> Agent:
    monkeypatch.setenv("DEPLOY_TOKEN", "the operator's, not the workload's")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/cuda/lib64")
    agent: Agent = await run_agent(
        "h01",
        output_dir=open_dir / "out",
        run_as_user=True,
        pass_env=("LD_LIBRARY_PATH",),
        cgroup_root=cgroup_root,
    )
    return agent


async def test_a_preempted_parts_escaped_process_ends_before_its_preemption_is_logged(
    js: JetStreamContext, events: Events, agent: Agent, open_dir: Path, cgroup_root: Path
) -> None:
    pidfile = open_dir / "escaped"
    pidfile.touch(mode=0o666)
    pidfile.chmod(0o666)
    script = (
        "env | sort; "
        """setsid sh -c 'echo $$ > "$1"; exec env -i sleep 300' sh "$1" & """
        "exec sleep 300"
    )
    log = await submitted(
        js, "daemon", user="nobody", command=("/bin/sh", "-c", script, "sh", str(pidfile))
    )
    await log.place("daemon", {"h01": (0,)})
    await events.wait(m.WorkloadStarted, "daemon")
    pid = int(await wait_file(pidfile))
    assert os.getsid(pid) == pid  # out of the part's session
    assert (cgroup_root / "daemon.1.h01").is_dir()
    try:
        await log.notice("daemon", grace_s=1.0)
        await events.wait(m.WorkloadPreempted, "daemon", timeout=10)
        # Gone, and its cgroup with it, before the part's end was reported.
        assert not running(pid)
        assert not (cgroup_root / "daemon.1.h01").exists()
    finally:
        if running(pid):
            os.kill(pid, 9)
    env = dict(
        line.split("=", 1)
        for line in (open_dir / "out" / "daemon.1.h01.out").read_text().splitlines()
        if "=" in line
    )
    assert env["USER"] == env["LOGNAME"] == "nobody"
    assert env["LD_LIBRARY_PATH"] == "/opt/cuda/lib64"  # --pass-env
    assert "DEPLOY_TOKEN" not in env  # the rest of the agent's environment
    assert env["ALLOT_WORKLOAD_ID"] == "daemon"
