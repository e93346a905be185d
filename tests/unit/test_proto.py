"""The wire contract: committed schema files, round trips, hostile input, subject tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from allot.core.decisions import PreemptReason
from allot.core.errors import ValidationError
from allot.core.model import MAX_MIN_RUNTIME_S
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.proto.codec import (
    MAX_PAYLOAD,
    PATTERN_WORDS,
    TYPES,
    decode,
    decode_as,
    encode,
    item_field,
)
from allot.proto.schema import drift, generated, main
from allot.proto.subjects import Kind

PROTO_DIR = Path(__file__).resolve().parents[2] / "proto"
T0 = 1_700_000_000.0


# -- builders ---------------------------------------------------------------------------------


def submit(**overrides: Any) -> dict[str, Any]:
    """A valid SubmitWorkload as the JSON object a non-SDK client would send."""
    body: dict[str, Any] = {
        "type": "SubmitWorkload",
        "client_id": "c-123",
        "user": "ada",
        "allocation": "nlp-pretrain",
        "gpus": 8,
        "min_runtime_s": 3600,
    }
    body.update(overrides)
    return body


def raw(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


def samples() -> list[msgspec.Struct]:
    """One instance of every message, with optional fields set."""
    assignment = (m.HostGpus(host="h01", gpus=(0, 1)), m.HostGpus(host="h02", gpus=(3,)))
    return [
        m.SubmitWorkload(
            client_id="c-1",
            user="ada",
            gpus=4,
            allocation="nlp",
            min_runtime_s=28_800,
            command=("python", "train.py"),
            duration_s=90.5,
        ),
        m.SubmitBatch(
            workloads=(
                m.SubmitWorkload(client_id="c-2", user="ada", gpus=1, allocation="nlp"),
                m.SubmitWorkload(client_id="c-3", user="ada", gpus=2, allocation="nlp"),
            )
        ),
        m.CancelWorkload(workload_id="w-1", user="ada", allocation=None, reason="changed my mind"),
        m.SetBudget(path=("root", "nlp", "pretrain"), shares=None, set_by="boss"),
        m.DrainHost(host="h01", operator="ops", reason="ECC errors"),
        m.UndrainHost(host="h01", operator="ops"),
        m.Heartbeat(host="h01", sent_at=T0, seq=7, gpus=8, running=("w-1",)),
        m.HealthReport(host="h01", sent_at=T0, healthy=False, failed_gpus=(3,), detail="xid 79"),
        m.WorkloadAccepted(workload_id="w-1", client_id="c-1", allocation="nlp", at=T0),
        m.WorkloadRejected(client_id="c-1", at=T0, field="gpus", reason="must be >= 1"),
        m.WorkloadQueued(workload_id="w-1", at=T0, position=3, sort_metric=-0.5, rank=2),
        m.WorkloadPlaced(workload_id="w-1", at=T0, gpus=3, assignment=assignment),
        m.WorkloadStarted(workload_id="w-1", at=T0, host="h01", pid=4242),
        m.PreemptionNotice(
            workload_id="w-1",
            allocation="cv",
            at=T0,
            reason="better-ranked",
            grace_deadline=T0 + 300,
            requeue=True,
            gpus=8,
            preemptor="w-9",
            victim_held_gpus=16,
            victim_entitlement_gpus=12.5,
        ),
        m.WorkloadPreempted(workload_id="w-1", at=T0, reason="host-drain", gpu_seconds=10.0),
        m.WorkloadRequeued(workload_id="w-1", at=T0, attempt=2),
        m.WorkloadCompleted(workload_id="w-1", at=T0, gpu_seconds=3600.0),
        m.WorkloadFailed(workload_id="w-1", at=T0, exit_code=-9, reason="killed"),
        m.WorkloadCancelled(workload_id="w-1", at=T0, by="ada"),
        m.HostDraining(host="h01", at=T0, reason="missed heartbeats"),
        m.HostDrained(host="h01", at=T0),
        m.HostHealthy(host="h01", at=T0),
        m.RankingUpdated(
            at=T0,
            window_s=7 * 86_400.0,
            nodes=(
                m.RankRow(
                    path="root/nlp",
                    name="nlp",
                    leaf=True,
                    raw_shares=10,
                    norm_shares=0.5,
                    raw_usage=0.0,
                    effective_usage=0.0,
                    level_fs="inf",
                    rank=2,
                    fairshare=1.0,
                ),
                m.RankRow(
                    path="root/cv",
                    name="cv",
                    leaf=True,
                    raw_shares=10,
                    norm_shares=0.5,
                    raw_usage=5.0,
                    effective_usage=1.0,
                    level_fs=0.5,
                    rank=1,
                    fairshare=0.5,
                ),
            ),
        ),
    ]


def kind_of(msg: msgspec.Struct) -> Kind:
    return next(k for k, t in TYPES.items() if type(msg) in getattr(t, "__args__", (t,)))


SUBMIT_ANSWERS = (m.WorkloadAccepted, m.WorkloadRejected)
"""Answers to a submission: a request's reply, carried by no subject kind (the SDK decodes
them as a union)."""


# -- generated files --------------------------------------------------------------------------


def test_committed_schema_files_match_the_structs() -> None:
    """Fails when a Struct changes without `python -m allot.proto.schema --write`."""
    for name, text in generated().items():
        committed = (PROTO_DIR / name).read_text(encoding="utf-8")
        assert committed == text, f"proto/{name} drifted: run python -m allot.proto.schema --write"


def test_check_mode_reports_drift(tmp_path: Path) -> None:
    assert main(["--write", "--dir", str(tmp_path)]) == 0
    assert main(["--check", "--dir", str(tmp_path)]) == 0
    (tmp_path / "schema.json").write_text("{}\n", encoding="utf-8")
    assert drift(tmp_path) == ["schema.json"]
    assert main(["--check", "--dir", str(tmp_path)]) == 1


def test_schema_lists_every_message_and_asyncapi_every_subject_kind() -> None:
    schema = json.loads(generated()["schema.json"])
    assert set(schema["messages"]) == {c.__name__ for c in m.MESSAGES}
    api = json.loads(generated()["asyncapi.json"])
    assert api["asyncapi"] == "3.0.0"
    addresses = {c["address"] for c in api["channels"].values()} - {None}
    queries = {
        s.QUERY_QUEUE,
        s.QUERY_PRIO,
        s.QUERY_HOSTS,
        s.QUERY_SHARE,
        s.QUERY_STATUS,
        s.QUERY_ALLOCATIONS,
        s.QUERY_PLACEMENT_STATS,
        s.QUERY_OWED,
        s.QUERY_USAGE,
        s.QUERY_IDLE,
        s.QUERY_HISTORY,
        s.QUERY_INTAKE,
        s.DASHBOARD_LOG,
    }
    # the per-allocation forms too: the only query subjects a team may use under auth
    scoped = {
        f"{q}.{{allocation}}" for q in (s.QUERY_QUEUE, s.QUERY_PRIO, s.QUERY_STATUS, s.QUERY_IDLE)
    }
    assert addresses == set(s.CHANNELS.values()) | queries | scoped
    assert set(api["components"]["messages"]) == {c.__name__ for c in m.MESSAGES}


# -- the contract agrees with the core --------------------------------------------------------


def test_limits_and_reasons_match_the_core() -> None:
    assert m.MAX_MIN_RUNTIME_S == MAX_MIN_RUNTIME_S
    assert set(m.PreemptReason.__args__) == {r.value for r in PreemptReason}


def test_every_message_is_a_frozen_tagged_struct_that_forbids_unknown_fields() -> None:
    for cls in m.MESSAGES:
        config = cls.__struct_config__
        assert config.frozen and config.forbid_unknown_fields, cls
        assert config.tag == cls.__name__, cls
    assert len(m.MESSAGES) == len({c.__name__ for c in m.MESSAGES}) == 57


# -- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("msg", samples(), ids=lambda x: type(x).__name__)
def test_round_trip(msg: msgspec.Struct) -> None:
    data = encode(msg)
    assert json.loads(data)["type"] == type(msg).__name__
    if isinstance(msg, SUBMIT_ANSWERS):
        assert msgspec.json.decode(data, type=m.WorkloadAccepted | m.WorkloadRejected) == msg
    else:
        assert decode(kind_of(msg), data) == msg


def test_a_batch_answer_round_trips_with_both_kinds_of_result() -> None:
    answer = m.SubmitBatchAnswered(
        at=1.0,
        results=(
            m.WorkloadAccepted(workload_id="w-2", client_id="c-2", allocation="nlp", at=1.0),
            m.WorkloadRejected(
                client_id="c-3", allocation="nlp", at=1.0, field="workloads[1].gpus", reason="r"
            ),
        ),
    )
    assert decode_as(m.SubmitBatchAnswered, encode(answer)) == answer


def test_a_submit_is_a_workload_or_a_batch_as_its_type_says() -> None:
    plain = raw(submit())
    assert isinstance(decode(Kind.SUBMIT, plain), m.SubmitWorkload)
    batch = b'{"type":"SubmitBatch","workloads":[' + plain + b"]}"
    assert decode(Kind.SUBMIT, batch) == m.SubmitBatch(
        workloads=(decode_as(m.SubmitWorkload, plain),)
    )
    with pytest.raises(ValidationError) as caught:
        decode(Kind.SUBMIT, raw(submit(type="SubmitPizza")))
    assert caught.value.field == "type"
    assert "'SubmitWorkload' or 'SubmitBatch'" in caught.value.reason


def without_type(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "type"}


AGENT_REPORT = m.PartReport(host="h01", workload_id="w", attempt=1, event="exited", at=T0)
AGENT_REQUESTS: list[msgspec.Struct] = [
    AGENT_REPORT,
    m.HostSync(host="h01"),
    m.PartReports(reports=(AGENT_REPORT,)),
]
"""The request subjects' messages that ``samples()`` leaves out."""


