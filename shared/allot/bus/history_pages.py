"""One page of a log stream for someone who may not read the log: ``allot.v1.query.history``
(``HistoryQuery`` -> ``HistoryPage`` or ``CommandRejected``), answered by the ranking service
with the services' credentials (decisions 0054, 0080): the CLI's history readers under
logins and the dashboard, which follows the log through these pages only.

A page is read by an ephemeral pull consumer (no acks, in memory, deleted after the page,
dropped by the server ``CONSUMER_INACTIVE_S`` after its last use in any case) from
``start_seq`` or ``start_time``: at most the query's ``limit`` (``HISTORY_PAGE_MAX`` at
most) records and ``max_bytes`` bytes of them, so one request never reads much of the log.
USAGE is read on its budget-tree subject (what a what-if replays), on its idle records
(``idle``: the dashboard's owed page) or on its rankings (``rankings``: what ``allot twin``
replays beside the trees and flags); never its hosts' utilization.

Every record is decoded (``allot.bus.decode_record``, as every reader does); one that does
not decode, or is a copy of an earlier record stored again (``allot.bus.replays``), is left
out and counted (``omitted``), so nothing unchecked reaches the asker. A
submission's record (``WorkloadSubmitted``) is re-encoded without ``command`` and ``env``:
a command line or an environment variable may hold a token, and nothing that reads the
history (export, whatif, budgets history) needs them. Every other record goes as the log
holds it.
"""

from __future__ import annotations

import contextlib
import datetime
import time
import uuid
from collections.abc import Callable, Iterator

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from allot.bus import decode_record, encode, stream_position
from allot.bus.replays import replayed, stored_at
from allot.bus.request_server import RequestServer
from allot.core.errors import ValidationError
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s

log = structlog.get_logger("allot.history")

FILTERS: dict[str, str] = {"WORKLOADS": ">", "HOSTS": ">", "USAGE": s.BUDGET_TREE}
"""Each stream's filter: all of WORKLOADS and HOSTS, the budget trees of USAGE."""
IDLE_FILTER = s.ALL_IDLE
"""USAGE's filter for a query with ``idle``."""
RANKINGS_FILTER = s.RANKING
"""USAGE's filter for a query with ``rankings``."""
MAX_PAGE_BYTES = 512 * 1024
"""The records' bytes one page carries at most (NATS's own limit is 1 MiB a message); a
first record larger than this goes alone, if it fits ``MAX_REPLY_BYTES``."""
MAX_REPLY_BYTES = 1000 * 1024
IN_FLIGHT = 2
"""Pages read at once by one answering service; more wait their turn: a login asking many
pages at once cannot make it read much of the log at a time."""
PENDING = 8
"""Requests that may wait their turn; more are dropped (their askers time out): a burst,
its asker gone or not, does not hold everyone else's pages back (decision 0080)."""
CONSUMER_INACTIVE_S = 10.0
FETCH_TIMEOUT_S = 2.0
_ENC = msgspec.json.Encoder()
_EMPTY_PAGE_BYTES = 256
"""The envelope of a page around its records, and each record's ``seq`` and ``subject``
keys, counted generously."""


def check_query(query: m.HistoryQuery) -> None:
    """What the schema cannot say: not both starts, ``idle`` and ``rankings`` of USAGE only
    and not both (raises ``ValidationError``)."""
    if query.start_seq is not None and query.start_time is not None:
        raise ValidationError("start_time", "give start_seq or start_time, not both")
    if query.idle and query.stream != "USAGE":
        raise ValidationError("idle", f"only USAGE holds idle records, not {query.stream}")
    if query.rankings and query.stream != "USAGE":
        raise ValidationError("rankings", f"only USAGE holds rankings, not {query.stream}")
    if query.idle and query.rankings:
        raise ValidationError("rankings", "give idle or rankings, not both (one filter a page)")


def filter_of(query: m.HistoryQuery) -> str:
    """The subject filter the query reads its stream on."""
    if query.idle:
        return IDLE_FILTER
    return RANKINGS_FILTER if query.rankings else FILTERS[query.stream]


def page_records(page: m.HistoryPage) -> Iterator[tuple[int, str, msgspec.Struct]]:
    """A page's records decoded by their subjects, with their sequences; one that does not
    decode is skipped, as every follower skips it."""
    for rec in page.records:
        try:
            yield rec.seq, rec.subject, decode_record(rec.subject, bytes(rec.record))
        except ValidationError:
            continue


def shown(
    subject: str, data: bytes, stored: float | None = None, stream: str | None = None
) -> bytes | None:
    """The record as the asker gets it: as stored, a submission without ``command`` and
    ``env``; None when it does not decode, or is a copy stored again long after its own
    time (``allot.bus.replays``; ``stored``: when the stream stored it): left out."""
    try:
        record = decode_record(subject, data)
    except ValidationError:
        return None
    if replayed(record, stored, stream, subject) is not None:
        return None
    if isinstance(record, m.WorkloadSubmitted) and (record.command or record.env):
        return encode(msgspec.structs.replace(record, command=(), env={}))
    return data


