"""A workload cannot get at its agent's NATS login, although it runs as the agent's user:
not from its own environment, not from the agent's (``/proc/<agent pid>/environ``), not
from the agent's memory (``/proc/<agent pid>/mem``, the ptrace check).

A real agent process (``python -m allot.services.agent``, as an operator starts it) gets
its password in its environment, the way ``allot auth gen``'s ``users/<agent>.env`` gives
it, and logs in with it to a nats-server that requires it; the test plays the placement
leader and the real dispatch service sends the agent a workload that tries each read and
prints what it got. The agent runs unprivileged: as this user when it is not root, else
as root without any capability (what ``CAP_SYS_PTRACE`` or ``CAP_SYS_ADMIN`` allows is
not in question here: docs/security.md).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js import JetStreamContext

from allot import bus
from allot.adapters.embedded import EmbeddedNats
from allot.bus import service_main
from allot.proto import messages as m
from allot.proto import subjects
from allot.services.dispatch import DispatchService

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux (/proc, prctl)"),
]

HOST = f"sec-{secrets.token_hex(3)}"
"""A host name of this run only: agents lock their host names machine-wide."""
AGENT_USER = "agent-sec"
SECRET = secrets.token_hex(16)
SERVICE_PASSWORD = secrets.token_hex(16)
CAP_SYS_PTRACE, CAP_SYS_ADMIN = 19, 21
PR_CAPBSET_DROP = 24

PROBE = r"""
import json, os, subprocess, sys

def read(path):
    try:
        with open(path, "rb") as f:
            return {"read": True, "data": f.read().decode("utf-8", "replace")}
    except OSError as e:
        return {"read": False, "error": type(e).__name__}

def opens(path):
    try:
        open(path, "rb").close()
        return {"read": True}
    except OSError as e:
        return {"read": False, "error": type(e).__name__}

agent = os.getppid()  # the agent starts a workload itself: no shell in between
# The control: a dumpable process of the same user (a child, up once it printed) is read.
child = subprocess.Popen(
    [sys.executable, "-c", "print(1, flush=True); import time; time.sleep(60)"],
    env={"PROBE_MARK": "dumpable"},
    stdout=subprocess.PIPE,
)
child.stdout.readline()
control = read(f"/proc/{child.pid}/environ")
child.kill()
child.wait()
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({
    "agent_pid": agent,
    "environ": read(f"/proc/{agent}/environ"),
    "mem": opens(f"/proc/{agent}/mem"),
    "control": control,
    "own_env": dict(os.environ),
    "cap_eff": int(status["CapEff"].strip(), 16),
}), flush=True)
"""


def _capabilities_dropped() -> Callable[[], None] | None:
    """For root: a ``preexec_fn`` that empties the bounding set, so the agent (root's
    ``execve`` takes its capabilities from that set) and its workloads run without any,
    as an unprivileged user's would. None for another user (already without)."""
    if os.geteuid() != 0:
        return None
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, *[ctypes.c_ulong] * 4]
    prctl.restype = ctypes.c_int

    def drop() -> None:
        for cap in range(last + 1):
            if prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {cap}")

    return drop


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    conf = tmp_path / "nats.conf"
    conf.write_text(
        "authorization {\n  users = [\n"
        f'    {{user: "services", password: "{SERVICE_PASSWORD}"}}\n'
        f'    {{user: "{AGENT_USER}", password: "{SECRET}"}}\n'
        "  ]\n}\n"
    )
    with EmbeddedNats(config_file=conf) as nats_server:  # free ports, never 4222
        yield nats_server


@pytest.fixture
def service_url(server: EmbeddedNats) -> str:
    return f"nats://services:{SERVICE_PASSWORD}@127.0.0.1:{server.port}"


@pytest.fixture
async def js(service_url: str) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(service_url)
    jsc = nc.jetstream()
    await bus.ensure_streams(jsc)
    yield jsc
    await nc.close()


@pytest.fixture
async def dispatch(service_url: str, js: JetStreamContext) -> AsyncIterator[DispatchService]:
    service = DispatchService(service_url)
    await service_main.start(service)
    yield service
    await service_main.stop(service)


