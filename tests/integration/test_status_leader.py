"""`allot status` of finished work and `allot hosts` of a drained host, through a real
placement leader on real NATS: a failed workload keeps its start, hosts, end, exit code and
reason; a host drained by an operator shows the reason, the operator and the time."""

from __future__ import annotations

import json
import time

import nats
import pytest
from live_harness import eventually, placements, seed

from allot import bus
from allot.bus import service_main
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.render import live_format as fmt
from allot.sdk import Client
from allot.services.intake import Intake
from allot.services.placement.service import PlacementService

pytestmark = pytest.mark.integration


async def test_finished_work_and_a_drain_are_in_the_leaders_answers(fresh_log: str) -> None:
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await seed(js, {"h1": 8, "h2": 8})
    intake = Intake(fresh_log, tracing=False)
    placement = PlacementService(fresh_log, lease_ttl_s=1.0, name="p1", tracing=False)
    await service_main.start(intake)
    await service_main.start(placement)
    try:
        async with Client(fresh_log) as c:
            accepted = await c.submit(client_id="job", user="ann", allocation="nlp", gpus=4)
            wid = accepted.workload_id
            (placed,) = await eventually(lambda: placements(js), lambda p: len(p) == 1)
            # What dispatch appends when the agent reports the process exited with 137.
            failed = m.WorkloadFailed(
                workload_id=wid,
                allocation="nlp",
                at=placed.at + 30,
                exit_code=137,
                reason="killed by signal 9",
                attempt=1,
                gpus=4,
                started_at=placed.at + 1,
            )
            await bus.publish(js, bus.event_subject("nlp", failed), failed)
            status = await eventually(lambda: c.status(wid), lambda st: st.state == "failed")
            assert status.started_at == pytest.approx(placed.at)
            assert status.assignment == placed.assignment
            assert status.ended_at == pytest.approx(placed.at + 30)
            assert (status.exit_code, status.reason) == (137, "killed by signal 9")
            text = fmt.status_text(status)
            assert "exit code:       137" in text and "reason:          killed by signal 9" in text
            data = json.loads(fmt.envelope_json(status, time.time()))["data"]
            assert data["exit_code"] == 137 and data["assignment"][0]["gpus"] == [0, 1, 2, 3]

            # `allot drain h2 --operator ops --reason "bad fan"`, as health appends it.
            at = time.time()
            await bus.publish(
                js,
                s.host_state("h2"),
                m.HostDraining(host="h2", at=at, reason="bad fan", by="ops"),
            )
            # h2 is empty: the leader appends HostDrained; the drain's record stays.
            hosts = await eventually(c.hosts, lambda h: any(r.state == "drained" for r in h.hosts))
            h2 = next(r for r in hosts.hosts if r.host == "h2")
            assert (h2.drain_reason, h2.drain_by, h2.drain_at) == ("bad fan", "ops", at)
            assert (
                "last_heartbeat" not in json.loads(fmt.envelope_json(hosts, at))["data"]["hosts"][0]
            )
            drains = fmt.hosts_table(hosts).split("\n\n")[1].splitlines()
            assert drains[2].split()[:2] == ["h2", "drained"] and drains[2].endswith("bad fan")
            assert drains[2].split()[3] == "ops"
    finally:
        await service_main.stop(placement)
        await service_main.stop(intake)
        await nc.close()
