"""Running a service's handlers with no server: its broker under FastStream's
``TestNatsBroker`` (its FastStream subscribers answer in memory), its log a ``MemoryLog``,
its nats-py handlers called directly (``raw_msg`` builds what nats-py would hand them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec
from faststream.nats import NatsBroker, TestNatsBroker
from nats.aio.msg import Msg

from allot.bus import runtime
from allot.proto import codec

UNUSED_URL = "nats://unused.invalid:4222"
"""A broker's URL that is never dialled (``TestNatsBroker`` patches the connection)."""
NOW = 1_800_000_000.0
T = TypeVar("T")


class Service(Protocol):
    broker: NatsBroker

    async def on_started(self) -> None: ...

    async def on_stopping(self) -> None: ...


@dataclass
class Clock:
    """A wall clock the test moves."""

    now: float = NOW

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def broker(service: str) -> NatsBroker:
    """The broker ``runtime.make_broker`` builds for ``service`` (its middlewares and
    whole-message decoding: what the handlers expect), never connected."""
    return runtime.make_broker(UNUSED_URL, service)


@asynccontextmanager
async def running(service: Service) -> AsyncIterator[Any]:
    """``service`` started on the test broker; yields the broker to send to."""
    async with TestNatsBroker(service.broker) as br:
        await service.on_started()
        try:
            yield br
        finally:
            await service.on_stopping()


async def ask(br: Any, subject: str, body: msgspec.Struct | bytes, answer: type[T]) -> T:
    """A request to a FastStream subscriber; its answer decoded as ``answer``."""
    data = body if isinstance(body, bytes) else codec.encode(body)
    reply = await br.request(data, subject, timeout=5.0)
    return msgspec.json.decode(reply.body, type=answer)


def raw_msg(subject: str, body: msgspec.Struct | bytes) -> Msg:
    """A core-NATS message as nats-py hands it to a subscription's callback."""
    data = body if isinstance(body, bytes) else codec.encode(body)
    return Msg(_client=None, subject=subject, data=data)  # type: ignore[arg-type]
