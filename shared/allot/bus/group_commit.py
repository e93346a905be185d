"""Group commit: a backlog of appends to one stream is stored as JetStream atomic batches.

Why: with fsync on every write (``sync_interval: always``, the durability issue 5 asks
for) nats-server fsyncs each append on its own, and a stream's appends are serial, so one
stream stores at most 1 / (write + fsync) records a second. An atomic batch (nats-server
>= 2.12, a stream with ``allow_atomic``) is stored with 4 fsyncs whatever its size (1 in
the store when staged on tmpfs, ``allot.adapters.batch_staging``), but its commit is
answered later than a single append. Figures: docs/decisions/0013. So:

* while fewer than ``threshold`` appends of this process are waiting for their acks, an
  append is sent at once on its own, exactly as ``allot.bus.publish`` sends it (a
  light load pays nothing);
* beyond that, appends queue, and one writer commits the queue as atomic batches of up to
  ``max_batch``, one commit at a time; what arrives during a commit is the next batch. The
  larger the backlog, the fewer fsyncs per record: the load the serial fsyncs could not
  keep up with is what gets batched;
* appends marked ``together`` (several records of one moment, awaited together) queue
  at once, whatever the backlog, and so become one commit;
* with ``linger_s`` (Kafka's ``linger.ms``), the writer waits that long before each commit
  so that more appends join it: for appends whose answer nobody waits on closely (an
  agent's report) under a steady load, where batches of 2-3 would cost more fsyncs (4 a
  commit) than the records alone. It applies only once appends queue; below
  ``threshold`` nothing waits.

Outcomes are those of ``bus.publish``: each append returns its own ``PubAck`` (a batch's
records take the consecutive sequences that end at the commit's) or raises its own failed
``Nats-Expected-*`` condition. A batch is all or nothing: when the server refuses it (a
duplicate msg id, a failed condition: one record fails the whole batch) or its commit is
not answered, each of its records is sent again on its own, under its own msg id, and gets
its own answer; a record the refused or unanswered batch did store is then a duplicate the
stream recognises by its msg id. That is why every grouped append needs a msg id.

Against a server or stream without atomic batches (``atomic=False``; nats-server 2.9 for
example) every append is sent on its own.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from dataclasses import dataclass

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import PubAck

from allot import bus

log = structlog.get_logger("allot.group_commit")

THRESHOLD = 8
"""Appends waiting for their acks beyond which new ones queue for a batch: a commit costs
a few ms and 4 fsyncs (1 staged on tmpfs), so a smaller batch saves nothing
(docs/decisions/0013)."""
MAX_BATCH = 500
"""Records per atomic batch (nats-server refuses more than 1,000)."""
_BATCH_IDS = itertools.count()


@dataclass(slots=True)
class _Queued:
    subject: str
    data: bytes
    headers: dict[str, str]
    done: asyncio.Future[PubAck]


class GroupCommit:
    """Appends to one stream (see the module docstring). ``nc`` is ``js``'s connection: a
    batch's messages must reach the server in order, on one connection."""

    def __init__(
        self,
        nc: NatsClient,
        js: JetStreamContext,
        *,
        atomic: bool,
        threshold: int = THRESHOLD,
        max_batch: int = MAX_BATCH,
        linger_s: float = 0.0,
    ) -> None:
        if threshold < 1 or not 2 <= max_batch <= 1000 or linger_s < 0:
            raise ValueError("threshold must be >= 1, max_batch 2-1000 and linger_s >= 0")
        self.nc = nc
        self.js = js
        self.atomic = atomic
        self.threshold = threshold
        self.max_batch = max_batch
        self.linger_s = linger_s
        self.commits = 0
        """Atomic batches stored so far."""
        self.batched = 0
        """Records stored by those batches."""
        self.refused = 0
        """Batches refused or unanswered, whose records were then sent one by one."""
        self._in_flight = 0
        self._queue: list[_Queued] = []
        self._group: list[_Queued] = []
        """What the writer is storing now."""
        self._writer: asyncio.Task[None] | None = None
        self._prefix = f"{os.getpid()}-{id(self):x}-"

    async def append(
        self,
        subject: str,
        record: msgspec.Struct,
        msg_id: str,
        conditions: dict[str, str] | None = None,
        *,
        together: bool = False,
    ) -> PubAck:
        """Store ``record`` under ``msg_id`` (and ``conditions``: more headers, such as
        ``Nats-Expected-*`` conditions or ``bus.HOSTS_SEQ_HEADER``); its
        ``PubAck``, or the ``APIError`` of a failed condition. ``together``: join the next
        batch even without a backlog, for records written at one moment whose answers are
        awaited together (a placement cycle's decisions): appends started in the same
        event-loop turn become one commit, one fsync instead of one each."""
        headers = bus.record_headers(msg_id, conditions or {})  # in the caller's trace
        data = bus.encode(record)
        if not self.atomic or (
            not together and self._in_flight < self.threshold and not self._queue
        ):
            return await self._single(subject, data, headers)
        done: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        self._queue.append(_Queued(subject, data, headers, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write())
            self._writer.add_done_callback(self._writer_ended)
        return await done

    async def _single(self, subject: str, data: bytes, headers: dict[str, str]) -> PubAck:
        self._in_flight += 1
        try:
            return await bus.send_record(self.js, subject, data, headers)
        finally:
            self._in_flight -= 1

    async def _write(self) -> None:
        while self._queue:
            if self.linger_s and len(self._queue) < self.max_batch:
                await asyncio.sleep(self.linger_s)  # let the batch grow (module docstring)
            self._group = self._queue[: self.max_batch]
            del self._queue[: self.max_batch]
            if len(self._group) == 1 or not await self._commit(self._group):
                await self._resolve_each(self._group)
        self._group = []

    async def _resolve_each(self, group: list[_Queued]) -> None:
        """Each record of a refused batch sent alone, at most ``threshold`` awaiting their
        acks at once: a record's ack wait starts when it is sent, so the last of a large
        batch does not time out queued behind the others' fsyncs on a slow disk, and the
        retries of timed-out sends do not multiply the load."""
        window = asyncio.Semaphore(self.threshold)

        async def alone(q: _Queued) -> None:
            async with window:
                await self._resolve_alone(q)

        await asyncio.gather(*(alone(q) for q in group))

    def _writer_ended(self, writer: asyncio.Task[None]) -> None:
        """A writer cancelled (shutdown; maybe before it ran) or failed leaves no caller
        waiting: the appends it held or had queued are cancelled."""
        if writer.cancelled() or writer.exception() is not None:
            for q in self._group + self._queue:
                q.done.cancel()
            self._group, self._queue = [], []

    async def _resolve_alone(self, q: _Queued) -> None:
        try:
            ack = await self._single(q.subject, q.data, q.headers)
        except Exception as e:  # the caller gets it, as from its own publish
            if not q.done.done():
                q.done.set_exception(e)
        else:
            if not q.done.done():
                q.done.set_result(ack)

    async def _commit(self, group: list[_Queued]) -> bool:
        """One atomic batch; False when it was refused or not answered (nothing resolved)."""
        batch_id = self._prefix + str(next(_BATCH_IDS))
        last = len(group)
        try:
            for n, q in enumerate(group[:-1], start=1):
                await self.nc.publish(
                    q.subject, q.data, headers={**q.headers, **batch_headers(batch_id, n)}
                )
            q = group[-1]
            reply = await self.nc.request(
                q.subject,
                q.data,
                timeout=bus.PUBLISH_TIMEOUT_S * 4,
                headers={**q.headers, **batch_headers(batch_id, last, commit=True)},
            )
            answer = json.loads(reply.data)
            if not isinstance(answer, dict):  # not a JetStream answer: refused below
                answer = {"error": answer}
        except (nats.errors.Error, TimeoutError, ValueError) as e:
            self.refused += 1
            log.info("batch not answered; its records sent one by one", records=last, error=e)
            return False
        error = answer.get("error")
        if error is not None or answer.get("count") != last:
            self.refused += 1
            # A duplicate or a failed condition is ordinary (a client's retry); the records
            # sent alone each get their own answer.
            log.debug("batch refused; its records sent one by one", records=last, error=error)
            if isinstance(error, dict) and error.get("err_code") in _NO_ATOMIC:
                self.atomic = False
                log.warning("the stream takes no atomic batches; appending one by one")
            return False
        stream, seq = answer.get("stream"), answer.get("seq")
        if not isinstance(stream, str) or not isinstance(seq, int):
            self.refused += 1
            log.warning("batch answer without stream and sequence", answer=answer)
            return False
        self.commits += 1
        self.batched += last
        for i, q in enumerate(group):
            if not q.done.done():
                q.done.set_result(PubAck(stream=stream, seq=seq - last + 1 + i, duplicate=False))
        return True


_NO_ATOMIC = (10174,)
"""JetStream's error code for a batch sent to a stream without ``allow_atomic``."""


def batch_headers(batch_id: str, n: int, *, commit: bool = False) -> dict[str, str]:
    """The headers that make a publish record ``n`` (from 1) of atomic batch ``batch_id``;
    ``commit`` on the last one stores the batch."""
    headers = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(n)}
    if commit:
        headers["Nats-Batch-Commit"] = "1"
    return headers


async def for_stream(
    nc: NatsClient,
    js: JetStreamContext,
    stream: str,
    *,
    threshold: int = THRESHOLD,
    linger_s: float = 0.0,
) -> GroupCommit:
    """A ``GroupCommit`` for ``stream``, batching when its config allows atomic batches."""
    info = await js.stream_info(stream)
    return GroupCommit(
        nc,
        js,
        atomic=bool(getattr(info.config, "allow_atomic", False)),
        threshold=threshold,
        linger_s=linger_s,
    )


__all__ = ["MAX_BATCH", "THRESHOLD", "GroupCommit", "batch_headers", "for_stream"]
