"""What every service process sets up the same way: JSON logs, tracing, the broker.

Logs: structlog, one JSON object per line on stderr, with ``service`` and any bound
``workload``, ``allocation`` and ``trace_id`` fields. Tracing: OpenTelemetry through
FastStream's NATS middleware, so a span started by a client's submit continues through
intake's handler into placement's decision (the trace context rides in message headers).
Exporter: ``ALLOT_OTEL_EXPORTER`` = ``console`` (default: spans as JSON on stderr),
``none``, or ``otlp`` (needs ``opentelemetry-exporter-otlp``, not a dependency).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, TypeAlias

import structlog
from faststream import BaseMiddleware, StreamMessage
from faststream.nats import NatsBroker
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from faststream.security import BaseSecurity
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)

from allot.auth.client import client_tls, inbox_prefix_for_url
from allot.bus import nats_error_logger, reply_allowed, server_urls


def wall_clock() -> float:
    """The shell's clock (the core never reads one)."""
    return time.time()


def _add_trace_id(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    span = trace.get_current_span()
    ctx = span.get_span_context()
    if ctx.is_valid:
        event.setdefault("trace_id", format(ctx.trace_id, "032x"))
    return event


def configure_logging(service: str, level: str | None = None) -> structlog.stdlib.BoundLogger:
    level = level or os.environ.get("ALLOT_LOG_LEVEL", "INFO")
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _add_trace_id,
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    log: structlog.stdlib.BoundLogger = structlog.get_logger(service).bind(service=service)
    return log


def tracer_provider(service: str, exporter: str | None = None) -> TracerProvider | None:
    """None when tracing is off (``none``): no middleware, no per-message span cost."""
    exporter = exporter or os.environ.get("ALLOT_OTEL_EXPORTER", "console")
    if exporter == "none":
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": f"allot-{service}"}))
    if exporter == "console":
        provider.add_span_processor(
            SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr, formatter=_one_line))
        )
    elif exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]  # noqa: PLC0415 - optional extra
            OTLPSpanExporter,
        )

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        raise ValueError(f"ALLOT_OTEL_EXPORTER: unknown exporter {exporter!r}")
    return provider


def _one_line(span: Any) -> str:
    return str(span.to_json(indent=None)) + "\n"


if TYPE_CHECKING:
    from faststream.nats.message import NatsMessage

    Delivery: TypeAlias = NatsMessage
else:
    # What a handler receives (see ``make_broker``). At run time the annotation must not
    # name FastStream's message class (FastStream refuses to inject it as a body) nor be
    # its ``Context`` annotation (resolved in a worker thread per message: docs/decisions/0016).
    Delivery = Any


async def _whole_message(msg: Any) -> Any:
    return msg


class InboxRepliesOnly(BaseMiddleware):
    """A request naming a reply subject other than an inbox is neither handled nor
    answered (``allot.bus.reply_allowed``): FastStream would publish the handler's
    answer there with the service's rights."""

    async def consume_scope(
        self, call_next: Callable[[StreamMessage[Any]], Awaitable[Any]], msg: StreamMessage[Any]
    ) -> Any:
        if reply_allowed(msg.reply_to):
            return await call_next(msg)
        msg.reply_to = ""  # nothing is published
        structlog.get_logger("allot.requests").warning(
            "request refused: its reply subject is no inbox", subject=msg.raw_message.subject
        )
        return None


def make_broker(url: str, service: str, provider: TracerProvider | None = None) -> NatsBroker:
    """A FastStream broker with tracing; FastStream's own per-message logs off (ours are
    structured and carry the ids)."""
    middlewares: list[Any] = [InboxRepliesOnly]
    if provider is not None:
        middlewares.append(NatsTelemetryMiddleware(tracer_provider=provider))
    return NatsBroker(
        server_urls(url),  # a comma-separated list names the nodes of a cluster
        # Handlers get the whole message as their one argument (``msg: Delivery``) and decode
        # ``msg.body`` themselves (allot.proto.codec, field-named errors): FastStream's own
        # JSON parsing would fail first on hostile bodies (1,000-deep nesting, invalid
        # UTF-8, a JSON content type on malformed JSON) and never reply.
        decoder=_whole_message,
        name=f"allot-{service}",
        inbox_prefix=inbox_prefix_for_url(url),
        security=BaseSecurity(ssl_context=tls) if (tls := client_tls(url)) else None,
        middlewares=middlewares,
        log_level=logging.DEBUG,
        max_reconnect_attempts=-1,
        reconnect_time_wait=1,
        error_cb=nats_error_logger(f"allot-{service}"),
    )


def given_broker(
    broker: NatsBroker | None, nats_url: str | None, service: str, provider: TracerProvider | None
) -> NatsBroker:
    """The broker a service was given (a unit test's), else ``make_broker(nats_url, ...)``."""
    if broker is not None:
        return broker
    if nats_url is None:
        raise ValueError(f"{service}: a NATS URL or a broker is needed")
    return make_broker(nats_url, service, provider)