@pytest.mark.parametrize(
    "msg",
    [x for x in samples() + AGENT_REQUESTS if not isinstance(x, SUBMIT_ANSWERS)],
    ids=lambda x: type(x).__name__,
)
def test_a_message_without_its_type_is_refused_naming_type(msg: msgspec.Struct) -> None:
    """proto/schema.json requires ``type`` in every message; msgspec alone accepts a tagged
    Struct without it when it is decoded outside a union (every command subject)."""
    body = without_type(json.loads(encode(msg)))
    for own in (False, True):
        with pytest.raises(ValidationError) as caught:
            decode(kind_of(msg), raw(body), own=own)
        assert caught.value.field == "type", caught.value
        assert repr(type(msg).__name__) in caught.value.reason


@pytest.mark.parametrize(
    ("cls", "body"),
    [(m.StatusQuery, {"workload_id": "w-1"}), (m.OwedQuery, {})],
    ids=["StatusQuery", "OwedQuery"],
)
def test_a_query_without_its_type_is_refused_naming_type(
    cls: type[msgspec.Struct], body: dict[str, Any]
) -> None:
    assert decode_as(cls, raw({"type": cls.__name__, **body})) == cls(**body)
    for bad in (body, {"type": "Bogus", **body}):
        with pytest.raises(ValidationError) as caught:
            decode_as(cls, raw(bad))
        assert caught.value.field == "type", caught.value
        assert repr(cls.__name__) in caught.value.reason


