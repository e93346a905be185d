"""The dashboard's view of the log: pages of ``allot.v1.query.history``, answered by the
ranking service, never the JetStream API (decision 0080: whoever may create a consumer may
steer the server's answers and deliveries onto any subject).

Each round reads one page of WORKLOADS first, then HOSTS, USAGE's budget trees and USAGE's
idle records each to its end, and hands over those before the WORKLOADS page: every record
of HOSTS or USAGE stored before a record of the page is handed over before it (a host
before its placement), which ``LogFollower`` gets from its HOSTS waits; what was stored
meanwhile comes early, as in a ``PolledLogFollower`` round. A round that did not reach
WORKLOADS' end is followed by the next at once; otherwise the next comes ``every_s`` later.
Nothing of a round is handed over unless all of it was read, so a page that fails is read
again from the same place.
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
from allot.sdk import Client, CommandRejectedError, SdkError

log = structlog.get_logger("allot.dashboard")

PAGE_RECORDS = m.HISTORY_PAGE_MAX
PAGE_TIMEOUT_S = 10.0
"""How long one page may take: the answering service reads up to ``PAGE_RECORDS``."""
RETRY_S = (0.25, 0.5, 1.0, 2.0, 5.0)
"""Waits between failed rounds at start (no service answers yet, it timed out or refused
a page), then the last, until one is read."""

OnRecord = Callable[[str, msgspec.Struct], None]


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
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Returns once the log has been read to its end (waiting, as long as it takes,
        for a service to answer the pages)."""
        failures = 0
        while True:
            try:
                if await self._round():
                    break
                failures = 0
            except (SdkError, CommandRejectedError) as e:
                wait = RETRY_S[min(failures, len(RETRY_S) - 1)]
                failures += 1
                log.warning("log pages not read yet", error=str(e), retry_s=wait)
                await asyncio.sleep(wait)
        self._task = asyncio.create_task(self._run(), name="dashboard-log-pages")

    async def stop(self) -> None:
        await stop_tasks([self._task])
        self._task = None

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                ended = await self._round()
                failures = 0
            except (SdkError, CommandRejectedError) as e:
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning("log pages not read", error=str(e), failures=failures)
                ended = True
            if ended:
                await asyncio.sleep(self.every_s)

    async def _round(self) -> bool:
        """One round (see the module docstring); True when WORKLOADS' page was its end."""
        head = await self._page(self.workloads)
        taken = [await self._drain(cursor) for cursor in self.before]
        for each in taken:
            hand = self.on_idle if each.cursor.idle else self.on_record
            for subject, record in each.records:
                hand(subject, record)
            each.cursor.next_seq = each.next_seq
        for _seq, subject, record in page_records(head):
            self.on_record(subject, record)
        self.workloads.next_seq = head.next_seq
        self.rounds += 1
        return head.end

    async def _drain(self, cursor: _Cursor) -> _Taken:
        """Every record of ``cursor``'s stream from its place to the end, not handed over."""
        taken = _Taken(cursor, [], cursor.next_seq)
        while True:
            page = await self._page(cursor, taken.next_seq)
            taken.records += [(subject, rec) for _seq, subject, rec in page_records(page)]
            moved = page.next_seq > taken.next_seq
            taken.next_seq = max(taken.next_seq, page.next_seq)
            if page.end or not moved:  # not moved: the rest comes next round
                return taken

    async def _page(self, cursor: _Cursor, start: int | None = None) -> m.HistoryPage:
        return await self.client.history_page(
            cursor.stream,
            start_seq=start or cursor.next_seq,
            limit=PAGE_RECORDS,
            idle=cursor.idle,
            timeout=self.page_timeout_s,
        )
