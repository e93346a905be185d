"""The wire contract (proto/asyncapi.json) says what the wire does.

A whole stack (services, fake agents that batch their reports, one real agent) runs a
scenario that uses every documented subject: submissions in both forms, a failure, a
completion, a preemption and requeue, cancels in their six forms, budget changes, a drain
and an undrain, a watch and every query. Everything on the server is recorded from before
the stack starts. Then:

1. every message seen is on a documented channel and of a message type listed for it (a
   reply: listed for the reply of the channel its request went to);
2. every documented channel is seen, and every reply channel;
3. the lifecycle events and host states are each seen, every type of them.

JetStream's own traffic (``$JS``/``$KV`` subjects, consumer deliveries and flow control to
inboxes) is the server's protocol, not Allot's contract, and is left out.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
from live_harness import eventually
from nats.aio.msg import Msg

from allot.ops.stack import AgentSpec, Stack, StackConfig
from allot.sdk import Client

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONTRACT: dict[str, Any] = json.loads((ROOT / "proto" / "asyncapi.json").read_text())
BUDGETS = """
name: root
children:
  - name: research
    shares: 2
    children:
      - {name: nlp, shares: 1}
      - {name: vision, shares: 1}
  - {name: search, shares: 1}
"""
EVENT_TYPES = {
    "WorkloadSubmitted",
    "CancelRequested",
    "WorkloadPlaced",
    "WorkloadStarted",
    "WorkloadPreempted",
    "WorkloadRequeued",
    "WorkloadCompleted",
    "WorkloadFailed",
    "WorkloadCancelled",
}
HOST_STATES = {"HostRegistered", "HostDraining", "HostDrained", "HostHealthy"}


class Channel:
    def __init__(self, cid: str, address: str, messages: set[str]) -> None:
        self.cid = cid
        self.tokens = address.split(".")
        self.messages = messages
        self.literals = sum(not t.startswith("{") for t in self.tokens)

    def matches(self, subject: str) -> bool:
        s = subject.split(".")
        for i, t in enumerate(self.tokens):
            if t == "{path}":  # the rest, one token or more
                return len(s) > i
            if i >= len(s) or (not t.startswith("{") and t != s[i]):
                return False
        return len(s) == len(self.tokens)


def contract_channels() -> list[Channel]:
    return [
        Channel(cid, c["address"], set(c["messages"]))
        for cid, c in CONTRACT["channels"].items()
        if c["address"] is not None
    ]


def channel_of(channels: list[Channel], subject: str) -> Channel | None:
    """The most specific documented channel of ``subject`` (``budget.set.{path}`` also
    matches a ``budget.set.by.<login>...`` subject; the identity form wins)."""
    found = [c for c in channels if c.matches(subject)]
    return max(found, key=lambda c: c.literals) if found else None


def test_channel_matching_prefers_the_most_specific_form() -> None:
    channels = contract_channels()
    by = channel_of(channels, "allot.v1.budget.set.by.lead.root.research.nlp")
    assert by is not None and by.cid == "budget_set_as"
    bare = channel_of(channels, "allot.v1.budget.set.root.research.nlp")
    assert bare is not None and bare.cid == "budget_set"
    assert channel_of(channels, "allot.v1.nothing.here") is None
    queue = channel_of(channels, "allot.v1.query.queue.nlp")
    assert queue is not None and queue.cid == "query_queue_allocation"


Seen = list[tuple[str, str | None, bytes]]


def recorder(seen: Seen) -> Callable[[Msg], Awaitable[None]]:
    """A subscription callback keeping every message (subject, reply, body) in order."""

    async def keep(msg: Msg) -> None:
        seen.append((msg.subject, msg.reply or None, msg.data))

    return keep


async def test_every_message_on_the_wire_is_in_the_contract_and_every_channel_is_used(
    fresh_log: str, redis_url: str, tmp_path: Path
) -> None:
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(BUDGETS)
    config = StackConfig(
        run_dir=tmp_path,
        nats_url=fresh_log,
        redis_url=redis_url,
        redis_prefix=f"wire{uuid.uuid4().hex[:8]}",
        budgets=budgets,
        agents=(AgentSpec("fk", hosts=2, gpus=4), AgentSpec("real1", gpus=2, fake=False)),
        placements=1,
        grace_s=2,
        unallocated_settle_s=0.5,  # the real host's unallocated runs follow each other
        lease_ttl_s=1.0,
        rank_every_s=1.0,
        accrue_s=1.0,
        slot_s=1.0,
        idle_after_s=2.0,  # nlp's fake runs ask to idle: flagged, then cleared by their cancel
        util_every_s=0.5,
    )
    seen_on_wire: Seen = []
    spy = await nats.connect(fresh_log)
    await spy.subscribe(
        ">", cb=recorder(seen_on_wire), pending_msgs_limit=1_000_000, pending_bytes_limit=-1
    )
    await spy.flush()
    nc = await nats.connect(fresh_log)

    async def ask(subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = b"" if body is None else json.dumps(body).encode()
        reply = await nc.request(subject, data, timeout=10)
        answer: dict[str, Any] = json.loads(reply.data)
        return answer

    def submit(cid: str, allocation: str | None, gpus: int, **kw: Any) -> dict[str, Any]:
        """A submission (allocated work needs a min runtime: without one it is unallocated)."""
        return {
            "type": "SubmitWorkload",
            "client_id": cid,
            "user": "alice",
            "gpus": gpus,
            "allocation": allocation,
            **kw,
        }

    async def status(wid: str, allocation: str) -> dict[str, Any]:
        return await ask(
            f"allot.v1.query.status.{allocation}", {"type": "StatusQuery", "workload_id": wid}
        )

    async def until(
        wid: str, allocation: str, ok: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        probe: Callable[[], Awaitable[dict[str, Any]]] = lambda: status(wid, allocation)  # noqa: E731
        return await eventually(probe, ok, timeout=30)

    try:
        with Stack(config):
            hosts = await eventually(
                lambda: ask("allot.v1.query.hosts"), lambda h: len(h.get("hosts", ())) == 3, 30
            )
            assert {h["host"] for h in hosts["hosts"]} == {"fk-0000", "fk-0001", "real1"}
            # The fake hosts filled by nlp (the identity form, then the bare form as a batch).
            idle = {"env": {"ALLOT_FAKE_UTIL": "idle"}, "min_runtime_s": 60}
            a = await ask(
                "allot.v1.submit.nlp.alice", submit("a", "nlp", 4, duration_s=600, **idle)
            )
            b = await ask(
                "allot.v1.submit.nlp",
                {
                    "type": "SubmitBatch",
                    "workloads": [submit("b", "nlp", 4, duration_s=600, **idle)],
                },
            )
            wid_a, wid_b = a["workload_id"], b["results"][0]["workload_id"]
            await until(wid_a, "nlp", lambda s: s["state"] == "running")
            await until(wid_b, "nlp", lambda s: s["state"] == "running")
            # Both idle (their env): flagged by health, listed by both forms of the query.
            await eventually(
                lambda: ask("allot.v1.query.idle.nlp"), lambda r: len(r.get("rows", ())) == 2, 30
            )
            await ask("allot.v1.query.idle")
            # The real host: a run that fails, then one that completes.
            fail = await ask(
                "allot.v1.submit.vision.alice",
                submit("f", "vision", 2, command=[sys.executable, "-c", "raise SystemExit(3)"]),
            )
            await until(fail["workload_id"], "vision", lambda s: s["state"] == "failed")
            done = await ask(
                "allot.v1.submit.vision.alice",
                submit("d", "vision", 2, command=[sys.executable, "-c", "pass"]),
            )
            wid_done = done["workload_id"]
            await until(wid_done, "vision", lambda s: s["state"] == "completed")
            # Unallocated work on the real host, preempted by allocated work, requeued.
            free = await ask("allot.v1.submit.~.alice", submit("u", None, 2, duration_s=600))
            wid_free = free["workload_id"]
            await until(wid_free, "~", lambda s: s["state"] == "running")
            await ask(
                "allot.v1.submit.vision.alice",
                submit("v", "vision", 2, duration_s=600, min_runtime_s=60),
            )
            await until(wid_free, "~", lambda s: s["state"] == "pending" and s.get("requeued_at"))
            # Cancels in all six forms: three of real work, three refused (unknown ids).
            cancel = {"type": "CancelWorkload", "user": "alice"}
            user = await ask(
                f"allot.v1.cancel.~.{wid_free}.user.alice", {**cancel, "workload_id": wid_free}
            )
            assert user["type"] == "CommandAccepted", user
            op = {**cancel, "user": "ops", "workload_id": wid_a}
            assert (await ask(f"allot.v1.cancel.nlp.{wid_a}.operator.ops", op))[
                "type"
            ] == "CommandAccepted"
            mgr = {**cancel, "user": "lead", "workload_id": wid_b}
            assert (await ask(f"allot.v1.cancel.nlp.{wid_b}.manager.lead", mgr))[
                "type"
            ] == "CommandAccepted"
            for form in ("", ".operator", ".manager"):
                body = {**cancel, "workload_id": "nope"}
                assert (await ask(f"allot.v1.cancel.nlp.nope{form}", body))[
                    "type"
                ] == "CommandRejected"
            await until(wid_a, "nlp", lambda s: s["state"] == "cancelled")
            await until(wid_b, "nlp", lambda s: s["state"] == "cancelled")
            # Budgets: a manager's form and the bare form.
            for subject, by in (
                ("allot.v1.budget.set.by.lead.root.research.nlp", "lead"),
                ("allot.v1.budget.set.root.research.vision", "root-admin"),
            ):
                path = subject.split(".root.", 1)[1].split(".")
                body = {"type": "SetBudget", "path": ["root", *path], "shares": 3, "set_by": by}
                assert (await ask(subject, body))["type"] == "CommandAccepted"
            # A drain of an idle fake host until drained, its undrain; the bare forms too.
            for subject, operator in (
                ("allot.v1.host.fk-0000.drain.ops", "ops"),
                ("allot.v1.host.fk-0001.drain", "ops"),
            ):
                host = subject.split(".")[3]
                body = {"type": "DrainHost", "host": host, "operator": operator, "reason": "test"}
                assert (await ask(subject, body))["type"] == "CommandAccepted"

            def drained(h: dict[str, Any]) -> bool:
                return sum(x["state"] == "drained" for x in h.get("hosts", ())) == 2

            await eventually(lambda: ask("allot.v1.query.hosts"), drained, 30)
            for subject in ("allot.v1.host.fk-0000.undrain.ops", "allot.v1.host.fk-0001.undrain"):
                host = subject.split(".")[3]
                body = {"type": "UndrainHost", "host": host, "operator": "ops"}
                assert (await ask(subject, body))["type"] == "CommandAccepted"
            # An agent's health report, as a real agent sends one.
            await nc.publish(
                "allot.v1.host.real1.health",
                json.dumps(
                    {
                        "type": "HealthReport",
                        "host": "real1",
                        "sent_at": time.time(),
                        "healthy": True,
                    }
                ).encode(),
            )
            # A watch of the completed run, through the SDK.
            async with Client(fresh_log) as c:
                seen = [r async for r in c.watch(wid_done, "vision", idle_timeout=10)]
            assert type(seen[-1]).__name__ == "WorkloadCompleted"
            # Every query, both scopes.
            for q in ("queue", "prio"):
                await ask(f"allot.v1.query.{q}")
                await ask(f"allot.v1.query.{q}.vision")
            await ask("allot.v1.query.status", {"type": "StatusQuery", "workload_id": wid_done})
            for q in ("share", "allocations", "hosts", "placement_stats"):
                await ask(f"allot.v1.query.{q}")
            await ask("allot.v1.query.hosts", {"type": "HostsQuery", "after": "fk-0000"})
            await ask("allot.v1.query.owed", {"type": "OwedQuery"})
            await ask("allot.v1.query.history", {"type": "HistoryQuery", "stream": "HOSTS"})
            await ask("allot.v1.dashboard.log", {"type": "HistoryQuery", "stream": "HOSTS"})
            await ask("allot.v1.query.usage", {"type": "UsageQuery", "window_s": 3600})
            await asyncio.sleep(1.0)  # the last answers and records reach the recorder
    finally:
        await nc.close()
        await spy.drain()

    channels = contract_channels()
    requests: dict[str, str] = {}  # reply inbox -> the request's subject
    used: set[str] = set()
    types_seen: dict[str, set[str]] = {}
    wrong: list[str] = []
    for subject, reply, data in seen_on_wire:
        if reply is not None and not reply.startswith("$"):
            requests[reply] = subject
        if subject.startswith("$"):  # the server's own protocol
            continue
        if not data:  # a query without a request message, or a consumer's status message
            found = channel_of(channels, subject)
            if found is not None and not found.messages:
                used.add(found.cid)
            continue
        if subject.startswith("_INBOX"):
            request = requests.get(subject)
            if request is None or request.startswith("$") or (reply or "").startswith("$JS"):
                continue  # a JetStream answer or a consumer's delivery
            asked = channel_of(channels, request)
            if asked is None:
                wrong.append(f"a reply to an undocumented request {request}")
                continue
            cid = f"{asked.cid}_reply"
            listed = set(CONTRACT["channels"].get(cid, {}).get("messages", ()))
        elif (reply or "").startswith("$JS.ACK.") and reply.split(".")[3].startswith("watch-"):
            # A watch's delivery: the server keeps the record's own subject on the wire, the
            # delivery subject routes it (its consumer is intake's ``watch-<random>``).
            cid = "watched"
            listed = set(CONTRACT["channels"][cid]["messages"])
        else:
            found = channel_of(channels, subject)
            if found is None:
                wrong.append(f"{subject}: on no documented channel")
                continue
            cid, listed = found.cid, found.messages
        body = json.loads(data)
        if subject.startswith("_INBOX") and "stream" in body and "seq" in body:
            continue  # JetStream's acknowledgement of an append (a PubAck)
        kind = body.get("type") if isinstance(body, dict) else None
        if kind not in listed:
            wrong.append(f"{subject} ({cid}): {kind} is not listed there ({sorted(listed)})")
        used.add(cid)
        types_seen.setdefault(cid, set()).add(str(kind))
    assert not wrong, "\n".join(wrong[:20])
    documented = set(CONTRACT["channels"])
    assert documented - used == set(), f"documented but never seen: {sorted(documented - used)}"
    assert types_seen["events"] == EVENT_TYPES
    assert types_seen["host_state"] == HOST_STATES
