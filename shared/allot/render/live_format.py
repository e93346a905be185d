"""What the live ``allot`` commands print: tables, status, one line per event, and the
``--json`` envelope. Pure functions of the replies (no NATS, no clock: "now" is the reply's
``at``), so they are unit-tested directly.

The ``--json`` envelope is stable: ``{"kind": <wire type>, "at": <seconds since the
epoch>, "data": <the message's fields, without its type tag>}``. A command that prints
one envelope prints it indented; one that prints several (``watch``, ``share -l``,
``owed``: the day, then the week) prints them as JSON Lines, one compact envelope each.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from allot.core.duration_text import format_duration
from allot.proto import messages as m
from allot.proto.subjects import UNALLOCATED

NONE = "-"
"""What an empty cell shows."""
NOT_STARTED = "not yet (placed; its host has not reported it)"
"""``allot status``'s and the dashboard's start of a placed run its host has not reported
started (placed is not running: the agent may still be starting it)."""


@dataclass(frozen=True)
class Column:
    title: str
    align: Literal["<", ">"] = "<"
    """``<`` for text, ``>`` for numbers."""


def render_table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """A header, a rule, then the rows; each column as wide as its widest cell. The last
    column is not padded (no trailing blanks)."""
    widths = [len(c.title) for c in columns]
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"row has {len(row)} cells for {len(columns)} columns: {row!r}")
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            f"{cell:{col.align}{w}}" for cell, col, w in zip(cells, columns, widths, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line([c.title for c in columns]), "  ".join("-" * w for w in widths)]
    out.extend(line(row) for row in rows)
    return "\n".join(out)


# -- cells -------------------------------------------------------------------------------------


def alloc_cell(allocation: str | None) -> str:
    return UNALLOCATED if allocation is None else allocation


def num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return NONE
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.{digits}f}"


def int_cell(value: int | None) -> str:
    return NONE if value is None else str(value)


def timestamp(at: float | None) -> str:
    """UTC, to the second: ``2026-01-02T03:04:05Z``."""
    if at is None:
        return NONE
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def assignment_text(assignment: Sequence[m.HostGpus]) -> str:
    """``h01:0,1,2,3 h02:0,1``."""
    return " ".join(f"{a.host}:{','.join(map(str, a.gpus))}" for a in assignment) or NONE


# -- tables ------------------------------------------------------------------------------------

QUEUE_COLUMNS = (
    Column("POS", ">"),
    Column("WORKLOAD"),
    Column("ALLOC"),
    Column("USER"),
    Column("GPUS", ">"),
    Column("TIER"),
    Column("FAIRSHARE", ">"),
    Column("REASON"),
    Column("EST.START*", ">"),
    Column("WHY"),
)
QUEUE_LONG_COLUMNS = (
    *QUEUE_COLUMNS[:7],
    Column("PRIO", ">"),
    Column("AGE", ">"),
    *QUEUE_COLUMNS[7:],
)
EST_START_NOTE = (
    "* EST.START is an estimate, not a promise: the notice deadline or protection end the "
    "reason names, 'now' when the next cycle starts it, '-' when nothing bounds it"
)
ORDER_NOTE = (
    "Served in POS order (1 = served first): by TIER (under-entitlement, then "
    "over-entitlement, then unallocated), then the allocation's FAIRSHARE factor "
    "(1 = served first), then the user's PRIO (higher first), then AGE (older first)"
)
"""The legend of ``allot queue`` and ``allot prio``: the words the dashboard's queue page
uses too."""


PRIO_COLUMNS = (
    Column("POS", ">"),
    Column("WORKLOAD"),
    Column("ALLOC"),
    Column("USER"),
    Column("GPUS", ">"),
    Column("TIER"),
    Column("HELD", ">"),
    Column("ENTITLED", ">"),
    Column("FAIRSHARE", ">"),
    Column("PRIO", ">"),
    Column("AGE", ">"),
)


def prio_table(snapshot: m.PrioSnapshot) -> str:
    """sprio -l-like: the inputs of each position, in precedence order left to right:
    tier (and why: held vs entitled), the allocation's fairshare factor, user priority,
    age; the legend says which way each one serves first."""
    rows = [
        (
            str(r.position),
            r.workload_id,
            alloc_cell(r.allocation),
            r.user,
            str(r.gpus),
            r.tier_name,
            str(r.held),
            f"{r.entitlement:.1f}",
            num(r.fairshare),
            str(r.priority),
            format_duration(r.age_s),
        )
        for r in snapshot.rows
    ]
    footer = f"{max(snapshot.total, len(snapshot.rows))} pending" + (
        f" (first {len(snapshot.rows)} shown)" if snapshot.total > len(snapshot.rows) else ""
    )
    return (
        f"{render_table(PRIO_COLUMNS, rows)}\n{footer} (at {timestamp(snapshot.at)})\n{ORDER_NOTE}"
    )


def est_start_cell(est: float | None, at: float) -> str:
    """``~12m05s`` from the snapshot's ``at`` (``now`` when due), ``-`` when unknown."""
    if est is None:
        return NONE
    if est - at < 1.0:
        return "now"
    return f"~{format_duration(est - at)}"


