"""JSON Schema and AsyncAPI 3.0 documents for the wire contract, generated from the Structs.

``python -m allot.proto.schema --write`` writes ``proto/schema.json`` (every message's JSON
Schema, from ``msgspec.json.schema_components``) and ``proto/asyncapi.json`` (channels =
subjects, operations, messages). ``--check`` exits 1 when the committed files differ from
freshly generated ones (drift), 0 otherwise. ``--dir`` picks another output folder.

Output is deterministic: keys sorted, two-space indent, a final newline.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from allot.proto import messages as m
from allot.proto.codec import MAX_PAYLOAD, TYPES
from allot.proto.subjects import (
    CHANNELS,
    DASHBOARD_LOG,
    EVENT_NAMES,
    IDENTITY_FORMS,
    PREFIX,
    QUERY_ALLOCATIONS,
    QUERY_HISTORY,
    QUERY_HOSTS,
    QUERY_IDLE,
    QUERY_INTAKE,
    QUERY_OWED,
    QUERY_PLACEMENT_STATS,
    QUERY_PRIO,
    QUERY_QUEUE,
    QUERY_SHARE,
    QUERY_STATUS,
    QUERY_USAGE,
    STREAMS,
    Kind,
)

SCHEMA_FILE = "schema.json"
ASYNCAPI_FILE = "asyncapi.json"
REF_PREFIX = "#/components/schemas/"

# Who sends each kind: "send" = clients publish it (commands), "receive" = clients subscribe.
_ACTION: dict[Kind, str] = {
    Kind.SUBMIT: "send",
    Kind.CANCEL: "send",
    Kind.OPERATOR_CANCEL: "send",
    Kind.MANAGER_CANCEL: "send",
    Kind.BUDGET_SET: "send",
    Kind.HEARTBEAT: "send",
    Kind.HEALTH: "send",
    Kind.HOST_REPORT: "send",
    Kind.HOST_SYNC: "send",
    Kind.HOST_UTIL: "send",
    Kind.HOSTS_REPORT: "send",
    Kind.HOST_WORK: "receive",
    Kind.DRAIN: "send",
    Kind.UNDRAIN: "send",
    Kind.HOST_STATE: "receive",
    Kind.EVENTS: "receive",
    Kind.PREEMPT: "receive",
    Kind.QUEUED: "receive",
    Kind.RANKING: "receive",
    Kind.LEADER: "receive",
    Kind.BUDGET_TREE: "receive",
    Kind.USAGE_GPU: "receive",
    Kind.IDLE: "receive",
    Kind.WATCH: "send",
    Kind.WATCHED: "receive",
}
_ACTION.update({ident: _ACTION[bare] for ident, bare in IDENTITY_FORMS.items()})

_COMMAND_REPLY = (m.CommandAccepted, m.CommandRejected)
_REPLIES: dict[Kind, tuple[type[msgspec.Struct], ...]] = {
    Kind.SUBMIT: (m.WorkloadAccepted, m.WorkloadRejected, m.SubmitBatchAnswered),
    Kind.CANCEL: _COMMAND_REPLY,
    Kind.OPERATOR_CANCEL: _COMMAND_REPLY,
    Kind.MANAGER_CANCEL: _COMMAND_REPLY,
    Kind.BUDGET_SET: _COMMAND_REPLY,
    Kind.DRAIN: _COMMAND_REPLY,
    Kind.UNDRAIN: _COMMAND_REPLY,
    Kind.HOST_REPORT: _COMMAND_REPLY,
    Kind.HOST_SYNC: (m.HostWork,),
    Kind.HOST_UTIL: _COMMAND_REPLY,
    Kind.HOSTS_REPORT: (m.PartReportsAnswered, m.CommandRejected),
    Kind.WATCH: (m.WatchStarted, m.CommandRejected),
}
"""What the service answers to each request (commands are core-NATS requests)."""
_REPLIES.update({ident: _REPLIES[bare] for ident, bare in IDENTITY_FORMS.items()})

_QUERIES: dict[
    str, tuple[str, tuple[type[msgspec.Struct], ...], tuple[type[msgspec.Struct], ...]]
] = {
    "query_queue": (QUERY_QUEUE, (), (m.QueueSnapshot, m.CommandRejected)),
    "query_queue_allocation": (
        f"{QUERY_QUEUE}.{{allocation}}",
        (),
        (m.QueueSnapshot, m.CommandRejected),
    ),
    "query_prio": (QUERY_PRIO, (), (m.PrioSnapshot, m.CommandRejected)),
    "query_prio_allocation": (
        f"{QUERY_PRIO}.{{allocation}}",
        (),
        (m.PrioSnapshot, m.CommandRejected),
    ),
    "query_hosts": (QUERY_HOSTS, (m.HostsQuery,), (m.HostsSnapshot, m.CommandRejected)),
    "query_status": (QUERY_STATUS, (m.StatusQuery,), (m.WorkloadStatus, m.CommandRejected)),
    "query_status_allocation": (
        f"{QUERY_STATUS}.{{allocation}}",
        (m.StatusQuery,),
        (m.WorkloadStatus, m.CommandRejected),
    ),
    "query_share": (QUERY_SHARE, (), (m.RankingUpdated, m.CommandRejected)),
    "query_intake": (QUERY_INTAKE, (), (m.CommandAccepted,)),
    "query_allocations": (QUERY_ALLOCATIONS, (), (m.AllocationsSnapshot, m.CommandRejected)),
    "query_placement_stats": (QUERY_PLACEMENT_STATS, (), (m.PlacementStats, m.CommandRejected)),
    "query_owed": (QUERY_OWED, (m.OwedQuery,), (m.OwedSnapshot, m.CommandRejected)),
    "query_usage": (QUERY_USAGE, (m.UsageQuery,), (m.UsageSnapshot, m.CommandRejected)),
    "query_history": (QUERY_HISTORY, (m.HistoryQuery,), (m.HistoryPage, m.CommandRejected)),
    "dashboard_log": (DASHBOARD_LOG, (m.HistoryQuery,), (m.HistoryPage, m.CommandRejected)),
    "query_idle": (QUERY_IDLE, (), (m.IdleSnapshot, m.CommandRejected)),
    "query_idle_allocation": (
        f"{QUERY_IDLE}.{{allocation}}",
        (),
        (m.IdleSnapshot, m.CommandRejected),
    ),
}
"""Query channels: address, request message (none: an empty body), reply messages."""

_TEAM, _MANAGER, _OPERATOR, _AGENT = "team", "manager", "operator", "agent"
_DASHBOARD = "dashboard"
_GRANTED: dict[str, tuple[str, ...]] = {
    Kind.SUBMIT_AS.value: (_TEAM,),
    Kind.CANCEL_AS.value: (_TEAM,),
    Kind.OPERATOR_CANCEL_AS.value: (_OPERATOR,),
    Kind.MANAGER_CANCEL_AS.value: (_MANAGER,),
    Kind.BUDGET_SET_AS.value: (_MANAGER,),
    Kind.DRAIN_AS.value: (_OPERATOR,),
    Kind.UNDRAIN_AS.value: (_OPERATOR,),
    Kind.HEARTBEAT.value: (_AGENT,),
    Kind.HEALTH.value: (_AGENT,),
    Kind.HOST_REPORT.value: (_AGENT,),
    Kind.HOST_SYNC.value: (_AGENT,),
    Kind.HOST_UTIL.value: (_AGENT,),
    Kind.HOST_WORK.value: (_AGENT,),
    Kind.HOST_STATE.value: (_OPERATOR,),
    Kind.EVENTS.value: (_TEAM,),
    Kind.PREEMPT.value: (_TEAM,),
    Kind.QUEUED.value: (_TEAM,),
    Kind.WATCH.value: (_TEAM,),
    Kind.WATCHED.value: (_TEAM,),
    Kind.RANKING.value: (_TEAM, _MANAGER),
    Kind.BUDGET_TREE.value: (_TEAM, _MANAGER),
    Kind.IDLE.value: (_TEAM,),
    "query_queue": (_MANAGER, _OPERATOR),
    "query_prio": (_MANAGER, _OPERATOR),
    "query_status": (_MANAGER, _OPERATOR),
    "query_queue_allocation": (_TEAM, _MANAGER, _OPERATOR),
    "query_prio_allocation": (_TEAM, _MANAGER, _OPERATOR),
    "query_status_allocation": (_TEAM, _MANAGER, _OPERATOR),
    "query_share": (_TEAM, _MANAGER, _OPERATOR),
    "query_allocations": (_TEAM, _MANAGER, _OPERATOR),
    "query_owed": (_TEAM, _MANAGER, _OPERATOR),
    "query_usage": (_TEAM, _MANAGER, _OPERATOR),
    "query_hosts": (_TEAM, _MANAGER, _OPERATOR),
    "query_placement_stats": (_TEAM, _MANAGER, _OPERATOR),
    "query_idle": (_MANAGER, _OPERATOR),
    "query_history": (_MANAGER, _OPERATOR),
    "dashboard_log": (_DASHBOARD,),
    "query_idle_allocation": (_TEAM, _MANAGER, _OPERATOR),
    "query_intake": (_MANAGER, _OPERATOR),
}
"""Who ``allot auth gen`` grants each channel to (publish for a send, subscribe for a
receive), besides the services, which are granted everything; a channel not listed is the
services' alone (the bare command forms, ``leader``, ``hosts.report``). Scoped: a team to
its own allocations, a manager to its subtree, an agent to its own hosts, a login to its own
token. ``tests/unit/test_contract_grants.py`` checks this against the generated
permissions."""


def _granted(key: str) -> dict[str, Any]:
    """A channel's grants (``key``: a subject kind's value or a query channel's id)."""
    roles = _GRANTED.get(key, ())
    text = ", ".join(roles) if roles else "no role: the services only"
    return {"x-allot-granted": list(roles), "x-allot-granted-text": f"under auth: {text}"}


