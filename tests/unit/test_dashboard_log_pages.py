"""``allot.services.dashboard.log_pages``: the dashboard's rounds of history pages against
a fake client (the order records are handed over in, a page that fails or is cut short,
paging, a fold that raises)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from allot.bus import encode
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sdk import NoResponderError
from allot.services.dashboard import log_pages
from allot.services.dashboard.log_pages import PagedLogFollower, RoundFailedError

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
        self.short: Key | None = None
        """Answered once as a service whose fetch timed out: nothing, not the end."""

    async def history_page(
        self,
        stream: str,
        *,
        start_seq: int,
        limit: int,
        idle: bool,
        subject: str,
        timeout: float,
    ) -> m.HistoryPage:
        assert subject == s.DASHBOARD_LOG  # the dashboard's own slots, not query.history
        key = (stream, idle)
        self.asked.append((stream, idle, start_seq))
        if self.fail == key:
            self.fail = None
            raise NoResponderError(s.DASHBOARD_LOG, "ranking service")
        if self.short == key:
            self.short = None
            last = len(self.rows[key])
            return m.HistoryPage(
                stream=stream,  # type: ignore[arg-type]
                records=(),
                next_seq=start_seq,
                last_seq=last,
                end=False,
                at=1.0,
            )
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


def follower(log: Log, raise_on: int = -1) -> tuple[PagedLogFollower, list[tuple[str, int]]]:
    got: list[tuple[str, int]] = []

    def on(kind: str) -> log_pages.OnRecord:
        def take(_subject: str, record: msgspec.Struct) -> None:
            assert isinstance(record, m.LeaderElected)
            if record.epoch == raise_on:
                raise RuntimeError("a fold's bug")
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


def test_a_stream_read_short_of_its_end_holds_the_workloads_page_back() -> None:
    """A service whose fetch timed out answers a page that is not the end and did not move:
    the WORKLOADS page may not go before the HOSTS records it may need."""
    log = Log(page=10)
    log.rows["WORKLOADS", False] = [leader(1)]
    log.rows["HOSTS", False] = [leader(10)]
    log.short = ("HOSTS", False)
    f, got = follower(log)
    with pytest.raises(RoundFailedError):
        asyncio.run(f._round())
    assert got == [] and f.workloads.next_seq == 1
    assert asyncio.run(f._round())
    assert got == [("log", 10), ("log", 1)]


def test_a_record_the_fold_raises_on_is_skipped_and_the_rest_follows() -> None:
    log = Log(page=10)
    log.rows["WORKLOADS", False] = [leader(1), leader(2), leader(3)]
    f, got = follower(log, raise_on=2)

    async def run() -> None:
        await f.start()
        log.rows["WORKLOADS", False].append(leader(4))
        for _ in range(200):
            if len(got) == 3:
                break
            await asyncio.sleep(0.01)
        assert f.following
        await f.stop()

    asyncio.run(run())
    assert got == [("log", 1), ("log", 3), ("log", 4)] and f.skipped == 1


def page(stream: str, seqs: list[int], next_seq: int) -> m.HistoryPage:
    data = encode(m.LeaderElected(epoch=1, leader="p", at=1.0))
    return m.HistoryPage(
        stream=stream,  # type: ignore[arg-type]
        records=tuple(
            m.HistoryRecord(seq=q, subject=s.LEADER, record=msgspec.Raw(data)) for q in seqs
        ),
        next_seq=next_seq,
        last_seq=max([*seqs, next_seq - 1]),
        end=True,
        at=1.0,
    )


@pytest.mark.parametrize(
    ("got", "why"),
    [
        (page("HOSTS", [5, 6], 7), "got a page of HOSTS"),
        (page("WORKLOADS", [4, 5], 6), "holds 4..5"),
        (page("WORKLOADS", [6, 5], 7), "holds 6..5"),
        (page("WORKLOADS", [5, 5], 6), "holds 5..5"),
        (page("WORKLOADS", [5, 6], 6), "holds 5..6"),
        (page("WORKLOADS", [], 3), "goes back to 3"),
    ],
)
def test_a_page_that_does_not_fit_the_question_fails_the_round(
    got: m.HistoryPage, why: str
) -> None:
    with pytest.raises(RoundFailedError) as caught:
        log_pages.check_page(got, "WORKLOADS", 5)
    assert why in str(caught.value)
    log_pages.check_page(page("WORKLOADS", [5, 6], 7), "WORKLOADS", 5)
