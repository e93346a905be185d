"""Intake + placement against a real nats-server: submissions become placements through
the log; bad input is rejected by field; duplicates are one workload; a standby takes
over from the log when the leader dies, with no GPU booked twice."""

from __future__ import annotations

import asyncio
import json

import msgspec
import nats
import pytest
from live_harness import eventually, of_type, records, seed

from allot.live import service_main
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.services.intake import Intake
from allot.services.placement import PlacementService

pytestmark = pytest.mark.integration

_REPLY = msgspec.json.Decoder(m.WorkloadAccepted | m.WorkloadRejected)


def submit_body(**fields: object) -> bytes:
    body = {"type": "SubmitWorkload", "client_id": "c1", "user": "ann", "gpus": 2}
    body.update(fields)
    return json.dumps(body).encode()


async def request(
    nc: nats.NATS, subject: str, body: bytes
) -> m.WorkloadAccepted | m.WorkloadRejected:
    reply = await nc.request(subject, body, timeout=5)
    return _REPLY.decode(reply.data)


async def _placements(js) -> list[m.WorkloadPlaced]:  # type: ignore[no-untyped-def]
    return of_type(await records(js), m.WorkloadPlaced)


async def test_submission_is_placed_and_bad_input_is_rejected_by_field(fresh_log: str) -> None:
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await seed(js, {"h1": 8, "h2": 8})
    intake = Intake(fresh_log, tracing=False)
    placement = PlacementService(fresh_log, lease_ttl_s=1.0, name="p1", tracing=False)
    await service_main.start(intake)
    await service_main.start(placement)
    try:
        ok = await request(
            nc, s.submit("nlp"), submit_body(allocation="nlp", min_runtime_s=600, gpus=4)
        )
        assert isinstance(ok, m.WorkloadAccepted) and not ok.duplicate
        again = await request(
            nc, s.submit("nlp"), submit_body(allocation="nlp", min_runtime_s=600, gpus=4)
        )
        assert isinstance(again, m.WorkloadAccepted) and again.duplicate
        assert again.workload_id == ok.workload_id

        placed = await eventually(lambda: _placements(js), lambda p: len(p) == 1)
        assert placed[0].workload_id == ok.workload_id
        assert sum(len(hg.gpus) for hg in placed[0].assignment) == 4
        assert placed[0].epoch == placement.epoch > 0

        bad = {
            "gpus": (submit_body(gpus=0), "gpus"),
            "too many gpus": (submit_body(gpus=17), "gpus"),
            "min runtime": (
                submit_body(allocation="nlp", min_runtime_s=8 * 3600 + 1),
                "min_runtime_s",
            ),
            "unknown field": (submit_body(colour="red"), "colour"),
            "wrong type": (submit_body(gpus="two"), "gpus"),
            "malformed": (b'{"type": "SubmitWorkload", "gpus": ', "body"),
            "nan": (b'{"type": "SubmitWorkload", "gpus": NaN}', "gpus"),
            "unknown allocation": (submit_body(allocation="chem", client_id="c9"), "allocation"),
            "oversized": (submit_body(kind="x" * 70_000), "body"),
        }
        for name, (body, field) in bad.items():
            subject = s.submit("chem") if "allocation" in name else s.submit(None)
            reply = await request(nc, subject, body)
            assert isinstance(reply, m.WorkloadRejected), name
            assert reply.field == field, (name, reply)
            assert reply.reason, name
        # Allocation in the payload must match the subject.
        mismatch = await request(nc, s.submit(None), submit_body(allocation="nlp", client_id="c7"))
        assert isinstance(mismatch, m.WorkloadRejected) and mismatch.field == "allocation"
        # The services kept running: a good submission still goes through.
        ok2 = await request(nc, s.submit(None), submit_body(client_id="c2", gpus=1))
        assert isinstance(ok2, m.WorkloadAccepted)
        await eventually(lambda: _placements(js), lambda p: len(p) == 2)
        submitted = of_type(await records(js), m.WorkloadSubmitted)
        assert [r.workload_id for r in submitted] == [ok.workload_id, ok2.workload_id]
        # A run that cannot fit waits; `allot prio` breaks its position into its inputs.
        big = await request(
            nc,
            s.submit("vision"),
            submit_body(client_id="big", allocation="vision", gpus=16, min_runtime_s=600),
        )
        assert isinstance(big, m.WorkloadAccepted)

        async def prio() -> m.PrioSnapshot:
            reply = await nc.request(s.QUERY_PRIO, b"{}", timeout=5)
            return msgspec.json.decode(reply.data, type=m.PrioSnapshot)

        snap = await eventually(prio, lambda p: p.total == 1)
        row = snap.rows[0]
        assert (row.workload_id, row.allocation, row.position, row.gpus) == (
            big.workload_id,
            "vision",
            1,
            16,
        )
        assert row.tier_name == "under-entitlement" and row.entitlement == 8.0
    finally:
        await service_main.stop(placement)
        await service_main.stop(intake)
        await nc.close()


async def test_standby_takes_over_from_the_log_without_double_booking(fresh_log: str) -> None:
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await seed(js, {"h1": 8})
    intake = Intake(fresh_log, tracing=False)
    first = PlacementService(fresh_log, lease_ttl_s=1.0, name="p1", tracing=False)
    second = PlacementService(fresh_log, lease_ttl_s=1.0, name="p2", tracing=False)
    await service_main.start(intake)
    await service_main.start(first)
    await eventually(lambda: asyncio.sleep(0, first.leader), bool)
    await service_main.start(second)
    try:
        for i in range(3):  # 3 x 4 GPUs on 8: two run, one waits
            reply = await request(
                nc,
                s.submit("nlp"),
                submit_body(client_id=f"a{i}", allocation="nlp", gpus=4, min_runtime_s=600),
            )
            assert isinstance(reply, m.WorkloadAccepted)
        await eventually(lambda: _placements(js), lambda p: len(p) == 2)
        assert not second.leader

        # "Kill" the leader: its tasks stop, its lease is not released (it just expires).
        for task in first._tasks:
            task.cancel()
        first.leader = False
        await eventually(lambda: asyncio.sleep(0, second.leader), bool, timeout=10)
        assert second.epoch > 0 and second.fold.epoch == second.epoch
        # The new leader rebuilt the same state from the log: two running, one pending.
        assert len(second.fold.state.running) == 2 and len(second.fold.queue) == 1
        # A stale decision from the old epoch is ignored by every fold.
        stale = first.fold.epoch
        pending = next(iter(second.fold.queue))
        await js.publish(
            s.events("nlp", pending.id),
            msgspec.json.encode(
                m.WorkloadPlaced(
                    workload_id=pending.id,
                    allocation="nlp",
                    at=1.0,
                    gpus=4,
                    assignment=(m.HostGpus(host="h1", gpus=(0, 1, 2, 3)),),
                    attempt=1,
                    epoch=stale,
                )
            ),
        )
        await asyncio.sleep(0.3)
        assert len(second.fold.state.running) == 2
        assert second.fold.ignored >= 1
    finally:
        await service_main.stop(second)
        await service_main.stop(first)
        await service_main.stop(intake)
        await nc.close()
