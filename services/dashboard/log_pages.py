"""The dashboard's view of the log: pages of ``allot.v1.dashboard.log`` (``HistoryQuery`` ->
``HistoryPage``), answered by the ranking service in slots of their own, never the
JetStream API (decision 0080: whoever may create a consumer may steer the server's answers
and deliveries onto any subject).

Each round reads one page of WORKLOADS first, then HOSTS, USAGE's budget trees and USAGE's
idle records each to its end, and hands over those before the WORKLOADS page: every record
of HOSTS or USAGE stored before a record of the page is handed over before it (a host
before its placement), which ``LogFollower`` gets from its HOSTS waits; what was stored
meanwhile comes early, as in a ``PolledLogFollower`` round. A round that did not reach
WORKLOADS' end is followed by the next at once; otherwise the next comes ``every_s`` later.
Nothing of a round is handed over unless all of it was read (a stream read short of its
end, or a page that does not fit what was asked, fails the round), so a failed round is
read again from the same place, after a wait. A record the fold raises on is logged and
skipped, as ``LogFollower`` skips it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import structlog

from allot.bus.history_pages import page_records
from allot.bus.tasks import stop_tasks
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sdk import Client, CommandRejectedError, SdkError

log = structlog.get_logger("allot.dashboard")

PAGE_RECORDS = m.HISTORY_PAGE_MAX
PAGE_TIMEOUT_S = 10.0
"""How long one page may take: the answering service reads up to ``PAGE_RECORDS``."""
RETRY_S = (0.25, 0.5, 1.0, 2.0, 5.0)
"""Waits between failed rounds (no service answers yet, it timed out or refused a page, a
stream was read short of its end), then the last, until one is read."""

OnRecord = Callable[[str, msgspec.Struct], None]


class RoundFailedError(Exception):
    """A round that cannot be handed over: read again, from the same place."""


@dataclass
class _Cursor:
    stream: str
    idle: bool = False
    next_seq: int = 1


@dataclass
class _Taken:
    cursor: _Cursor
    records: list[tuple[str, msgspec.Struct]]
    next_seq: int


class PagedLogFollower:
    """``on_record``: HOSTS, the budget trees, WORKLOADS; ``on_idle``: the idle records."""

    def __init__(
        self,
        client: Client,
        on_record: OnRecord,
        on_idle: OnRecord,
        *,
        every_s: float,
        page_timeout_s: float = PAGE_TIMEOUT_S,
    ) -> None:
        self.client = client
        self.on_record = on_record
        self.on_idle = on_idle
        self.every_s = every_s
        self.page_timeout_s = page_timeout_s
        self.workloads = _Cursor("WORKLOADS")
        self.before = (_Cursor("HOSTS"), _Cursor("USAGE"), _Cursor("USAGE", idle=True))
        """Read to their ends after each WORKLOADS page and handed over before it."""
        self.rounds = 0
        self.skipped = 0
        """Records the fold raised on (logged, not applied)."""
        self._failures = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Returns once the log has been read to its end (waiting, as long as it takes,
        for a service to answer the pages)."""
        while not await self._try_round():
            pass
        self._task = asyncio.create_task(self._run(), name="dashboard-log-pages")

    async def stop(self) -> None:
        await stop_tasks([self._task])
        self._task = None

    @property
    def following(self) -> bool:
        """Whether the log is still followed (the task reading it has not ended)."""
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        while True:
            if await self._try_round():
                await asyncio.sleep(self.every_s)

    async def _try_round(self) -> bool:
        """One round; True when WORKLOADS' end was reached. A failed round waits (longer
        each time in a row) and says False: read again."""
        try:
            ended = await self._round()
        except (SdkError, CommandRejectedError, RoundFailedError) as e:
            wait = RETRY_S[min(self._failures, len(RETRY_S) - 1)]
            self._failures += 1
            if self._failures <= len(RETRY_S) or self._failures % 20 == 0:
                log.warning("log pages not read", error=str(e), failures=self._failures)
            await asyncio.sleep(wait)
            return False
        self._failures = 0
        return ended

    async def _round(self) -> bool:
        """One round (see the module docstring); True when WORKLOADS' page was its end."""
        head = await self._page(self.workloads, self.workloads.next_seq)
        taken = [await self._drain(cursor) for cursor in self.before]
        for each in taken:
            hand = self.on_idle if each.cursor.idle else self.on_record
            for subject, record in each.records:
                self._hand(hand, subject, record)
            each.cursor.next_seq = each.next_seq
        for _seq, subject, record in page_records(head):
            self._hand(self.on_record, subject, record)
        self.workloads.next_seq = head.next_seq  # past its start (``check_page``)
        self.rounds += 1
        return head.end

    def _hand(self, hand: OnRecord, subject: str, record: msgspec.Struct) -> None:
        try:
            hand(subject, record)
        except Exception:
            # Folds never raise on a record (they ignore what does not fit); a bug that
            # does is logged with the record, and the follower goes on.
            self.skipped += 1
            log.exception("log record not applied", subject=subject)

    async def _drain(self, cursor: _Cursor) -> _Taken:
        """Every record of ``cursor``'s stream from its place to the end, not handed over
        (a page short of the end that does not move on fails the round: ``check_page``)."""
        taken = _Taken(cursor, [], cursor.next_seq)
        while True:
            page = await self._page(cursor, taken.next_seq)
            taken.records += [(subject, rec) for _seq, subject, rec in page_records(page)]
            taken.next_seq = page.next_seq
            if page.end:
                return taken

    async def _page(self, cursor: _Cursor, start: int) -> m.HistoryPage:
        page = await self.client.history_page(
            cursor.stream,
            start_seq=start,
            limit=PAGE_RECORDS,
            idle=cursor.idle,
            subject=s.DASHBOARD_LOG,
            timeout=self.page_timeout_s,
        )
        check_page(page, cursor.stream, start)
        return page


def check_page(page: m.HistoryPage, stream: str, start: int) -> None:
    """A page must be of the stream asked, from ``start`` on, in order, and point past what
    it holds, and past ``start`` unless it is the stream's end (a read short of the end that
    did not move, as a service's timed-out fetch answers; raises ``RoundFailedError``). A
    first record past ``start`` is a gap: the stream dropped what came before (its limits),
    said in a warning."""
    seqs = [r.seq for r in page.records]
    if page.stream != stream:
        raise RoundFailedError(f"asked for {stream}, got a page of {page.stream}")
    if seqs and (seqs[0] < start or seqs != sorted(set(seqs)) or page.next_seq <= seqs[-1]):
        raise RoundFailedError(f"a page of {stream} from {start} holds {seqs[0]}..{seqs[-1]}")
    if page.next_seq < start:
        raise RoundFailedError(f"a page of {stream} from {start} goes back to {page.next_seq}")
    if not page.end and page.next_seq == start:
        raise RoundFailedError(f"{stream} did not move past {start}")
    if stream != "USAGE" and seqs and seqs[0] > start and page.omitted == 0:  # unfiltered
        log.warning("log records gone before read", stream=stream, start=start, first=seqs[0])