def queue_table(snapshot: m.QueueSnapshot, *, long: bool = False) -> str:
    """squeue-like: pending work in service order, each with its allocation's fairshare
    factor, its reason code (docs/reasons.md), an ESTIMATED start (footnoted as such) and
    the reason's text. ``long`` adds the rest of the order's inputs (user priority, age at
    ``at``). The legend says which way each column serves first."""
    rows = []
    for r in snapshot.rows:
        cells = [
            str(r.position),
            r.workload_id,
            alloc_cell(r.allocation),
            r.user,
            str(r.gpus),
            r.tier,
            num(r.fairshare),
        ]
        if long:
            cells += [str(r.priority), format_duration(snapshot.at - r.submitted_at)]
        cells += [r.reason or NONE, est_start_cell(r.est_start, snapshot.at), r.why or NONE]
        rows.append(cells)
    footer = (
        f"{max(snapshot.total, len(snapshot.rows))} pending"
        + (f" (first {len(snapshot.rows)} shown)" if snapshot.total > len(snapshot.rows) else "")
        + f", {snapshot.free_gpus} GPUs free "
        f"(epoch {snapshot.epoch}, at {timestamp(snapshot.at)})"
    )
    columns = QUEUE_LONG_COLUMNS if long else QUEUE_COLUMNS
    return f"{render_table(columns, rows)}\n{footer}\n{ORDER_NOTE}\n{EST_START_NOTE}"


SHARE_COLUMNS = (
    Column("Account"),
    Column("RawShares", ">"),
    Column("NormShares", ">"),
    Column("RawUsage(GPU-h)", ">"),
    Column("EffectvUsage", ">"),
    Column("LevelFS", ">"),
    Column("FairShare", ">"),
)
FAIRSHARE_NOTE = (
    "FairShare: the allocation's fairshare factor, 1 = served first within a tier "
    "(allot queue shows the tiers)"
)


def gpu_h_cell(hours: float | None) -> str:
    """GPU-hours in a usage column: two decimals, more below 0.1 (three significant
    digits, at most six decimals), so a young stack's hundredths do not print as 0.00
    beside a ratio computed from them."""
    if hours is None:
        return NONE
    if hours == 0 or abs(hours) >= 0.1 or not math.isfinite(hours):
        return f"{hours:.2f}"
    return f"{hours:.{min(6, 2 - math.floor(math.log10(abs(hours))))}f}"


def gpu_hours(gpu_s: float) -> str:
    """A usage column's cell: GPU-seconds on the wire, GPU-hours on screen."""
    return gpu_h_cell(gpu_s / 3600.0)


def share_table(ranking: m.RankingUpdated) -> str:
    """``sshare`` like: one row per node in tree order, the path shown as is; raw usage
    arrives in GPU-seconds and is shown in GPU-hours. Slurm's rank is left to ``-l``: the
    factor alone says who is served first."""
    rows = [
        (
            r.path,
            "parent" if r.raw_shares is None else str(r.raw_shares),
            num(r.norm_shares, 6),
            gpu_hours(r.raw_usage),
            num(r.effective_usage, 6),
            r.level_fs if isinstance(r.level_fs, str) else num(r.level_fs, 6),
            num(r.fairshare, 6),
        )
        for r in ranking.nodes
    ]
    return f"{render_table(SHARE_COLUMNS, rows)}\n{_ranked(ranking)}\n{FAIRSHARE_NOTE}"


