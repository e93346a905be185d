"""Bad inputs for ``test_hostile_input.py``: a hand-written table and hypothesis strategies.

Every case is one request (or, for heartbeats and health reports, one plain publish) that
the live services must refuse, with the field the refusal must name. The table covers each
category of issue 5 by hand; the strategies mutate a *valid* command in exactly one way
(one field made wrong-typed or out of range, one unknown key, one duplicated key, one
required field dropped, a wrong ``type`` tag), so the field to blame is known.
"""

from __future__ import annotations

import json
import string
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from allot.proto import messages as m
from allot.proto import subjects as s

# Categories of issue 5 (the names printed with the counts).
WRONG_TYPE = "wrong type"
UNKNOWN_FIELD = "unknown field"
DUPLICATE_KEY = "duplicate key"
DEEP_NESTING = "nesting 1000 deep"
NAN_HUGE = "NaN / huge number"
BAD_UTF8 = "invalid UTF-8"
OVERSIZED = "oversized payload"
BAD_NAME = "bad name (. * > space unicode)"
ABSURD = "absurd GPUs / times"
REPLAY = "replay of an old command"
MALFORMED = "malformed body / wrong message"
MISMATCH = "subject/payload mismatch, unknown target"
MISSING = "missing required field"

BODY = "body"
"""The field named when the whole payload is at fault."""

# Request kinds: who answers and with what.
SUBMIT = "submit"  # intake -> WorkloadRejected
CANCEL = "cancel"  # intake -> CommandRejected
BUDGET = "budget"  # ranking -> CommandRejected
DRAIN = "drain"  # health -> CommandRejected
UNDRAIN = "undrain"  # health -> CommandRejected
STATUS = "status"  # placement -> CommandRejected
REPORT = "report"  # dispatch -> CommandRejected (an agent's report of its part)
# Fire-and-forget kinds: the health service must ignore them (no reply exists).
HEARTBEAT = "heartbeat"
HEALTH = "health"
FIRE_AND_FORGET = frozenset({HEARTBEAT, HEALTH})

CLUSTER_GPUS = 16
"""GPUs registered by the test's seed (h1 and h2, 8 each): intake refuses more."""
ALLOCATION = "nlp"
HOST = "h1"
OTHER_HOST = "h2"
OWNER = "ann"
"""Who submits the test's workloads (the templates' ``user``): only they may cancel them."""
DAYS_30 = 30 * 86_400
PLACED_CLIENT_ID = "keep"
"""The ``client_id`` of the test's running workload (16 GPUs, 8 h minimum runtime)."""


@dataclass(frozen=True)
class Case:
    category: str
    kind: str
    subject: str
    body: bytes
    field: str
    """The field the rejection must name (``body`` for whole-payload faults)."""
    headers: tuple[tuple[str, str], ...] = ()
    note: str = ""

    @property
    def key(self) -> tuple[str, bytes, tuple[tuple[str, str], ...]]:
        """What makes two cases the same input."""
        return (self.subject, self.body, self.headers)


def names_field(got: str, expected: str) -> bool:
    """``got`` names ``expected`` or a part of it (``command[0]`` names ``command``)."""
    return got == expected or got.startswith((f"{expected}[", f"{expected}."))


def dumps(obj: object) -> bytes:
    # ensure_ascii=False: non-ASCII names travel as UTF-8, as a real client would send them.
    return json.dumps(obj, ensure_ascii=False).encode()


def with_pairs(pairs: list[tuple[str, Any]]) -> bytes:
    """A JSON object from key/value pairs, keeping repeated keys (``dict`` cannot)."""
    inner = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs)
    return ("{" + inner + "}").encode()


# == valid templates ===========================================================================


def submit_template(client_id: str = "hostile") -> dict[str, Any]:
    return {
        "type": "SubmitWorkload",
        "client_id": client_id,
        "user": OWNER,
        "gpus": 2,
        "allocation": ALLOCATION,
        "min_runtime_s": 60,
        "resumable": True,
        "kind": "training",
        "priority": 0,
        "command": ["sleep", "1"],
        "duration_s": 5.0,
    }


def batch(workloads: list[Any]) -> dict[str, Any]:
    return {"type": "SubmitBatch", "workloads": workloads}


def cancel_template(workload_id: str) -> dict[str, Any]:
    return {
        "type": "CancelWorkload",
        "workload_id": workload_id,
        "user": OWNER,
        "allocation": ALLOCATION,
        "reason": "no longer needed",
    }


def budget_template() -> dict[str, Any]:
    return {"type": "SetBudget", "path": ["root", ALLOCATION], "shares": 3, "set_by": "boss"}


def drain_template() -> dict[str, Any]:
    return {"type": "DrainHost", "host": HOST, "operator": "op", "reason": "maintenance"}


def status_template(workload_id: str) -> dict[str, Any]:
    return {"type": "StatusQuery", "workload_id": workload_id}


def heartbeat_template() -> dict[str, Any]:
    return {"type": "Heartbeat", "host": HOST, "sent_at": 1.7e9, "seq": 1, "gpus": 8}


