"""The log as a service's handlers use it: the port ``RecordLog`` and its JetStream side.

A service is given a ``RecordLog`` (a unit test's in-memory one) or, given none, builds a
``JetStreamLog`` in ``on_started`` from its broker's connection. A ``JetStreamLog`` appends
as ``allot.bus.publish`` does, or through a ``GroupCommit`` when given one: the same msg
ids, ``Nats-Expected-*`` conditions, retries and acks either way. It reads with the
JetStream API and follows the log with ``allot.bus.LogFollower``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec
from nats.js import JetStreamContext
from nats.js.api import PubAck, RawStreamMsg
from nats.js.errors import NotFoundError

from allot.bus import LogFollower, OnRecord, encode, record_headers, send_record
from allot.bus.group_commit import GroupCommit
from allot.bus.polled_follower import PolledLogFollower

FOLLOWED = ("HOSTS", "WORKLOADS")
"""The streams a follower reads by default, in this order (``LogFollower``'s default)."""


class Follower(Protocol):
    """What a service uses of its log's follower (``allot.bus.LogFollower``)."""

    last_seq: dict[str, int]
    """Stream sequence of the last record handed over, per stream."""

    async def start(self) -> None:
        """Return once every stream has been replayed to its end; then follow it."""

    async def stop(self) -> None: ...

    async def catch_up(self, stream: str, timeout: float) -> bool:
        """Wait until every record ``stream`` holds now has been handed over."""

    async def wait_for(self, stream: str, seq: int, timeout: float) -> bool:
        """Wait until the record at ``seq`` of ``stream`` (one this follower takes) has been
        handed over."""


class RecordLog(Protocol):
    """Appending to, reading and following the log (``allot.bus`` says what is where)."""

    async def append(
        self,
        subject: str,
        record: msgspec.Struct,
        msg_id: str,
        conditions: dict[str, str] | None = None,
    ) -> PubAck:
        """Store ``record`` on ``subject`` under ``msg_id`` and ``conditions`` (headers such
        as ``Nats-Expected-Last-Subject-Sequence``): its ``PubAck`` (``duplicate`` for a
        msg id the stream knew), or the ``APIError`` of a failed condition."""

    async def read(self, stream: str, subject: str, *, first: bool = False) -> RawStreamMsg | None:
        """The last record (``first``: the first) on ``subject``, which may hold wildcards;
        None when it holds none."""

    def follower(
        self,
        on_record: OnRecord,
        streams: Sequence[str] = FOLLOWED,
        subjects: Mapping[str, str | tuple[str, ...]] | None = None,
        every_s: float | None = None,
    ) -> Follower:
        """A follower handing ``streams``' records (filtered by ``subjects``, per stream) to
        ``on_record``, one at a time, replay first; started by its ``start``. With
        ``every_s``, the records are taken in batches that often (``PolledLogFollower``)."""


@dataclass
class JetStreamLog:
    """``RecordLog`` on JetStream. ``appends``: the group commit of the stream the service
    appends to (``allot.bus.group_commit``); without one, each append is sent on its own."""

    js: JetStreamContext
    appends: GroupCommit | None = None

    async def append(
        self,
        subject: str,
        record: msgspec.Struct,
        msg_id: str,
        conditions: dict[str, str] | None = None,
    ) -> PubAck:
        if self.appends is not None:
            return await self.appends.append(subject, record, msg_id, conditions)
        return await send_record(
            self.js, subject, encode(record), record_headers(msg_id, conditions or {})
        )

    async def read(self, stream: str, subject: str, *, first: bool = False) -> RawStreamMsg | None:
        try:
            if first:
                return await self.js.get_msg(stream, seq=1, subject=subject, next=True)
            return await self.js.get_last_msg(stream, subject)
        except NotFoundError:
            return None

    def follower(
        self,
        on_record: OnRecord,
        streams: Sequence[str] = FOLLOWED,
        subjects: Mapping[str, str | tuple[str, ...]] | None = None,
        every_s: float | None = None,
    ) -> LogFollower:
        if every_s is not None:
            return PolledLogFollower(
                self.js, on_record, streams=streams, subjects=dict(subjects or {}), every_s=every_s
            )
        return LogFollower(self.js, on_record, streams=streams, subjects=dict(subjects or {}))