_PARAMS: dict[str, str] = {
    "allocation": "allocation name, or '~' for unallocated work",
    "workload": "workload id",
    "event": "what happened (the record's type, see EVENT_NAME): " + ", ".join(EVENT_NAMES),
    "host": "host id",
    "path": "budget path from 'root' down to the node, one token per level",
    "deliver": "the watcher's own token, chosen in its WatchLog",
    "login": "the sender's NATS login: the payload's user, set_by or operator must be it",
}


def _messages_of(kind: Kind) -> tuple[type[msgspec.Struct], ...]:
    t = TYPES[kind]
    args = getattr(t, "__args__", None)
    return tuple(args) if args else (t,)


def json_schema() -> dict[str, Any]:
    """Every message and nested Struct under ``components/schemas`` (``$defs`` for tools)."""
    _, components = msgspec.json.schema_components(m.MESSAGES, ref_template=REF_PREFIX + "{name}")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"Allot wire contract ({PREFIX})",
        "description": (
            "JSON messages of Allot's NATS subjects. Each top-level message carries its class "
            "name in 'type'; unknown fields are rejected; payloads are at most "
            f"{MAX_PAYLOAD} bytes."
        ),
        "messages": sorted(c.__name__ for c in m.MESSAGES),
        "components": {"schemas": components},
    }