def _ranked(ranking: m.RankingUpdated) -> str:
    return (
        f"window {format_duration(ranking.window_s)}, ranked at {timestamp(ranking.at)} "
        "(RawUsage: GPU-hours charged in the window by then)"
    )


SHARE_LONG_COLUMNS = (
    Column("Account"),
    Column("RawShares", ">"),
    Column("NormShares", ">"),
    Column("RawUsage(GPU-h)", ">"),
    Column("NormUsage", ">"),
    Column("EffectvUsage", ">"),
    Column("FairShare", ">"),
    Column("LevelFS", ">"),
    Column("Rank", ">"),
    Column("Budget", ">"),
    Column("Entitlement", ">"),
    Column("Held", ">"),
)


def share_long_table(ranking: m.RankingUpdated, allocations: m.AllocationsSnapshot | None) -> str:
    """``sshare -l``: Slurm's columns, then what Allot adds for now.

    Slurm's: RawShares (``parent`` for a parent node), NormShares (S), RawUsage (in the
    window, subtree sum for an account; shown in GPU-hours where sshare shows seconds),
    NormUsage (its usage over the whole tree's, ``RankRow.effective_usage``), EffectvUsage
    (the level's U = its usage over its Fair Tree parent's, the parent skipping ``parent``
    accounts; what sshare shows under Fair Tree; ``-`` for a ``parent`` node), FairShare
    (leaves), LevelFS and Rank (Fair Tree's, explained in the legend: the highest is
    served first). Allot's: Budget (effective share of the cluster), Entitlement (that
    share of the healthy GPUs) and Held (GPUs its allocated work holds now). An account
    shows the sums over its leaves. ``allocations`` None (the placement leader did not
    answer): those three columns show ``-``.
    """
    nodes = ranking.nodes
    by_path = {r.path: r for r in nodes}
    root_usage = math.fsum(r.raw_usage for r in nodes if r.path.count("/") == 1)
    alloc = {a.allocation: a for a in allocations.rows} if allocations is not None else {}
    leaves = [r for r in nodes if r.leaf]
    rows = []
    for r in nodes:
        under = [r] if r.leaf else [x for x in leaves if x.path.startswith(r.path + "/")]
        mine = [alloc[x.name] for x in under if x.name in alloc]
        known = allocations is not None and bool(mine)
        rows.append(
            (
                r.path,
                "parent" if r.raw_shares is None else str(r.raw_shares),
                num(r.norm_shares, 6),
                gpu_hours(r.raw_usage),
                num(r.effective_usage, 6),
                num(_level_usage(r, by_path, root_usage), 6),
                num(r.fairshare, 6),
                r.level_fs if isinstance(r.level_fs, str) else num(r.level_fs, 6),
                int_cell(r.rank),
                f"{100 * math.fsum(a.effective_share for a in mine):.1f}%" if known else NONE,
                f"{math.fsum(a.entitlement_gpus for a in mine):.1f}" if known else NONE,
                str(sum(a.held_gpus for a in mine)) if known else NONE,
            )
        )
    footer = _ranked(ranking)
    if allocations is None:
        footer += "; Budget, Entitlement, Held unknown (the placement leader did not answer)"
    else:
        footer += (
            f"; Entitlement = Budget x {allocations.healthy_gpus} healthy GPUs "
            f"(of {allocations.total_gpus}), Held at {timestamp(allocations.at)}"
        )
    legend = f"{FAIRSHARE_NOTE}\n{rank_legend(len(leaves))}"
    return f"{render_table(SHARE_LONG_COLUMNS, rows)}\n{footer}\n{legend}"


def rank_legend(allocations: int) -> str:
    """What Rank and FairShare say: Fair Tree counts ranks up, so the highest is served
    first (a newcomer reads Rank 1 as first)."""
    n = allocations
    return (
        f"Rank: Slurm's Fair Tree rank, {n} (the number of allocations) = served first, "
        f"1 = served last; FairShare = Rank / {n}"
    )