@pytest.mark.parametrize(
    ("kind", "body", "field"),
    [
        (
            Kind.SUBMIT,
            {"type": "SubmitBatch", "workloads": [submit(), without_type(submit())]},
            "workloads[1].type",
        ),
        (
            Kind.HOSTS_REPORT,
            {"type": "PartReports", "reports": [without_type(json.loads(encode(AGENT_REPORT)))]},
            "reports[0].type",
        ),
    ],
    ids=["SubmitBatch", "PartReports"],
)
def test_a_batch_item_without_its_type_is_refused_naming_it(
    kind: Kind, body: dict[str, Any], field: str
) -> None:
    for own in (False, True):
        with pytest.raises(ValidationError) as caught:
            decode(kind, raw(body), own=own)
        assert caught.value.field == field, caught.value
        assert "missing required field `type`" in caught.value.reason


def test_type_may_come_anywhere_in_the_object() -> None:
    """Services write it first (the check's fast path); a client need not."""
    last = raw(without_type(submit()) | {"type": "SubmitWorkload"})
    spaced = b' { "type" : "CancelWorkload", "workload_id": "w", "user": "u"}'
    assert decode(Kind.SUBMIT, last) == decode(Kind.SUBMIT, raw(submit()))
    assert decode(Kind.CANCEL, spaced) == m.CancelWorkload(workload_id="w", user="u")


@pytest.mark.parametrize(
    ("field", "inside"),
    [("workloads[3].gpus", "gpus"), ("workloads[12].command[0]", "command[0]"), ("body", "body")],
)
def test_item_field_is_the_field_inside_a_batch_item(field: str, inside: str) -> None:
    assert item_field(field) == inside


def test_defaults_fill_in_for_a_minimal_plain_json_submit() -> None:
    got = decode("submit", b'{"type":"SubmitWorkload","client_id":"c","user":"u","gpus":1}')
    assert got == m.SubmitWorkload(client_id="c", user="u", gpus=1)
    assert isinstance(got, m.SubmitWorkload)
    assert got.allocation is None and got.min_runtime_s == 0 and got.resumable


def test_event_union_is_told_apart_by_type() -> None:
    got = decode(Kind.EVENTS, raw({"type": "WorkloadRequeued", "workload_id": "w", "at": 1.0}))
    assert got == m.WorkloadRequeued(workload_id="w", at=1.0)


# -- hostile input ----------------------------------------------------------------------------

NESTED = b'{"type":"WorkloadStarted","x":' + b"[" * 1000 + b"]" * 1000 + b"}"
DEEP_UNION = b'{"x":' + b"[" * 5000 + b"]" * 5000 + b',"type":"WorkloadStarted"}'