class PageBuilder:
    """Records in, a bounded page out (the pure half of ``read_page``)."""

    def __init__(
        self, limit: int, max_bytes: int = MAX_PAGE_BYTES, stream: str | None = None
    ) -> None:
        self.stream = stream
        """The stream read: a record on a subject it does not capture is left out."""
        self.limit = limit
        self.max_bytes = max_bytes
        self.records: list[m.HistoryRecord] = []
        self.size = 0
        self.omitted = 0
        self.next_seq: int | None = None
        """Set once the page is full: the first sequence it did not take."""

    def full(self) -> bool:
        return self.next_seq is not None

    def add(self, seq: int, subject: str, data: bytes, stored: float | None = None) -> None:
        if self.full():
            return
        if len(self.records) + self.omitted >= self.limit:  # read, taken or not
            self.next_seq = seq
            return
        body = shown(subject, data, stored, self.stream)
        if body is None:
            self.omitted += 1
            log.warning(
                "history record left out: it does not decode, or is a copy stored again",
                subject=subject,
                seq=seq,
            )
            return
        cost = len(body) + len(subject) + 40
        room = self.max_bytes if self.records else MAX_REPLY_BYTES - _EMPTY_PAGE_BYTES
        if self.size + cost > room:
            if not self.records:
                raise ValidationError(
                    "start_seq", f"record {seq} is larger than a reply may carry ({len(body)} B)"
                )
            self.next_seq = seq
            return
        self.records.append(m.HistoryRecord(seq=seq, subject=subject, record=msgspec.Raw(body)))
        self.size += cost

    def page(self, stream: str, after: int, last_seq: int, end: bool, at: float) -> m.HistoryPage:
        """``after``: the next sequence when the page is not full (the last read + 1)."""
        return m.HistoryPage(
            stream=stream,  # type: ignore[arg-type]  # one of HISTORY_STREAMS
            records=tuple(self.records),
            next_seq=self.next_seq if self.next_seq is not None else max(after, 1),
            last_seq=last_seq,
            end=end and not self.full(),
            omitted=self.omitted,
            at=at,
        )


async def read_page(
    js: JetStreamContext,
    query: m.HistoryQuery,
    *,
    max_bytes: int = MAX_PAGE_BYTES,
    timeout: float = FETCH_TIMEOUT_S,
    clock: Callable[[], float] = time.time,
) -> m.HistoryPage:
    """One page of ``query.stream`` (see the module docstring); raises ``ValidationError``
    for a query the schema let through but the log cannot answer."""
    check_query(query)
    stream = query.stream
    info = await js.stream_info(stream)
    last, first = info.state.last_seq, info.state.first_seq
    builder = PageBuilder(query.limit, max_bytes, stream)
    start = max(query.start_seq or 1, first, 1)
    if query.start_time is None and start > last:
        return builder.page(stream, start, last, True, clock())
    wanted = filter_of(query)
    if query.start_time is None and wanted != ">":
        # A filtered read (USAGE, whose rankings and utilization keep coming) starts at
        # its first match, found by one lookup; none: the page is empty and ends there.
        try:
            start = (await js.get_msg(stream, seq=start, subject=wanted, next=True)).seq or start
        except NotFoundError:
            return builder.page(stream, last + 1, last, True, clock())
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE,
        inactive_threshold=CONSUMER_INACTIVE_S,
        mem_storage=True,
        num_replicas=1,
        max_waiting=1,
    )
    if query.start_time is not None:
        config.deliver_policy = DeliverPolicy.BY_START_TIME
        config.opt_start_time = _utc(query.start_time)
    else:
        config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
        config.opt_start_seq = start
    if wanted != ">":
        config.filter_subject = wanted
    config.name = name = f"history-{uuid.uuid4().hex}"
    await js.add_consumer(stream, config)
    sub = await js.pull_subscribe_bind(consumer=name, stream=stream)
    after = start
    try:
        made = await sub.consumer_info()
        pending = made.num_pending or 0
        if query.start_time is not None:  # the first record at or after it (none: last + 1)
            after = (made.delivered.stream_seq if made.delivered else 0) + 1
        while pending > 0 and not builder.full():
            try:
                msgs = await sub.fetch(min(pending, query.limit + 1), timeout=timeout)
            except TimeoutError:  # nats-py's, or asyncio's from a batch's fetch
                break  # nothing more within the wait: the page ends here, not the stream
            for msg in msgs:
                seq, pending = stream_position(msg)
                builder.add(seq, msg.subject, msg.data, stored_at(msg))
                if builder.full():
                    break
                after = seq + 1
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        with contextlib.suppress(NotFoundError, nats.errors.Error, TimeoutError):
            await js.delete_consumer(stream, name)
    if pending == 0 and not builder.full():
        after = max(after, last + 1)  # what is left up to ``last`` does not match the filter
    return builder.page(stream, after, last, pending == 0, clock())


def rejected(e: ValidationError, at: float) -> bytes:
    return _ENC.encode(m.CommandRejected(at=at, field=e.field, reason=e.reason))


async def answer(js: JetStreamContext, body: bytes) -> bytes:
    """The reply's bytes to a ``HistoryQuery`` body: a page or ``CommandRejected``."""
    now = time.time()
    try:
        query = codec.decode_as(m.HistoryQuery, body)
        page = await read_page(js, query)
    except ValidationError as e:
        return rejected(e, now)
    return _ENC.encode(page)


def _utc(at: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(at, tz=datetime.UTC)


def request_server(
    nc: NatsClient, js: JetStreamContext, queue: str, subject: str = s.QUERY_HISTORY
) -> RequestServer:
    """The server of ``subject`` (``QUERY_HISTORY`` or ``DASHBOARD_LOG``) on ``nc`` (queue
    group ``queue``), reading with ``js``'s credentials; at most ``IN_FLIGHT`` pages at
    once, inbox replies only."""
    return RequestServer(
        nc,
        subject,
        queue,
        lambda _subject, body: answer(js, body),
        IN_FLIGHT,
        max_pending=PENDING,
    )
