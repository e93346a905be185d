"""Unallocated churn on the live stack: a steady stream of small allocated work (20
submissions a second, 1-2 s each, on 64 fake GPUs) beside unallocated work that fills
whatever is idle. Before ``unallocated_settle_s`` every idle GPU was filled with
unallocated work at once and taken back by the next arrival: 400 unallocated submissions
made 689 attempts, most preempted within a second of starting. Now no unallocated
workload is preempted more than once a minute on average, and most unallocated
GPU-seconds are in attempts longer than the 60 s start-up allowance, as the dashboard's
figures computed from the log say (``allot.sim.report.unallocated_goodput`` over
``LogTimeline.sim_record``)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import nats
import pytest
from live_harness import records

from allot.eventlog.timeline import LogTimeline
from allot.ops.stack import AgentSpec, Stack, StackConfig
from allot.proto import messages as m
from allot.sdk import Client
from allot.sim.report import unallocated_goodput

pytestmark = pytest.mark.integration

RATE = 20.0  # allocated submissions a second
STREAM_S = 75.0  # long enough for unallocated attempts to pass the 60 s allowance


async def test_a_steady_allocated_stream_does_not_churn_unallocated_work(
    fresh_log: str, redis_url: str, tmp_path: Path
) -> None:
    config = StackConfig(
        run_dir=tmp_path,
        nats_url=fresh_log,
        redis_url=redis_url,
        redis_prefix=f"churn{uuid.uuid4().hex[:8]}",
        agents=(AgentSpec("fake-a", hosts=8, gpus=8),),
        placements=1,
        grace_s=3,
        unallocated_grace_s=1,
        lease_ttl_s=1.0,
        rank_every_s=2.0,
        accrue_s=2.0,
        slot_s=2.0,
    )
    with Stack(config):
        async with Client(fresh_log, timeout=10) as c:
            for i in range(40):  # unallocated work for every GPU the stream leaves idle
                await c.submit(client_id=f"free-{i}", user="batch", gpus=2, duration_s=600)
            start = time.monotonic()
            sent = 0
            while (elapsed := time.monotonic() - start) < STREAM_S:
                due = int(elapsed * RATE) + 1
                batch = []
                while sent < due:
                    batch.append(
                        c.submit(
                            client_id=f"a-{sent}",
                            user="ann",
                            allocation="nlp",
                            gpus=1 + sent % 2,
                            min_runtime_s=60,
                            duration_s=1.0 + (sent % 3) * 0.5,
                        )
                    )
                    sent += 1
                await asyncio.gather(*batch)
                await asyncio.sleep(0.05)

        nc = await nats.connect(fresh_log)
        try:
            js = nc.jetstream()
            log = [
                *[r for r in await records(js, "USAGE") if isinstance(r, m.BudgetTreeSet)],
                *await records(js, "HOSTS"),
                *await records(js, "WORKLOADS"),
            ]
        finally:
            await nc.close()
    timeline = LogTimeline()
    for record in log:
        timeline.apply(record)
    now = max(getattr(r, "at", 0.0) for r in log)
    figures = unallocated_goodput(timeline.sim_record(now, 3600.0))

    assert sent >= RATE * STREAM_S * 0.9  # the stream ran
    assert figures["workloads"] >= 20, figures  # unallocated work ran beside it
    assert figures["preemptions_per_minute_mean"] <= 1.0, figures
    assert figures["goodput_fraction"] > 0.5, figures
