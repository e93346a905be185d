"""Contract tests for the log port (STYLE rule 11): every case runs against the unit tests'
``MemoryLog`` and the production ``JetStreamLog`` on a real server (its streams emptied first; those
cases carry the ``integration`` marker), so what the handlers rely on behaves alike in
both: sequences, msg-id dedupe, the subject-sequence condition, reads, followers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import msgspec
import nats
import pytest
from nats.js.errors import APIError, NotFoundError

from allot import bus
from allot.bus.record_log import JetStreamLog, RecordLog
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.proto.subjects import STREAMS
from allot.services.intake import EXPECT_NEW_SUBJECT, WRONG_LAST_SEQUENCE
from memory_log import MemoryLog


def host(name: str) -> m.HostRegistered:
    return m.HostRegistered(host=name, gpus=8, at=time.time())


def submitted(wid: str, gpus: int = 1) -> m.WorkloadSubmitted:
    return m.WorkloadSubmitted(
        workload_id=wid, client_id=wid, user="ann", gpus=gpus, allocation="nlp", at=1.0
    )


@pytest.fixture(params=["memory", pytest.param("jetstream", marks=pytest.mark.integration)])
async def record_log(request: pytest.FixtureRequest) -> AsyncIterator[RecordLog]:
    if request.param == "memory":
        yield MemoryLog()
        return
    nc = await nats.connect(request.getfixturevalue("nats_url"))
    js = nc.jetstream()
    for name in STREAMS:  # an empty log (the streams have fixed names)
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)
    await bus.ensure_streams(js)
    try:
        yield JetStreamLog(js)
    finally:
        await nc.close()


async def test_appends_take_sequences_and_a_known_msg_id_stores_nothing(
    record_log: RecordLog,
) -> None:
    first = await record_log.append(s.host_state("h1"), host("h1"), "registered:h1")
    second = await record_log.append(s.host_state("h2"), host("h2"), "registered:h2")
    again = await record_log.append(s.host_state("h1"), host("h1"), "registered:h1")
    assert (first.stream, first.seq, bool(first.duplicate)) == ("HOSTS", 1, False)
    assert (second.seq, bool(second.duplicate)) == (2, False)
    assert (again.seq, again.duplicate) == (1, True)
    last = await record_log.read("HOSTS", s.ALL_HOST_STATE)
    assert last is not None and last.seq == 2


@pytest.mark.parametrize("msg_id", ["submitted:w1", "another id"], ids=["a retry", "another"])
async def test_the_subject_sequence_condition_refuses_any_second_record(
    record_log: RecordLog, msg_id: str
) -> None:
    """nats-server 2.12 and later check the condition before the msg id: a retry of a
    stored append is refused, not deduplicated (intake then compares it with the first
    submission); older servers (2.9) deduplicate a retry first. Either way nothing more is
    stored, and a record under another msg id is refused."""
    subject = bus.event_subject("nlp", submitted("w1"))
    await record_log.append(subject, submitted("w1"), "submitted:w1", EXPECT_NEW_SUBJECT)
    try:
        ack = await record_log.append(subject, submitted("w1"), msg_id, EXPECT_NEW_SUBJECT)
    except APIError as refused:
        assert refused.err_code in WRONG_LAST_SEQUENCE
    else:
        assert msg_id == "submitted:w1", "another record was stored on the subject"
        assert ack.duplicate and ack.seq == 1
    last = await record_log.read("WORKLOADS", subject)
    assert last is not None and last.seq == 1


async def test_read_gives_the_first_or_last_record_on_a_wildcard_subject(
    record_log: RecordLog,
) -> None:
    assert await record_log.read("WORKLOADS", s.workload_events("nlp", "w1")) is None
    start = submitted("w1")
    end = m.WorkloadCompleted(workload_id="w1", allocation="nlp", at=2.0)
    other = submitted("w2")
    for record in (start, end, other):
        await record_log.append(bus.event_subject("nlp", record), record, f"x:{id(record)}")
    first = await record_log.read("WORKLOADS", s.workload_events("nlp", "w1"), first=True)
    last = await record_log.read("WORKLOADS", s.workload_events("nlp", "w1"))
    assert first is not None and last is not None
    assert msgspec.json.decode(first.data or b"", type=m.WorkloadSubmitted) == start
    assert bus.decode_record(last.subject or "", last.data or b"") == end
    assert (first.seq, last.seq) == (1, 2)


@pytest.mark.parametrize("every_s", [None, 0.05], ids=["pushed", "polled"])
async def test_a_follower_replays_then_follows_only_what_it_filters(
    record_log: RecordLog, every_s: float | None
) -> None:
    tree = m.BudgetTreeSet(at=time.time(), by="t", tree=m.BudgetNodeSpec(name="root"))
    ranking = m.RankingUpdated(at=time.time(), window_s=60.0, nodes=())
    h1, h2 = host("h1"), host("h2")
    await record_log.append(s.host_state("h1"), h1, "a")
    await record_log.append(s.RANKING, ranking, "b")
    await record_log.append(s.BUDGET_TREE, tree, "c")
    got: list[tuple[str, msgspec.Struct]] = []
    follower = record_log.follower(
        lambda subject, record: got.append((subject, record)),
        streams=("HOSTS", "USAGE"),
        subjects={"USAGE": s.BUDGET_TREE},
        every_s=every_s,
    )
    await follower.start()
    try:
        assert got == [(s.host_state("h1"), h1), (s.BUDGET_TREE, tree)]  # replayed
        await record_log.append(s.host_state("h2"), h2, "d")
        await record_log.append(s.RANKING, ranking, "e")  # filtered out
        for _ in range(200):
            if len(got) == 3:
                break
            await asyncio.sleep(0.01)
        assert got[2:] == [(s.host_state("h2"), h2)]
        assert await follower.catch_up("HOSTS", timeout=5.0)
        assert follower.last_seq["HOSTS"] == 2
    finally:
        await follower.stop()