def asyncapi() -> dict[str, Any]:
    """An AsyncAPI 3.0 document: one channel per subject kind, one operation per channel."""
    _, components = msgspec.json.schema_components(m.MESSAGES, ref_template=REF_PREFIX + "{name}")
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}

    def add_message(n: str) -> None:
        messages[n] = {
            "name": n,
            "contentType": "application/json",
            "payload": {"$ref": REF_PREFIX + n},
        }

    def add_reply(cid: str, replies: tuple[type[msgspec.Struct], ...]) -> dict[str, Any]:
        rid = f"{cid}_reply"
        reply_names = [c.__name__ for c in replies]
        channels[rid] = {
            "address": None,
            "description": "the requester's inbox (NATS request/reply)",
            "messages": {n: {"$ref": f"#/components/messages/{n}"} for n in reply_names},
        }
        for n in reply_names:
            add_message(n)
        return {
            "channel": {"$ref": f"#/channels/{rid}"},
            "messages": [{"$ref": f"#/channels/{rid}/messages/{n}"} for n in reply_names],
        }

    for cid, (address, requests, replies) in _QUERIES.items():
        names = [c.__name__ for c in requests]
        channels[cid] = {
            "address": address,
            "description": (
                "core NATS request/reply; without a listed message the body is ignored "
                "(send it empty)"
                + (
                    "; one allocation's rows only (the form a team is granted under auth)"
                    if "{allocation}" in address
                    else ""
                )
            ),
            "messages": {n: {"$ref": f"#/components/messages/{n}"} for n in names},
            **_granted(cid),
        }
        query_params = {p: {"description": d} for p, d in _PARAMS.items() if f"{{{p}}}" in address}
        if query_params:
            channels[cid]["parameters"] = query_params
        operations[f"send_{cid}"] = {
            "action": "send",
            "channel": {"$ref": f"#/channels/{cid}"},
            "messages": [{"$ref": f"#/channels/{cid}/messages/{n}"} for n in names],
            "reply": add_reply(cid, replies),
        }
        for n in names:
            add_message(n)
    for kind in Kind:
        cid = kind.value.replace(".", "_")
        address = CHANNELS[kind]
        names = [c.__name__ for c in _messages_of(kind)]
        channel: dict[str, Any] = {
            "address": address,
            "messages": {n: {"$ref": f"#/components/messages/{n}"} for n in names},
            **_granted(kind.value),
        }
        params = {p: {"description": d} for p, d in _PARAMS.items() if f"{{{p}}}" in address}
        if params:
            channel["parameters"] = params
        stream = [s for s, subjects in STREAMS.items() if _captured(address, subjects)]
        channel["description"] = (
            f"JetStream stream {stream[0]}" if stream else "core NATS (not captured by a stream)"
        )
        channels[cid] = channel
        operation: dict[str, Any] = {
            "action": _ACTION[kind],
            "channel": {"$ref": f"#/channels/{cid}"},
            "messages": [{"$ref": f"#/channels/{cid}/messages/{n}"} for n in names],
        }
        if kind in _REPLIES:
            operation["reply"] = add_reply(cid, _REPLIES[kind])
        operations[f"{_ACTION[kind]}_{cid}"] = operation
        for n in names:
            add_message(n)
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Allot",
            "version": PREFIX.rsplit(".", 1)[1],
            "description": (
                "GPU-cluster scheduler wire contract. 'send' operations are what clients "
                "publish (commands, answered by the services); 'receive' what they subscribe "
                "to (events)."
            ),
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {"host": "127.0.0.1:4222", "protocol": "nats", "description": "dev stack"}
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": components},
    }