def report_template(workload_id: str) -> dict[str, Any]:
    """A report of the placed workload's end from its primary host: valid, so every
    mutation below must be what gets it refused (accepted, it would end the workload)."""
    return {
        "type": "PartReport",
        "host": HOST,
        "workload_id": workload_id,
        "attempt": 1,
        "event": "exited",
        "at": time.time(),
        "exit_code": 0,
    }


def health_template() -> dict[str, Any]:
    return {"type": "HealthReport", "host": HOST, "sent_at": 1.7e9, "healthy": False}


def typeless(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "type"}


def untyped(body: dict[str, Any]) -> bytes:
    """``body`` without its ``type``: a client that leaves the message's name out."""
    return dumps(typeless(body))


def submit(**changes: Any) -> bytes:
    body = submit_template()
    body.update(changes)
    return dumps(body)


def deep_array(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def deep_object(depth: int) -> bytes:
    return b'{"a": ' * depth + b"1" + b"}" * depth


def splice(body: bytes, key: str, raw_value: bytes) -> bytes:
    """``body`` (a JSON object) with ``"key": <raw bytes>`` added at the end."""
    assert body.endswith(b"}")
    return body[:-1] + b", " + json.dumps(key).encode() + b": " + raw_value + b"}"


# == the hand-written table ====================================================================


def hand_cases(placed: str) -> list[Case]:
    """``placed``: a running workload of ``nlp`` (must not be touched). A replay that
    must be *accepted* (the same submission, a cancel of a cancelled workload) is sent by
    the test itself, not listed here."""
    sub = s.submit(ALLOCATION)
    unalloc = s.submit(None)
    can = s.cancel(ALLOCATION, placed)
    drain, undrain = s.drain(HOST), s.undrain(HOST)
    budget = s.budget_set(["root", ALLOCATION])
    hb, hr = s.heartbeat(HOST), s.health(HOST)
    ok = submit()
    cases = [
        # -- wrong types ----------------------------------------------------------------
        Case(WRONG_TYPE, SUBMIT, sub, submit(gpus="two"), "gpus"),
        Case(WRONG_TYPE, SUBMIT, sub, submit(gpus=2.5), "gpus"),
        Case(WRONG_TYPE, SUBMIT, sub, submit(gpus=True), "gpus"),
        Case(WRONG_TYPE, SUBMIT, sub, submit(user=42), "user"),
        Case(WRONG_TYPE, SUBMIT, sub, submit(client_id=None), "client_id"),
        Case(WRONG_TYPE, SUBMIT, sub, submit(resumable="yes"), "resumable"),
        Case(WRONG_TYPE, SUBMIT, sub, submit(command="rm -rf /"), "command"),
        Case(WRONG_TYPE, SUBMIT, sub, submit(command=[1, 2]), "command"),
        Case(WRONG_TYPE, SUBMIT, sub, submit(allocation=["nlp"]), "allocation"),
        Case(WRONG_TYPE, SUBMIT, sub, submit(min_runtime_s="600"), "min_runtime_s"),
        Case(WRONG_TYPE, SUBMIT, sub, submit(priority={"high": True}), "priority"),
        Case(WRONG_TYPE, CANCEL, can, dumps({**cancel_template(placed), "reason": 7}), "reason"),
        Case(WRONG_TYPE, BUDGET, budget, dumps({**budget_template(), "shares": "3"}), "shares"),
        Case(WRONG_TYPE, BUDGET, budget, dumps({**budget_template(), "path": "root/nlp"}), "path"),
        Case(WRONG_TYPE, DRAIN, drain, dumps({**drain_template(), "operator": 1}), "operator"),
        Case(
            WRONG_TYPE,
            STATUS,
            s.QUERY_STATUS,
            dumps({**status_template(placed), "workload_id": 1}),
            "workload_id",
        ),
        Case(WRONG_TYPE, HEARTBEAT, hb, dumps({**heartbeat_template(), "gpus": "8"}), "gpus"),
        Case(WRONG_TYPE, HEALTH, hr, dumps({**health_template(), "healthy": "no"}), "healthy"),
        # -- unknown fields -------------------------------------------------------------
        Case(UNKNOWN_FIELD, SUBMIT, sub, submit(colour="red"), "colour"),
        Case(UNKNOWN_FIELD, SUBMIT, sub, submit(GPUS=4), "GPUS"),
        Case(UNKNOWN_FIELD, SUBMIT, sub, submit(__proto__={"admin": True}), "__proto__"),
        Case(UNKNOWN_FIELD, SUBMIT, sub, submit(**{"a`b": 1}), "a`b", note="backtick in key"),
        Case(UNKNOWN_FIELD, CANCEL, can, dumps({**cancel_template(placed), "force": 1}), "force"),
        Case(UNKNOWN_FIELD, BUDGET, budget, dumps({**budget_template(), "sudo": 1}), "sudo"),
        Case(
            UNKNOWN_FIELD,
            UNDRAIN,
            undrain,
            dumps({"type": "UndrainHost", "host": HOST, "operator": "op", "reason": "x"}),
            "reason",
        ),
        Case(UNKNOWN_FIELD, HEARTBEAT, hb, dumps({**heartbeat_template(), "load": 1}), "load"),
        # -- duplicate keys -------------------------------------------------------------
        Case(DUPLICATE_KEY, SUBMIT, sub, splice(ok, "gpus", b"3"), "gpus"),
        Case(DUPLICATE_KEY, SUBMIT, sub, splice(ok, "type", b'"SubmitWorkload"'), "type"),
        Case(DUPLICATE_KEY, SUBMIT, sub, splice(ok, "allocation", b'"vision"'), "allocation"),
        Case(DUPLICATE_KEY, DRAIN, drain, splice(dumps(drain_template()), "host", b'"h1"'), "host"),
        Case(
            DUPLICATE_KEY,
            HEALTH,
            hr,
            splice(dumps(health_template()), "healthy", b"true"),
            "healthy",
        ),
        # -- nesting 1000 deep ----------------------------------------------------------
        Case(DEEP_NESTING, SUBMIT, sub, deep_array(1000), BODY),
        Case(
            DEEP_NESTING,
            SUBMIT,
            sub,
            deep_object(1000),
            BODY,
            note="a submit is a union: its type is sought first, through the nesting",
        ),
        Case(
            DEEP_NESTING,
            SUBMIT,
            sub,
            ok.replace(b'"command": ["sleep", "1"]', b'"command": ' + deep_array(1000)),
            "command",
        ),
        Case(DEEP_NESTING, SUBMIT, sub, splice(ok, "extra", deep_object(1000)), "extra"),
        Case(DEEP_NESTING, BUDGET, budget, deep_array(1000), BODY),
        Case(DEEP_NESTING, STATUS, s.QUERY_STATUS, deep_object(1000), "a"),
        Case(DEEP_NESTING, HEARTBEAT, hb, deep_array(1000), BODY),
        # -- NaN and huge numbers -------------------------------------------------------
        Case(NAN_HUGE, SUBMIT, sub, ok.replace(b'"gpus": 2', b'"gpus": NaN'), "gpus"),
        Case(NAN_HUGE, SUBMIT, sub, ok.replace(b'"gpus": 2', b'"gpus": Infinity'), "gpus"),
        Case(
            NAN_HUGE,
            SUBMIT,
            sub,
            ok.replace(b'"duration_s": 5.0', b'"duration_s": 1e999'),
            "duration_s",
        ),
        Case(
            NAN_HUGE,
            SUBMIT,
            sub,
            ok.replace(b'"duration_s": 5.0', b'"duration_s": -Infinity'),
            "duration_s",
        ),
        Case(NAN_HUGE, SUBMIT, sub, submit(gpus=10**40), "gpus"),
        Case(NAN_HUGE, SUBMIT, sub, submit(priority=-(10**30)), "priority"),
        Case(NAN_HUGE, BUDGET, budget, dumps({**budget_template(), "shares": 10**25}), "shares"),
        Case(
            NAN_HUGE,
            HEARTBEAT,
            hb,
            dumps(heartbeat_template()).replace(b"1700000000.0", b"NaN"),
            "sent_at",
        ),
        Case(NAN_HUGE, HEARTBEAT, hb, dumps({**heartbeat_template(), "seq": 2**70}), "seq"),
        # -- invalid UTF-8 --------------------------------------------------------------
        Case(BAD_UTF8, SUBMIT, sub, ok.replace(b'"ann"', b'"a\xffn"'), "user"),
        Case(BAD_UTF8, SUBMIT, sub, ok.replace(b'"training"', b'"tr\xc0\xafin"'), "kind"),
        Case(
            BAD_UTF8,
            SUBMIT,
            sub,
            ok.replace(b'"ann"', b'"a\xed\xa0\x80"'),
            "user",
            note="UTF-8-encoded surrogate",
        ),
        Case(
            BAD_UTF8,
            SUBMIT,
            sub,
            ok.replace(b'"ann"', b'"a\\ud800"'),
            "user",
            note="escaped lone surrogate",
        ),
        Case(BAD_UTF8, SUBMIT, sub, b"\xff\xfe" + ok, BODY),
        Case(
            BAD_UTF8,
            DRAIN,
            drain,
            dumps(drain_template()).replace(b'"op"', b'"o\x80p"'),
            "operator",
        ),
        Case(
            BAD_UTF8,
            HEALTH,
            hr,
            dumps({**health_template(), "detail": "x"}).replace(b'"x"', b'"\xf8\x88\x80\x80\x80"'),
            "detail",
        ),
        # -- oversized payloads ---------------------------------------------------------
        Case(OVERSIZED, SUBMIT, sub, submit(kind="x" * 70_000), BODY),
        # -- batches (SubmitBatch): a body that does not decode is refused whole ----------
        Case(
            OVERSIZED,
            SUBMIT,
            sub,
            dumps(batch([submit_template(f"b{i}") for i in range(257)])),
            "workloads",
        ),
        Case(
            OVERSIZED,
            SUBMIT,
            sub,
            dumps(batch([{**submit_template(f"b{i}"), "kind": "k" * 60} for i in range(300)])),
            BODY,
            note="~80 KB",
        ),
        Case(MALFORMED, SUBMIT, sub, dumps(batch([])), "workloads"),
        Case(
            MALFORMED, SUBMIT, sub, dumps(batch([batch([submit_template()])])), "workloads[0].type"
        ),
        Case(
            WRONG_TYPE,
            SUBMIT,
            sub,
            dumps({"type": "SubmitBatch", "workloads": submit_template()}),
            "workloads",
        ),
        Case(
            ABSURD,
            SUBMIT,
            sub,
            dumps(batch([submit_template(), {**submit_template("b"), "gpus": -8}])),
            "workloads[1].gpus",
        ),
        Case(
            UNKNOWN_FIELD,
            SUBMIT,
            sub,
            dumps({**batch([submit_template()]), "priority": 9}),
            "priority",
        ),
        Case(OVERSIZED, SUBMIT, sub, submit(command=["x" * 1000] * 900), BODY, note="~900 KB"),
        Case(OVERSIZED, SUBMIT, sub, submit(command=["x"] * 300), "command", note="300 args"),
        Case(OVERSIZED, SUBMIT, sub, submit(command=["x" * 5000]), "command"),
        Case(
            OVERSIZED,
            CANCEL,
            can,
            dumps({**cancel_template(placed), "reason": "r" * 2000}),
            "reason",
        ),
        Case(OVERSIZED, DRAIN, drain, dumps({**drain_template(), "reason": "r" * 65_600}), BODY),
        Case(
            OVERSIZED,
            HEARTBEAT,
            hb,
            dumps({**heartbeat_template(), "running": ["w"] * 2000}),
            "running",
        ),
        # -- names with '.', '*', '>', spaces, unicode ----------------------------------
        Case(BAD_NAME, SUBMIT, sub, submit(user="ann.smith"), "user"),
        Case(BAD_NAME, SUBMIT, sub, submit(client_id="c*"), "client_id"),
        Case(BAD_NAME, SUBMIT, sub, submit(client_id=">"), "client_id"),
        Case(BAD_NAME, SUBMIT, sub, submit(user="ann smith"), "user"),
        Case(BAD_NAME, SUBMIT, sub, submit(kind="trainé"), "kind"),
        Case(BAD_NAME, SUBMIT, sub, submit(user="ann\n"), "user"),
        Case(BAD_NAME, SUBMIT, sub, submit(client_id=""), "client_id"),
        Case(BAD_NAME, SUBMIT, sub, submit(client_id="c" * 65), "client_id"),
        Case(BAD_NAME, SUBMIT, sub, submit(allocation="nlp.>"), "allocation"),
        Case(BAD_NAME, SUBMIT, sub, submit(user="用户"), "user"),
        Case(BAD_NAME, CANCEL, can, dumps({**cancel_template(placed), "user": "a b"}), "user"),
        Case(
            BAD_NAME,
            BUDGET,
            s.budget_set(["root", "nlp"]),
            dumps({**budget_template(), "path": ["root", "n.lp"]}),
            "path",
        ),
        Case(BAD_NAME, DRAIN, drain, dumps({**drain_template(), "operator": "*"}), "operator"),
        Case(BAD_NAME, STATUS, s.QUERY_STATUS, dumps(status_template("w.>")), "workload_id"),
        Case(
            BAD_NAME, HEARTBEAT, hb, dumps({**heartbeat_template(), "running": ["a.b"]}), "running"
        ),
        # -- negative or absurd GPU counts and times ------------------------------------
        Case(ABSURD, SUBMIT, sub, submit(gpus=0), "gpus"),
        Case(ABSURD, SUBMIT, sub, submit(gpus=-8), "gpus"),
        Case(
            ABSURD,
            SUBMIT,
            sub,
            submit(gpus=CLUSTER_GPUS + 1),
            "gpus",
            note="over the cluster, under the wire ceiling",
        ),
        Case(ABSURD, SUBMIT, sub, submit(gpus=16_385), "gpus"),
        Case(ABSURD, SUBMIT, sub, submit(min_runtime_s=-1), "min_runtime_s"),
        Case(ABSURD, SUBMIT, sub, submit(min_runtime_s=8 * 3600 + 1), "min_runtime_s"),
        Case(ABSURD, SUBMIT, sub, submit(env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}), "env"),
        Case(ABSURD, SUBMIT, sub, submit(env={"ALLOT_WORKLOAD_ID": "someone-else"}), "env"),
        Case(BAD_NAME, SUBMIT, sub, submit(env={"1BAD": "x"}), "env"),
        Case(BAD_NAME, SUBMIT, sub, submit(env={"A=B": "x"}), "env"),
        Case(WRONG_TYPE, SUBMIT, sub, submit(env={"A": 1}), "env"),
        Case(WRONG_TYPE, SUBMIT, sub, submit(env=["A=1"]), "env"),
        Case(ABSURD, SUBMIT, sub, submit(env={"A": "x\u0000y"}), "env"),
        Case(ABSURD, SUBMIT, sub, submit(command=["python", "x\u0000y"]), "command[1]"),
        Case(ABSURD, SUBMIT, sub, submit(env={f"V{i}": "x" for i in range(65)}), "env"),
        Case(ABSURD, SUBMIT, sub, submit(duration_s=0), "duration_s"),
        Case(ABSURD, SUBMIT, sub, submit(duration_s=-30.0), "duration_s"),
        Case(ABSURD, SUBMIT, sub, submit(duration_s=1e300), "duration_s"),
        Case(ABSURD, BUDGET, budget, dumps({**budget_template(), "shares": -1}), "shares"),
        Case(ABSURD, HEARTBEAT, hb, dumps({**heartbeat_template(), "gpus": -1}), "gpus"),
        Case(ABSURD, HEARTBEAT, hb, dumps({**heartbeat_template(), "sent_at": -5.0}), "sent_at"),
        Case(ABSURD, HEARTBEAT, hb, dumps({**heartbeat_template(), "sent_at": 1e15}), "sent_at"),
        Case(ABSURD, HEALTH, hr, dumps({**health_template(), "failed_gpus": [-1]}), "failed_gpus"),
        Case(
            ABSURD, HEALTH, hr, dumps({**health_template(), "failed_gpus": [4096]}), "failed_gpus"
        ),
        # -- malformed bodies and wrong messages ----------------------------------------
        Case(MALFORMED, SUBMIT, sub, b"", BODY),
        Case(MALFORMED, SUBMIT, sub, b"null", BODY),
        Case(MALFORMED, SUBMIT, sub, b"[]", BODY),
        Case(MALFORMED, SUBMIT, sub, b'"SubmitWorkload"', BODY),
        Case(MALFORMED, SUBMIT, sub, b"\x00\x01\x02", BODY),
        Case(MALFORMED, SUBMIT, sub, ok[:-1], BODY, note="truncated"),
        Case(MALFORMED, SUBMIT, sub, ok + b" trailing", BODY, note="garbage after the object"),
        Case(
            MALFORMED, SUBMIT, sub, dumps({**submit_template(), "type": "CancelWorkload"}), "type"
        ),
        Case(
            MALFORMED,
            SUBMIT,
            sub,
            submit(colour="red"),
            "colour",
            headers=(("traceparent", "00-zz-not-a-trace-01"), ("Nats-Msg-Id", "")),
            note="junk trace headers",
        ),
        # FastStream decodes a body itself when its content-type header says JSON or text
        # (before our handler sees it): a lying header must not cost the reply.
        Case(
            MALFORMED,
            SUBMIT,
            sub,
            b"{",
            BODY,
            headers=(("content-type", "application/json"),),
            note="JSON content-type on malformed JSON",
        ),
        Case(
            BAD_UTF8,
            SUBMIT,
            sub,
            ok.replace(b'"ann"', b'"a\xffn"'),
            "user",
            headers=(("content-type", "text/plain"),),
            note="text content-type on bad UTF-8",
        ),
        Case(
            MALFORMED,
            DRAIN,
            drain,
            b"{",
            BODY,
            headers=(("content-type", "application/json"),),
            note="JSON content-type on malformed JSON",
        ),
        Case(
            MALFORMED,
            HEARTBEAT,
            hb,
            b"{",
            BODY,
            headers=(("content-type", "application/json"),),
            note="JSON content-type on malformed JSON",
        ),
        Case(MALFORMED, CANCEL, can, b"{", BODY),
        Case(MALFORMED, BUDGET, budget, b"", BODY),
        Case(
            MALFORMED,
            DRAIN,
            drain,
            dumps({"type": "UndrainHost", "host": HOST, "operator": "op"}),
            "type",
        ),
        Case(MALFORMED, UNDRAIN, undrain, b"[1, 2, 3]", BODY),
        Case(MALFORMED, STATUS, s.QUERY_STATUS, b"", BODY),
        Case(MALFORMED, STATUS, s.QUERY_STATUS, dumps(heartbeat_template()), "type"),
        Case(MALFORMED, HEARTBEAT, hb, b"beat", BODY),
        Case(MALFORMED, HEALTH, hr, b"", BODY),
        # -- subject/payload mismatches and unknown targets -----------------------------
        Case(MISMATCH, SUBMIT, s.submit("vision"), ok, "allocation"),
        Case(MISMATCH, SUBMIT, unalloc, ok, "allocation"),
        Case(MISMATCH, SUBMIT, s.submit("chem"), submit(allocation="chem"), "allocation"),
        Case(
            MISMATCH,
            SUBMIT,
            s.submit("root"),
            submit(allocation="root"),
            "allocation",
            note="an inner node is not an allocation",
        ),
        Case(
            MISMATCH,
            CANCEL,
            s.cancel(ALLOCATION, "wdeadbeef"),
            dumps(cancel_template(placed)),
            "workload_id",
        ),
        Case(
            MISMATCH,
            CANCEL,
            s.cancel("vision", placed),
            dumps({**cancel_template(placed), "allocation": "vision"}),
            "workload_id",
        ),
        Case(
            MISMATCH,
            CANCEL,
            can,
            dumps({**cancel_template(placed), "allocation": "vision"}),
            "allocation",
            note="left out, it would be the subject's",
        ),
        # -- a name other than the identity subject's login -----------------------------
        Case(MISMATCH, SUBMIT, s.submit_as(ALLOCATION, "mallory"), ok, "user"),
        Case(
            MISMATCH,
            CANCEL,
            s.cancel_as(ALLOCATION, placed, "mallory"),
            dumps(cancel_template(placed)),
            "user",
        ),
        Case(
            MISMATCH,
            CANCEL,
            s.cancel_as(ALLOCATION, placed, "op", s.OPERATOR),
            dumps(cancel_template(placed)),
            "user",
            note="the operators' form: it would cancel anyone's",
        ),
        Case(
            MISMATCH,
            BUDGET,
            s.budget_set_as(["root", ALLOCATION], "mallory"),
            dumps(budget_template()),
            "set_by",
        ),
        Case(MISMATCH, DRAIN, s.drain_as(HOST, "mallory"), dumps(drain_template()), "operator"),
        Case(
            MISMATCH,
            UNDRAIN,
            s.undrain_as(HOST, "mallory"),
            dumps({"type": "UndrainHost", "host": HOST, "operator": "op"}),
            "operator",
        ),
        Case(
            MISMATCH,
            CANCEL,
            s.cancel(ALLOCATION, "wnothere"),
            dumps(cancel_template("wnothere")),
            "workload_id",
        ),
        Case(
            MISMATCH,
            BUDGET,
            budget,
            dumps({**budget_template(), "path": ["root", "vision"]}),
            "path",
        ),
        Case(
            MISMATCH,
            BUDGET,
            s.budget_set(["root", "chem"]),
            dumps({**budget_template(), "path": ["root", "chem"]}),
            "path",
        ),
        Case(
            MISMATCH,
            BUDGET,
            s.budget_set(["root", "nlp", "a"]),
            dumps({**budget_template(), "path": ["root", "nlp", "a"]}),
            "path",
        ),
        Case(
            MISMATCH,
            BUDGET,
            "allot.v1.budget.set.root",
            dumps({**budget_template(), "path": ["root"]}),
            "path",
        ),
        Case(
            MISMATCH,
            BUDGET,
            "allot.v1.budget.set." + ".".join(["root", *["n"] * 110]),
            dumps({**budget_template(), "path": ["root", *["n"] * 110]}),
            "path",
        ),
        Case(MISMATCH, DRAIN, s.drain(OTHER_HOST), dumps(drain_template()), "host"),
        Case(MISMATCH, DRAIN, s.drain("h9"), dumps({**drain_template(), "host": "h9"}), "host"),
        Case(
            MISMATCH,
            UNDRAIN,
            s.undrain("h9"),
            dumps({"type": "UndrainHost", "host": "h9", "operator": "op"}),
            "host",
        ),
        Case(MISMATCH, HEARTBEAT, s.heartbeat(OTHER_HOST), dumps(heartbeat_template()), "host"),
        Case(MISMATCH, HEALTH, s.health(OTHER_HOST), dumps(health_template()), "host"),
        Case(
            MISMATCH,
            HEALTH,
            s.health("h9"),
            dumps({**health_template(), "host": "h9"}),
            "host",
            note="unregistered host",
        ),
        # -- missing required fields ----------------------------------------------------
        Case(
            MISSING,
            SUBMIT,
            sub,
            dumps({"type": "SubmitWorkload", "client_id": "c", "user": "u"}),
            "gpus",
        ),
        Case(
            MISSING,
            BUDGET,
            budget,
            dumps({"type": "SetBudget", "path": ["root", "nlp"], "set_by": "boss"}),
            "shares",
            note="shares has no default: null (parent) must be explicit",
        ),
        Case(MISSING, STATUS, s.QUERY_STATUS, b"{}", "workload_id"),
        # ``type`` is required everywhere (proto/schema.json), a batch's items included.
        Case(MISSING, SUBMIT, sub, untyped(submit_template()), "type"),
        Case(
            MISSING,
            SUBMIT,
            sub,
            dumps(batch([submit_template("b0"), typeless(submit_template("b1"))])),
            "workloads[1].type",
        ),
        Case(MISSING, CANCEL, can, untyped(cancel_template(placed)), "type"),
        Case(
            MISSING,
            CANCEL,
            can + ".operator",
            untyped({**cancel_template(placed), "user": "op"}),
            "type",
        ),
        Case(MISSING, BUDGET, budget, untyped(budget_template()), "type"),
        Case(MISSING, DRAIN, drain, untyped(drain_template()), "type"),
        Case(MISSING, UNDRAIN, undrain, dumps({"host": HOST, "operator": "op"}), "type"),
        Case(MISSING, STATUS, s.QUERY_STATUS, untyped(status_template(placed)), "type"),
        Case(MISSING, HEARTBEAT, hb, untyped(heartbeat_template()), "type"),
        Case(MISSING, HEALTH, hr, untyped(health_template()), "type"),
        # -- replays ----------------------------------------------------------------------
        Case(
            REPLAY,
            SUBMIT,
            sub,
            submit(client_id=PLACED_CLIENT_ID),
            "client_id",
            note="client_id of the running workload reused with other values",
        ),
        Case(
            MISMATCH,
            CANCEL,
            can,
            dumps({**cancel_template(placed), "user": "mallory"}),
            "user",
            note="not the workload's owner",
        ),
    ]
    # -- an agent's report of its part (dispatch) -------------------------------------
    rep, rep_other = s.host_report(HOST), s.host_report(OTHER_HOST)

    def report(**changes: Any) -> bytes:
        return dumps({**report_template(placed), **changes})

    now = time.time()

    cases += [
        Case(MISMATCH, REPORT, rep, report(host=OTHER_HOST), "host", note="payload host differs"),
        Case(MISMATCH, REPORT, rep_other, report(host=OTHER_HOST), "host", note="not primary"),
        Case(MISMATCH, REPORT, rep, report(workload_id="ghost"), "workload_id"),
        Case(MISMATCH, REPORT, rep, report(attempt=2), "attempt", note="an attempt to come"),
        Case(WRONG_TYPE, REPORT, rep, report(event="exploded"), "event"),
        Case(WRONG_TYPE, REPORT, rep, report(exit_code="0"), "exit_code"),
        Case(ABSURD, REPORT, rep, report(exit_code=256), "exit_code"),
        Case(ABSURD, REPORT, rep, report(at=-1.0), "at"),
        Case(NAN_HUGE, REPORT, rep, report(at=1e300), "at"),
        # Issue 34: times that would charge GPU time that never ran.
        Case(ABSURD, REPORT, rep, report(at=now + DAYS_30), "at", note="an end 30 days ahead"),
        Case(ABSURD, REPORT, rep, report(at=m.MAX_TIME), "at", note="an end at the schema's limit"),
        Case(
            ABSURD,
            REPORT,
            rep,
            report(started_at=now - DAYS_30),
            "started_at",
            note="a start 30 days before the placement",
        ),
        Case(
            ABSURD,
            REPORT,
            rep,
            report(started_at=now - 10, at=now - 20),
            "at",
            note="an end before its start",
        ),
        Case(MALFORMED, REPORT, rep, dumps(heartbeat_template()), "type"),
        Case(MISSING, REPORT, rep, untyped(report_template(placed)), "type"),
        Case(
            MISSING,
            REPORT,
            s.HOSTS_REPORT,
            dumps({"reports": [report_template(placed)]}),
            "type",
            note="PartReports",
        ),
        Case(
            MISSING,
            REPORT,
            s.HOSTS_REPORT,
            dumps({"type": "PartReports", "reports": [typeless(report_template(placed))]}),
            "reports[0].type",
        ),
    ]
    return cases


