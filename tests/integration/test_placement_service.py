"""Intake + placement against a real nats-server: submissions become placements through
the log; bad input is rejected by field; duplicates are one workload; a standby takes
over from the log when the leader dies, with no GPU booked twice; queue rows carry their
pending reason, numbers and estimated start; the leader answers allocations (held vs
entitlement) and its cycle-duration histogram."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from typing import TypeVar

import msgspec
import nats
import nats.js.errors
import pytest
from live_harness import eventually, of_type, placements, records, running_intake, seed
from nats.aio.msg import Msg
from structlog.testing import capture_logs

from allot import bus
from allot.adapters.embedded import EmbeddedNats
from allot.bus import service_main
from allot.cli import live_cmds
from allot.core.policy import make_policy
from allot.eventlog.twin import twin_parity
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.proto.codec import encode_within
from allot.sdk import Client, CommandRejectedError
from allot.services.dashboard.pages import queue_page
from allot.services.intake import Intake
from allot.services.placement.service import PlacementService

pytestmark = pytest.mark.integration
T = TypeVar("T")

_REPLY = msgspec.json.Decoder(m.WorkloadAccepted | m.WorkloadRejected)
ACCOUNT_TREE: dict[str, object] = {
    "name": "root",
    "children": [
        {"name": "research", "shares": 1, "children": [{"name": "nlp", "shares": 1}]},
        {"name": "vision", "shares": 1},
    ],
}
"""A budget tree with an account (``research``) above the allocation ``nlp``."""


def submit_body(**fields: object) -> bytes:
    body = {"type": "SubmitWorkload", "client_id": "c1", "user": "ann", "gpus": 2}
    body.update(fields)
    return json.dumps(body).encode()


async def request(
    nc: nats.NATS, subject: str, body: bytes
) -> m.WorkloadAccepted | m.WorkloadRejected:
    reply = await nc.request(subject, body, timeout=5)
    return _REPLY.decode(reply.data)


async def test_submission_is_placed_and_bad_input_is_rejected_by_field(fresh_log: str) -> None:
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await seed(js, {"h1": 8, "h2": 8})
    intake = Intake(fresh_log, tracing=False)
    placement = PlacementService(fresh_log, lease_ttl_s=1.0, name="p1", tracing=False)
    await service_main.start(intake)
    await service_main.start(placement)
    try:
        ok = await request(
            nc, s.submit("nlp"), submit_body(allocation="nlp", min_runtime_s=600, gpus=4)
        )
        assert isinstance(ok, m.WorkloadAccepted) and not ok.duplicate
        again = await request(
            nc, s.submit("nlp"), submit_body(allocation="nlp", min_runtime_s=600, gpus=4)
        )
        assert isinstance(again, m.WorkloadAccepted) and again.duplicate
        assert again.workload_id == ok.workload_id

        placed = await eventually(lambda: placements(js), lambda p: len(p) == 1)
        assert placed[0].workload_id == ok.workload_id
        assert sum(len(hg.gpus) for hg in placed[0].assignment) == 4
        assert placed[0].epoch == placement.epoch > 0

        bad = {
            "gpus": (submit_body(gpus=0), "gpus"),
            "too many gpus": (submit_body(gpus=17), "gpus"),
            "min runtime": (
                submit_body(allocation="nlp", min_runtime_s=8 * 3600 + 1),
                "min_runtime_s",
            ),
            "unknown field": (submit_body(colour="red"), "colour"),
            "wrong type": (submit_body(gpus="two"), "gpus"),
            "malformed": (b'{"type": "SubmitWorkload", "gpus": ', "body"),
            "nan": (b'{"type": "SubmitWorkload", "gpus": NaN}', "gpus"),
            "unknown allocation": (submit_body(allocation="chem", client_id="c9"), "allocation"),
            "oversized": (submit_body(kind="x" * 70_000), "body"),
        }
        for name, (body, field) in bad.items():
            subject = s.submit("chem") if "allocation" in name else s.submit(None)
            reply = await request(nc, subject, body)
            assert isinstance(reply, m.WorkloadRejected), name
            assert reply.field == field, (name, reply)
            assert reply.reason, name
        # Allocation in the payload must match the subject.
        mismatch = await request(nc, s.submit(None), submit_body(allocation="nlp", client_id="c7"))
        assert isinstance(mismatch, m.WorkloadRejected) and mismatch.field == "allocation"
        # The services kept running: a good submission still goes through.
        ok2 = await request(nc, s.submit(None), submit_body(client_id="c2", gpus=1))
        assert isinstance(ok2, m.WorkloadAccepted)
        await eventually(lambda: placements(js), lambda p: len(p) == 2)
        submitted = of_type(await records(js), m.WorkloadSubmitted)
        assert [r.workload_id for r in submitted] == [ok.workload_id, ok2.workload_id]
        # A run that cannot fit waits; `allot prio` breaks its position into its inputs.
        big = await request(
            nc,
            s.submit("vision"),
            submit_body(client_id="big", allocation="vision", gpus=16, min_runtime_s=600),
        )
        assert isinstance(big, m.WorkloadAccepted)

        async def prio() -> m.PrioSnapshot:
            reply = await nc.request(s.QUERY_PRIO, b"{}", timeout=5)
            return msgspec.json.decode(reply.data, type=m.PrioSnapshot)

        snap = await eventually(prio, lambda p: p.total == 1)
        row = snap.rows[0]
        assert (row.workload_id, row.allocation, row.position, row.gpus) == (
            big.workload_id,
            "vision",
            1,
            16,
        )
        assert row.tier_name == "under-entitlement" and row.entitlement == 8.0
    finally:
        await service_main.stop(placement)
        await service_main.stop(intake)
        await nc.close()


async def test_standby_takes_over_from_the_log_without_double_booking(fresh_log: str) -> None:
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await seed(js, {"h1": 8})
    intake = Intake(fresh_log, tracing=False)
    first = PlacementService(fresh_log, lease_ttl_s=1.0, name="p1", tracing=False)
    second = PlacementService(fresh_log, lease_ttl_s=1.0, name="p2", tracing=False)
    await service_main.start(intake)
    await service_main.start(first)
    await eventually(lambda: asyncio.sleep(0, first.leader), bool)
    await service_main.start(second)
    try:
        for i in range(3):  # 3 x 4 GPUs on 8: two run, one waits
            reply = await request(
                nc,
                s.submit("nlp"),
                submit_body(client_id=f"a{i}", allocation="nlp", gpus=4, min_runtime_s=600),
            )
            assert isinstance(reply, m.WorkloadAccepted)
        await eventually(lambda: placements(js), lambda p: len(p) == 2)
        assert not second.leader

        # "Kill" the leader: its tasks stop, its lease is not released (it just expires).
        for task in first._tasks:
            task.cancel()
        first.leader = False
        await eventually(lambda: asyncio.sleep(0, second.leader), bool, timeout=10)
        assert second.epoch > 0 and second.fold.epoch == second.epoch
        # The new leader rebuilt the same state from the log: two running, one pending.
        assert len(second.fold.state.running) == 2 and len(second.fold.queue) == 1
        # A stale decision from the old epoch is ignored by every fold.
        stale = first.fold.epoch
        pending = next(iter(second.fold.queue))
        ignored_before = second.fold.ignored
        ack = await js.publish(
            s.events("nlp", pending.id, "placed"),
            msgspec.json.encode(
                m.WorkloadPlaced(
                    workload_id=pending.id,
                    allocation="nlp",
                    at=1.0,
                    gpus=4,
                    assignment=(m.HostGpus(host="h1", gpus=(0, 1, 2, 3)),),
                    attempt=1,
                    epoch=stale,
                )
            ),
        )
        # Read: the follower is past the stale placement's sequence (the publish's ack).
        assert second.follower is not None
        follower = second.follower
        await eventually(
            lambda: asyncio.sleep(0, follower.last_seq.get("WORKLOADS", 0)),
            lambda seq: seq >= ack.seq,
        )
        assert len(second.fold.state.running) == 2
        assert second.fold.ignored > ignored_before
    finally:
        await service_main.stop(second)
        await service_main.stop(first)
        await service_main.stop(intake)
        await nc.close()


async def test_a_failed_leader_election_append_does_not_end_the_lease_loop(
    fresh_log: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make chaos-cluster`` (2026-12-02 17:51 UTC): the ``LeaderElected`` append failed
    during a stream leader's election (``NoStreamResponseError``), the exception ended
    the lease loop of both instances, and nothing was placed again. Now the lease is let
    go and taken again once the log answers."""
    nc = await nats.connect(fresh_log)
    await seed(nc.jetstream(), {"h1": 8})
    placement = PlacementService(fresh_log, lease_ttl_s=1.0, name="p1", tracing=False)
    real_publish = bus.publish
    failures = [2]

    async def flaky_publish(js, subject, record, msg_id=None):  # type: ignore[no-untyped-def]
        if isinstance(record, m.LeaderElected) and failures[0] > 0:
            failures[0] -= 1
            raise nats.js.errors.NoStreamResponseError()
        return await real_publish(js, subject, record, msg_id)

    monkeypatch.setattr(bus, "publish", flaky_publish)
    await service_main.start(placement)
    try:
        await eventually(lambda: asyncio.sleep(0, placement.leader), bool, timeout=10)
        assert failures == [0]  # it failed twice, and kept trying
        assert placement.epoch > 0 and placement.fold.epoch == placement.epoch
        assert all(not t.done() for t in placement._tasks)
    finally:
        await service_main.stop(placement)
        await nc.close()


