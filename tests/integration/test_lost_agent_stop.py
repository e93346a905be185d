"""A stopping agent (SIGTERM) takes its hosts out of service before it reports the runs its
stop ends: the requeued attempt is not placed straight back on a host that no agent serves
(health would notice only after its heartbeat timeout), and the agent's return puts the
host back in service, where the run then goes."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import msgspec
import nats
import pytest
from live_harness import eventually, of_type, records, seed

from allot import bus
from allot.bus import service_main
from allot.eventlog.host_work import AGENT_STOPPING
from allot.proto import messages as m
from allot.services.agent.service import Agent, AgentConfig
from allot.services.dispatch import DispatchService
from allot.services.health import HealthService
from allot.services.placement.service import PlacementService

pytestmark = pytest.mark.integration

# Attempt 1 runs until stopped; a later attempt writes its attempt number and finishes.
WORKER = """
import os, pathlib, sys, time
attempt = os.environ["ALLOT_ATTEMPT"]
pathlib.Path(sys.argv[1], attempt).write_text(os.environ["ALLOT_HOST"])
if attempt == "1":
    while True:
        time.sleep(0.05)
"""


def _of(log: list[msgspec.Struct], kind: type[msgspec.Struct], wid: str) -> list[msgspec.Struct]:
    return [r for r in of_type(log, kind) if getattr(r, "workload_id", None) == wid]


async def test_a_stopping_agents_requeued_run_does_not_land_back_on_its_host(
    fresh_log: str, tmp_path: Path
) -> None:
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await seed(js, {})
    # A heartbeat timeout far above the test: only the agent's own word drains its host.
    health = HealthService(fresh_log, timeout_s=60.0, check_s=0.2)
    placement = PlacementService(fresh_log, grace_s=1, lease_ttl_s=1.0, tracing=False)
    dispatch = DispatchService(fresh_log)
    services: list[service_main.Service] = [health, placement, dispatch]
    for service in services:
        await service_main.start(service)

    def agent() -> Agent:
        config = AgentConfig(
            nats_url=fresh_log, hosts=("h01",), gpus=2, heartbeat_s=0.2, stop_grace_s=1.0
        )
        return Agent(config)

    first = agent()
    first_running = False
    second: Agent | None = None
    try:
        await service_main.start(first)
        first_running = True
        sub = m.WorkloadSubmitted(
            workload_id="train",
            client_id="train",
            user="ann",
            gpus=2,
            allocation="nlp",
            min_runtime_s=1,
            command=(sys.executable, "-c", WORKER, str(tmp_path)),
            at=time.time(),
        )
        await bus.publish(js, bus.event_subject("nlp", sub), sub)
        await eventually(
            lambda: records(js), lambda r: bool(_of(r, m.WorkloadStarted, "train")), timeout=20
        )

        first_running = False
        await service_main.stop(first)  # SIGTERM to the agent: a planned shutdown
        log = await eventually(
            lambda: records(js), lambda r: bool(_of(r, m.WorkloadPreempted, "train")), timeout=10
        )
        [stopped] = _of(log, m.WorkloadPreempted, "train")
        assert isinstance(stopped, m.WorkloadPreempted) and stopped.reason == "host-drain"
        hosts = await records(js, "HOSTS")
        drains = [r for r in of_type(hosts, m.HostDraining) if r.host == "h01"]
        assert [d.reason for d in drains] == [AGENT_STOPPING]
        # Requeued, and not placed back on h01 (healthy by its heartbeats for a minute more).
        await asyncio.sleep(1.5)
        log = await records(js)
        assert [getattr(p, "attempt", 0) for p in _of(log, m.WorkloadPlaced, "train")] == [1]

        # The agent comes back: its heartbeat ends the drain and the run goes there again.
        second = agent()
        await service_main.start(second)
        log = await eventually(
            lambda: records(js), lambda r: bool(_of(r, m.WorkloadCompleted, "train")), timeout=20
        )
        assert [getattr(p, "attempt", 0) for p in _of(log, m.WorkloadPlaced, "train")] == [1, 2]
        assert (tmp_path / "2").read_text() == "h01"
        hosts = await records(js, "HOSTS")
        assert any(isinstance(r, m.HostHealthy) and r.host == "h01" for r in hosts)
    finally:
        if first_running:
            await service_main.stop(first)
        if second is not None:
            await service_main.stop(second)
        for service in reversed(services):
            await service_main.stop(service)
        await nc.close()