# == hypothesis strategies =====================================================================

_NAME_CHARS = string.ascii_letters + string.digits + "_-"
_valid_text = st.text(alphabet=_NAME_CHARS, max_size=10)
_bad_char = st.one_of(
    st.sampled_from([".", "*", ">", " ", "\t", "\n", "/", "~", "é", "名", "\u200b", "\x00"]),
    st.characters(blacklist_characters=_NAME_CHARS, blacklist_categories=("Cs",)),
)

bad_names = st.one_of(
    st.just(""),
    st.text(alphabet=_NAME_CHARS, min_size=65, max_size=80),
    st.builds(lambda a, c, b: a + c + b, _valid_text, _bad_char, _valid_text),
)
"""Strings that are not names: empty, too long, or holding a character outside
``[A-Za-z0-9_-]`` (the subject-token specials ``.``, ``*``, ``>`` and whitespace first)."""

_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.text(max_size=8)
)
_not_str = st.one_of(
    st.integers(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(_json_scalars, max_size=3),
    st.dictionaries(st.text(max_size=4), _json_scalars, max_size=2),
)
_not_int = st.one_of(
    st.text(max_size=8),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def _int_outside(lo: int, hi: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(max_value=lo - 1),
        st.integers(min_value=hi + 1),
        st.integers(max_value=-(10**20)),
        st.integers(min_value=10**20),
        _not_int,
    )


def _name(optional: bool = False) -> st.SearchStrategy[Any]:
    wrong = _not_str if optional else st.one_of(_not_str, st.none())
    return st.one_of(bad_names, wrong)


_text_field = st.one_of(_not_str, st.text(alphabet="ab", min_size=1025, max_size=1100))
_not_bool = st.one_of(st.integers(), st.text(max_size=5), st.none(), st.lists(st.booleans()))
_bad_command = st.one_of(
    _not_str.filter(lambda v: not isinstance(v, list)),
    st.lists(_not_str, min_size=1, max_size=3),
    st.lists(st.just("x"), min_size=257, max_size=260),
    st.lists(st.text(alphabet="x", min_size=4097, max_size=4100), min_size=1, max_size=1),
)
_ENV_CHARS = string.ascii_letters + "_"
_bad_env_names = st.one_of(
    st.just(""),
    st.text(alphabet=string.digits, min_size=1, max_size=3),  # a digit first
    st.text(alphabet=_ENV_CHARS, min_size=129, max_size=140),
    st.builds(
        lambda a, c, b: a + c + b,
        st.text(alphabet=_ENV_CHARS, min_size=1, max_size=5),
        st.sampled_from(["-", ".", "=", " ", "\n", "\x00", "é", "$"]),
        st.text(alphabet=_ENV_CHARS, max_size=5),
    ),
)
_bad_env = st.one_of(
    _not_str.filter(lambda v: not isinstance(v, (dict, str))),
    st.dictionaries(_bad_env_names, st.just("x"), min_size=1, max_size=2),
    st.dictionaries(st.just("A"), _not_str, min_size=1),
    st.sampled_from(sorted(m.RESERVED_ENV)).map(lambda n: {n: "x"}),
)
_bad_duration = st.one_of(
    st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
    st.floats(min_value=1.01e11, allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.booleans(),
    st.lists(st.floats(0.1, 10), max_size=2),
)
_bad_path = st.one_of(
    _not_str.filter(lambda v: not isinstance(v, list)),
    st.lists(bad_names, min_size=1, max_size=3).map(lambda xs: ["root", *xs]),
    st.lists(_not_str, min_size=1, max_size=2).map(lambda xs: ["root", *xs]),
)

FIELD_STRATEGIES: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "SubmitWorkload": {
        "client_id": _name(),
        "user": _name(),
        "kind": _name(),
        "allocation": _name(True),
        "gpus": _int_outside(1, CLUSTER_GPUS),
        "min_runtime_s": _int_outside(0, 28_800),
        "priority": _int_outside(-1000, 1000),
        "resumable": _not_bool,
        "command": _bad_command,
        "env": _bad_env,
        "duration_s": _bad_duration,
    },
    "CancelWorkload": {
        "workload_id": _name(),
        "user": _name(),
        "allocation": _name(True),
        "reason": _text_field,
    },
    "SetBudget": {
        "path": _bad_path,
        "set_by": _name(),
        "shares": st.one_of(st.integers(max_value=-1), st.integers(min_value=1_000_001), _not_int),
    },
    "DrainHost": {"host": _name(), "operator": _name(), "reason": _text_field},
    "StatusQuery": {"workload_id": _name()},
    "PartReport": {
        "host": _name(),
        "workload_id": _name(),
        "attempt": _int_outside(1, 1_000_000),
        "event": st.one_of(
            st.text(max_size=12).filter(
                lambda e: e not in ("started", "exited", "lost", "not-started")
            ),
            _not_str,
        ),
        "at": _bad_duration.filter(lambda v: not (isinstance(v, float) and v == 0.0)),
        "exit_code": _int_outside(-255, 255),
        "detail": _text_field,
        "stopping": _not_bool,
    },
}
REQUIRED = {
    "SubmitWorkload": ("type", "client_id", "user", "gpus"),
    "CancelWorkload": ("type", "workload_id", "user"),
    "SetBudget": ("type", "path", "shares", "set_by"),
    "DrainHost": ("type", "host", "operator"),
    "StatusQuery": ("type", "workload_id"),
    "PartReport": ("type", "host", "workload_id", "attempt", "event", "at"),
}
_OTHER_TYPES = [
    "SubmitWorkload",
    "CancelWorkload",
    "SetBudget",
    "DrainHost",
    "UndrainHost",
    "StatusQuery",
    "Heartbeat",
    "WorkloadPlaced",
    "Bogus",
    "",
    "submitworkload",
]


def templates(placed: str) -> dict[str, tuple[str, str, Callable[[], dict[str, Any]]]]:
    """Message type -> (kind, subject, valid body factory)."""
    return {
        "SubmitWorkload": (SUBMIT, s.submit(ALLOCATION), submit_template),
        "CancelWorkload": (CANCEL, s.cancel(ALLOCATION, placed), lambda: cancel_template(placed)),
        "SetBudget": (BUDGET, s.budget_set(["root", ALLOCATION]), budget_template),
        "DrainHost": (DRAIN, s.drain(HOST), drain_template),
        "StatusQuery": (STATUS, s.QUERY_STATUS, lambda: status_template(placed)),
        "PartReport": (REPORT, s.host_report(HOST), lambda: report_template(placed)),
    }


@st.composite
def mutated_commands(draw: st.DrawFn, placed: str) -> Case:
    """A valid command made invalid in exactly one way; the case names the field at fault."""
    kinds = templates(placed)
    mtype = draw(st.sampled_from(sorted(kinds)))
    kind, subject, make = kinds[mtype]
    body = make()
    how = draw(st.sampled_from(["value", "value", "value", "unknown", "duplicate", "drop", "tag"]))
    if how == "value":
        field = draw(st.sampled_from(sorted(FIELD_STRATEGIES[mtype])))
        body[field] = draw(FIELD_STRATEGIES[mtype][field])
        category = _category_of(body[field])
        return Case(category, kind, subject, dumps(body), field)
    if how == "unknown":
        # Backticks are left out: the hand-written table has that case (msgspec quotes
        # the key in backticks, see the report).
        key = draw(
            st.text(min_size=1, max_size=30).filter(
                lambda k: k not in body and k != "type" and "`" not in k
            )
        )
        body[key] = draw(_json_scalars)
        return Case(UNKNOWN_FIELD, kind, subject, dumps(body), key)
    if how == "duplicate":
        key = draw(st.sampled_from(sorted(body)))
        pairs = list(body.items())
        pairs.insert(draw(st.integers(0, len(pairs))), (key, body[key]))
        return Case(DUPLICATE_KEY, kind, subject, with_pairs(pairs), key)
    if how == "drop":
        key = draw(st.sampled_from(REQUIRED[mtype]))
        del body[key]
        return Case(MISSING, kind, subject, dumps(body), key)
    body["type"] = draw(st.sampled_from([t for t in _OTHER_TYPES if t != mtype]))
    return Case(MALFORMED, kind, subject, dumps(body), "type")


def _category_of(value: Any) -> str:
    if isinstance(value, str) and (
        not value or len(value) > 64 or any(c not in _NAME_CHARS for c in value)
    ):
        return BAD_NAME
    if isinstance(value, int | float) and not isinstance(value, bool):
        return ABSURD if abs(value) < 10**20 else NAN_HUGE
    if isinstance(value, list) and len(value) > 200:
        return OVERSIZED
    return WRONG_TYPE
