"""An in-memory ``RecordLog`` (``allot.bus.record_log``) for the services' unit tests: no
server. Integration tests use real NATS; this keeps of JetStream only what the handlers
rely on:

* each stream of ``subjects.STREAMS`` holds its records with sequences from 1; an append to
  a subject no stream captures fails as nats-py's does (``NoStreamResponseError``);
* ``Nats-Expected-Last-Subject-Sequence`` refuses the append with ``APIError(err_code=
  10071)`` unless the subject's last sequence is the one expected (0: none), before the
  msg id is looked at, as nats-server does (a retry of a stored append is refused too);
  any other ``Nats-Expected-*`` header raises ``NotImplementedError`` instead of being
  ignored;
* a ``Nats-Msg-Id`` the stream has seen is answered ``PubAck(duplicate=True)`` with the
  first one's sequence and stores nothing, forever, unless ``forget_msg_ids`` (the
  duplicate window has passed);
* records are stored encoded and decoded by ``bus.decode_record`` for followers, which
  replay their streams in the order given, then get each new record, handed to the
  callback one at a time from a task of their own, as ``bus.LogFollower`` does. A callback
  that raises is counted in ``errors`` (``settled`` raises it) where the real follower
  logs and goes on: a fold must never raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
from nats.js.api import PubAck, RawStreamMsg
from nats.js.errors import APIError, NoStreamResponseError

from allot import bus
from allot.bus.record_log import FOLLOWED
from allot.core.errors import ValidationError
from allot.proto import subjects
from allot.proto.subjects import STREAMS

EXPECT_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
WRONG_LAST_SEQUENCE = 10071
_MSG_IDS = itertools.count(1)


subject_matches = subjects.matches
"""NATS wildcards: ``*`` is one token, a final ``>`` one or more."""


def stream_of(subject: str) -> str:
    for name, patterns in STREAMS.items():
        if any(subject_matches(p, subject) for p in patterns):
            return name
    raise NoStreamResponseError()


@dataclass(frozen=True, slots=True)
class Stored:
    stream: str
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]


class MemoryLog:
    """See the module docstring."""

    def __init__(self) -> None:
        self.streams: dict[str, list[Stored]] = {name: [] for name in STREAMS}
        self._msg_ids: dict[str, dict[str, int]] = {name: {} for name in STREAMS}
        self._followers: list[MemoryFollower] = []

    # -- the port ------------------------------------------------------------------------

    async def append(
        self,
        subject: str,
        record: msgspec.Struct,
        msg_id: str,
        conditions: dict[str, str] | None = None,
    ) -> PubAck:
        stream = stream_of(subject)
        conditions = dict(conditions or {})
        expected = conditions.get(EXPECT_LAST_SUBJECT_SEQ)
        unknown = [
            h for h in conditions if h.startswith("Nats-Expected-") and h != EXPECT_LAST_SUBJECT_SEQ
        ]
        if unknown:
            raise NotImplementedError(f"MemoryLog does not check {unknown}")
        if expected is not None:
            last = self._last_seq_on(stream, subject)
            if last != int(expected):
                raise APIError(
                    code=400,
                    err_code=WRONG_LAST_SEQUENCE,
                    description=f"wrong last sequence: {last}",
                    stream=stream,
                )
        known = self._msg_ids[stream].get(msg_id)
        if known is not None:
            return PubAck(stream=stream, seq=known, duplicate=True)
        stored = Stored(
            stream=stream,
            seq=len(self.streams[stream]) + 1,
            subject=subject,
            data=bus.encode(record),
            headers={**conditions, "Nats-Msg-Id": msg_id},
        )
        self.streams[stream].append(stored)
        self._msg_ids[stream][msg_id] = stored.seq
        for follower in self._followers:
            follower.offer(stored)
        return PubAck(stream=stream, seq=stored.seq)

    async def read(self, stream: str, subject: str, *, first: bool = False) -> RawStreamMsg | None:
        matching = [r for r in self.streams[stream] if subject_matches(subject, r.subject)]
        if not matching:
            return None
        r = matching[0] if first else matching[-1]
        return RawStreamMsg(subject=r.subject, seq=r.seq, data=r.data, headers=r.headers)

    def follower(
        self,
        on_record: bus.OnRecord,
        streams: Sequence[str] = FOLLOWED,
        subjects: Mapping[str, str | tuple[str, ...]] | None = None,
        every_s: float | None = None,
    ) -> MemoryFollower:
        return MemoryFollower(self, on_record, tuple(streams), dict(subjects or {}))

    # -- for tests -----------------------------------------------------------------------

    async def seed(self, subject: str, *records: msgspec.Struct) -> None:
        """Append ``records`` to ``subject``, each under a fresh msg id."""
        for record in records:
            await self.append(subject, record, f"seed:{next(_MSG_IDS)}")

    async def seed_events(self, allocation: str | None, *records: msgspec.Struct) -> None:
        """Append lifecycle events, each on its own subject (``bus.event_subject``)."""
        for record in records:
            await self.seed(bus.event_subject(allocation, record), record)

    def records(self, stream: str, kind: type[msgspec.Struct] | None = None) -> list[object]:
        """``stream``'s records decoded, in order (only ``kind``'s, given one)."""
        out = [bus.decode_record(r.subject, r.data) for r in self.streams[stream]]
        return [r for r in out if kind is None or isinstance(r, kind)]

    def forget_msg_ids(self) -> None:
        """As if the duplicate window had passed: msg ids no longer dedupe."""
        for ids in self._msg_ids.values():
            ids.clear()

    async def settled(self) -> None:
        """Wait until every follower has handed over every record; raise what a callback
        raised."""
        for follower in list(self._followers):
            await follower.queue.join()
            if follower.errors:
                raise follower.errors[0]

    def _last_seq_on(self, stream: str, subject: str) -> int:
        seqs = [r.seq for r in self.streams[stream] if r.subject == subject]
        return seqs[-1] if seqs else 0


@dataclass(eq=False)
class MemoryFollower:
    """A ``Follower`` of a ``MemoryLog`` (see the module docstring)."""

    log: MemoryLog
    on_record: bus.OnRecord
    streams: tuple[str, ...]
    subjects: dict[str, str | tuple[str, ...]]
    last_seq: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    errors: list[BaseException] = field(default_factory=list)
    queue: asyncio.Queue[Stored] = field(default_factory=asyncio.Queue)
    _task: asyncio.Task[None] | None = None

    def wants(self, stored: Stored) -> bool:
        if stored.stream not in self.streams:
            return False
        wanted = self.subjects.get(stored.stream, ">")
        patterns = (wanted,) if isinstance(wanted, str) else wanted
        return any(subject_matches(p, stored.subject) for p in patterns)

    def offer(self, stored: Stored) -> None:
        if self.wants(stored):
            self.queue.put_nowait(stored)

    async def start(self) -> None:
        for stream in self.streams:  # the replay, stream by stream
            for stored in self.log.streams[stream]:
                if self.wants(stored):
                    self.queue.put_nowait(stored)
        self.log._followers.append(self)
        self._task = asyncio.create_task(self._run())
        await self.queue.join()

    async def _run(self) -> None:
        while True:
            stored = await self.queue.get()
            try:
                record = bus.decode_record(stored.subject, stored.data)
            except ValidationError:
                self.skipped += 1
            else:
                try:
                    result = self.on_record(stored.subject, record)
                    if inspect.isawaitable(result):
                        await result
                except Exception as e:
                    self.errors.append(e)
            self.last_seq[stored.stream] = stored.seq
            self.queue.task_done()

    async def catch_up(self, stream: str, timeout: float) -> bool:
        """Everything appended so far is queued: wait until the queue is empty."""
        try:
            await asyncio.wait_for(self.queue.join(), timeout)
        except TimeoutError:
            return False
        return True

    async def wait_for(self, stream: str, seq: int, timeout: float) -> bool:
        """Everything appended so far is queued: ``seq`` is handed over once it is empty."""
        return await self.catch_up(stream, timeout)

    async def stop(self) -> None:
        with contextlib.suppress(ValueError):
            self.log._followers.remove(self)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