def _captured(address: str, subjects: tuple[str, ...]) -> bool:
    """Whether a stream subject pattern captures the channel address (params as ``*``)."""
    tokens = [("*" if t.startswith("{") else t) for t in address.split(".")]
    for pattern in subjects:
        p = pattern.split(".")
        if p[-1] == ">" and tokens[: len(p) - 1] == p[:-1] and len(tokens) >= len(p):
            return True
        if len(p) == len(tokens) and all(a in (b, "*") for a, b in zip(p, tokens, strict=True)):
            return True
    return False


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def generated() -> dict[str, str]:
    """File name -> the text the generator writes."""
    return {SCHEMA_FILE: render(json_schema()), ASYNCAPI_FILE: render(asyncapi())}


def default_dir() -> Path:
    """``proto/`` at the repository root (``shared/allot/proto/schema.py`` -> ``../../..``)."""
    return Path(__file__).resolve().parents[3] / "proto"


def drift(directory: Path) -> list[str]:
    """Names of the files in ``directory`` that are missing or differ from the generator."""
    out = []
    for name, text in generated().items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.append(name)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m allot.proto.schema", description=__doc__)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write the generated files")
    mode.add_argument("--check", action="store_true", help="exit 1 if the files drifted")
    ap.add_argument("--dir", type=Path, default=None, help="output folder (default: proto/)")
    args = ap.parse_args(argv)
    directory: Path = args.dir or default_dir()
    if args.write:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in generated().items():
            (directory / name).write_text(text, encoding="utf-8")
            print(f"wrote {directory / name}")
        return 0
    stale = drift(directory)
    for name in stale:
        print(
            f"{directory / name} differs from the Structs; run "
            "`python -m allot.proto.schema --write` and commit the result",
            file=sys.stderr,
        )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