async def test_queue_rows_carry_reasons_and_the_leader_answers_allocations_and_stats(
    fresh_log: str,
) -> None:
    """Two 8-GPU hosts, h2 draining: vision runs 8 GPUs on h1 (protected 10 min, over its
    entitlement of 4). nlp's 4-GPU request may reclaim them only once that protection ends
    (protected-until, with that time as its estimated start); nlp's 16 GPUs need h2 back
    (hosts-draining); unallocated work waits for idle GPUs."""
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await seed(js, {"h1": 8, "h2": 8})
    await bus.publish(js, s.host_state("h2"), m.HostDraining(host="h2", at=time.time()))
    intake = Intake(fresh_log, tracing=False)
    placement = PlacementService(fresh_log, lease_ttl_s=1.0, name="p1", tracing=False)
    await service_main.start(intake)
    await service_main.start(placement)

    async def query(subject: str, cls: type[T]) -> T:
        reply = await nc.request(subject, b"{}", timeout=5)
        return msgspec.json.decode(reply.data, type=cls)

    queued: list[m.WorkloadQueued] = []

    async def on_queued(msg: Msg) -> None:
        queued.append(msgspec.json.decode(msg.data, type=m.WorkloadQueued))

    await nc.subscribe(f"{s.PREFIX}.queued.>", cb=on_queued)
    try:
        vision = await request(
            nc,
            s.submit("vision"),
            submit_body(client_id="v", allocation="vision", gpus=8, min_runtime_s=600),
        )
        assert isinstance(vision, m.WorkloadAccepted)
        (placed,) = await eventually(lambda: placements(js), lambda p: len(p) == 1)
        ids = {}
        for cid, alloc, gpus in (("n4", "nlp", 4), ("n16", "nlp", 16), ("free", None, 1)):
            subject = s.submit(alloc)
            body = submit_body(client_id=cid, allocation=alloc, gpus=gpus, min_runtime_s=600)
            if alloc is None:
                body = submit_body(client_id=cid, gpus=gpus)
            reply = await request(nc, subject, body)
            assert isinstance(reply, m.WorkloadAccepted), reply
            ids[cid] = reply.workload_id

        snap = await eventually(
            lambda: query(s.QUERY_QUEUE, m.QueueSnapshot),
            lambda q: q.total == 3,
        )
        rows = {r.workload_id: r for r in snap.rows}
        n4, n16, free = rows[ids["n4"]], rows[ids["n16"]], rows[ids["free"]]
        until = placed.at + 600
        assert n4.reason == "protected-until"
        assert n4.reason_numbers["until"] == pytest.approx(until)
        # A team's per-allocation queries: its rows only (global positions), and another
        # allocation's workload is unknown to it.
        mine = await query(s.query_scoped(s.QUERY_QUEUE, "nlp"), m.QueueSnapshot)
        assert {r.workload_id for r in mine.rows} == {ids["n4"], ids["n16"]} and mine.total == 2
        assert {r.position for r in mine.rows} == {rows[ids["n4"]].position, n16.position}
        free_q = await query(s.query_scoped(s.QUERY_QUEUE, None), m.QueueSnapshot)
        assert [r.workload_id for r in free_q.rows] == [ids["free"]]
        body = msgspec.json.encode(m.StatusQuery(workload_id=vision.workload_id))
        theirs = await nc.request(s.query_scoped(s.QUERY_STATUS, "nlp"), body, timeout=5)
        assert msgspec.json.decode(theirs.data, type=m.WorkloadStatus).state == "unknown"
        own = await nc.request(s.query_scoped(s.QUERY_STATUS, "vision"), body, timeout=5)
        assert msgspec.json.decode(own.data, type=m.WorkloadStatus).state == "running"
        # Subscribers of allot.v1.queued.<alloc>.<workload> get the same code and estimate.
        got = await eventually(
            lambda: asyncio.sleep(0, {q.workload_id: q for q in queued}),
            lambda by_id: ids["n4"] in by_id,
        )
        assert got[ids["n4"]].reason == "protected-until"
        assert got[ids["n4"]].est_start == pytest.approx(until)
        assert n4.reason_numbers["protected_gpus"] == 8 and n4.reason_numbers["hosts"] == "h1"
        assert (n4.reason_numbers["held"], n4.reason_numbers["entitlement"]) == (0, 4.0)
        assert n4.est_start == pytest.approx(until)  # an estimate: the protection end
        assert "protection ends" in n4.why
        assert n16.reason == "hosts-draining" and n16.est_start is None
        assert n16.reason_numbers == {
            "requested": 16,
            "healthy_gpus": 8,
            "unavailable_hosts": 1,
            "unavailable_gpus": 8,
        }
        assert free.reason == "unallocated-idle-only"
        assert free.reason_numbers["free_gpus"] == 0
        # Nothing changed: the next answer comes from the cache, not a new dry run.
        cached = placement.queries.explained
        again = await query(s.QUERY_QUEUE, m.QueueSnapshot)
        assert placement.queries.explained is cached
        assert [(r.workload_id, r.reason) for r in again.rows] == [
            (r.workload_id, r.reason) for r in snap.rows
        ]

        allocs = await query(s.QUERY_ALLOCATIONS, m.AllocationsSnapshot)
        assert (allocs.healthy_gpus, allocs.total_gpus) == (8, 16)
        by = {r.allocation: r for r in allocs.rows}
        assert set(by) == {"nlp", "vision"}
        hosts = await query(s.QUERY_HOSTS, m.HostsSnapshot)
        on_h1 = next(h for h in hosts.hosts if h.host == "h1")
        assert on_h1.workloads == (vision.workload_id,) and on_h1.free_gpus == 0  # vision's 8
        assert [h.host for h in hosts.hosts] == ["h1", "h2"] and hosts.total == 2
        # The next page starts after the host it names; a bad ``after`` is refused by name.
        reply = await nc.request(s.QUERY_HOSTS, codec.encode(m.HostsQuery(after="h1")), timeout=5)
        page = msgspec.json.decode(reply.data, type=m.HostsSnapshot)
        assert [h.host for h in page.hosts] == ["h2"] and page.total == 2
        reply = await nc.request(s.QUERY_HOSTS, b'{"type": "HostsQuery", "after": 7}', timeout=5)
        refused = msgspec.json.decode(reply.data, type=m.CommandRejected)
        assert refused.field == "after"
        assert (by["vision"].held_gpus, by["vision"].pending_workloads) == (8, 0)
        assert (by["nlp"].held_gpus, by["nlp"].pending_workloads, by["nlp"].pending_gpus) == (
            0,
            2,
            20,
        )
        for row in by.values():
            assert row.effective_share == pytest.approx(0.5)
            assert row.entitlement_gpus == pytest.approx(4.0)

        # A cycle is counted when it ends, after its appends are acknowledged and its queue
        # positions published: ask until the cycle that placed vision has ended.
        stats = await eventually(
            lambda: query(s.QUERY_PLACEMENT_STATS, m.PlacementStats),
            lambda st: st.append_wait_s > 0.0,
        )
        assert stats.epoch == placement.epoch > 0
        assert stats.count >= 1 and stats.cycles >= stats.count
        assert len(stats.counts) == len(stats.buckets_s) + 1
        assert list(stats.counts) == sorted(stats.counts) and stats.counts[-1] == stats.count
        assert 0.0 < stats.sum_s < 10.0 * stats.count
        assert stats.decisions >= 1  # vision's placement
        # A cycle that placed vision decided, then waited for its append: both parts are
        # measured, and together they are at most the cycles' summed duration.
        assert stats.decide_s > 0.0 and stats.append_wait_s > 0.0
        assert stats.decide_s + stats.append_wait_s <= stats.sum_s
    finally:
        await service_main.stop(placement)
        await service_main.stop(intake)
        await nc.close()


