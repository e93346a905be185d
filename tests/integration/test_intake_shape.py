"""Intake refuses a request whose placement shape no set of the registered hosts can hold
(it would wait for ever as ``too-large``), as Slurm refuses a job no node configuration
can satisfy; a shape that fits is accepted, even when it needs every host."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import nats
import pytest
from live_harness import seed

from allot.bus import service_main
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.services.intake import Intake

pytestmark = pytest.mark.integration

HOSTS = {"h1": 8, "h2": 8, "h3": 4, "h4": 2}
"""22 GPUs: 16 and 20 fit the shape (two whole 8s; two 8s plus 4 on h3), 22 does not."""


@pytest.mark.parametrize(
    ("gpus", "refused"),
    [(8, False), (16, False), (20, False), (18, False), (22, True), (17, False), (23, True)],
)
async def test_a_shape_no_hosts_can_hold_is_refused_at_submit(
    fresh_log: str, gpus: int, refused: bool
) -> None:
    nc = await nats.connect(fresh_log)
    await seed(nc.jetstream(), HOSTS)
    intake = Intake(fresh_log, tracing=False)
    await service_main.start(intake)
    try:
        body: dict[str, Any] = {
            "type": "SubmitWorkload",
            "client_id": f"shape-{gpus}",
            "user": "ann",
            "gpus": gpus,
            "allocation": "nlp",
            "min_runtime_s": 600,
        }
        reply = await nc.request(s.submit("nlp"), json.dumps(body).encode(), timeout=5)
        answer = msgspec.json.decode(reply.data, type=m.WorkloadAccepted | m.WorkloadRejected)
    finally:
        await service_main.stop(intake)
        await nc.close()
    assert isinstance(answer, m.WorkloadRejected) is refused, answer
    if refused:
        assert answer.field == "gpus"
        assert gpus > 22 or "fits no set of the registered hosts" in answer.reason


async def test_a_host_that_joins_makes_a_refused_shape_fit(fresh_log: str) -> None:
    """Intake remembers each size's answer until the hosts change."""
    nc = await nats.connect(fresh_log)
    await seed(nc.jetstream(), HOSTS)
    intake = Intake(fresh_log, tracing=False)
    await service_main.start(intake)

    async def submit(client_id: str) -> Any:
        body = {"type": "SubmitWorkload", "client_id": client_id, "user": "ann", "gpus": 22}
        reply = await nc.request(s.submit(None), json.dumps(body).encode(), timeout=5)
        return msgspec.json.decode(reply.data, type=m.WorkloadAccepted | m.WorkloadRejected)

    try:
        assert isinstance(await submit("before"), m.WorkloadRejected)
        await seed(nc.jetstream(), {"h5": 8})  # 3 x 8 now hold 22 (two whole 8s plus 6)
        deadline = asyncio.get_running_loop().time() + 5
        while isinstance(answer := await submit("after"), m.WorkloadRejected):
            assert asyncio.get_running_loop().time() < deadline, answer
            await asyncio.sleep(0.05)
    finally:
        await service_main.stop(intake)
        await nc.close()
