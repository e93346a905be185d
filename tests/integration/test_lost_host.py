"""A dead agent's runs are requeued (Slurm: a node not responding is set DOWN and its jobs
requeued): a real agent process is SIGKILLed and not restarted; health drains its host for
missed heartbeats, and once the host has been silent for ``--lost-after-s`` dispatch records
the run lost in the agent's place, noticed or not (a minimum runtime far longer than that
protects nothing on a dead host), so it is requeued and placed on a free host. A slow
agent's late report adds no second end."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import TypeVar

import msgspec
import nats
import pytest
from live_harness import eventually, of_type, records, seed

from allot import bus
from allot.bus import service_main
from allot.proto import codec, subjects
from allot.proto import messages as m
from allot.services.agent.service import Agent, AgentConfig
from allot.services.dispatch import DispatchService
from allot.services.health import HealthService
from allot.services.placement.service import PlacementService

pytestmark = pytest.mark.integration
T = TypeVar("T")

# Attempt 1 runs until killed; a later attempt writes its host and finishes.
WORKER = """
import os, pathlib, sys, time
attempt = int(os.environ["ALLOT_ATTEMPT"])
pathlib.Path(sys.argv[1], f"{attempt}.host").write_text(os.environ["ALLOT_HOST"])
if attempt == 1:
    while True:
        time.sleep(0.05)