def _level_usage(
    row: m.RankRow, by_path: Mapping[str, m.RankRow], root_usage: float
) -> float | None:
    """Fair Tree's U for ``row``: its usage over its Fair Tree parent's (the nearest
    ancestor that is not a ``parent`` account; the root's usage is the sum of its
    children's). None for a ``parent`` node, which has no level of its own."""
    if row.raw_shares is None:
        return None
    parent_path = row.path.rsplit("/", 1)[0]
    parent = by_path.get(parent_path)
    while parent is not None and parent.raw_shares is None:
        parent_path = parent_path.rsplit("/", 1)[0]
        parent = by_path.get(parent_path)
    used = root_usage if parent is None else parent.raw_usage
    return row.raw_usage / used if used else 0.0


HOSTS_COLUMNS = (
    Column("HOST"),
    Column("STATE"),
    Column("GPUS", ">"),
    Column("FREE", ">"),
    Column("LANE"),
    Column("WORKLOADS"),
)


DRAIN_COLUMNS = (
    Column("HOST"),
    Column("STATE"),
    Column("SINCE"),
    Column("BY"),
    Column("REASON"),
)


def hosts_table(snapshot: m.HostsSnapshot) -> str:
    """The hosts (LANE: ``short`` for placement's short lane), then (when any host is
    draining or drained) its drain, like ``sinfo -R``: since when, by whom (``-``: the
    health service) and why."""
    rows = [
        (
            h.host,
            h.state,
            str(h.gpus),
            str(h.free_gpus),
            "short" if h.short_lane else NONE,
            ",".join(h.workloads) or NONE,
        )
        for h in snapshot.hosts
    ]
    out = render_table(HOSTS_COLUMNS, rows)
    drains = [
        (h.host, h.state, timestamp(h.drain_at), h.drain_by or NONE, h.drain_reason or NONE)
        for h in snapshot.hosts
        if h.state != "healthy" and (h.drain_at is not None or h.drain_reason)
    ]
    if drains:
        out += "\n\n" + render_table(DRAIN_COLUMNS, drains)
    return out


def one_line(text: str) -> str:
    """``text`` with its line breaks and tabs written as ``\\n``, ``\\r``, ``\\t``: a
    free-text field (a cancel's reason, a command's argument) must not break a listing's
    one-line-per-field layout."""
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def _run_started(status: m.WorkloadStatus) -> str:
    """When the host reported the process started (the run's start, as the end events'
    ``started_at`` says); for a placed run whose host has not yet, says so (placed is not
    running: the agent may still be starting it). The placement (the wire's ``started_at``,
    Slurm's job start) is the ``placed`` line."""
    if status.run_started_at is not None:
        return timestamp(status.run_started_at)
    return NOT_STARTED if status.state in m.LIVE_STATES else NONE


def _requeued(status: m.WorkloadStatus) -> str:
    """A workload pending again: when its last attempt ended and why (Slurm's restart count
    and requeue reason)."""
    if status.requeued_at is None:
        return NONE
    why = f" ({one_line(status.requeue_reason)})" if status.requeue_reason else ""
    return f"{timestamp(status.requeued_at)}, after attempt {status.attempt}{why}"


def status_text(
    status: m.WorkloadStatus, waiting: m.QueueRow | None = None, at: float | None = None
) -> str:
    """One ``key: value`` line per field that says something; an ended workload shows its
    last attempt's placement, start and hosts, its end, exit code and reason (like
    ``sacct``). ``waiting``: a pending workload's queue row (as of ``at``), which says why
    it waits and when it may start (as ``squeue``'s REASON and START_TIME)."""
    why = (waiting.why or waiting.reason) if waiting is not None else ""
    estimate = NONE
    if waiting is not None and waiting.est_start is not None and at is not None:
        estimate = f"{timestamp(waiting.est_start)} ({est_start_cell(waiting.est_start, at)})"
    lines = [
        ("workload", status.workload_id),
        ("state", status.state),
        ("allocation", alloc_cell(status.allocation)),
        ("user", status.user or NONE),
        ("gpus", str(status.gpus)),
        ("attempt", str(status.attempt)),
        ("position", int_cell(status.position)),
        ("requeued", _requeued(status)),
        ("waiting for", one_line(why) or NONE),
        ("waiting code", (waiting.reason if waiting is not None else "") or NONE),
        ("est. start", estimate),
        ("submitted", timestamp(status.submitted_at)),
        ("placed", timestamp(status.started_at)),
        ("started", _run_started(status)),
        ("protected until", timestamp(status.protected_until)),
        ("preempt at", timestamp(status.preempt_at)),
        ("assignment", assignment_text(status.assignment)),
        ("ended", timestamp(status.ended_at)),
        ("exit code", int_cell(status.exit_code)),
        ("reason", one_line(status.reason) or NONE),
        ("cancelled by", status.cancelled_by or NONE),
        ("command", one_line(shlex.join(status.command)) if status.command else NONE),
        ("env", " ".join(status.env_names) or NONE),
        ("kind", status.kind if status.kind == m.SESSION_KIND else NONE),
        ("checkpoint dir", status.checkpoint_dir or NONE),
        *(
            (f"checkpoint {c.attempt}", checkpoint_cell(c))
            for c in status.checkpoints  # issue 40: each preempted attempt's outcome
        ),
    ]
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k + ':':{width + 1}} {v}" for k, v in lines if v != NONE)


