"""Answering a hot core-NATS request subject with nats-py directly, not through FastStream
(why, and which subjects: ``docs/decisions/0010-raw-nats-on-hot-subjects.md``).

Each message is handled in its own task, at most ``max_in_flight`` at once (a handler
awaits a JetStream ack, an fsync away), inside the trace context its headers carry, and,
given a tracer provider, in a span of its own (``<subject> process``, as FastStream's
middleware names it), so a trace still runs client -> service -> what it wrote. The
handler's bytes are the reply; an exception is logged (one line when NATS itself did not
answer in time: a leader election, a reconnect) and left unanswered, so the requester's
timeout and retry take over, as with FastStream. It must not be a refusal: an append whose
ack was lost may be in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import nats.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import DEFAULT_SUB_PENDING_MSGS_LIMIT
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Tracer

from allot.bus import attach_trace, confirm_subscriptions, detach_trace, inbox_replies_only
from allot.bus.tasks import stop_tasks

if TYPE_CHECKING:
    from faststream.nats import NatsBroker

log = structlog.get_logger("allot.requests")

Handler = Callable[[str, bytes], Awaitable[bytes]]

REQUEST_HEADERS: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "REQUEST_HEADERS", default=MappingProxyType({})
)
"""The headers of the request a handler is serving (each is served in a task of its own,
so this is that request's), as the trace context is attached from them."""
"""(subject, body) -> the reply's bytes."""

_NATS_UNAVAILABLE = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
)

DRAIN_TIMEOUT_S = 5.0
"""How long ``stop`` lets requests in progress finish before cancelling them."""


def raw_connection(broker: NatsBroker) -> NatsClient | None:
    """``broker``'s nats-py client, on which a service serves its hot subjects
    (``docs/decisions/0010-raw-nats-on-hot-subjects.md``); None under FastStream's
    ``TestNatsBroker``, which has none: unit tests call those handlers directly."""
    nc = broker.connection
    return nc if isinstance(nc, NatsClient) else None


@dataclass
class RequestServer:
    nc: NatsClient
    subject: str
    queue: str
    handler: Handler
    max_in_flight: int = 64
    provider: TracerProvider | None = None
    max_pending: int | None = None
    """Requests waiting beyond those in flight; more are dropped by nats-py (a slow
    consumer, logged by the connection's error callback) and their askers time out, as they
    would have waiting. None: nats-py's own bound (512 Ki messages). For costly answers a
    flood must not queue up for minutes (history pages, ``allot owed``)."""
    handled: int = 0
    _sub: Any = None
    _gate: asyncio.Semaphore | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _tracer: Tracer | None = None
    _span_name: str = ""

    async def start(self) -> None:
        self._gate = asyncio.Semaphore(self.max_in_flight)
        if self.provider is not None:
            self._tracer = self.provider.get_tracer("allot.requests")
            self._span_name = f"{self.subject} process"
        # Never publish where the sender points: only inbox replies are handled.
        self._sub = await self.nc.subscribe(
            self.subject,
            queue=self.queue,
            cb=inbox_replies_only(self._on_msg),
            pending_msgs_limit=self.max_pending or DEFAULT_SUB_PENDING_MSGS_LIMIT,
        )
        await confirm_subscriptions(self.nc)  # a request right after start finds us

    async def _on_msg(self, msg: Msg) -> None:
        # nats-py runs one callback at a time per subscription: waiting here for a free
        # slot is the backpressure (pending messages wait in the subscription's queue).
        assert self._gate is not None
        await self._gate.acquire()
        task = asyncio.create_task(self._serve(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, msg: Msg) -> None:
        assert self._gate is not None
        token = attach_trace(msg.headers)
        REQUEST_HEADERS.set(msg.headers or {})
        try:
            with self._span():
                reply = await self.handler(msg.subject, msg.data)
            if msg.reply:
                await msg.respond(reply)
            self.handled += 1
        except _NATS_UNAVAILABLE as e:  # the log is electing a leader, or reconnecting
            log.warning(
                "request not answered: NATS did not answer", subject=msg.subject, error=repr(e)
            )
        except Exception:
            log.exception("request not answered", subject=msg.subject)
        finally:
            detach_trace(token)
            self._gate.release()

    def _span(self) -> AbstractContextManager[object]:
        if self._tracer is None:
            return contextlib.nullcontext()
        return self._tracer.start_as_current_span(self._span_name, kind=SpanKind.SERVER)

    async def stop(self) -> None:
        """Stop taking requests, let those in progress finish (``DRAIN_TIMEOUT_S``)."""
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=DRAIN_TIMEOUT_S)
            await stop_tasks(list(late))