"""
ENDS = (m.WorkloadPreempted, m.WorkloadFailed, m.WorkloadCompleted, m.WorkloadCancelled)


def _submitted(
    wid: str, command: tuple[str, ...], gpus: int = 2, min_runtime_s: int = 1
) -> m.WorkloadSubmitted:
    return m.WorkloadSubmitted(
        workload_id=wid,
        client_id=wid,
        user="ann",
        gpus=gpus,
        allocation="nlp",
        min_runtime_s=min_runtime_s,
        command=command,
        at=time.time(),
    )


def _of(log: list[msgspec.Struct], kind: type[T], wid: str) -> list[T]:
    return [r for r in of_type(log, kind) if getattr(r, "workload_id", None) == wid]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize(
    "min_runtime_s",
    [1, 2 * 3600],
    ids=["protection-over-noticed-on-drain", "protected-for-hours-never-noticed"],
)
async def test_a_killed_agents_run_is_requeued_and_placed_on_another_host(
    fresh_log: str, tmp_path: Path, min_runtime_s: int
) -> None:
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await seed(js, {})  # streams and the budget tree; health registers the hosts
    health = HealthService(fresh_log, timeout_s=1.0, check_s=0.2)
    placement = PlacementService(fresh_log, grace_s=1, lease_ttl_s=1.0, tracing=False)
    dispatch = DispatchService(fresh_log, lost_after_s=1.5, lost_check_s=0.2)
    services: list[service_main.Service] = [health, placement, dispatch]
    for service in services:
        await service_main.start(service)
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "allot.services.agent", "--host", "real2", "--gpus", "2"),
        *("--nats-url", fresh_log, "--heartbeat-s", "0.2"),
        env={**os.environ, "ALLOT_OTEL_EXPORTER": "none"},
        stdout=(tmp_path / "agent.log").open("wb"),
        stderr=asyncio.subprocess.STDOUT,
    )
    other: Agent | None = None
    started: m.WorkloadStarted | None = None
    try:
        wid = "train"
        sub = _submitted(
            wid, (sys.executable, "-c", WORKER, str(tmp_path)), min_runtime_s=min_runtime_s
        )
        await bus.publish(js, bus.event_subject("nlp", sub), sub)
        log = await eventually(
            lambda: records(js), lambda r: bool(_of(r, m.WorkloadStarted, wid)), timeout=20
        )
        started = _of(log, m.WorkloadStarted, wid)[0]
        assert started.host == "real2"
        # A free host for the requeued run, then the agent of real2 dies for good.
        other = Agent(AgentConfig(nats_url=fresh_log, hosts=("real1",), gpus=2, heartbeat_s=0.2))
        await service_main.start(other)
        agent.kill()
        await agent.wait()

        log = await eventually(
            lambda: records(js), lambda r: bool(_of(r, m.WorkloadCompleted, wid)), timeout=30
        )
        notices = _of(log, m.PreemptionNotice, wid)
        [lost] = _of(log, m.WorkloadPreempted, wid)
        assert (lost.reason, lost.attempt) == ("host-drain", 1)
        if min_runtime_s > 1:
            assert notices == []  # protected: placement never noticed it; lost all the same
        else:
            assert all(n.reason == "host-drain" for n in notices)
        host_log = await records(js, "HOSTS")
        drain = next(r for r in host_log if isinstance(r, m.HostDraining) and r.host == "real2")
        assert lost.at == drain.at  # charged to the drain, not the wait for a report
        placed = _of(log, m.WorkloadPlaced, wid)
        assert [p.attempt for p in placed] == [1, 2]
        assert placed[1].at - drain.at < 15  # about the margin, not the minimum runtime
        assert [hg.host for hg in placed[1].assignment] == ["real1"]
        assert (tmp_path / "2.host").read_text() == "real1"
        assert not _of(log, m.WorkloadFailed, wid)
        assert len([r for r in log if isinstance(r, ENDS) and r.workload_id == wid]) == 2
        # The host stays out of service: drained, nothing new lands there.
        host_log = await records(js, "HOSTS")
        assert not any(isinstance(r, m.HostHealthy) and r.host == "real2" for r in host_log)
        assert dispatch.lost_recorded == 1
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
        if started is not None and started.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(started.pid, signal.SIGKILL)  # a kill -9 of its agent left it
        if other is not None:
            await service_main.stop(other)
        for service in reversed(services):
            await service_main.stop(service)
        await nc.close()


async def test_a_slow_agents_late_report_adds_no_second_end(fresh_log: str) -> None:
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await seed(js, {"h01": 4})
    dispatch = DispatchService(fresh_log, lost_after_s=0.5, lost_check_s=0.1)
    await service_main.start(dispatch)
    try:
        now = time.time()
        records_in = [
            m.LeaderElected(epoch=1, leader="test", at=now),
            _submitted("w", ("true",), gpus=1),
            m.WorkloadPlaced(
                workload_id="w",
                allocation="nlp",
                at=now,
                gpus=1,
                assignment=(m.HostGpus(host="h01", gpus=(0,)),),
                epoch=1,
            ),
            m.WorkloadStarted(workload_id="w", allocation="nlp", at=now, host="h01", gpus=1),
            m.PreemptionNotice(
                workload_id="w",
                allocation="nlp",
                at=now,
                reason="host-drain",
                grace_deadline=now,
                requeue=True,
                gpus=1,
                epoch=1,
            ),
        ]
        drain = m.HostDraining(host="h01", at=now, reason="missed heartbeats for 10.1 s")
        await bus.publish(js, subjects.host_state("h01"), drain)
        for rec in records_in:
            if isinstance(rec, m.LeaderElected):
                subject = subjects.LEADER
            elif isinstance(rec, m.PreemptionNotice):
                subject = subjects.preempt("nlp", "w")
            else:
                subject = bus.event_subject("nlp", rec)
            await bus.publish(js, subject, rec)
        log = await eventually(
            lambda: records(js), lambda r: bool(_of(r, m.WorkloadPreempted, "w")), timeout=10
        )
        # The agent was alive after all and reports the end now.
        late = m.PartReport(
            host="h01",
            workload_id="w",
            attempt=1,
            event="exited",
            exit_code=-9,
            at=time.time(),
            detail="killed by SIGKILL",
        )
        reply = await nc.request(subjects.host_report("h01"), codec.encode(late), timeout=5)
        answer = msgspec.json.decode(reply.data, type=m.CommandAccepted)
        assert answer.detail == "already in the log"
        await asyncio.sleep(0.5)  # the checker runs again: nothing more to record
        log = await records(js)
        assert len([r for r in log if isinstance(r, ENDS) and r.workload_id == "w"]) == 1
        assert dispatch.lost_recorded == 1
    finally:
        await service_main.stop(dispatch)
        await nc.close()
