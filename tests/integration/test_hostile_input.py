"""Issue 5, hostile input: bad commands sent to the live services (intake, ranking, health,
placement, in-process against a real NATS and Redis) are each refused with a reply naming
the field at fault, nothing restarts, and nothing reaches the log.

The inputs: a hand-written table covering every category of the issue
(``hostile_cases.hand_cases``), replays of old commands, and hypothesis-generated mutations
of valid commands (``hostile_cases.mutated_commands``). Hypothesis runs in a worker thread
(its ``@given`` is synchronous) and hands each example to the test's event loop, so a
failing example is shrunk against the live services. Run with ``-s`` to see the counts;
they are also recorded as junit properties.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import hostile_cases as hc
import msgspec
import nats
import pytest
from hypothesis import HealthCheck, given, settings
from live_harness import eventually, of_type, records, seed
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext

from allot.bus import service_main
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.services.dispatch import DispatchService
from allot.services.health import HealthService
from allot.services.intake import Intake
from allot.services.placement.service import PlacementService
from allot.services.ranking import RankingService

pytestmark = pytest.mark.integration

REPLY_TIMEOUT_S = 3.0
HYPOTHESIS_EXAMPLES = 200
MIN_DISTINCT = 50
STREAMS = ("WORKLOADS", "HOSTS", "USAGE")

Reply = (
    m.WorkloadAccepted
    | m.WorkloadRejected
    | m.CommandAccepted
    | m.CommandRejected
    | m.WorkloadStatus
    | m.RankingUpdated
)
_REPLY: msgspec.json.Decoder[Any] = msgspec.json.Decoder(Reply)


@dataclass
class Live:
    nc: Client
    js: JetStreamContext
    intake: Intake
    health: HealthService
    ranking: RankingService
    placement: PlacementService
    dispatch: DispatchService
    placed: str
    """A running ``nlp`` workload (16 GPUs, protected for 8 h): no bad input may touch it."""
    placed_body: bytes
    cancelled: str
    """An unallocated workload cancelled while pending."""
    ignored: list[tuple[str, dict[str, Any]]]
    """What the health service ignored, with the fields it logged (a spy on ``_ignore``)."""


def submit_body(client_id: str, gpus: int, allocation: str | None, **more: Any) -> bytes:
    body = {
        "type": "SubmitWorkload",
        "client_id": client_id,
        "user": hc.OWNER,
        "gpus": gpus,
        "allocation": allocation,
        **more,
    }
    return json.dumps(body).encode()


async def ask(nc: Client, subject: str, body: bytes) -> Any:
    return _REPLY.decode((await nc.request(subject, body, timeout=REPLY_TIMEOUT_S)).data)


@pytest.fixture
async def live(fresh_log: str, redis_url: str) -> AsyncIterator[Live]:
    nc = await nats.connect(fresh_log)
    js = nc.jetstream()
    await seed(js, {hc.HOST: 8, hc.OTHER_HOST: 8})
    # Long periods: no timer may write to the log while the bad inputs go in (a missed
    # heartbeat drain or a periodic ranking would change the stream counts).
    ranking = RankingService(
        fresh_log, redis_url, rank_every_s=3600, redis_prefix=f"hostile{os.getpid()}"
    )
    health = HealthService(fresh_log, timeout_s=3600, check_s=0.5)
    intake = Intake(fresh_log, tracing=False)
    placement = PlacementService(fresh_log, lease_ttl_s=10.0, name="hostile", tracing=False)
    dispatch = DispatchService(fresh_log)
    ignored: list[tuple[str, dict[str, Any]]] = []
    original_ignore = health._ignore

    def spy(why: str, **kw: object) -> None:
        ignored.append((why, dict(kw)))
        original_ignore(why, **kw)

    health._ignore = spy  # type: ignore[method-assign]
    started: list[Any] = []
    try:
        for service in (ranking, health, intake, placement, dispatch):
            await service_main.start(service)
            started.append(service)
        await eventually(lambda: asyncio.sleep(0, ranking.latest), lambda r: r is not None)
        await eventually(lambda: asyncio.sleep(0, placement.leader), bool)

        placed_body = submit_body(hc.PLACED_CLIENT_ID, 16, hc.ALLOCATION, min_runtime_s=28_800)
        ok = await ask(nc, s.submit(hc.ALLOCATION), placed_body)
        assert isinstance(ok, m.WorkloadAccepted), ok
        gone = await ask(nc, s.submit(None), submit_body("gone", 2, None))
        assert isinstance(gone, m.WorkloadAccepted), gone
        await eventually(
            lambda: records(js),
            lambda rs: any(r.workload_id == ok.workload_id for r in of_type(rs, m.WorkloadPlaced)),
        )
        cancel = {"type": "CancelWorkload", "workload_id": gone.workload_id, "user": hc.OWNER}
        accepted = await ask(nc, s.cancel(None, gone.workload_id), json.dumps(cancel).encode())
        assert isinstance(accepted, m.CommandAccepted), accepted
        await eventually(
            lambda: records(js),
            lambda rs: any(
                r.workload_id == gone.workload_id for r in of_type(rs, m.WorkloadCancelled)
            ),
        )
        yield Live(
            nc,
            js,
            intake,
            health,
            ranking,
            placement,
            dispatch,
            ok.workload_id,
            placed_body,
            gone.workload_id,
            ignored,
        )
    finally:
        for service in reversed(started):
            await service_main.stop(service)
        await nc.close()


# -- one bad input ----------------------------------------------------------------------------


async def check_request(live: Live, case: hc.Case) -> str | None:
    """Send ``case``; None if the reply is the rejection it must be, else what was wrong."""
    headers = dict(case.headers) or None
    try:
        raw = await live.nc.request(
            case.subject, case.body, timeout=REPLY_TIMEOUT_S, headers=headers
        )
    except NatsTimeout:
        return f"no reply within {REPLY_TIMEOUT_S}s"
    try:
        reply = _REPLY.decode(raw.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return f"unreadable reply {raw.data[:200]!r}: {e}"
    want = m.WorkloadRejected if case.kind == hc.SUBMIT else m.CommandRejected
    if not isinstance(reply, want):
        return f"expected {want.__name__}, got {reply!r}"[:400]
    if not reply.reason:
        return "rejection without a reason"
    if not hc.names_field(reply.field, case.field):
        return f"field {reply.field!r} (reason {reply.reason!r}); expected {case.field!r}"
    return None


async def check_fire_and_forget(live: Live, case: hc.Case) -> str | None:
    """Publish ``case`` (no reply exists): the health service must ignore it, naming the
    field (in what it logs), before the next one goes."""
    before = len(live.ignored)
    await live.nc.publish(case.subject, case.body, headers=dict(case.headers) or None)
    try:
        await eventually(
            lambda: asyncio.sleep(0, len(live.ignored)),
            lambda n: n > before,
            timeout=REPLY_TIMEOUT_S,
        )
    except AssertionError:
        return f"not ignored within {REPLY_TIMEOUT_S}s (handled as valid?)"
    why, kw = live.ignored[before]
    # A mismatch or an unknown host is about the host by construction; decoding faults
    # carry the codec's field.
    field = str(kw.get("field", "host" if why in ("host mismatch", "unregistered host") else ""))
    if not hc.names_field(field, case.field):
        return f"ignored as {why!r} naming {field!r}; expected {case.field!r}"
    return None


async def check(live: Live, case: hc.Case) -> str | None:
    if case.kind in hc.FIRE_AND_FORGET:
        return await check_fire_and_forget(live, case)
    return await check_request(live, case)


def describe(case: hc.Case) -> str:
    body = case.body if len(case.body) <= 120 else case.body[:120] + b"..."
    note = f" [{case.note}]" if case.note else ""
    return f"{case.category} / {case.kind} on {case.subject}{note}: {body!r}"


# -- the state that must not change -----------------------------------------------------------


async def log_positions(js: JetStreamContext) -> dict[str, tuple[int, int]]:
    out = {}
    for stream in STREAMS:
        info = await js.stream_info(stream)
        out[stream] = (info.state.messages, info.state.last_seq)
    return out


def service_problems(live: Live) -> list[str]:
    """What is not running any more (an empty list when everything is)."""
    problems = []
    brokers = {
        "intake": live.intake.broker,
        "health": live.health.broker,
        "ranking": live.ranking.broker,
        "placement": live.placement.broker,
        "dispatch": live.dispatch.broker,
    }
    for name, broker in brokers.items():
        if not broker.connection.is_connected:
            problems.append(f"{name}: broker disconnected")
    for name, nc in (("intake", live.intake.nc), ("placement", live.placement.nc)):
        if nc is None or not nc.is_connected:
            problems.append(f"{name}: log connection closed")
    tasks: dict[str, list[asyncio.Task[Any] | None]] = {
        "intake follower": list(live.intake.follower.tasks) if live.intake.follower else [None],
        "placement": list(live.placement._tasks),
        "placement follower": list(live.placement.follower.tasks)
        if live.placement.follower
        else [None],
        "health checker": [live.health._checker],
        "health follower": list(live.health._follower.tasks) if live.health._follower else [None],
        "ranking loop": [live.ranking._loop],
        "dispatch follower": list(live.dispatch._follower.tasks)
        if live.dispatch._follower
        else [None],
        "dispatch lists": [live.dispatch._flusher],
    }
    for name, ts in tasks.items():
        if not ts or any(t is None or t.done() for t in ts):
            problems.append(f"{name}: task ended")
    if not live.placement.leader:
        problems.append("placement: lost the leadership")
    return problems


# -- hypothesis, driven from a worker thread --------------------------------------------------


def run_hypothesis(
    loop: asyncio.AbstractEventLoop,
    live: Live,
    sent: dict[Any, hc.Case],
    on_case: Callable[[hc.Case, str | None], None],
) -> None:
    @settings(
        max_examples=HYPOTHESIS_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=hc.mutated_commands(live.placed))
    def every_mutation_is_rejected_naming_its_field(case: hc.Case) -> None:
        problem = asyncio.run_coroutine_threadsafe(check(live, case), loop).result(timeout=30)
        sent[case.key] = case
        on_case(case, problem)
        assert problem is None, f"{describe(case)}: {problem}"

    every_mutation_is_rejected_naming_its_field()


# -- the test ---------------------------------------------------------------------------------


async def test_hostile_inputs_are_rejected_by_field_without_state_change(
    live: Live, record_property: Callable[[str, object], None]
) -> None:
    nc, js = live.nc, live.js
    before = await log_positions(js)
    fold_size = len(live.placement.fold.records)
    hosts_before = {h: (i.state, i.gpus) for h, i in live.health.book.hosts.items()}
    tree_before = live.ranking.tree

    sent: dict[Any, hc.Case] = {}
    failures: list[str] = []

    def on_case(case: hc.Case, problem: str | None) -> None:
        if problem is not None:
            failures.append(f"{describe(case)}\n      -> {problem}")

    # 1. The hand-written table.
    for case in hc.hand_cases(live.placed):
        sent[case.key] = case
        on_case(case, await check(live, case))
    hand = len(sent)

    # 2. Replays that are retries, each answered as the first was and logging nothing: the
    # same submission again (duplicate=true, no second workload), and the cancel of a
    # workload already cancelled (accepted again). The same client_id with other values
    # is in the table (refused, naming client_id).
    resubmit = hc.Case(
        hc.REPLAY,
        hc.SUBMIT,
        s.submit(hc.ALLOCATION),
        live.placed_body,
        "",
        note="resubmission of an accepted submission",
    )
    sent[resubmit.key] = resubmit
    reply = await ask(nc, resubmit.subject, resubmit.body)
    if not (
        isinstance(reply, m.WorkloadAccepted)
        and reply.duplicate
        and reply.workload_id == live.placed
    ):
        on_case(resubmit, f"expected a duplicate of {live.placed}, got {reply!r}")
    recancel = hc.Case(
        hc.REPLAY,
        hc.CANCEL,
        s.cancel(None, live.cancelled),
        hc.dumps({**hc.cancel_template(live.cancelled), "allocation": None}),
        "",
        note="cancel of a workload already cancelled",
    )
    sent[recancel.key] = recancel
    reply = await ask(nc, recancel.subject, recancel.body)
    if not (isinstance(reply, m.CommandAccepted) and "already cancelled" in reply.detail):
        on_case(recancel, f"expected an accepted 'already cancelled', got {reply!r}")
    replays = 2
    if len(live.placement.fold.records) != fold_size:
        failures.append(
            f"replays changed the fold: {fold_size} -> {len(live.placement.fold.records)} workloads"
        )

    # 3. Hypothesis: one-field mutations of valid commands, to every command subject.
    before_hyp = len(sent)
    try:
        await asyncio.to_thread(run_hypothesis, asyncio.get_running_loop(), live, sent, on_case)
    except Exception as e:  # the shrunk example is reported with the other problems
        failures.append(f"hypothesis (shrunk): {e}")
    generated = len(sent) - before_hyp

    # 4. Nothing changed, nothing stopped.
    await asyncio.sleep(0.2)  # a late write caused by a bad input would show up by now
    after = await log_positions(js)
    for stream in STREAMS:
        if after[stream] != before[stream]:
            added = await records(js, stream)
            failures.append(
                f"{stream} changed: (messages, last seq) {before[stream]} -> "
                f"{after[stream]}; new records {added[before[stream][0] :]!r}"[:800]
            )
    if len(live.placement.fold.records) != fold_size:
        failures.append(f"placement fold: {fold_size} -> {len(live.placement.fold.records)}")
    hosts_after = {h: (i.state, i.gpus) for h, i in live.health.book.hosts.items()}
    if hosts_after != hosts_before:
        failures.append(f"health's hosts changed: {hosts_before} -> {hosts_after}")
    if live.ranking.tree is not tree_before:
        failures.append("ranking's budget tree changed")
    failures.extend(service_problems(live))

    # ...and every service still answers a valid request.
    ok = await ask(nc, s.submit(None), submit_body("after-the-storm", 1, None))
    assert isinstance(ok, m.WorkloadAccepted) and not ok.duplicate, ok
    await eventually(
        lambda: asyncio.sleep(0, live.placement.fold.records), lambda r: ok.workload_id in r
    )
    status = await ask(
        nc, s.QUERY_STATUS, json.dumps({"type": "StatusQuery", "workload_id": live.placed}).encode()
    )
    assert isinstance(status, m.WorkloadStatus) and status.state == "running", status
    undrain = await ask(
        nc,
        s.undrain(hc.HOST),
        json.dumps({"type": "UndrainHost", "host": hc.HOST, "operator": "op"}).encode(),
    )
    assert isinstance(undrain, m.CommandAccepted), undrain  # healthy already: a no-op
    share = await ask(nc, s.QUERY_SHARE, b"{}")
    assert isinstance(share, m.RankingUpdated), share

    # 5. The counts.
    by_category = Counter(c.category for c in sent.values())
    by_kind = Counter(c.kind for c in sent.values())
    total = len(sent)
    lines = [
        f"hostile inputs: {total} distinct ({hand} hand-written, "
        f"{replays} accepted replays, {generated} generated by hypothesis)"
    ]
    lines += [f"  {n:4d}  {cat}" for cat, n in sorted(by_category.items())]
    lines += ["  by subject: " + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items()))]
    print("\n" + "\n".join(lines))
    record_property("hostile_inputs_total", total)
    record_property("hostile_inputs_hand_written", hand)
    record_property("hostile_inputs_generated", generated)
    for cat, n in sorted(by_category.items()):
        record_property(f"hostile_inputs[{cat}]", n)

    assert not failures, f"{len(failures)} problem(s):\n  " + "\n  ".join(failures)
    assert total >= MIN_DISTINCT, lines[0]