async def _agent(server: EmbeddedNats, tmp_path: Path) -> asyncio.subprocess.Process:
    """The agent for ``HOST``, its login in its environment (and once more under a name
    that is not Allot's, as a deployment's settings for the ``nats`` CLI would put it)."""
    url = f"nats://{AGENT_USER}:{SECRET}@127.0.0.1:{server.port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALLOT_", "NATS_"))}
    env.update(
        ALLOT_NATS_URL=url,
        ALLOT_NATS_USER=AGENT_USER,
        ALLOT_NATS_PASSWORD=SECRET,
        NATS_URL=url,
        ALLOT_OTEL_EXPORTER="none",
        TMPDIR=str(tmp_path),  # its host lock
    )
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "allot.services.agent", "--host", HOST, "--gpus", "1"),
        *("--heartbeat-s", "0.2", "--output-dir", str(tmp_path / "out")),
        env=env,
        stdout=(tmp_path / "agent.log").open("wb"),
        stderr=asyncio.subprocess.STDOUT,
        preexec_fn=_capabilities_dropped(),
    )


async def _wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(0.05)
    return found


async def _run_probe(js: JetStreamContext, wid: str) -> None:
    """Publish what intake, health and placement would: the host, a leader, the probe
    submitted and placed on the host's GPU 0."""
    now = time.time()
    await bus.publish(js, subjects.host_state(HOST), m.HostRegistered(host=HOST, gpus=1, at=now))
    await bus.publish(js, subjects.LEADER, m.LeaderElected(epoch=1, leader="test", at=now))
    submitted = m.WorkloadSubmitted(
        workload_id=wid,
        client_id=wid,
        user="alice",
        gpus=1,
        allocation="nlp",
        min_runtime_s=60,
        command=(sys.executable, "-c", PROBE),
        at=now,
    )
    await bus.publish(js, bus.event_subject("nlp", submitted), submitted)
    placed = m.WorkloadPlaced(
        workload_id=wid,
        allocation="nlp",
        at=time.time(),
        gpus=1,
        assignment=(m.HostGpus(host=HOST, gpus=(0,)),),
        min_runtime_s=60,
        attempt=1,
        epoch=1,
    )
    await bus.publish(js, bus.event_subject("nlp", placed), placed)


def _json_line(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    if not text.endswith("\n"):
        return None
    report: dict[str, Any] = json.loads(text.splitlines()[-1])
    return report


async def test_a_workload_reads_neither_its_agents_login_nor_its_environment_nor_memory(
    server: EmbeddedNats, js: JetStreamContext, dispatch: DispatchService, tmp_path: Path
) -> None:
    agent = await _agent(server, tmp_path)
    agent_log = tmp_path / "agent.log"
    try:
        await _wait_for("the agent started", lambda: b"agent started" in agent_log.read_bytes())
        await _run_probe(js, "probe")
        out = tmp_path / "out" / f"probe.1.{HOST}.out"
        report = await _wait_for("the probe's report", lambda: _json_line(out))
    finally:
        if agent.returncode is None:
            agent.terminate()
        try:
            await asyncio.wait_for(agent.wait(), 15.0)
        except TimeoutError:
            agent.kill()
            await agent.wait()

    # The premises: the probe is the agent's child, unprivileged, and reads a dumpable
    # process of its own user (so a refusal below is the agent's doing, nothing else's).
    assert report["agent_pid"] == agent.pid
    if report["cap_eff"] & (1 << CAP_SYS_PTRACE | 1 << CAP_SYS_ADMIN):
        pytest.skip("the workload holds CAP_SYS_PTRACE or CAP_SYS_ADMIN: it may read anything")
    assert report["control"]["read"], report["control"]
    assert "PROBE_MARK=dumpable" in report["control"]["data"]

    # The agent's environment and memory are out of its reach.
    read = report["environ"]
    assert not read["read"], "the workload read its agent's environment" + (
        ", its NATS password included" if SECRET in read["data"] else ""
    )
    assert read["error"] == "PermissionError"
    assert report["mem"] == {"read": False, "error": "PermissionError"}
    assert b"non-dumpable" in agent_log.read_bytes()  # and it says so

    # Its own environment holds nothing of the agent's login, and what it needs.
    own: dict[str, str] = report["own_env"]
    assert not [k for k, v in own.items() if SECRET in v], "the agent's password leaked"
    assert not {"ALLOT_NATS_USER", "ALLOT_NATS_PASSWORD", "NATS_URL"} & own.keys()
    assert own["ALLOT_NATS_URL"] == f"nats://127.0.0.1:{server.port}"
    assert (own["ALLOT_WORKLOAD_ID"], own["ALLOT_HOST"]) == ("probe", HOST)
    assert own["CUDA_VISIBLE_DEVICES"] == "0"
    assert SECRET not in agent_log.read_text()  # nor does the agent's log
