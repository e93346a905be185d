"""A log follower that reads in batches: for readers a delay of a fraction of a second
costs nothing (health's idle watch, dispatch), and for whom records handed over one at a
time are most of their CPU.

Pushed one at a time as they are stored (``LogFollower``'s ordered consumers), each record
wakes its reader on its own: a socket read, the event loop's callbacks and nats-py's
queues per record, several times what decoding and folding it costs (decision 0057).
Here each stream has an ephemeral pull consumer without acks, from the stream's start (or
past the last record handed over, when it is made again); every ``every_s`` seconds one
request takes what it holds (``no_wait``), so records arrive together in one or a few
socket reads. The records and their order are those of ``LogFollower`` (same filters,
same hand-over, ``HOSTS_SEQ_HEADER`` waits included); only the moment differs.

A consumer lost (nats-server restarted, the consumer removed: its requests go unanswered)
is made again from the last stream sequence handed over, as nats-py does for an ordered
consumer; a record seen twice across that is handed over once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError

from allot.bus import LogFollower, consumer_filter, stream_position
from allot.bus.batch_pull import NO_MESSAGES, until_answered
from allot.bus.tasks import stop_tasks

log = structlog.get_logger("allot.bus")

BATCH = 1000
"""Records asked for per request; a full batch is followed by another request at once."""
INACTIVE_S = 60.0
"""nats-server removes the ephemeral consumer after this long without a request (a
follower gone without stopping); polls come every ``every_s``, far more often."""


@dataclass
class _Poll:
    """One stream's consumer and its requests."""

    js: JetStreamContext
    stream: str
    wanted: str | tuple[str, ...]
    receive: Callable[[Msg], Awaitable[None]]
    handed_over: Callable[[], int]
    """The last stream sequence handed over (the follower's ``last_seq``)."""
    caught_up: asyncio.Event
    """Set when a request comes back with nothing (more): all the stream held was read."""
    consumer: str = ""
    inbox: str = ""
    _answered: asyncio.Event = field(default_factory=asyncio.Event)
    _taking: asyncio.Lock = field(default_factory=asyncio.Lock)
    _got = 0
    _lost = False
    _sub: Subscription | None = None

    async def open(self) -> None:
        nc = self.js._nc
        self.inbox = nc.new_inbox()
        self._sub = await nc.subscribe(self.inbox, cb=self._on_msg)
        await self._make_consumer()

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        if self.consumer:
            with contextlib.suppress(Exception):
                await self.js.delete_consumer(self.stream, self.consumer)

    @property
    def sub_task(self) -> asyncio.Task[None] | None:
        """nats-py's task handing the inbox's messages to ``_on_msg``."""
        return getattr(self._sub, "_wait_for_msgs_task", None)

    async def _make_consumer(self) -> None:
        after = self.handed_over()
        one, several = consumer_filter(self.wanted)
        config = ConsumerConfig(
            # Named in the create request's subject: a grant of only that form could not
            # name another's consumer in the body (decision 0079).
            name=f"poll-{uuid.uuid4().hex}",
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE if after else DeliverPolicy.ALL,
            opt_start_seq=after + 1 if after else None,
            filter_subject=one,
            filter_subjects=several,
            inactive_threshold=INACTIVE_S,
            mem_storage=True,
            num_replicas=1,
        )
        info = await self.js.add_consumer(self.stream, config)
        self.consumer = info.name

    async def take(self) -> None:
        """Everything the consumer holds now, a batch at a time; a lost consumer is made
        again (retried until the server answers: a restarting nats-server takes seconds)."""
        async with self._taking:
            await self._take()

    async def _take(self) -> None:
        nc = self.js._nc
        while True:
            self._answered.clear()
            self._got = 0
            self._lost = False
            try:
                await nc.publish(
                    f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}",
                    _REQUEST,
                    reply=self.inbox,
                )
                if not await until_answered(self._answered, lambda: self._got):
                    # nats-server drops a request to a consumer it does not have: a request
                    # with nothing from it for ``ANSWER_S`` has its consumer looked up.
                    self._lost = not await self._exists()
                    if not self._lost:
                        continue  # the request itself was lost: ask again
            except nats.errors.Error:  # not connected: made again once it is
                self._lost = True
            if self._lost:
                await self._remake()
            elif self._got < BATCH:
                return

    async def _exists(self) -> bool:
        try:
            await self.js.consumer_info(self.stream, self.consumer)
        except (TimeoutError, nats.errors.Error, APIError):
            return False
        return True

    async def _remake(self) -> None:
        old = self.consumer
        while True:
            try:
                await self._make_consumer()
            except (TimeoutError, nats.errors.Error, APIError) as e:
                log.warning("log consumer not made again", stream=self.stream, error=repr(e))
                await asyncio.sleep(RETRY_S)
                continue
            log.info("log consumer made again", stream=self.stream, was=old, now=self.consumer)
            with contextlib.suppress(Exception):
                await self.js.delete_consumer(self.stream, old)
            return

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status is not None and not msg.data:
            # 404/408 end a request; anything else (409 consumer deleted or leadership
            # changed, 503 no responders) means the consumer must be made again.
            self._lost = status not in NO_MESSAGES
            if not self._lost:
                self.caught_up.set()
            self._answered.set()
            return
        if not msg.reply.startswith("$JS.ACK."):
            return  # not a stored record (nothing else is sent to this inbox)
        seq, _ = stream_position(msg)
        if seq > self.handed_over():  # once only, across a remade consumer
            await self.receive(msg)
        self._got += 1
        if self._got >= BATCH:
            self._answered.set()


