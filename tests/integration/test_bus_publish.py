"""``allot.bus.publish`` sends a msg-id'd record again when its ack does not come (a
stream leader's hand-over can lose it), the same bytes and msg id each time; a
``LogFollower`` replays, then follows, past a callback that fails; so does a
``PolledLogFollower`` (the same cases, records taken in batches), which also makes its
consumer again when it is lost."""

from __future__ import annotations

import asyncio
import time

import msgspec
import nats
import nats.errors
import pytest

from allot import bus
from allot.bus import streams as bus_streams
from allot.bus.polled_follower import PolledLogFollower
from allot.eventlog.logfold import LogFold
from allot.proto import messages as m
from allot.proto import subjects as s

pytestmark = pytest.mark.integration

SUBJECT = "allot.test.publish.x"


@pytest.fixture(params=["pushed", "polled"])
def follower_kind(request: pytest.FixtureRequest) -> type[bus.LogFollower]:
    """Each follower case runs with records pushed one at a time and taken in batches."""
    if request.param == "pushed":
        return bus.LogFollower

    def polled(*args: object, **kwargs: object) -> bus.LogFollower:
        return PolledLogFollower(*args, every_s=0.05, **kwargs)  # type: ignore[arg-type]

    return polled  # type: ignore[return-value]


async def test_an_unacknowledged_publish_is_sent_again_with_the_same_msg_id(
    nats_url: str,
) -> None:
    nc = await nats.connect(nats_url)
    seen: list[tuple[bytes, str | None]] = []

    async def lossy_stream(msg: nats.aio.msg.Msg) -> None:
        seen.append((msg.data, (msg.headers or {}).get("Nats-Msg-Id")))
        if len(seen) >= 3:  # the first two acks are lost
            await msg.respond(b'{"stream":"WORKLOADS","seq":7}')

    sub = await nc.subscribe(SUBJECT, cb=lossy_stream)
    try:
        record = m.WorkloadRequeued(workload_id="w", at=1.0)
        seq = await bus.publish(nc.jetstream(), SUBJECT, record, "requeued:w:1")
    finally:
        await sub.unsubscribe()
        await nc.close()
    assert seq == 7
    assert len(seen) == 3
    assert {data for data, _ in seen} == {bus.encode(record)}
    assert {msg_id for _, msg_id in seen} == {"requeued:w:1"}


