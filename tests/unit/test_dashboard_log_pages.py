"""``allot.services.dashboard.log_pages``: the dashboard's rounds of history pages against
a fake client (the order records are handed over in, a page that fails, paging)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from allot.bus import encode
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sdk import NoResponderError
from allot.services.dashboard import log_pages
from allot.services.dashboard.log_pages import PagedLogFollower

Key = tuple[str, bool]


def leader(epoch: int) -> tuple[str, bytes]:
    return s.LEADER, encode(m.LeaderElected(epoch=epoch, leader="p", at=1.0))


class Log:
    """Four lists of (subject, data) as the history query pages them, ``page`` a time; a
    hook runs after each page (records stored meanwhile), ``fail`` raises once at a key."""

    def __init__(self, page: int) -> None:
        self.page = page
        self.rows: dict[Key, list[tuple[str, bytes]]] = {
            ("WORKLOADS", False): [],
            ("HOSTS", False): [],
            ("USAGE", False): [],
            ("USAGE", True): [],
        }
        self.asked: list[tuple[str, bool, int]] = []
        self.after_page: list[tuple[Key, tuple[str, bytes]]] = []
        self.fail: Key | None = None

    async def history_page(
        self, stream: str, *, start_seq: int, limit: int, idle: bool, timeout: float
    ) -> m.HistoryPage:
        key = (stream, idle)
        self.asked.append((stream, idle, start_seq))
        if self.fail == key:
            self.fail = None
            raise NoResponderError(s.QUERY_HISTORY, "ranking service")
        stored = self.rows[key]
        first = start_seq - 1
        taken = stored[first : first + min(limit, self.page)]
        records = tuple(
            m.HistoryRecord(seq=first + i + 1, subject=j, record=msgspec.Raw(d))
            for i, (j, d) in enumerate(taken)
        )
        nxt = first + len(taken) + 1
        page = m.HistoryPage(
            stream=stream,  # type: ignore[arg-type]
            records=records,
            next_seq=nxt,
            last_seq=len(stored),
            end=nxt > len(stored),
            at=1.0,
        )
        while self.after_page:
            k, row = self.after_page.pop(0)
            self.rows[k].append(row)
        return page


def follower(log: Log) -> tuple[PagedLogFollower, list[tuple[str, int]]]:
    got: list[tuple[str, int]] = []

    def on(kind: str) -> log_pages.OnRecord:
        def take(_subject: str, record: msgspec.Struct) -> None:
            assert isinstance(record, m.LeaderElected)
            got.append((kind, record.epoch))

        return take

    f = PagedLogFollower(log, on("log"), on("idle"), every_s=0.01)  # type: ignore[arg-type]
    return f, got


def test_hosts_and_usage_stored_while_a_workloads_page_was_read_come_before_it() -> None:
    log = Log(page=10)
    log.rows["WORKLOADS", False] = [leader(1), leader(2)]
    # Stored after the WORKLOADS page was read: handed over before it all the same, as
    # every record of HOSTS stored before a page's records must be.
    log.after_page = [(("HOSTS", False), leader(10)), (("USAGE", True), leader(30))]
    f, got = follower(log)
    assert asyncio.run(f._round())
    assert got == [("log", 10), ("idle", 30), ("log", 1), ("log", 2)]
    assert [a[0] for a in log.asked[:2]] == ["WORKLOADS", "HOSTS"]


def test_start_reads_every_page_and_a_failed_round_hands_nothing_over() -> None:
    log = Log(page=2)
    log.rows["WORKLOADS", False] = [leader(k) for k in range(1, 6)]
    log.rows["HOSTS", False] = [leader(k) for k in range(10, 13)]
    log.rows["USAGE", False] = [leader(20)]
    log.fail = ("USAGE", True)  # the first round fails after reading three streams

    async def run() -> None:
        f, got = follower(log)
        await f.start()
        await f.stop()
        # HOSTS (all of it, over two pages) and the tree before the first WORKLOADS page;
        # nothing twice, though the first round was read again.
        assert got == [
            ("log", 10),
            ("log", 11),
            ("log", 12),
            ("log", 20),
            ("log", 1),
            ("log", 2),
            ("log", 3),
            ("log", 4),
            ("log", 5),
        ]
        assert f.workloads.next_seq == 6 and f.rounds == 3

    asyncio.run(run())
    assert log.asked.count(("WORKLOADS", False, 1)) == 2  # the failed round again


def test_live_rounds_take_what_is_stored_later() -> None:
    log = Log(page=100)

    async def run() -> None:
        f, got = follower(log)
        await f.start()
        log.rows["HOSTS", False].append(leader(7))
        log.rows["WORKLOADS", False].append(leader(8))
        for _ in range(200):
            if len(got) == 2:
                break
            await asyncio.sleep(0.01)
        await f.stop()
        assert got == [("log", 7), ("log", 8)]

    asyncio.run(run())


@pytest.mark.parametrize("stream", ["HOSTS", "WORKLOADS"])
def test_an_undecodable_record_is_skipped(stream: str) -> None:
    log = Log(page=10)
    log.rows[stream, False] = [leader(1), (s.LEADER, b"not json"), leader(3)]
    f, got = follower(log)
    assert asyncio.run(f._round())
    assert got == [("log", 1), ("log", 3)]
