"""JetStream plumbing shared by the services: publishing records, replaying the log.

The streams themselves and the lease bucket: ``allot.bus.streams`` (their names are
re-exported here, where the services have always found them).

Every record is published with a ``Nats-Msg-Id`` derived from what it says (e.g.
``placed:<workload>:<attempt>``), so a retried publish inside the stream's duplicate window
is stored once; folds ignore duplicates beyond it (see ``allot.eventlog.logfold``).

``follow_log`` is how every reader rebuilds state: replay HOSTS to its end, then WORKLOADS
to its end (ordered consumers from sequence 1), report "caught up", then keep delivering
both live. Records are handed to one callback, one at a time, in that order. Live, the two
streams' consumers deliver independently; a record that needs a host's registration says
how far into HOSTS its writer had read (``HOSTS_SEQ_HEADER``) and waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import Token
from dataclasses import dataclass, field
from typing import Any

import msgspec
import nats
import nats.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.client import ServerVersion
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    ConsumerConfig,
    DeliverPolicy,
    PubAck,
)
from opentelemetry import context as otel_context
from opentelemetry import propagate

from allot.auth.client import client_tls, inbox_prefix_for_url, masked_url
from allot.bus.replays import replayed, stored_at
from allot.bus.streams import (
    ATOMIC_STREAMS as ATOMIC_STREAMS,
)
from allot.bus.streams import (
    DUPLICATE_WINDOW_S as DUPLICATE_WINDOW_S,
)
from allot.bus.streams import (
    LEADER_BUCKET as LEADER_BUCKET,
)
from allot.bus.streams import (
    LEASE_TTL_S as LEASE_TTL_S,
)
from allot.bus.streams import (
    REPLICAS_ENV as REPLICAS_ENV,
)
from allot.bus.streams import (
    STREAMS_READY_TIMEOUT_S as STREAMS_READY_TIMEOUT_S,
)
from allot.bus.streams import (
    UNNAMED_EVENTS as UNNAMED_EVENTS,
)
from allot.bus.streams import (
    USAGE_KEPT_PER_SUBJECT as USAGE_KEPT_PER_SUBJECT,
)
from allot.bus.streams import (
    LeaseBucketError as LeaseBucketError,
)
from allot.bus.streams import (
    StreamsNotReadyError as StreamsNotReadyError,
)
from allot.bus.streams import (
    UnreadableLogError as UnreadableLogError,
)
from allot.bus.streams import (
    ensure_streams as ensure_streams,
)
from allot.bus.streams import (
    lease_bucket as lease_bucket,
)
from allot.bus.streams import (
    new_lease_bucket as new_lease_bucket,
)
from allot.bus.streams import (
    replicas_asked as replicas_asked,
)
from allot.bus.streams import (
    stream_configs as stream_configs,
)
from allot.bus.streams import (
    stream_differs as stream_differs,
)
from allot.bus.streams import (
    stream_replicas as stream_replicas,
)
from allot.bus.streams import (
    until_ready as until_ready,
)
from allot.bus.tasks import stop_tasks
from allot.core.errors import ValidationError
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.proto.subjects import Kind, kind_of

log = structlog.get_logger("allot.bus")

PUBLISH_TIMEOUT_S = 0.5
PUBLISH_ATTEMPTS = 10
"""A publish with a msg id waits ``PUBLISH_TIMEOUT_S`` for its ack and is sent again, up
to ``PUBLISH_ATTEMPTS`` times (5 s in all, nats-py's single default wait): the stream
stores it once whatever the number of tries. A publish lost in a stream leader's
hand-over then costs about 0.5 s, not 5 (docs/decisions/0017); one without a msg id is
sent once."""
ORDERED_HEARTBEAT_S = 0.5
_ENCODER = msgspec.json.Encoder()


def server_urls(url: str) -> list[str]:
    """A comma-separated server list (a cluster: ``nats://a:4222,nats://b:4222``) as the
    list nats-py and FastStream take; nats-py refuses the comma string itself."""
    urls = [u.strip() for u in url.split(",") if u.strip()]
    if not urls:
        raise ValidationError("nats_url", f"no server URL in {url!r}")
    for u in urls:
        # nats-py reads a bare host:port as nats://; any other scheme (http://, a Redis URL
        # pasted in the wrong place) would only fail later as "cannot reach".
        scheme = u.partition("://")[0].lower() if "://" in u else "nats"
        if scheme not in NATS_SCHEMES:
            shown = masked_url(u)
            raise ValidationError(
                "nats_url", f"{shown!r} is no NATS URL (schemes: {', '.join(NATS_SCHEMES)})"
            )
    return urls


NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def encode(record: msgspec.Struct) -> bytes:
    return _ENCODER.encode(record)


ERROR_REPEAT_S = 10.0
"""The same connection error is logged at most once per this many seconds (an unreachable
server is retried every second or faster)."""


def nats_error_logger(
    connection: str, clock: Callable[[], float] = time.monotonic
) -> Callable[[Exception], Awaitable[None]]:
    """nats-py's ``error_cb`` for a service's connection: a warning naming the connection
    and the error (a refused connection, a permissions violation, a slow consumer).
    Without one, a service whose NATS is unreachable says nothing while it retries. The
    URL is not logged: it may carry a password."""
    last: dict[str, float] = {}

    async def on_error(e: Exception) -> None:
        key, now = repr(e), clock()
        if now - last.get(key, -ERROR_REPEAT_S) >= ERROR_REPEAT_S:
            last[key] = now
            log.warning("nats error", connection=connection, error=key)

    return on_error


async def connect(
    url: str,
    name: str,
    on_error: Callable[[Exception], None] | None = None,
    *,
    for_s: float | None = None,
) -> tuple[NatsClient, JetStreamContext]:
    """A long-lived connection (reconnects forever); ``on_error`` also hears each error
    the server reports (a refused publish, for one). ``for_s``: a one-shot command's, which
    tries about that long (a try every ``RECONNECT_WAIT_S``), then raises nats-py's
    ``NoServersError`` instead of waiting forever for a wrong address."""
    log_error = nats_error_logger(name)

    async def error_cb(e: Exception) -> None:
        if on_error is not None:
            on_error(e)
        await log_error(e)

    nc = await nats.connect(
        server_urls(url),
        name=name,
        inbox_prefix=inbox_prefix_for_url(url),
        tls=client_tls(url),
        max_reconnect_attempts=-1 if for_s is None else max(1, int(for_s / RECONNECT_WAIT_S)),
        reconnect_time_wait=RECONNECT_WAIT_S,
        error_cb=error_cb,
    )
    return nc, nc.jetstream()


RECONNECT_WAIT_S = 0.25


async def confirm_subscriptions(nc: NatsClient) -> None:
    """Return once the server has every subscription made so far on ``nc``.

    nats-py 2.16 writes a flush's PING straight to the socket while a SUB may still wait
    in its pending buffer (the flusher task writes it later), so one ``flush()`` can return
    before the server saw the SUB and a publish right after it is lost (docs/decisions/0018).
    The first flush gets the buffer written; the second PING then travels behind the SUB,
    and its PONG proves the server processed it."""
    await nc.flush()
    await nc.flush()


async def publish(
    js: JetStreamContext, subject: str, record: msgspec.Struct, msg_id: str | None = None
) -> int:
    """Append ``record`` to the stream that captures ``subject``; returns its sequence. The
    current trace context rides in the headers (W3C ``traceparent``), so a reader of the
    log continues the trace of whoever wrote the record."""
    return (await send_record(js, subject, encode(record), record_headers(msg_id, {}))).seq


def record_headers(msg_id: str | None, conditions: dict[str, str]) -> dict[str, str]:
    """A record's headers: its ``Nats-Msg-Id``, ``conditions`` and the current trace
    context (W3C ``traceparent``); call it in the writer's context."""
    headers = {**conditions, "Nats-Msg-Id": msg_id} if msg_id else dict(conditions)
    propagate.inject(headers)
    return headers


async def send_record(
    js: JetStreamContext, subject: str, data: bytes, headers: dict[str, str]
) -> PubAck:
    """One append of encoded ``data``: with a ``Nats-Msg-Id`` in ``headers`` it is sent
    again until acknowledged (see ``PUBLISH_ATTEMPTS``), without one it is sent once."""
    if "Nats-Msg-Id" not in headers:
        return await js.publish(subject, data, headers=headers or None)
    for attempt in range(1, PUBLISH_ATTEMPTS):
        try:
            return await js.publish(
                subject, data, timeout=PUBLISH_TIMEOUT_S, headers=headers or None
            )
        except nats.errors.TimeoutError:
            log.info("publish not acknowledged; sent again", subject=subject, attempt=attempt)
    return await js.publish(subject, data, timeout=PUBLISH_TIMEOUT_S, headers=headers or None)


def decode_record(subject: str, data: bytes) -> msgspec.Struct:
    """Decode a log record by its subject (raises ``ValidationError``); only services write
    the log (``codec.decode``'s ``own``). A lifecycle event must be filed under its own name
    (``event_subject``): readers that filter by name (accounting) would never see a record
    filed under another, so every reader refuses it alike and no two folds differ."""
    kind = kind_of(subject)
    record = codec.decode(kind, data, own=True)
    if kind is Kind.EVENTS:
        name, filed = m.EVENT_NAME.get(type(record)), s.event_name(subject)
        if name != filed:
            raise ValidationError(
                "subject",
                f"{subject!r} names the event {filed!r}, but carries a "
                f"{type(record).__name__}"
                + (f" (logged as {name!r})" if name else " (never logged)"),
            )
    return record


def event_subject(allocation: str | None, record: msgspec.Struct) -> str:
    """Where the lifecycle event ``record`` of one of ``allocation``'s workloads is logged:
    ``allot.v1.events.<allocation>.<workload>.<event>``, named by ``messages.EVENT_NAME``."""
    name = m.EVENT_NAME.get(type(record))
    if name is None:
        raise ValidationError("type", f"{type(record).__name__} is not a logged lifecycle event")
    return s.events(allocation, getattr(record, "workload_id"), name)  # noqa: B009


def attach_trace(headers: dict[str, str] | None) -> Token[otel_context.Context] | None:
    """Make the trace context ``headers`` carry (W3C ``traceparent``) the current one; the
    token for ``detach_trace``. Headers without one (tracing off) attach nothing: extracting
    and attaching an empty context cost every record and request a few microseconds."""
    if headers and "traceparent" in headers:
        return otel_context.attach(propagate.extract(headers))
    return None


def detach_trace(token: Token[otel_context.Context] | None) -> None:
    if token is not None:
        otel_context.detach(token)


OnRecord = Callable[[str, msgspec.Struct], Awaitable[None] | None]


REPLY_PREFIXES = ("_INBOX.", "_INBOX_")
"""The only subjects a service answers on: a requester's inbox (``_INBOX.`` or a user's
``_INBOX_<user>.``). The reply subject is the sender's choice and nats-server does not check
it, while a service may publish anywhere: answering a request whose reply subject is a
stream's subject, another team's watch or the JetStream API would publish there with the
service's rights."""


def reply_allowed(reply: str | None) -> bool:
    """Whether a request may be handled: no reply wanted, or a reply to an inbox."""
    return not reply or reply.startswith(REPLY_PREFIXES)


def inbox_replies_only(
    handler: Callable[[Msg], Awaitable[None]],
) -> Callable[[Msg], Awaitable[None]]:
    """``handler`` for a raw subscription, skipping (logged) a request that names a reply
    subject other than an inbox: it is neither handled nor answered."""

    async def guarded(msg: Msg) -> None:
        if reply_allowed(msg.reply):
            await handler(msg)
        else:
            log.warning("request refused: its reply subject is no inbox", subject=msg.subject)

    return guarded


def takes_several_filters(server: ServerVersion) -> bool:
    """Whether ``server`` honours a consumer with several filter subjects (nats-server
    >= 2.10); an older one ignores them and delivers everything."""
    return (server.major, server.minor) >= (2, 10)


HOSTS_SEQ_HEADER = "Allot-Hosts-Seq"
"""On a record that names hosts (``WorkloadPlaced``): the HOSTS sequence its writer had
read when it decided. A reader following both streams hands the record over only once it
has read HOSTS that far (``LogFollower``): its two consumers deliver independently, so a
placement on a host registered a moment before could otherwise arrive before the host's
``HostRegistered`` and be ignored by that reader's fold ("host ... is unknown"): dispatch
would then never list the run to its agent until it restarted."""
HOSTS_WAIT_S = 5.0
"""Longest wait for HOSTS to reach a record's ``HOSTS_SEQ_HEADER``; past it the record is
handed over anyway (logged), as it was before the header: HOSTS may have been deleted and
made again, and a reader must not stop on that. Nor wait that long for each record of a
replay: after a wait in vain, records are not held again until HOSTS has moved on."""

_ACK_V1_TOKENS = 9
"""``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>``"""


def stream_position(msg: Msg) -> tuple[int, int]:
    """(stream sequence, messages pending) of a JetStream delivery, read from its reply
    subject. The common form is split here directly (nats-py's ``Msg.metadata`` builds
    several objects per message); any other form goes through ``Msg.metadata``."""
    tokens = msg.reply.split(".")
    if len(tokens) == _ACK_V1_TOKENS and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[5]), int(tokens[8])
    meta = msg.metadata
    return meta.sequence.stream, meta.num_pending


def consumer_filter(wanted: str | Sequence[str]) -> tuple[str | None, list[str] | None]:
    """``(filter_subject, filter_subjects)`` of a consumer reading ``wanted``: one subject
    goes in the first (any server), several in the second (nats-server 2.10 and later)."""
    subjects = [wanted] if isinstance(wanted, str) else list(wanted)
    return (subjects[0], None) if len(subjects) == 1 else (None, subjects)


@dataclass
class LogFollower:
    """Replays then follows the given streams (see the module docstring)."""

    js: JetStreamContext
    on_record: OnRecord
    streams: Sequence[str] = ("HOSTS", "WORKLOADS")
    subjects: dict[str, str | tuple[str, ...]] = field(default_factory=dict)
    """Optional filter per stream (default: everything in it): a subject, or several
    (nats-server before 2.10 ignores several filters and delivers everything, so a reader
    given several must take any record)."""
    _subs: list[Any] = field(default_factory=list)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    skipped: int = 0
    last_seq: dict[str, int] = field(default_factory=dict)
    """Stream sequence of the last record handed over, per stream."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set after every record handed over (waiters clear it)."""
    _hosts_waited_in_vain: int = -1
    """HOSTS' last sequence read when a wait for it ran out (``HOSTS_WAIT_S``)."""

    async def _stream_end(self, stream: str) -> tuple[int, asyncio.Event]:
        """``stream``'s last sequence now, and the event its replay sets on reaching it (set
        at once for an empty stream)."""
        info = await self.js.stream_info(stream)
        caught_up = asyncio.Event()
        if info.state.messages == 0:
            caught_up.set()
        return info.state.last_seq, caught_up

    async def start(self) -> None:
        """Returns once every stream has been replayed to the end it had when read."""
        for stream in self.streams:
            last, caught_up = await self._stream_end(stream)
            # A callback, not ``sub.messages``: nats-py's iterator creates a task and an
            # ``asyncio.wait`` per message (docs/decisions/0016). The callback runs in the
            # subscription's one task, so records are still handed over one at a time.
            one, several = consumer_filter(self.subjects.get(stream, ">"))
            sub = await self.js.subscribe(
                # With several subjects nats-py takes them from ``filter_subjects``.
                one or ">",
                stream=stream,
                cb=self._receiver(stream, last, caught_up),
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL,
                # A lost consumer (nats-server restarted) is noticed after two missed
                # heartbeats and re-created from the last sequence: 1 s, not nats-py's 10 s.
                idle_heartbeat=ORDERED_HEARTBEAT_S,
                config=ConsumerConfig(filter_subjects=several) if several else None,
            )
            self._subs.append(sub)
            if not caught_up.is_set():
                # A filter may match nothing in a stream that is not empty (USAGE holding
                # rankings but no budget tree yet): no record comes to say "caught up", so
                # without this intake and placement would wait here forever.
                consumer = await sub.consumer_info()
                delivered = consumer.delivered.consumer_seq if consumer.delivered else 0
                if consumer.num_pending == 0 and not delivered:
                    caught_up.set()
            await caught_up.wait()

    def _receiver(
        self, stream: str, last: int, caught_up: asyncio.Event
    ) -> Callable[[Msg], Awaitable[None]]:
        async def receive(msg: Msg) -> None:
            seq, pending = stream_position(msg)
            if stream != "HOSTS" and msg.headers and HOSTS_SEQ_HEADER in msg.headers:
                await self._read_hosts_to(msg.headers[HOSTS_SEQ_HEADER], msg.subject)
            try:
                await self._deliver(msg, stream)
            except Exception:
                # Folds never raise on a record (they ignore what does not fit); a bug
                # that does is logged with the record, and the follower goes on.
                self.skipped += 1
                log.exception("log record not applied", subject=msg.subject, seq=seq)
            self.last_seq[stream] = seq
            self.changed.set()
            if not caught_up.is_set() and (seq >= last or pending == 0):
                caught_up.set()

        return receive

    @property
    def tasks(self) -> list[asyncio.Task[None] | None]:
        """The task handing over each stream's records (nats-py's callback task of its
        subscription); one that is done means that stream is no longer followed."""
        return [getattr(sub._sub, "_wait_for_msgs_task", None) for sub in self._subs]

    async def wait_for(self, stream: str, seq: int, timeout: float) -> bool:
        """Wait until the record at ``seq`` of ``stream`` has been handed over."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.last_seq.get(stream, 0) < seq:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            self.changed.clear()
            if self.last_seq.get(stream, 0) >= seq:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        return True

    async def catch_up(self, stream: str, timeout: float) -> bool:
        """Wait until every record ``stream`` holds now has been handed over."""
        info = await self.js.stream_info(stream)
        return await self.wait_for(stream, info.state.last_seq, timeout)

    async def _read_hosts_to(self, value: str, subject: str) -> None:
        """Wait until HOSTS is read up to ``value`` (a ``HOSTS_SEQ_HEADER``), if this
        follower reads HOSTS at all; the HOSTS records are handed over by their own task."""
        if "HOSTS" not in self.streams:
            return
        try:
            seq = int(value)
        except ValueError:
            log.warning("bad header ignored", header=HOSTS_SEQ_HEADER, value=value[:40])
            return
        read = self.last_seq.get("HOSTS", 0)
        if read >= seq or read == self._hosts_waited_in_vain:
            return
        if not await self.wait_for("HOSTS", seq, HOSTS_WAIT_S):
            self._hosts_waited_in_vain = self.last_seq.get("HOSTS", 0)
            log.warning(
                "HOSTS not read as far as a record needs",
                subject=subject,
                needs=seq,
                read=self._hosts_waited_in_vain,
            )

    async def _deliver(self, msg: Msg, stream: str) -> None:
        try:
            record = decode_record(msg.subject, msg.data)
        except ValidationError as e:
            self.skipped += 1
            log.warning("log record skipped", subject=msg.subject, field=e.field, reason=e.reason)
            return
        copy = replayed(record, stored_at(msg), stream, msg.subject)
        if copy is not None:  # decision 0085
            self.skipped += 1
            log.warning("log record skipped", subject=msg.subject, reason=copy)
            return
        token = attach_trace(msg.headers)  # the writer's trace continues here
        try:
            async with self._lock:
                result = self.on_record(msg.subject, record)
                if result is not None:
                    await result
        finally:
            detach_trace(token)

    async def stop(self) -> None:
        # Unsubscribing cancels each subscription's callback task; then they are awaited.
        tasks = [t for t in self.tasks if t is not None]
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        await stop_tasks(tasks)
        self._subs.clear()