_REQUEST = json.dumps({"batch": BATCH, "no_wait": True}).encode()
RETRY_S = 0.5
"""Between two attempts to make a lost consumer again."""
WAIT_EVERY_S = 0.02
"""How often ``wait_for`` asks while a reader waits for a record not stored yet."""


@dataclass
class PolledLogFollower(LogFollower):
    """``LogFollower``'s records, taken in batches every ``every_s`` seconds: each round
    takes the streams in order (HOSTS before WORKLOADS), so a record is handed over after
    every record of an earlier stream that was stored before it."""

    every_s: float = 0.25
    _polls: list[_Poll] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Returns once every stream has been replayed to the end it had when read."""
        for stream in self.streams:
            last, caught_up = await self._stream_end(stream)
            poll = _Poll(
                self.js,
                stream,
                self.subjects.get(stream, ">"),
                self._receiver(stream, last, caught_up),
                handed_over=functools.partial(self._handed_over, stream),
                caught_up=caught_up,
            )
            await poll.open()
            self._polls.append(poll)
            await poll.take()
            await caught_up.wait()
        self._task = asyncio.create_task(self._run(), name="polled-follower")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self._take_to(self._polls[-1])

    async def _take_to(self, last: _Poll) -> None:
        """Take the streams in order up to ``last``: what an earlier stream stored before
        a record of a later one is handed over first (a host before its placement)."""
        for poll in self._polls:
            await poll.take()
            if poll is last:
                return

    def _handed_over(self, stream: str) -> int:
        return self.last_seq.get(stream, 0)

    @property
    def consumers(self) -> dict[str, str]:
        """Each stream's consumer name (made again when lost)."""
        return {poll.stream: poll.consumer for poll in self._polls}

    async def wait_for(self, stream: str, seq: int, timeout: float) -> bool:
        """Wait until the record at ``seq`` of ``stream`` has been handed over, taking the
        streams up to it in this task meanwhile (not waiting for the next round: a record
        waiting for HOSTS is handed over inside its round)."""
        poll = next((p for p in self._polls if p.stream == stream), None)
        if poll is None:
            return await super().wait_for(stream, seq, timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.last_seq.get(stream, 0) < seq:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await self._take_to(poll)
            if self.last_seq.get(stream, 0) < seq:
                await asyncio.sleep(min(WAIT_EVERY_S, remaining))
        return True

    @property
    def tasks(self) -> list[asyncio.Task[None] | None]:
        """The polling task and nats-py's task handing each stream's records over."""
        return [self._task, *(p.sub_task for p in self._polls)]

    async def stop(self) -> None:
        await stop_tasks([self._task])
        self._task = None
        for poll in self._polls:
            await poll.close()
        self._polls.clear()
