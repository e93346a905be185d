"""``allot.bus.history_pages`` (the pure half: a bounded page, what a record shows) and
``allot.ops.log_reader.read_pages`` against a fake client; the query's validation."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from allot.bus import encode
from allot.bus import history_pages as hp
from allot.core.errors import ValidationError
from allot.ops import log_reader
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.sdk import NoResponderError
from memory_log import subject_matches

SUBMITTED = m.WorkloadSubmitted(
    workload_id="w-1",
    client_id="c-1",
    user="u",
    gpus=1,
    allocation="nlp",
    command=("train.py", "--token=s3cret"),
    env={"API_TOKEN": "s3cret"},
    at=1.0,
)
SUBJECT = s.events("nlp", "w-1", m.EVENT_NAME[m.WorkloadSubmitted])
LEADER = m.LeaderElected(epoch=1, leader="p1", at=1.0)


def test_a_submission_is_shown_without_its_command_and_env() -> None:
    body = hp.shown(SUBJECT, encode(SUBMITTED))
    assert body is not None and b"s3cret" not in body
    record = msgspec.json.decode(body, type=m.WorkloadSubmitted)
    assert record == msgspec.structs.replace(SUBMITTED, command=(), env={})


def test_other_records_go_as_stored_and_undecodable_ones_not_at_all() -> None:
    data = encode(LEADER)
    assert hp.shown(s.LEADER, data) is data
    assert hp.shown(s.LEADER, b'{"type": "LeaderElected"') is None
    # A submission filed under another event's name is refused as every reader refuses it.
    assert hp.shown(s.events("nlp", "w-1", "completed"), encode(SUBMITTED)) is None


def test_a_page_stops_at_its_limit_and_names_the_next_sequence() -> None:
    b = hp.PageBuilder(limit=2)
    for seq in (5, 6, 7, 8):
        b.add(seq, s.LEADER, encode(LEADER))
    page = b.page("WORKLOADS", 99, last_seq=8, end=True, at=2.0)
    assert [r.seq for r in page.records] == [5, 6]
    assert (page.next_seq, page.end) == (7, False)


def test_undecodable_records_count_against_the_limit() -> None:
    b = hp.PageBuilder(limit=2)
    for seq in (1, 2, 3):
        b.add(seq, s.LEADER, b"not json")
    page = b.page("WORKLOADS", 3, last_seq=3, end=True, at=2.0)
    assert (page.records, page.omitted, page.next_seq, page.end) == ((), 2, 3, False)


def test_a_page_stops_at_its_byte_bound_but_always_takes_one_record() -> None:
    size = len(encode(LEADER)) + len(s.LEADER) + 40
    b = hp.PageBuilder(limit=100, max_bytes=2 * size)
    for seq in range(1, 6):
        b.add(seq, s.LEADER, encode(LEADER))
    page = b.page("WORKLOADS", 6, last_seq=5, end=True, at=2.0)
    assert [r.seq for r in page.records] == [1, 2] and page.next_seq == 3 and not page.end
    one = hp.PageBuilder(limit=100, max_bytes=1)
    one.add(1, s.LEADER, encode(LEADER))
    assert len(one.records) == 1


def test_a_page_fits_a_nats_message() -> None:
    big = m.LeaderElected(epoch=1, leader="p" * 64, at=1.0)
    b = hp.PageBuilder(limit=m.HISTORY_PAGE_MAX)
    for seq in range(1, m.HISTORY_PAGE_MAX + 1):
        b.add(seq, s.LEADER, encode(big))
    reply = msgspec.json.encode(b.page("WORKLOADS", 1, 1, True, 2.0))
    assert len(reply) <= hp.MAX_REPLY_BYTES


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"type": "HistoryQuery", "stream": "WORKLOADS", "limit": 0}', "limit"),
        (b'{"type": "HistoryQuery", "stream": "WORKLOADS", "limit": 1001}', "limit"),
        (b'{"type": "HistoryQuery", "stream": "RANKINGS"}', "stream"),
        (b'{"type": "HistoryQuery", "stream": "HOSTS", "start_seq": 0}', "start_seq"),
        (b'{"type": "HistoryQuery", "stream": "HOSTS", "colour": 1}', "colour"),
    ],
)
def test_a_bad_query_is_refused_naming_the_field(body: bytes, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        codec.decode_as(m.HistoryQuery, body)
    assert caught.value.field == field


def test_both_starts_are_refused_naming_start_time() -> None:
    query = m.HistoryQuery(stream="HOSTS", start_seq=1, start_time=5.0)
    with pytest.raises(ValidationError) as caught:
        hp.check_query(query)
    assert caught.value.field == "start_time"
    reply = asyncio.run(hp.answer(None, codec.encode(query)))  # type: ignore[arg-type]
    rejected = msgspec.json.decode(reply, type=m.CommandRejected)
    assert rejected.field == "start_time"


class FakeClient:
    """``history_page`` over a list of (seq, subject, data), pages of ``page`` records."""

    def __init__(self, records: dict[str, list[tuple[int, str, bytes]]], page: int) -> None:
        self.records, self.page = records, page
        self.asked: list[tuple[str, int]] = []

    async def history_page(
        self,
        stream: str,
        *,
        start_seq: int,
        limit: int,
        idle: bool = False,
        rankings: bool = False,
    ) -> m.HistoryPage:
        """As the ranking service answers: the query's filter, from ``start_seq``."""
        self.asked.append((stream, start_seq))
        query = m.HistoryQuery(stream=stream, idle=idle, rankings=rankings)  # type: ignore[arg-type]
        hp.check_query(query)
        wanted = hp.filter_of(query)
        matching = [r for r in self.records[stream] if subject_matches(wanted, r[1])]
        left = [r for r in matching if r[0] >= start_seq]
        rows = left[: self.page]
        last = self.records[stream][-1][0] if self.records[stream] else 0
        nxt = rows[-1][0] + 1 if rows else start_seq
        if len(rows) == len(left):  # nothing after them matches: the page ends the stream
            nxt = max(nxt, last + 1)
        recs = tuple(m.HistoryRecord(seq=q, subject=j, record=msgspec.Raw(d)) for q, j, d in rows)
        return m.HistoryPage(
            stream=stream,  # type: ignore[arg-type]
            records=recs,
            next_seq=nxt,
            last_seq=last,
            end=nxt > last,
            at=1.0,
        )


