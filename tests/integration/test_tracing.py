"""One trace spans submit -> intake -> placement decision: the client's span context rides
in the request headers, intake's FastStream middleware continues it, the log record
carries it, and placement's decision span is its child."""

from __future__ import annotations

import json

import nats
import pytest
from live_harness import eventually, seed
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from allot.bus import service_main
from allot.proto import subjects as s
from allot.services.intake import Intake
from allot.services.placement.service import PlacementService

pytestmark = pytest.mark.integration


async def test_one_trace_from_submit_to_placement(fresh_log: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # placement's decision span uses the global one
    tracer = provider.get_tracer("test-client")

    nc = await nats.connect(fresh_log)
    await seed(nc.jetstream(), {"h1": 8})
    intake = Intake(fresh_log, provider=provider)
    placement = PlacementService(fresh_log, lease_ttl_s=1.0, name="p1", tracing=False)
    await service_main.start(intake)
    await service_main.start(placement)
    try:
        await eventually(lambda: _leader(placement), bool)
        with tracer.start_as_current_span("client.submit") as span:
            trace_id = span.get_span_context().trace_id
            headers: dict[str, str] = {}
            propagate.inject(headers)
            body = {"type": "SubmitWorkload", "client_id": "t1", "user": "ann", "gpus": 1}
            reply = await nc.request(
                s.submit(None), json.dumps(body).encode(), timeout=5, headers=headers
            )
        assert b"WorkloadAccepted" in reply.data

        def decided() -> list[object]:
            return [sp for sp in exporter.get_finished_spans() if sp.name == "placement.decide"]

        spans = await eventually(lambda: _value(decided()), bool)
        assert spans[0].context.trace_id == trace_id  # type: ignore[attr-defined]
        intake_spans = [
            sp
            for sp in exporter.get_finished_spans()
            if sp.context.trace_id == trace_id and sp.name != "client.submit"
        ]
        assert len(intake_spans) >= 2  # intake's handler span and the decision span
    finally:
        await service_main.stop(placement)
        await service_main.stop(intake)
        await nc.close()


async def _leader(p: PlacementService) -> bool:
    return p.leader


async def _value(v: list[object]) -> list[object]:
    return v
