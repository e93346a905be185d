"""A durable pull consumer read a batch per request, its records landing in a list from a
subscription's callback (accounting's consumer), and what every pull request of ours shares
(``until_answered``, ``NO_MESSAGES``; ``allot.bus.polled_follower`` too).

nats-py's ``PullSubscription.fetch`` waits for each record of a batch with an
``asyncio.wait_for`` of its own (a task and a timer per record), several times what the
subscription's callback costs when it appends them to a list (measured in decision 0074).
The request is the same one ``fetch`` sends first (``no_wait``: what the consumer holds
now, up to ``batch``), answered with the records and then a status that ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

log = structlog.get_logger("allot.bus")

ANSWER_S = 1.0
"""A request with nothing from it for this long (no record, no status) is over: nats-server
drops a request to a consumer it does not have."""
NO_MESSAGES = ("404", "408")
"""Status codes that end a request normally: nothing (more) to give, or its time ran out."""
_HEARTBEAT = "100"


async def until_answered(answered: asyncio.Event, received: Callable[[], int]) -> bool:
    """Wait for a pull request's end (``answered`` set); records still arriving (``received``
    growing: a large batch, a record waiting for HOSTS) extend the wait. False when nothing
    came for ``ANSWER_S``."""
    while True:
        had = received()
        try:
            await asyncio.wait_for(answered.wait(), ANSWER_S)
            return True
        except TimeoutError:
            if received() == had:
                return False


@dataclass
class BatchPull:
    """Requests on the durable consumer ``consumer`` of ``stream``; ``take`` returns what
    the consumer holds now, up to ``batch`` records (more when records of an earlier
    request came late: none is dropped, each comes once)."""

    nc: NatsClient
    stream: str
    consumer: str
    batch: int
    _inbox: str = ""
    _sub: Subscription | None = None
    _request: int = 0
    _records: list[Msg] = field(default_factory=list)
    _over: asyncio.Event = field(default_factory=asyncio.Event)

    async def open(self) -> None:
        self._inbox = self.nc.new_inbox()
        # One subject per request (``<inbox>.<n>``): a status answering an earlier request
        # that timed out must not end the current one.
        self._sub = await self.nc.subscribe(f"{self._inbox}.*", cb=self._on_msg)

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def take(self) -> list[Msg]:
        """What the consumer holds now, up to ``batch`` records; ``[]`` when it holds none
        or nothing answers (no such consumer). Raises nats-py's errors when not connected."""
        self._request += 1
        self._over.clear()
        request = {"batch": max(1, self.batch - len(self._records)), "no_wait": True}
        await self.nc.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}",
            json.dumps(request).encode(),
            reply=f"{self._inbox}.{self._request}",
        )
        await until_answered(self._over, lambda: len(self._records))
        taken, self._records = self._records, []
        return taken

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status is not None and not msg.data:
            if status == _HEARTBEAT:
                return
            if status not in NO_MESSAGES:  # 409: consumer deleted, too many waiting requests...
                log.warning(
                    "pull request ended",
                    stream=self.stream,
                    consumer=self.consumer,
                    status=status,
                    description=msg.headers.get("Description", "") if msg.headers else "",
                )
            if msg.subject == f"{self._inbox}.{self._request}":
                self._over.set()
            return
        if not msg.reply.startswith("$JS.ACK."):
            return  # not a stored record (nothing else is sent to this inbox)
        self._records.append(msg)
        if len(self._records) >= self.batch:
            self._over.set()