def test_read_pages_reads_each_stream_to_its_end_in_order() -> None:
    rows = [
        (k, s.LEADER, encode(m.LeaderElected(epoch=k, leader="p", at=1.0))) for k in (1, 2, 4, 5, 6)
    ]
    client = FakeClient({"HOSTS": [], "USAGE": [], "WORKLOADS": rows}, page=2)
    got: list[Any] = []
    assert asyncio.run(log_reader.read_pages(client, got.append, log_reader.WHOLE_LOG))  # type: ignore[arg-type]
    assert [r.epoch for r in got] == [1, 2, 4, 5, 6]
    assert client.asked == [
        ("HOSTS", 1),
        ("USAGE", 1),
        ("WORKLOADS", 1),
        ("WORKLOADS", 3),
        ("WORKLOADS", 6),
    ]


def test_several_filters_of_usage_are_read_one_by_one_and_handed_over_in_its_order() -> None:
    """``allot twin`` reads USAGE's budget trees, rankings and idle flags: the query reads
    one filter a page, the reader merges them back into the stream's order; what no filter
    asks (the hosts' utilization) is not read."""
    tree = m.BudgetTreeSet(at=1.0, by="ops", tree=m.BudgetNodeSpec(name="root"))
    ranking = m.RankingUpdated(at=2.0, window_s=60.0, nodes=())
    flag = m.WorkloadFlaggedIdle(
        workload_id="w",
        allocation="nlp",
        gpus=1,
        at=3.0,
        idle_since=1.0,
        threshold_pct=5.0,
        window_s=60.0,
    )
    util = m.HostUtilizationRecorded(host="h", since=1.0, until=2.0, at=2.0, parts=())
    rows = [
        (1, s.BUDGET_TREE, encode(tree)),
        (2, s.RANKING, encode(ranking)),
        (3, s.usage_gpu("h"), encode(util)),
        (4, s.idle("nlp", "w"), encode(flag)),
        (5, s.RANKING, encode(msgspec.structs.replace(ranking, at=5.0))),
        (6, s.BUDGET_TREE, encode(msgspec.structs.replace(tree, at=6.0))),
    ]
    client = FakeClient({"USAGE": rows}, page=1)
    twin = {"USAGE": (s.BUDGET_TREE, s.RANKING, s.ALL_IDLE)}
    got: list[Any] = []
    assert asyncio.run(log_reader.read_pages(client, got.append, ("USAGE",), subjects=twin))  # type: ignore[arg-type]
    assert [(type(r).__name__, r.at) for r in got] == [
        ("BudgetTreeSet", 1.0),
        ("RankingUpdated", 2.0),
        ("WorkloadFlaggedIdle", 3.0),
        ("RankingUpdated", 5.0),
        ("BudgetTreeSet", 6.0),
    ]
    assert log_reader.history_queries(("USAGE",), twin) == {
        "USAGE": [{}, {"rankings": True}, {"idle": True}]
    }
    # What the query cannot serve is read from the log itself (or refused under logins).
    assert log_reader.history_queries(("USAGE",), {"USAGE": ">"}) is None
    assert log_reader.history_queries(("WORKLOADS",), {"WORKLOADS": s.LEADER}) is None


