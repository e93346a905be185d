"""Reading the log for teams: ``allot.v1.watch.<allocation>`` (``WatchLog``).

Only services use the JetStream API (``allot auth gen`` grants no ``$JS.API`` subject to
anyone else). A user who may create consumers chooses their name, filter and delivery
subject: it can re-point a service's durable consumer to a filter of its own (accounting
then charges nobody), or make the server publish the log onto any subject, permissions
notwithstanding. So a team asks here instead, and the service creates the consumer:

* the filter is the subject's allocation and the workload asked (``events`` or
  ``notices``), never a filter of the asker's choosing;
* the delivery subject is ``allot.v1.watched.<allocation>.<deliver>``, which only that
  allocation's team (and the services) may read;
* the name is the service's own (``watch-<random>``), so no service durable can be hit;
* it is ephemeral (memory, one replica, no acks, idle heartbeats) and removed by the
  server once nobody has listened on its subject for ``INACTIVE_S``;
* at most ``MAX_WATCHES`` are open per allocation and service process: a team cannot
  exhaust the server with watches.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from allot.bus.request_server import RequestServer
from allot.core.errors import ValidationError
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.proto.subjects import Kind

STREAM = "WORKLOADS"
MAX_WATCHES = 64
"""Open watches per allocation and service process (an SDK watch holds two)."""
HEARTBEAT_S = 1.0
"""Idle heartbeat: a watcher that hears nothing for a few of these asks again."""
INACTIVE_S = 10.0
"""The server removes a watch's consumer once nobody has listened for this long."""


def watch_filter(allocation: str | None, req: m.WatchLog) -> str:
    """The only subjects a watch of ``allocation`` reads: one workload's events or notices."""
    if req.records == "events":
        return s.workload_events(allocation, req.workload_id)
    return s.preempt(allocation, req.workload_id)


def allocation_of(subject: str) -> str | None:
    """``allot.v1.watch.<token>`` -> the allocation (None: ``~``, unallocated work)."""
    token = subject.split(".")[3]
    return None if token == s.UNALLOCATED else s.validate_token(token, "allocation")


@dataclass
class LogWatchServer:
    """Answers ``allot.v1.watch.*`` (queue group ``watch``) by creating the consumer."""

    nc: NatsClient
    js: JetStreamContext
    clock: Callable[[], float]
    max_watches: int = MAX_WATCHES
    inactive_s: float = INACTIVE_S
    _open: dict[str, list[str]] = field(default_factory=dict)
    _server: RequestServer | None = None

    async def start(self) -> None:
        self._server = RequestServer(self.nc, s.ALL_WATCH, "watch", self.on_watch)
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()

    async def on_watch(self, subject: str, body: bytes) -> bytes:
        now = self.clock()
        try:
            allocation = allocation_of(subject)
            req = codec.decode(Kind.WATCH, body)
            assert isinstance(req, m.WatchLog)
            deliver = s.watched(allocation, req.deliver)
            filter_subject = watch_filter(allocation, req)
        except ValidationError as e:
            return codec.encode(m.CommandRejected(at=now, field=e.field, reason=e.reason))
        token = s.allocation_token(allocation)
        if not await self._room(token):
            return codec.encode(
                m.CommandRejected(
                    at=now,
                    field="allocation",
                    reason=f"{self.max_watches} watches of {token!r} are open; "
                    "end one (or wait for an abandoned one to expire) and ask again",
                )
            )
        name = f"watch-{secrets.token_hex(8)}"
        config = ConsumerConfig(
            name=name,
            deliver_subject=deliver,
            filter_subject=filter_subject,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE if req.start_seq else DeliverPolicy.ALL,
            opt_start_seq=req.start_seq or None,
            ack_policy=AckPolicy.NONE,
            idle_heartbeat=HEARTBEAT_S,
            inactive_threshold=self.inactive_s,
            mem_storage=True,
            num_replicas=1,
        )
        try:
            await self.js.add_consumer(STREAM, config)
        except NotFoundError:
            return codec.encode(
                m.CommandRejected(
                    at=now, field="stream", reason=f"the log (stream {STREAM}) does not exist yet"
                )
            )
        self._open.setdefault(token, []).append(name)
        return codec.encode(
            m.WatchStarted(
                at=now,
                consumer=name,
                subject=deliver,
                heartbeat_s=HEARTBEAT_S,
                inactive_s=self.inactive_s,
            )
        )

    async def _room(self, token: str) -> bool:
        """Whether ``token`` may open one more watch; at the limit, forget the watches the
        server has removed since (nobody listened) before saying no."""
        names = self._open.get(token, [])
        if len(names) < self.max_watches:
            return True
        alive = []
        for name in names:
            try:
                await self.js.consumer_info(STREAM, name)
            except NotFoundError:
                continue
            alive.append(name)
        self._open[token] = alive
        return len(alive) < self.max_watches