async def test_a_publish_never_acknowledged_fails_after_the_last_try(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    tries = 0

    async def silent_stream(_: nats.aio.msg.Msg) -> None:
        nonlocal tries
        tries += 1

    sub = await nc.subscribe(SUBJECT, cb=silent_stream)
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await bus.publish(
                nc.jetstream(), SUBJECT, m.WorkloadRequeued(workload_id="w", at=1.0), "r"
            )
    finally:
        await sub.unsubscribe()
        await nc.close()
    assert tries == bus.PUBLISH_ATTEMPTS


async def test_a_follower_replays_then_follows_and_survives_a_failing_callback(
    fresh_log: str, follower_kind: type[bus.LogFollower]
) -> None:
    """Records are handed over once each, in stream order, replayed then live; one whose
    callback raises is counted and logged, and the records after it still arrive."""
    nc, js = await bus.connect(fresh_log, "test-follower")
    await bus.ensure_streams(js)
    subject = s.events("nlp", "w1", "requeued")

    def record(i: int) -> m.WorkloadRequeued:
        return m.WorkloadRequeued(workload_id="w1", allocation="nlp", at=float(i), attempt=i)

    for i in range(1, 4):  # replayed
        await bus.publish(js, subject, record(i))
    seen: list[float] = []

    def on_record(_subject: str, rec: msgspec.Struct) -> None:
        assert isinstance(rec, m.WorkloadRequeued)
        if rec.attempt == 2:
            raise RuntimeError("a bug in a fold")
        seen.append(rec.at)

    follower = follower_kind(js, on_record, streams=("WORKLOADS",))
    await follower.start()
    tasks = follower.tasks
    try:
        assert seen == [1.0, 3.0] and follower.skipped == 1  # replayed to the end first
        last = 0
        for i in range(4, 7):  # live
            last = await bus.publish(js, subject, record(i))
        assert await follower.wait_for("WORKLOADS", last, timeout=5.0)
        assert seen == [1.0, 3.0, 4.0, 5.0, 6.0]
        assert follower.last_seq["WORKLOADS"] == last
        assert tasks and all(t is not None and not t.done() for t in tasks)
    finally:
        await follower.stop()
        await nc.close()
    assert all(t is not None and t.done() for t in tasks)  # stop() ends the delivery task


async def test_a_placement_waits_for_the_registration_of_its_host(
    fresh_log: str, follower_kind: type[bus.LogFollower]
) -> None:
    """HOSTS and WORKLOADS are delivered by two consumers, so a placement on a host
    registered a moment before can reach a reader first: here it is appended first, saying
    its writer had read HOSTS one record further. The follower hands it over only after the
    host's registration, and the fold places the workload instead of ignoring it ("host
    h2 is unknown"; dispatch then never listed the run to its agent)."""
    nc, js = await bus.connect(fresh_log, "test-hosts-order")
    await bus.ensure_streams(js)
    await bus.publish(js, s.host_state("h1"), m.HostRegistered(host="h1", gpus=8, at=time.time()))
    await bus.publish(js, s.LEADER, m.LeaderElected(epoch=1, leader="p", at=1.0))
    submitted = m.WorkloadSubmitted(
        workload_id="w1", client_id="c1", user="ana", gpus=2, allocation="nlp", at=2.0
    )
    await bus.publish(js, s.events("nlp", "w1", "submitted"), submitted)
    fold = LogFold()

    def on_record(_subject: str, record: msgspec.Struct) -> None:
        fold.apply(record)

    follower = follower_kind(js, on_record)
    await follower.start()
    try:
        assert follower.last_seq["HOSTS"] == 1 and fold.records["w1"].status == "pending"
        placed = m.WorkloadPlaced(
            workload_id="w1",
            allocation="nlp",
            at=3.0,
            gpus=2,
            assignment=(m.HostGpus(host="h2", gpus=(0, 1)),),
            epoch=1,
        )
        seq = await js.publish(
            s.events("nlp", "w1", "placed"),
            bus.encode(placed),
            headers={bus.HOSTS_SEQ_HEADER: "2"},  # h2's registration, not yet appended
        )
        await asyncio.sleep(0.3)
        assert follower.last_seq.get("WORKLOADS", 0) < seq.seq  # held back, not ignored
        await bus.publish(
            js, s.host_state("h2"), m.HostRegistered(host="h2", gpus=4, at=time.time())
        )
        assert await follower.wait_for("WORKLOADS", seq.seq, timeout=5.0)
        assert fold.records["w1"].status == "running"
        assert fold.workload_on("h2") == {"w1"}
    finally:
        await follower.stop()
        await nc.close()


async def test_a_reader_does_not_stop_on_hosts_that_never_come(
    fresh_log: str, monkeypatch: pytest.MonkeyPatch, follower_kind: type[bus.LogFollower]
) -> None:
    """Records naming HOSTS sequences that never come (HOSTS deleted and made again) are
    handed over after one wait in vain, not one wait each."""
    monkeypatch.setattr(bus, "HOSTS_WAIT_S", 0.3)
    nc, js = await bus.connect(fresh_log, "test-hosts-gone")
    await bus.ensure_streams(js)
    await bus.publish(js, s.host_state("h1"), m.HostRegistered(host="h1", gpus=8, at=time.time()))
    subject = s.events("nlp", "w1", "requeued")
    for i in range(1, 4):
        await js.publish(
            subject,
            bus.encode(m.WorkloadRequeued(workload_id="w1", allocation="nlp", at=float(i))),
            headers={bus.HOSTS_SEQ_HEADER: str(100 + i)},
        )
    seen: list[float] = []

    def on_record(_subject: str, record: msgspec.Struct) -> None:
        if isinstance(record, m.WorkloadRequeued):
            seen.append(record.at)

    follower = follower_kind(js, on_record)
    waits: list[int] = []
    wait_for = follower.wait_for

    async def counted(stream: str, seq: int, timeout: float) -> bool:
        if stream == "HOSTS":
            waits.append(seq)
        return await wait_for(stream, seq, timeout)

    monkeypatch.setattr(follower, "wait_for", counted)
    try:
        await follower.start()
        assert seen == [1.0, 2.0, 3.0]
        assert waits == [101]  # one wait in vain; HOSTS did not move on after it
    finally:
        await follower.stop()
        await nc.close()


async def test_a_filter_that_matches_nothing_yet_is_caught_up_at_once(
    fresh_log: str, follower_kind: type[bus.LogFollower]
) -> None:
    """USAGE holds a ranking but no budget tree: a reader of the tree alone (intake,
    placement) starts at once, and then reads the tree when it comes; so does a reader
    with several filters (which nats-server before 2.10 ignores: it delivers everything)."""
    nc, js = await bus.connect(fresh_log, "test-filter-none")
    await bus.ensure_streams(js)
    await js.publish(s.RANKING, b"{}")
    seen: list[str] = []

    def on_record(subject: str, _record: msgspec.Struct) -> None:
        seen.append(subject)

    one = follower_kind(
        js, lambda _s, _r: None, streams=("USAGE",), subjects={"USAGE": s.BUDGET_TREE}
    )
    several = follower_kind(
        js,
        on_record,
        streams=("USAGE", "WORKLOADS"),
        subjects={"WORKLOADS": (s.every_workload("placed"), s.LEADER)},
    )
    try:
        await asyncio.wait_for(one.start(), 10.0)
        await bus.publish(
            js,
            s.events("nlp", "w1", "requeued"),
            m.WorkloadRequeued(workload_id="w1", allocation="nlp", at=1.0),
        )
        await asyncio.wait_for(several.start(), 10.0)
        spec = m.BudgetNodeSpec(name="root", children=(m.BudgetNodeSpec(name="nlp"),))
        tree = await bus.publish(
            js, s.BUDGET_TREE, m.BudgetTreeSet(at=time.time(), by="t", tree=spec)
        )
        leader = await bus.publish(js, s.LEADER, m.LeaderElected(epoch=1, leader="p", at=3.0))
        assert await one.wait_for("USAGE", tree, timeout=5.0)
        assert one.last_seq["USAGE"] == tree
        assert await several.wait_for("WORKLOADS", leader, timeout=5.0)
        assert await several.wait_for("USAGE", tree, timeout=5.0)  # its own consumer
        assert seen.count(s.BUDGET_TREE) == 1 and seen.count(s.LEADER) == 1
        version = nc.connected_server_version
        if (version.major, version.minor) >= (2, 10):  # an older server ignores filters
            assert not any(x.endswith(".requeued") for x in seen)
    finally:
        await one.stop()
        await several.stop()
        await nc.close()


async def test_usage_keeps_the_budget_tree_however_many_rankings_follow(
    fresh_log: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing in USAGE ages out (a tree set once must outlive a quiet month, or every
    allocation becomes unknown): each subject keeps its last messages, so rankings cannot
    push the tree out either. Here each keeps 3."""
    monkeypatch.setattr(bus_streams, "USAGE_KEPT_PER_SUBJECT", 3)
    nc, js = await bus.connect(fresh_log, "test-usage-kept")
    try:
        await bus.ensure_streams(js)
        info = await js.stream_info("USAGE")
        assert info.config.max_age in (0, None) and info.config.max_msgs_per_subject == 3
        spec = m.BudgetNodeSpec(name="root", children=(m.BudgetNodeSpec(name="nlp"),))
        tree = await bus.publish(
            js, s.BUDGET_TREE, m.BudgetTreeSet(at=time.time(), by="t", tree=spec)
        )
        for i in range(5):
            await js.publish(s.RANKING, f'{{"n":{i}}}'.encode())
        info = await js.stream_info("USAGE")
        assert info.state.messages == 4  # the tree and the last 3 rankings
        assert (await js.get_last_msg("USAGE", s.BUDGET_TREE)).seq == tree
        assert (await js.get_last_msg("USAGE", s.RANKING)).data == b'{"n":4}'
    finally:
        await nc.close()


def _unnamed_workloads() -> nats.js.api.StreamConfig:
    """WORKLOADS as created before lifecycle events were named in their subjects."""
    config = next(c for c in bus.stream_configs() if c.name == "WORKLOADS")
    config.subjects = [bus.UNNAMED_EVENTS if x == s.ALL_EVENTS else x for x in config.subjects]
    return config


async def test_a_log_of_unnamed_events_is_refused_not_half_read(fresh_log: str) -> None:
    """Records on ``allot.v1.events.<a>.<w>`` would be skipped by every reader, so each
    service would start from a log missing its history: starting is refused, saying why."""
    nc, js = await bus.connect(fresh_log, "test-unnamed")
    try:
        await js.add_stream(_unnamed_workloads())
        await js.publish("allot.v1.events.nlp.w1", b'{"type":"WorkloadRequeued"}')
        with pytest.raises(bus.UnreadableLogError) as caught:
            await bus.ensure_streams(js)
        assert "WORKLOADS holds 1 records" in str(caught.value)
        assert s.ALL_EVENTS in str(caught.value)
    finally:
        await nc.close()


async def test_an_empty_stream_of_the_old_form_is_brought_up_to_date(fresh_log: str) -> None:
    nc, js = await bus.connect(fresh_log, "test-unnamed-empty")
    try:
        await js.add_stream(_unnamed_workloads())
        await bus.ensure_streams(js)
        subjects = (await js.stream_info("WORKLOADS")).config.subjects or []
        assert s.ALL_EVENTS in subjects and bus.UNNAMED_EVENTS not in subjects
    finally:
        await nc.close()


async def test_a_polled_follower_makes_its_lost_consumer_again_past_what_it_handed_over(
    fresh_log: str,
) -> None:
    """The polled follower's consumer removed (as a nats-server restart loses it) while
    records keep coming: it is made again from the last record handed over, so every
    record arrives once, in order, none lost in the gap and none handed over twice."""
    nc, js = await bus.connect(fresh_log, "test-polled-lost")
    await bus.ensure_streams(js)
    subject = s.events("nlp", "w1", "requeued")
    seen: list[int] = []

    def on_record(_subject: str, rec: msgspec.Struct) -> None:
        assert isinstance(rec, m.WorkloadRequeued)
        seen.append(rec.attempt)

    def record(i: int) -> m.WorkloadRequeued:
        return m.WorkloadRequeued(workload_id="w1", allocation="nlp", at=float(i), attempt=i)

    for i in range(1, 4):
        await bus.publish(js, subject, record(i))
    follower = PolledLogFollower(js, on_record, streams=("WORKLOADS",), every_s=0.05)
    await follower.start()
    try:
        assert seen == [1, 2, 3]
        lost = follower.consumers["WORKLOADS"]
        await js.delete_consumer("WORKLOADS", lost)
        last = 0
        for i in range(4, 8):
            last = await bus.publish(js, subject, record(i))
        assert await follower.wait_for("WORKLOADS", last, timeout=10.0)
        assert seen == list(range(1, 8))
        assert follower.consumers["WORKLOADS"] != lost
    finally:
        await follower.stop()
        await nc.close()