def test_rankings_are_read_of_usage_only_and_not_with_idle() -> None:
    rankings = m.HistoryQuery(stream="USAGE", rankings=True)
    hp.check_query(rankings)
    assert hp.filter_of(rankings) == s.RANKING
    for wrong in (
        m.HistoryQuery(stream="HOSTS", rankings=True),
        m.HistoryQuery(stream="USAGE", rankings=True, idle=True),
    ):
        with pytest.raises(ValidationError) as caught:
            hp.check_query(wrong)
        assert caught.value.field == "rankings"


def test_read_pages_falls_back_only_when_no_one_answers_the_first_page() -> None:
    class Nobody:
        async def history_page(self, *_a: object, **_k: object) -> m.HistoryPage:
            raise NoResponderError(s.QUERY_HISTORY, "ranking service")

    assert not asyncio.run(log_reader.read_pages(Nobody(), print, ("HOSTS",), probe=True))  # type: ignore[arg-type]
    with pytest.raises(log_reader.LogUnreadableError):
        asyncio.run(log_reader.read_pages(Nobody(), print, ("HOSTS",)))  # type: ignore[arg-type]


def test_idle_records_are_read_of_usage_only() -> None:
    idle = m.HistoryQuery(stream="USAGE", idle=True)
    hp.check_query(idle)
    assert hp.filter_of(idle) == s.ALL_IDLE
    assert hp.filter_of(m.HistoryQuery(stream="USAGE")) == s.BUDGET_TREE
    assert hp.filter_of(m.HistoryQuery(stream="HOSTS")) == ">"
    wrong = m.HistoryQuery(stream="WORKLOADS", idle=True)
    with pytest.raises(ValidationError) as caught:
        hp.check_query(wrong)
    assert caught.value.field == "idle"
    reply = asyncio.run(hp.answer(None, codec.encode(wrong)))  # type: ignore[arg-type]
    assert msgspec.json.decode(reply, type=m.CommandRejected).field == "idle"


def test_the_filters_of_one_stream_are_read_to_one_cut() -> None:
    """A record stored while the first filter was read is not read by the next one: the
    merged stream is one cut of the log, as one consumer with several filters reads it."""
    tree = m.BudgetTreeSet(at=1.0, by="ops", tree=m.BudgetNodeSpec(name="root"))
    ranking = m.RankingUpdated(at=2.0, window_s=60.0, nodes=())
    rows = [(1, s.BUDGET_TREE, encode(tree)), (2, s.RANKING, encode(ranking))]

    class Growing(FakeClient):
        async def history_page(self, stream: str, **kw: Any) -> m.HistoryPage:
            page = await super().history_page(stream, **kw)
            if not kw.get("rankings") and len(self.records[stream]) == 2:  # stored meanwhile
                later = msgspec.structs.replace(ranking, at=3.0)
                self.records[stream].append((3, s.RANKING, encode(later)))
            return page

    client = Growing({"USAGE": rows}, page=10)
    got: list[Any] = []
    reads = {"USAGE": (s.BUDGET_TREE, s.RANKING)}
    assert asyncio.run(log_reader.read_pages(client, got.append, ("USAGE",), subjects=reads))  # type: ignore[arg-type]
    assert [r.at for r in got] == [1.0, 2.0]


def test_a_query_sends_only_what_it_sets() -> None:
    """A ranking service older than a field answers the queries that leave it out."""
    body = msgspec.json.decode(codec.encode(m.HistoryQuery(stream="USAGE", start_seq=5)))
    assert body == {"type": "HistoryQuery", "stream": "USAGE", "start_seq": 5}
