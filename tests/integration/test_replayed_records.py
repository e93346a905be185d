"""A copy of an earlier record stored again through a pull request's reply subject (what
any login with the consumer API can do: decision 0079) is refused by every reader
(decision 0085). The server is a nats-server of the test's own, its duplicate window cut
to 1 s so the copy is stored (past the window) within the test's time."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import AsyncIterator

import msgspec
import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from allot import bus
from allot.adapters.embedded import EmbeddedNats
from allot.adapters.usage_store import MemoryUsageStore
from allot.bus import history_pages, replays, runtime
from allot.bus import streams as bus_streams
from allot.bus.record_log import JetStreamLog
from allot.eventlog.budget_wire import spec_from_tree
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.services.ranking import RankingService

pytestmark = pytest.mark.integration

WINDOW_S = 1.0


def tree(name: str) -> m.BudgetTreeSet:
    spec = m.BudgetNodeSpec(name="root", children=(m.BudgetNodeSpec(name=name),))
    return m.BudgetTreeSet(at=time.time(), by="ops", tree=spec)


@pytest.fixture
async def nc(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[NatsClient]:
    monkeypatch.setattr(bus_streams, "DUPLICATE_WINDOW_S", WINDOW_S)
    monkeypatch.setattr(replays, "REPLAY_AFTER_S", WINDOW_S)
    with EmbeddedNats() as server:
        conn = await nats.connect(server.url)
        try:
            await bus.ensure_streams(conn.jetstream())
            yield conn
        finally:
            await conn.close()


async def test_an_earlier_budget_tree_stored_again_is_refused_by_every_reader(
    nc: NatsClient,
) -> None:
    js = nc.jetstream()
    first = tree("old")
    await bus.publish(js, s.BUDGET_TREE, first, "tree:first")
    await asyncio.sleep(WINDOW_S + 0.5)
    current = tree("new")
    await bus.publish(js, s.BUDGET_TREE, current, "tree:current")

    # A core subscriber of the subject (as placement is of rankings) hears the copy.
    heard: list[Msg] = []
    watcher = await nc.subscribe(s.BUDGET_TREE, cb=functools.partial(_keep, heard))
    # The replay: a pull consumer of the trees, its first record asked for onto the trees'
    # own subject; the stream stores it anew, its msg id past the window.
    await _first_tree_onto(nc, s.BUDGET_TREE)
    last = await _until_stored(js, 3)
    assert msgspec.json.decode(last.data or b"", type=m.BudgetTreeSet) == first  # it worked
    await _until(lambda: len(heard) == 1)
    await watcher.unsubscribe()
    assert replays.jetstream_delivery(heard[0])  # the copy, as a core subscriber sees it

    # A follower (pushed and polled) hands over the two genuine trees, not the copy.
    for every_s in (None, 0.05):
        got: list[msgspec.Struct] = []
        follower = JetStreamLog(js).follower(
            lambda _subject, record, got=got: got.append(record),
            streams=("USAGE",),
            subjects={"USAGE": s.BUDGET_TREE},
            every_s=every_s,
        )
        await follower.start()
        await follower.stop()
        assert got == [first, current] and follower.skipped == 1

    # The history pages (ranking's answers to operators and the dashboard) leave it out.
    page = await history_pages.read_page(js, m.HistoryQuery(stream="USAGE"))
    assert [r.seq for r in page.records] == [1, 2] and page.omitted == 1

    # Ranking starting on this log takes the current tree, not the copy stored last.
    ranking = RankingService(
        broker=runtime.make_broker("nats://127.0.0.1:1", "ranking"),
        record_log=JetStreamLog(js),
        store=MemoryUsageStore(),
        rank_every_s=3600.0,
    )
    await ranking._load_tree(JetStreamLog(js))
    assert ranking.tree is not None
    assert [c.name for c in spec_from_tree(ranking.tree).children] == ["new"]


async def test_a_genuine_record_stored_at_its_time_is_taken(nc: NatsClient) -> None:
    """The other side: a tree and a host's state written now are read as ever."""
    js = nc.jetstream()
    written = tree("nlp")
    await bus.publish(js, s.BUDGET_TREE, written, "tree:now")
    healthy = m.HostRegistered(host="h1", gpus=8, at=time.time())
    await bus.publish(js, s.host_state("h1"), healthy, "registered:h1")
    got: list[msgspec.Struct] = []
    follower = JetStreamLog(js).follower(
        lambda _subject, record: got.append(record), streams=("HOSTS", "USAGE")
    )
    await follower.start()
    await follower.stop()
    assert got == [healthy, written] and follower.skipped == 0


async def _first_tree_onto(nc: NatsClient, subject: str) -> None:
    """The replay, as any login with the consumer API may: a pull consumer of USAGE's trees,
    its first record asked for onto ``subject``."""
    name = f"replay-{abs(hash(subject))}"
    await nc.jetstream().add_consumer(
        "USAGE",
        ConsumerConfig(
            name=name,
            filter_subject=s.BUDGET_TREE,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.NONE,
        ),
    )
    request = json.dumps({"batch": 1, "no_wait": True}).encode()
    await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.USAGE.{name}", request, reply=subject)
    await nc.flush()


async def _keep(into: list[Msg], msg: Msg) -> None:
    into.append(msg)


async def _until(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def _until_stored(js: object, seq: int) -> object:
    deadline = time.monotonic() + 10.0
    while True:
        last = await js.get_last_msg("USAGE", s.BUDGET_TREE)  # type: ignore[attr-defined]
        if last.seq >= seq:
            return last
        assert time.monotonic() < deadline, "the copy was not stored"
        await asyncio.sleep(0.02)


async def test_a_record_delivered_into_another_stream_is_refused_whatever_its_time(
    nc: NatsClient,
) -> None:
    """A tree requested onto a host's state subject is stored in HOSTS under the tree's
    own subject, at once (HOSTS dedupes only its own records): every reader of HOSTS,
    which reads all of it, skips it (placement adopted it as its budget tree)."""
    js = nc.jetstream()
    first = tree("old")
    await bus.publish(js, s.BUDGET_TREE, first, "tree:first")
    registered = m.HostRegistered(host="h1", gpus=8, at=time.time())
    await bus.publish(js, s.host_state("h1"), registered, "registered:h1")
    await _first_tree_onto(nc, s.host_state("zz"))
    deadline = time.monotonic() + 10.0
    while (await js.stream_info("HOSTS")).state.messages < 2:
        assert time.monotonic() < deadline, "the copy was not stored"
        await asyncio.sleep(0.02)
    copy = await js.get_msg("HOSTS", 2)
    assert copy.subject == s.BUDGET_TREE  # stored in HOSTS under the tree's own subject

    for every_s in (None, 0.05):
        got: list[msgspec.Struct] = []
        follower = JetStreamLog(js).follower(
            lambda _subject, record, got=got: got.append(record),
            streams=("HOSTS",),
            every_s=every_s,
        )
        await follower.start()
        await follower.stop()
        assert got == [registered] and follower.skipped == 1
    page = await history_pages.read_page(js, m.HistoryQuery(stream="HOSTS"))
    assert [r.seq for r in page.records] == [1] and page.omitted == 1