async def test_a_query_of_an_allocation_the_budget_tree_lacks_is_refused_naming_it(
    fresh_log: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``allot.v1.query.{queue,prio,status}.<alloc>`` of a name the budget tree lacks, or of
    one of its accounts, is refused naming ``allocation``, not answered as an empty queue
    (a typo looked like an allocation with nothing pending). ``~`` and a known allocation
    without work still answer empty; the SDK raises the refusal and ``allot queue`` prints
    it on one line."""
    nc = await nats.connect(fresh_log)
    await seed(nc.jetstream(), {"h1": 8}, ACCOUNT_TREE)
    placement = PlacementService(fresh_log, lease_ttl_s=1.0, name="p1", tracing=False)
    await service_main.start(placement)
    status = codec.encode(m.StatusQuery(workload_id="w-x"))
    answers = msgspec.json.Decoder(
        m.QueueSnapshot | m.PrioSnapshot | m.WorkloadStatus | m.CommandRejected
    )

    async def ask(query: str, allocation: str | None) -> msgspec.Struct:
        body = status if query == s.QUERY_STATUS else b"{}"
        reply = await nc.request(s.query_scoped(query, allocation), body, timeout=5)
        return answers.decode(reply.data)  # type: ignore[no-any-return]

    async def answered() -> msgspec.Struct | None:  # None until the leader's queries are up
        try:
            return await ask(s.QUERY_QUEUE, "nlp")
        except nats.errors.NoRespondersError:
            return None

    known = "(allocations: nlp, vision)"
    try:
        await eventually(answered, lambda got: got is not None)
        for query in (s.QUERY_QUEUE, s.QUERY_PRIO, s.QUERY_STATUS):
            for allocation, reason in (
                ("nosuch", f"no allocation 'nosuch' in the budget tree {known}"),
                ("research", f"'research' is an account, not an allocation {known}"),
            ):
                got = await ask(query, allocation)
                assert isinstance(got, m.CommandRejected), (query, allocation, got)
                assert (got.field, got.reason) == ("allocation", reason)
            for nothing_pending in ("nlp", None):
                got = await ask(query, nothing_pending)
                if isinstance(got, m.WorkloadStatus):
                    assert got.state == "unknown", (query, nothing_pending, got)
                else:
                    assert isinstance(got, m.QueueSnapshot | m.PrioSnapshot), (query, got)
                    assert (got.rows, got.total) == ((), 0), (query, nothing_pending, got)

        async with Client(fresh_log, timeout=5) as client:
            with pytest.raises(CommandRejectedError) as caught:
                await client.queue(scope="nosuch")
        assert caught.value.field == "allocation"
        capsys.readouterr()
        argv = ["queue", "--nats-url", fresh_log, "--alloc", "nosuch"]
        assert await asyncio.to_thread(live_cmds.main, argv) == 2
        err = f"allot queue: --alloc: no allocation 'nosuch' in the budget tree {known}\n"
        assert capsys.readouterr().err == err
    finally:
        await service_main.stop(placement)
        await nc.close()


def test_a_listing_answer_fits_one_nats_message_and_keeps_its_total() -> None:
    """2,000 queue rows with long reasons are over 1 MiB: the answer carries the first rows
    that fit, in order, and still counts them all (no server needed)."""
    row = m.QueueRow(
        position=1,
        workload_id="w0",
        user="ann",
        gpus=1000,
        kind="training",
        tier="over-entitlement",
        sort_metric=1.5,
        submitted_at=1.0,
        why="x" * 600,
        reason="over-entitlement",
        reason_numbers={"held": 7200, "entitlement": 1600.0, "allocation": "search"},
    )
    rows = tuple(
        msgspec.structs.replace(row, position=i + 1, workload_id=f"w{i}") for i in range(2000)
    )

    def build(n: int) -> m.QueueSnapshot:
        return m.QueueSnapshot(at=1.0, rows=rows[:n], total=len(rows))

    limit = 1024 * 1024
    assert len(msgspec.json.encode(build(len(rows)))) > limit
    data = encode_within(build, len(rows), limit)
    assert len(data) <= limit
    got = msgspec.json.decode(data, type=m.QueueSnapshot)
    assert got.total == 2000 and 1000 < len(got.rows) < 2000
    assert [r.workload_id for r in got.rows] == [f"w{i}" for i in range(len(got.rows))]
    # Small answers are untouched.
    assert encode_within(build, 10, limit) == msgspec.json.encode(build(10))


@pytest.fixture(scope="module")
def filtering_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The wheel's nats-server (>= 2.10: consumers with several filters), whatever the
    suite's own server is (this machine's is 2.9, which reads everything)."""
    with EmbeddedNats(store_dir=tmp_path_factory.mktemp("filtering")) as server:
        yield server.url


async def test_status_reads_the_start_that_placement_does_not_follow(
    filtering_server: str,
) -> None:
    """Placement's follower skips runs' starts (``DECISION_INPUTS``: they decide nothing
    and come in bursts ahead of submissions); `allot status` still shows when a run
    started, read from the log when asked, for a running workload and for one whose start
    is read only after its end."""
    nc = await nats.connect(filtering_server)
    js = nc.jetstream()
    for name in s.STREAMS:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(name)
    await seed(js, {"h1": 8})
    placement = PlacementService(filtering_server, lease_ttl_s=1.0, name="p1", tracing=False)
    await service_main.start(placement)
    try:
        assert placement.follower is not None and not placement.reads_starts
        for wid in ("run", "done"):
            sub = m.WorkloadSubmitted(
                workload_id=wid, client_id=wid, user="ann", gpus=2, allocation="nlp", at=1.0
            )
            await bus.publish(js, s.events("nlp", wid, "submitted"), sub)
        placed = await eventually(lambda: placements(js), lambda p: len(p) == 2)
        at = {p.workload_id: p.at for p in placed}
        for wid in ("run", "done"):
            started = m.WorkloadStarted(
                workload_id=wid, allocation="nlp", at=at[wid] + 0.5, host="h1", attempt=1
            )
            await bus.publish(js, s.events("nlp", wid, "started"), started)
        ended = m.WorkloadCompleted(workload_id="done", allocation="nlp", at=at["done"] + 9)
        seq = await bus.publish(js, s.events("nlp", "done", "completed"), ended)
        assert await placement.follower.wait_for("WORKLOADS", seq, timeout=5.0)
        # Not followed: the fold has the end, not the starts before it.
        assert placement.fold.records["done"].status == "completed"
        assert all(placement.fold.records[w].run_started_at is None for w in ("run", "done"))
        async with Client(filtering_server) as c:
            running, done = await c.status("run"), await c.status("done")
        assert running.state == "running" and running.run_started_at == at["run"] + 0.5
        assert done.state == "completed" and done.run_started_at == at["done"] + 0.5
        assert done.ended_at == at["done"] + 9
    finally:
        await service_main.stop(placement)
        await nc.close()


async def test_free_work_of_a_team_gets_its_notice_on_the_teams_subject(fresh_log: str) -> None:
    """Work submitted to an allocation with no minimum runtime runs unallocated (charged to
    nobody, preemptible at once); its notice is still filed under that allocation, as its
    other events are, so the team's subscriber and `allot watch` see it."""
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await seed(js, {"h1": 2})
    placement = PlacementService(fresh_log, lease_ttl_s=1.0, name="p1", grace_s=1, tracing=False)
    await service_main.start(placement)
    notices: list[m.PreemptionNotice] = []
    try:
        async with Client(fresh_log) as c:
            await c.on_preemption(notices.append, allocation="nlp")
            free = m.WorkloadSubmitted(
                workload_id="free", client_id="free", user="ann", gpus=2, allocation="nlp", at=1.0
            )
            await bus.publish(js, s.events("nlp", "free", "submitted"), free)
            await eventually(lambda: placements(js), lambda p: len(p) == 1)
            owed = m.WorkloadSubmitted(
                workload_id="owed",
                client_id="owed",
                user="bo",
                gpus=2,
                allocation="vision",
                min_runtime_s=600,
                at=2.0,
            )
            await bus.publish(js, s.events("vision", "owed", "submitted"), owed)
            await eventually(lambda: asyncio.sleep(0, notices), bool)
        assert [(n.workload_id, n.allocation, n.preemptor) for n in notices] == [
            ("free", "nlp", "owed")
        ]
        assert notices[0].victim_held_gpus == 0  # charged to nobody
        logged = of_type(await records(js), m.PreemptionNotice)
        assert [n.allocation for n in logged] == ["nlp"]
    finally:
        await service_main.stop(placement)
        await nc.close()


async def test_a_blocked_gang_shows_its_reservation_in_allot_queue_and_the_dashboard(
    fresh_log: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """16 hosts of 8 GPUs: vision runs 15 runs of 8 GPUs, protected 10 minutes, far over its
    entitlement of 64. nlp, holding nothing, asks for a 64-GPU gang: it cannot start and
    preempts nothing yet, so the leader reserves the free host and seven of vision's for
    it, until their protection ends (reason reserved-until, with hosts and time), as
    ``allot queue`` and the dashboard's queue rows show."""
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await seed(js, {f"h{i:02d}": 8 for i in range(1, 17)})
    intake = Intake(fresh_log, tracing=False)
    placement = PlacementService(fresh_log, lease_ttl_s=1.0, name="p1", tracing=False)
    await service_main.start(intake)
    await service_main.start(placement)
    try:
        for i in range(15):
            body = submit_body(client_id=f"v{i}", allocation="vision", gpus=8, min_runtime_s=600)
            assert isinstance(await request(nc, s.submit("vision"), body), m.WorkloadAccepted)
        placed = await eventually(lambda: placements(js), lambda p: len(p) == 15)
        body = submit_body(client_id="gang", allocation="nlp", gpus=64, min_runtime_s=600)
        gang = await request(nc, s.submit("nlp"), body)
        assert isinstance(gang, m.WorkloadAccepted)
        snap = await eventually(
            lambda: nc.request(s.QUERY_QUEUE, b"{}", timeout=5),
            lambda reply: b"reserved-until" in reply.data,
        )
        (row,) = msgspec.json.decode(snap.data, type=m.QueueSnapshot).rows
        assert row.reason == "reserved-until"
        hosts = str(row.reason_numbers["hosts"]).split(",")
        assert len(hosts) == 8 and row.reason_numbers["host_count"] == 8
        # The free host and the seven whose protection ends first: the seventh end.
        ends = sorted(p.at + 600 for p in placed)
        assert row.reason_numbers["until"] == pytest.approx(ends[6], abs=1)
        assert row.est_start == pytest.approx(row.reason_numbers["until"])
        assert not [r for r in await records(js) if isinstance(r, m.PreemptionNotice)]
        page = queue_page(time.time(), msgspec.json.decode(snap.data, type=m.QueueSnapshot))
        assert "reserved-until" in page.html and hosts[0] in page.html

        capsys.readouterr()
        argv = ["queue", "--nats-url", fresh_log, "-l"]
        assert await asyncio.to_thread(live_cmds.main, argv) == 0
        out = capsys.readouterr().out
        assert "reserved-until" in out and "held for it" in out
    finally:
        await service_main.stop(placement)
        await service_main.stop(intake)
        await nc.close()


async def test_the_short_lane_starts_only_short_and_free_work_and_the_twin_agrees(
    fresh_log: str,
) -> None:
    """``--short-lane h2``: with h1 full, long allocated work waits and short work (2 GPUs
    or fewer, protected 15 min or less) and unallocated work start on h2; the twin replays
    the same decisions with the lane given, and other ones without it."""
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await seed(js, {"h1": 8, "h2": 8})
    placement = PlacementService(
        fresh_log, short_lane=("h2",), lease_ttl_s=1.0, name="p1", tracing=False
    )
    await service_main.start(placement)
    try:
        async with running_intake(fresh_log):
            bodies = [
                ("fill", "nlp", 8, 3600),  # h1, all of it
                ("long", "nlp", 1, 3600),  # not short: waits, though h2 is free
                ("wide", "vision", 3, 600),  # not short either: 3 GPUs
                ("dbg", "vision", 1, 600),  # short
                ("free", None, 2, 0),  # unallocated
            ]
            ids = {}
            for cid, alloc, gpus, protection in bodies:
                fields = {"client_id": cid, "gpus": gpus, "min_runtime_s": protection}
                if alloc is not None:
                    fields["allocation"] = alloc
                reply = await request(nc, s.submit(alloc), submit_body(**fields))
                assert isinstance(reply, m.WorkloadAccepted), reply
                ids[reply.workload_id] = cid
                if cid == "fill":  # on h1 before the rest arrive
                    await eventually(lambda: placements(js), lambda p: len(p) == 1)
            placed = await eventually(lambda: placements(js), lambda p: len(p) == 3)
            await asyncio.sleep(0.5)  # and no more
            where = {
                ids[p.workload_id]: {hg.host for hg in p.assignment} for p in await placements(js)
            }
            assert where == {"fill": {"h1"}, "dbg": {"h2"}, "free": {"h2"}}, placed
            # `allot hosts` and the dashboard say which host is the lane.
            reply = await nc.request(s.QUERY_HOSTS, b"{}", timeout=5)
            hosts = msgspec.json.decode(reply.data, type=m.HostsSnapshot)
            assert {h.host: h.short_lane for h in hosts.hosts} == {"h1": False, "h2": True}
    finally:
        await service_main.stop(placement)
    log = await records(js, "WORKLOADS") + await records(js, "HOSTS")
    log += await records(js, "USAGE")
    await nc.close()
    with_lane = twin_parity(log, make_policy("fairshare", 300), short_lane=("h2",))
    assert with_lane.fraction_identical == 1.0
    without = twin_parity(log, make_policy("fairshare", 300))
    assert without.fraction_identical < 1.0


async def test_a_short_lane_of_every_host_is_warned_of_once(fresh_log: str) -> None:
    """``--short-lane h1 h2``: no host yet, nothing to say; h1 joins and the lane holds
    every host known, so placement warns that long work can start nowhere, once (h2 joining
    the lane too says nothing more); h3 joins outside the lane and nothing is said."""
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await seed(js, {})
    placement = PlacementService(
        fresh_log, short_lane=("h1", "h2"), lease_ttl_s=1.0, name="p1", tracing=False
    )

    async def join(host: str) -> list[str]:
        await bus.publish(
            js, s.host_state(host), m.HostRegistered(host=host, gpus=8, at=time.time())
        )
        return await eventually(
            lambda: asyncio.sleep(0, result=placement.fold.state.host_ids), lambda h: host in h
        )

    def warnings(captured: list[dict[str, object]]) -> list[tuple[object, object]]:
        return [
            (e["log_level"], e["hosts"])
            for e in captured
            if "short lane holds every host" in str(e["event"])
        ]

    with capture_logs() as captured:
        await service_main.start(placement)
        try:
            assert warnings(captured) == []  # no host at all
            await join("h1")  # every host known is in the lane
            assert warnings(captured) == [("warning", 1)]
            await join("h2")  # still: not said again
            await join("h3")  # outside the lane: long work may start there
            assert warnings(captured) == [("warning", 1)]
            assert not placement.fold.state.lane_holds_every_host
        finally:
            await service_main.stop(placement)
            await nc.close()