def checkpoint_cell(c: m.AttemptCheckpoint) -> str:
    """``done, checkpointed 12:00:03, lost 0.01 GPU-h`` (issue 40)."""
    parts: list[str] = [c.outcome or "no notice"]
    if c.checkpointed_at is not None:
        parts.append(f"checkpointed {timestamp(c.checkpointed_at)}")
    parts.append(f"lost {c.lost_gpu_seconds / 3600:.2f} GPU-h")
    return ", ".join(parts)


# -- events ------------------------------------------------------------------------------------

_QUIET_FIELDS = frozenset({"workload_id", "allocation", "at"})


def event_line(record: msgspec.Struct) -> str:
    """``<UTC time>  <type>  key=value ...``: every field that is not its default (the id,
    allocation and time are the line's context)."""
    at = getattr(record, "at", None)
    parts = [timestamp(at), type(record).__name__]
    defaults = dict(
        zip(
            record.__struct_fields__,
            _field_defaults(type(record)),
            strict=True,
        )
    )
    for name in record.__struct_fields__:
        if name in _QUIET_FIELDS:
            continue
        value = getattr(record, name)
        if name in defaults and defaults[name] is not _REQUIRED and value == defaults[name]:
            continue
        parts.append(f"{name}={_value_text(name, value, at)}")
    return "  ".join(parts[:2]) + ("  " + " ".join(parts[2:]) if len(parts) > 2 else "")


_REQUIRED = object()


def _field_defaults(cls: type[msgspec.Struct]) -> list[object]:
    """Struct defaults aligned with ``__struct_fields__`` (required fields first)."""
    fields = cls.__struct_fields__
    given = cls.__struct_defaults__
    return [_REQUIRED] * (len(fields) - len(given)) + list(given)


def _value_text(name: str, value: object, at: float | None) -> str:
    if name == "assignment" and isinstance(value, tuple):
        return assignment_text(value)
    if name == "grace_deadline" and isinstance(value, float) and at is not None:
        return f"{timestamp(value)}(+{format_duration(value - at)})"
    if isinstance(value, float) and (name.endswith(("_at", "since")) or name == "until"):
        return timestamp(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return json.dumps(msgspec.to_builtins(value), separators=(",", ":"))
    if isinstance(value, str) and (not value or " " in value):
        return json.dumps(value)
    return str(value)


# -- JSON --------------------------------------------------------------------------------------


def envelope(msg: msgspec.Struct, now: float) -> dict[str, Any]:
    """The ``--json`` envelope; ``at`` is the message's own time when it has one, else
    ``now`` (e.g. ``WorkloadStatus``)."""
    data = msgspec.to_builtins(msg)
    data.pop("type", None)
    at = getattr(msg, "at", None)
    return {"kind": type(msg).__name__, "at": now if at is None else at, "data": data}


def envelope_json(msg: msgspec.Struct, now: float, *, indent: int | None = 2) -> str:
    return json.dumps(envelope(msg, now), indent=indent, allow_nan=False)


def envelope_lines(msgs: Iterable[msgspec.Struct], now: float) -> str:
    """One compact envelope per line (JSON Lines), e.g. ``share -l --json``."""
    return "\n".join(envelope_json(msg, now, indent=None) for msg in msgs)