BAD: list[tuple[str, Kind, bytes, str]] = [
    (
        "batch with no workloads",
        Kind.SUBMIT,
        raw({"type": "SubmitBatch", "workloads": []}),
        "workloads",
    ),
    (
        "batch over 256 workloads",
        Kind.SUBMIT,
        raw({"type": "SubmitBatch", "workloads": [submit()] * 257}),
        "workloads",
    ),
    (
        "batch item with a bad field",
        Kind.SUBMIT,
        raw({"type": "SubmitBatch", "workloads": [submit(), submit(gpus=0)]}),
        "workloads[1].gpus",
    ),
    (
        "batch inside a batch",
        Kind.SUBMIT,
        raw({"type": "SubmitBatch", "workloads": [{"type": "SubmitBatch", "workloads": []}]}),
        "workloads[0].type",
    ),
    (
        "duplicate key inside a batch item",
        Kind.SUBMIT,
        b'{"type":"SubmitBatch","workloads":[' + raw(submit())[:-1] + b', "gpus": 8}]}',
        "gpus",
    ),
    ("not JSON at all", Kind.SUBMIT, b"hello", "body"),
    ("truncated JSON", Kind.SUBMIT, b'{"client_id": "c"', "body"),
    ("empty payload", Kind.SUBMIT, b"", "body"),
    ("an array, not an object", Kind.SUBMIT, b"[1, 2]", "body"),
    ("NaN literal for gpus", Kind.SUBMIT, b'{"client_id":"c","user":"u","gpus":NaN}', "gpus"),
    ("infinite float for a time", Kind.PREEMPT, b'{"workload_id":"w","at":1e999}', "at"),
    ("gpus as a string", Kind.SUBMIT, raw(submit(gpus="8")), "gpus"),
    ("gpus as a float", Kind.SUBMIT, raw(submit(gpus=1.5)), "gpus"),
    ("gpus as a boolean", Kind.SUBMIT, raw(submit(gpus=True)), "gpus"),
    ("gpus zero", Kind.SUBMIT, raw(submit(gpus=0)), "gpus"),
    ("gpus negative", Kind.SUBMIT, raw(submit(gpus=-1)), "gpus"),
    ("gpus huge", Kind.SUBMIT, raw(submit(gpus=10**30)), "gpus"),
    (
        "min_runtime one second over 8 h",
        Kind.SUBMIT,
        raw(submit(min_runtime_s=28_801)),
        "min_runtime_s",
    ),
    ("min_runtime negative", Kind.SUBMIT, raw(submit(min_runtime_s=-1)), "min_runtime_s"),
    ("unknown top-level field", Kind.SUBMIT, raw(submit(gpu=8)), "gpu"),
    (
        "missing required field",
        Kind.SUBMIT,
        raw({"type": "SubmitWorkload", "client_id": "c", "gpus": 1}),
        "user",
    ),
    ("allocation with a dot", Kind.SUBMIT, raw(submit(allocation="nlp.pretrain")), "allocation"),
    ("allocation with a star", Kind.SUBMIT, raw(submit(allocation="nlp*")), "allocation"),
    ("allocation with a >", Kind.SUBMIT, raw(submit(allocation="nlp>")), "allocation"),
    ("user with a space", Kind.SUBMIT, raw(submit(user="ada lovelace")), "user"),
    ("client_id with a final newline", Kind.SUBMIT, raw(submit(client_id="c\n")), "client_id"),
    ("empty client_id", Kind.SUBMIT, raw(submit(client_id="")), "client_id"),
    ("name over 64 characters", Kind.SUBMIT, raw(submit(user="u" * 65)), "user"),
    ("nesting 1000 deep in an unknown field", Kind.EVENTS, NESTED, "x"),
    ("nesting 1000 deep at the top", Kind.SUBMIT, b"[" * 1000 + b"]" * 1000, "body"),
    ("nesting 5000 deep before the tag", Kind.EVENTS, DEEP_UNION, "body"),
    (
        "invalid UTF-8 inside a string",
        Kind.SUBMIT,
        b'{"type":"SubmitWorkload","client_id":"c","user":"a\xff"}',
        "user",
    ),
    ("invalid UTF-8 outside any key", Kind.SUBMIT, b"\xff\xfe", "body"),
    ("oversized payload", Kind.SUBMIT, raw(submit(pad="x" * MAX_PAYLOAD)), "body"),
    (
        "duplicate key smuggles a second value",
        Kind.SUBMIT,
        raw(submit())[:-1] + b', "gpus": 0}',
        "gpus",
    ),
    ("duplicate key with equal values", Kind.SUBMIT, raw(submit())[:-1] + b', "gpus": 8}', "gpus"),
    ("wrong message type on the subject", Kind.SUBMIT, raw(submit(type="CancelWorkload")), "type"),
    ("unknown event type", Kind.EVENTS, raw({"type": "WorkloadExploded", "at": 1.0}), "type"),
    ("event without a type", Kind.EVENTS, raw({"workload_id": "w", "at": 1.0}), "type"),
    (
        "unknown preemption reason",
        Kind.PREEMPT,
        raw({"workload_id": "w", "reason": "because"}),
        "reason",
    ),
    (
        "nested field out of range",
        Kind.EVENTS,
        raw(
            {
                "type": "WorkloadPlaced",
                "workload_id": "w",
                "at": 1.0,
                "gpus": 1,
                "assignment": [{"host": "h01", "gpus": [-1]}],
            }
        ),
        "assignment[0].gpus[0]",
    ),
    (
        "unknown field in a nested struct",
        Kind.EVENTS,
        raw(
            {
                "type": "WorkloadPlaced",
                "workload_id": "w",
                "at": 1.0,
                "gpus": 1,
                "assignment": [{"host": "h01", "gpus": [0], "rack": "r1"}],
            }
        ),
        "assignment[0].rack",
    ),
    (
        "budget path with a dot",
        Kind.BUDGET_SET,
        raw({"path": ["root", "a.b"], "shares": 1, "set_by": "x"}),
        "path[1]",
    ),
    (
        "negative shares",
        Kind.BUDGET_SET,
        raw({"path": ["root", "a"], "shares": -1, "set_by": "x"}),
        "shares",
    ),
]


@pytest.mark.parametrize(("kind", "data", "field"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_one_validation_error_naming_the_field(
    kind: Kind, data: bytes, field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        decode(kind, data)
    assert caught.value.field == field, caught.value
    assert caught.value.reason


def test_a_services_own_message_skips_only_the_repeated_key_scan() -> None:
    """``own=True`` (log records, host work lists): a repeated key is not searched for, and
    every schema check still holds."""
    placed = encode(
        m.WorkloadPlaced(
            workload_id="w",
            at=1.0,
            gpus=1,
            assignment=(m.HostGpus(host="h01", gpus=(0,)),),
        )
    )
    repeated = placed[:-1] + b',"gpus":1}'
    with pytest.raises(ValidationError) as caught:
        decode(Kind.EVENTS, repeated)
    assert caught.value.field == "gpus"
    assert decode(Kind.EVENTS, repeated, own=True) == decode(Kind.EVENTS, placed)
    for bad, field in (
        (placed.replace(b'"gpus":1', b'"gpus":-1'), "gpus"),
        (placed[:-1] + b',"rack":"r1"}', "rack"),
        (b'{"type":"WorkloadExploded"}', "type"),
    ):
        with pytest.raises(ValidationError) as caught:
            decode(Kind.EVENTS, bad, own=True)
        assert caught.value.field == field
    work = encode(m.HostWork(host="h01", seq=1, at=1.0))
    assert decode_as(m.HostWork, work[:-1] + b',"seq":1}', own=True).seq == 1
    with pytest.raises(ValidationError):
        decode_as(m.HostWork, work[:-1] + b',"seq":1}')


def test_unknown_kind_is_a_validation_error() -> None:
    with pytest.raises(ValidationError) as caught:
        decode("nope", b"{}")
    assert caught.value.field == "subject"


# -- subjects ---------------------------------------------------------------------------------


def test_subject_builders() -> None:
    assert s.submit("nlp") == "allot.v1.submit.nlp"
    assert s.submit(None) == "allot.v1.submit.~"
    assert s.cancel("nlp", "w-1") == "allot.v1.cancel.nlp.w-1"
    assert s.budget_set(["root", "nlp", "pretrain"]) == "allot.v1.budget.set.root.nlp.pretrain"
    assert s.budget_subtree(["root", "nlp"]) == "allot.v1.budget.set.root.nlp.>"
    assert s.preempt("nlp", "w-1") == "allot.v1.preempt.nlp.w-1"
    assert s.events(None, "w-1", "placed") == "allot.v1.events.~.w-1.placed"
    assert s.workload_events("nlp", "w-1") == "allot.v1.events.nlp.w-1.*"
    assert s.allocation_events("nlp") == "allot.v1.events.nlp.>"
    assert s.every_workload("started") == "allot.v1.events.*.*.started"
    assert s.allocation_preempt("nlp") == "allot.v1.preempt.nlp.*"
    assert s.heartbeat("h01") == "allot.v1.host.h01.heartbeat"
    assert s.drain("h01") == "allot.v1.host.h01.drain"
    assert s.undrain("h01") == "allot.v1.host.h01.undrain"
    assert s.health("h01") == "allot.v1.host.h01.health"
    assert s.host_state("h01") == "allot.v1.host.h01.state"
    assert s.host_all("h01") == "allot.v1.host.h01.>"


def test_identity_forms_carry_the_senders_login() -> None:
    assert s.submit_as("nlp", "alice") == "allot.v1.submit.nlp.alice"
    assert s.submit_as(None, "alice") == "allot.v1.submit.~.alice"
    assert s.cancel_as("nlp", "w-1", "alice") == "allot.v1.cancel.nlp.w-1.user.alice"
    assert s.cancel_as("nlp", "w-1", "ops", s.OPERATOR) == "allot.v1.cancel.nlp.w-1.operator.ops"
    assert s.cancel_as("nlp", "w-1", "lead", s.MANAGER) == "allot.v1.cancel.nlp.w-1.manager.lead"
    assert s.budget_set_as(["root", "nlp", "x"], "lead") == "allot.v1.budget.set.by.lead.root.nlp.x"
    assert s.budget_subtree(["root", "nlp"], "lead") == "allot.v1.budget.set.by.lead.root.nlp.>"
    assert s.drain_as("h01", "ops") == "allot.v1.host.h01.drain.ops"
    assert s.undrain_as("h01", "ops") == "allot.v1.host.h01.undrain.ops"
    for subject, login in [
        (s.submit_as("nlp", "alice"), "alice"),
        (s.cancel_as(None, "w", "bob"), "bob"),
        (s.cancel_as("nlp", "w", "ops", s.OPERATOR), "ops"),
        (s.cancel_as("nlp", "w", "lead", s.MANAGER), "lead"),
        (s.budget_set_as(["root", "a", "b", "c"], "lead"), "lead"),
        (s.drain_as("h", "ops"), "ops"),
        (s.undrain_as("h", "ops"), "ops"),
    ]:
        assert s.login_of(subject) == login, subject
    # Bare forms and other subjects name no login; nor does a subject of no known form.
    for subject in [
        s.submit("nlp"),
        s.cancel("nlp", "w"),
        s.operator_cancel("nlp", "w"),
        s.budget_set(["root", "nlp"]),
        s.drain("h"),
        s.events("nlp", "w", "placed"),
        "allot.v1.budget.set.by.lead",
    ]:
        assert s.login_of(subject) is None, subject
    # The budget path is read from either form.
    assert s.budget_path_of(s.budget_set_as(["root", "a", "b"], "lead")) == ("root", "a", "b")
    assert s.budget_path_of(s.budget_set(["root", "a"])) == ("root", "a")


def test_check_login_names_the_field_and_the_login() -> None:
    s.check_login("user", "alice", "alice")
    s.check_login("user", "bob", None)  # a bare form checks nothing
    with pytest.raises(ValidationError) as caught:
        s.check_login("set_by", "bob", "alice")
    assert caught.value.field == "set_by"
    assert caught.value.reason == "'bob' differs from the login 'alice'"


def _grant_covers(grant: str, subject: str) -> bool:
    """NATS's subject matching: ``*`` one token, a last ``>`` one or more."""
    g, t = grant.split("."), subject.split(".")
    if g[-1] == ">":
        return len(t) >= len(g) and all(a in ("*", b) for a, b in zip(g[:-1], t, strict=False))
    return len(g) == len(t) and all(a in ("*", b) for a, b in zip(g, t, strict=True))


def test_a_logins_grant_covers_only_its_own_identity_forms() -> None:
    """A grant ending with the login's literal token never covers another login's form, the
    bare form, or (for a team) an operator's or manager's form."""
    team_cancel = "allot.v1.cancel.nlp.*.user.alice"
    assert _grant_covers(team_cancel, s.cancel_as("nlp", "w1", "alice"))
    for other in (
        s.cancel_as("nlp", "w1", "bob"),
        s.cancel("nlp", "w1"),
        s.cancel_as("nlp", "w1", "alice", s.OPERATOR),
        s.cancel_as("vision", "w1", "alice"),
    ):
        assert not _grant_covers(team_cancel, other), other
    budget = s.budget_subtree(["root", "nlp"], "lead")
    assert _grant_covers(budget, s.budget_set_as(["root", "nlp", "x", "y"], "lead"))
    for other in (
        s.budget_set_as(["root", "nlp"], "lead"),  # its own node
        s.budget_set_as(["root", "nlp", "x"], "eve"),
        s.budget_set(["root", "nlp", "x"]),
    ):
        assert not _grant_covers(budget, other), other
    assert _grant_covers("allot.v1.host.*.drain.ops", s.drain_as("h1", "ops"))
    assert not _grant_covers("allot.v1.host.*.drain.ops", s.drain_as("h1", "eve"))
    assert not _grant_covers("allot.v1.host.*.drain.ops", s.drain("h1"))


@pytest.mark.parametrize(
    ("subject", "kind"),
    [
        (s.submit("nlp"), Kind.SUBMIT),
        (s.cancel(None, "w"), Kind.CANCEL),
        (s.operator_cancel("nlp", "w"), Kind.OPERATOR_CANCEL),
        (s.manager_cancel("nlp", "w"), Kind.MANAGER_CANCEL),
        (s.budget_set(["root", "a", "b", "c"]), Kind.BUDGET_SET),
        (s.heartbeat("h"), Kind.HEARTBEAT),
        (s.health("h"), Kind.HEALTH),
        (s.drain("h"), Kind.DRAIN),
        (s.undrain("h"), Kind.UNDRAIN),
        (s.host_state("h"), Kind.HOST_STATE),
        (s.events("a", "w", "cancel_requested"), Kind.EVENTS),
        (s.preempt("a", "w"), Kind.PREEMPT),
        (s.queued("a", "w"), Kind.QUEUED),
        (s.RANKING, Kind.RANKING),
        (s.submit_as("nlp", "alice"), Kind.SUBMIT_AS),
        (s.cancel_as(None, "w", "alice"), Kind.CANCEL_AS),
        (s.cancel_as("nlp", "w", "ops", s.OPERATOR), Kind.OPERATOR_CANCEL_AS),
        (s.cancel_as("nlp", "w", "lead", s.MANAGER), Kind.MANAGER_CANCEL_AS),
        (s.budget_set_as(["root", "a"], "lead"), Kind.BUDGET_SET_AS),
        (s.budget_set_as(["root", "by", "root"], "lead"), Kind.BUDGET_SET_AS),
        (s.drain_as("h", "ops"), Kind.DRAIN_AS),
        (s.undrain_as("h", "ops"), Kind.UNDRAIN_AS),
    ],
)
def test_kind_of_a_subject(subject: str, kind: Kind) -> None:
    assert s.kind_of(subject) is kind


@pytest.mark.parametrize(
    "subject",
    [
        "allot.v2.submit.a",
        "allot.v1.submit",
        "allot.v1.host.h.reboot",
        "x",
        "allot.v1.events.a.w",  # no event name (the form before the name was added)
        "allot.v1.events.a.w.exploded",
        "allot.v1.events.a.w.placed.again",
        "allot.v1.cancel.a.w.root",  # only the operators' suffix
        "allot.v1.cancel.a.w.user",  # the owner's form exists only with a login
        "allot.v1.cancel.a.w.root.x",
        "allot.v1.cancel.a.w.operator.x.y",
        "allot.v1.submit.a.alice.x",
        "allot.v1.host.h.drain.ops.x",
        "allot.v1.host.h.heartbeat.x",  # an agent's subjects have no identity form
        "allot.v1.budget.set.by.lead",
        "allot.v1.budget.set.by.lead.nlp.x",  # a path not from the root
    ],
)
def test_kind_of_rejects_unknown_subjects(subject: str) -> None:
    with pytest.raises(ValidationError) as caught:
        s.kind_of(subject)
    assert caught.value.field == "subject"


def _budget_grant_covers(grant: str, subject: str) -> bool:
    g, t = grant.split("."), subject.split(".")
    return g[-1] == ">" and len(t) >= len(g) and t[: len(g) - 1] == g[:-1]


def test_a_budget_grant_means_exactly_the_subtree_below_the_node() -> None:
    grant = s.budget_subtree(["root", "nlp"])
    assert _budget_grant_covers(grant, s.budget_set(["root", "nlp", "pretrain"]))
    assert _budget_grant_covers(grant, s.budget_set(["root", "nlp", "evals", "x"]))
    assert not _budget_grant_covers(grant, s.budget_set(["root", "nlp"]))  # not its own share
    assert not _budget_grant_covers(grant, s.budget_set(["root", "nlp2"]))
    assert not _budget_grant_covers(grant, s.budget_set(["root", "cv", "nlp"]))


BAD_TOKENS = [
    ("empty", "", "must not be empty"),
    ("dot", "nlp.pretrain", "'.'"),
    ("star", "nlp*", "'*'"),
    ("greater-than", "a>", "'>'"),
    ("space", "a b", "' '"),
    ("tab", "a\tb", "'\\t'"),
    ("newline", "a\n", "'\\n'"),
    ("too long", "x" * 65, "65 characters"),
]


@pytest.mark.parametrize(
    ("name", "why"), [b[1:] for b in BAD_TOKENS], ids=[b[0] for b in BAD_TOKENS]
)
def test_validate_token_rejects(name: str, why: str) -> None:
    with pytest.raises(ValidationError) as caught:
        s.validate_token(name, "allocation")
    assert caught.value.field == "allocation"
    assert why in caught.value.reason


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: s.submit("a.b"), "allocation"),
        (lambda: s.cancel("a", "w*"), "workload"),
        (lambda: s.preempt("a", ""), "workload"),
        (lambda: s.events("a b", "w", "placed"), "allocation"),
        (lambda: s.events("a", "w", "exploded"), "event"),
        (lambda: s.every_workload("Placed"), "event"),
        (lambda: s.heartbeat("h>"), "host"),
        (lambda: s.drain(""), "host"),
        (lambda: s.budget_set(["root", "nlp", "x.y"]), "path[2]"),
        (lambda: s.budget_set(["nlp", "x"]), "path"),
        (lambda: s.budget_set(["root"]), "path"),
        (lambda: s.budget_set("root.nlp"), "path"),
        (lambda: s.submit_as("nlp", "a.b"), "user"),
        (lambda: s.cancel_as("nlp", "w", ""), "user"),
        (lambda: s.cancel_as("nlp", "w", "ops", "root"), "form"),
        (lambda: s.drain_as("h", "o*"), "user"),
        (lambda: s.budget_set_as(["root", "nlp"], "l>"), "user"),
        (lambda: s.budget_set_as(["nlp"], "lead"), "path"),
    ],
    ids=[
        "submit-dot",
        "cancel-star",
        "preempt-empty",
        "events-space",
        "events-unknown-name",
        "every-workload-unknown-name",
        "heartbeat-gt",
        "drain-empty",
        "budget-dot",
        "budget-not-from-root",
        "budget-root-itself",
        "budget-string",
        "submit-as-dot",
        "cancel-as-empty",
        "cancel-as-unknown-form",
        "drain-as-star",
        "budget-as-gt",
        "budget-as-not-from-root",
    ],
)
def test_subject_builders_reject_bad_tokens(build: Any, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        build()
    assert caught.value.field == field


def test_validate_token_accepts_a_plain_name() -> None:
    assert s.validate_token("nlp-pretrain_2", "allocation") == "nlp-pretrain_2"
    assert s.validate_token("x" * 64, "allocation") == "x" * 64


def test_a_large_ranking_record_decodes_while_commands_keep_the_64_kib_limit() -> None:
    rows = tuple(
        m.RankRow(
            path=f"root/team{i:04d}",
            name=f"team{i:04d}",
            leaf=True,
            raw_shares=1,
            norm_shares=0.001,
            raw_usage=1234.5,
            effective_usage=0.001,
            level_fs="inf",
            rank=i + 1,
            fairshare=0.5,
        )
        for i in range(1000)
    )
    data = encode(m.RankingUpdated(at=1.0, window_s=604800.0, nodes=rows))
    assert len(data) > MAX_PAYLOAD
    decoded = decode(Kind.RANKING, data)
    assert isinstance(decoded, m.RankingUpdated) and len(decoded.nodes) == 1000
    big_submit = b'{"type":"SubmitWorkload","kind":"' + b"x" * MAX_PAYLOAD + b'"}'
    with pytest.raises(ValidationError) as err:
        decode(Kind.SUBMIT, big_submit)
    assert err.value.field == "body"


def _patterns(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["pattern"]} if isinstance(node.get("pattern"), str) else set()
        return found.union(*(_patterns(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_patterns(v) for v in node))
    return set()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"client_id": "c", "user": "a b", "gpus": 1}, "user"),
        ({"client_id": "c/1", "user": "ann", "gpus": 1}, "client_id"),
        ({"client_id": "c", "user": "ann\n", "gpus": 1}, "user"),
    ],
)
def test_a_bad_name_is_explained_in_words_not_as_a_regex(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        decode(Kind.SUBMIT, raw({"type": "SubmitWorkload", **body}))
    assert caught.value.field == field
    assert "regex" not in caught.value.reason
    assert "letters, digits, '_' and '-' only" in caught.value.reason


def test_every_pattern_of_the_wire_types_is_worded_by_the_codec() -> None:
    """The codec words each pattern (``PATTERN_WORDS``); a new one needs words too."""
    _, components = msgspec.json.schema_components(tuple(TYPES.values()))
    assert _patterns(components) == set(PATTERN_WORDS)


def test_a_nul_in_a_command_argument_is_refused_naming_it() -> None:
    """exec cannot pass it: refused at intake, not after the run was placed."""
    body = {"type": "SubmitWorkload", "client_id": "c", "user": "u", "gpus": 1}
    with pytest.raises(ValidationError) as caught:
        decode(Kind.SUBMIT, raw({**body, "command": ["python", "a\x00"]}))
    assert (caught.value.field, caught.value.reason) == (
        "command[1]",
        "Expected a value without NUL",
    )


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"1A": "x"}, "not starting with a digit (one of its names)"),
        ({"A-B": "x"}, "not starting with a digit (one of its names)"),
        ({"A": "x\x00y"}, "without NUL"),
    ],
)
def test_a_bad_env_entry_is_explained_in_words_naming_env(env: dict[str, str], words: str) -> None:
    body = {"type": "SubmitWorkload", "client_id": "c", "user": "ann", "gpus": 1, "env": env}
    with pytest.raises(ValidationError) as caught:
        decode(Kind.SUBMIT, raw(body))
    assert caught.value.field.startswith("env")
    assert "regex" not in caught.value.reason
    assert words in caught.value.reason


@pytest.mark.parametrize("body", [b"", b" \n\t"])
def test_an_empty_body_is_refused_saying_what_was_expected(body: bytes) -> None:
    with pytest.raises(ValidationError) as caught:
        decode(Kind.SUBMIT, body)
    assert caught.value.field == "body"
    assert "empty" in caught.value.reason and "'SubmitWorkload'" in caught.value.reason
