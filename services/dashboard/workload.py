"""The dashboard's workload page: one workload's life from the log.

``workload_page`` shows where it is now (the placement leader's ``WorkloadStatus``, and its
queue row with the pending reason when it waits) and its timeline (``LogTimeline.events``,
in time order): submitted, placed, started, protected until, preemption notice (reason
code and meaning, preemptor, the victim allocation's held vs entitled GPUs, the deadline),
preempted, requeued, completed, failed, cancelled.

Stable hooks: ``#state[data-state]``; ``li[data-event-kind][data-attempt]`` in
``#timeline``, with ``data-reason`` (notice, preempted) and ``data-preemptor``; the
preemptor is a link to its own page.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any, TypeGuard

import msgspec

from allot.core.duration_text import format_duration
from allot.core.reasons import PREEMPT_TEXT as _CORE_TEXT
from allot.eventlog.timeline import TimelineEvent
from allot.proto import messages as m
from allot.render.live_format import NOT_STARTED, gpu_h_cell
from allot.services.dashboard.frame import (
    PageView,
    error_banners,
    estimate,
    reason_cell,
    when,
    workload_link,
)

PREEMPT_TEXT: dict[str, str] = {reason.value: text for reason, text in _CORE_TEXT.items()}
"""The preemption reasons of ``docs/reasons.md``, one line each, by wire code."""


# ------------------------------------------------------------------------------ workload


def workload_page(
    now: float,
    workload_id: str,
    status: m.WorkloadStatus | None,
    events: Sequence[TimelineEvent],
    *,
    queue_row: m.QueueRow | None = None,
    errors: Sequence[str] = (),
) -> PageView:
    """One workload's life from the log: submitted, started, protected until, notice
    (reason, preemptor and the numbers), preempted, requeued, ended; plus where it waits."""
    parts = [error_banners(errors)]
    known = bool(events) or (status is not None and status.state != "unknown")
    if not known:
        parts.append(f'<p id="unknown">No workload {escape(workload_id)} in the log.</p>')
        missing = {"workload_id": workload_id, "state": "unknown", "events": []}
        return PageView("workload", f"Workload {workload_id}", "\n".join(parts), missing, now, 404)
    if status is not None and status.state != "unknown":
        facts = [
            (
                "state",
                f'<b id="state" data-state="{escape(status.state)}">{escape(status.state)}</b>',
            ),
            ("allocation", escape(status.allocation or "(unallocated)")),
            ("user", escape(status.user or "")),
            ("GPUs", str(status.gpus)),
            ("attempt", str(status.attempt)),
        ]
        if status.submitted_at is not None:
            facts.append(("submitted", when(status.submitted_at, now)))
        if status.started_at is not None:
            facts.append(("placed", when(status.started_at, now)))
        if status.run_started_at is not None:
            facts.append(("started", when(status.run_started_at, now)))
        elif status.state in m.LIVE_STATES:
            facts.append(("started", NOT_STARTED))
        if status.protected_until is not None:
            facts.append(("protected until", when(status.protected_until, now)))
        if status.preempt_at is not None:
            facts.append(("must leave by", when(status.preempt_at, now)))
        if status.assignment:
            facts.append(
                (
                    "ran on" if status.ended_at is not None else "GPUs held",
                    escape(", ".join(f"{a.host}:{list(a.gpus)}" for a in status.assignment)),
                )
            )
        if status.position is not None:
            facts.append(("queue position", str(status.position)))
        if status.requeued_at is not None:
            why = f" ({escape(status.requeue_reason)})" if status.requeue_reason else ""
            facts.append(
                ("requeued", f"{when(status.requeued_at, now)}: attempt {status.attempt}{why}")
            )
        if status.ended_at is not None:
            facts.append(("ended", when(status.ended_at, now)))
        if status.exit_code is not None:
            facts.append(("exit code", str(status.exit_code)))
        if status.reason:
            facts.append(("reason", escape(status.reason)))
        if status.cancelled_by:
            facts.append(("cancelled by", escape(status.cancelled_by)))
        parts.append(
            '<table id="facts"><tbody>'
            + "".join(f'<tr><th class="l">{k}</th><td class="l">{v}</td></tr>' for k, v in facts)
            + "</tbody></table>"
        )
    if queue_row is not None:
        parts.append(
            '<p id="waiting">Waiting: '
            + reason_cell(queue_row.reason, queue_row.why, queue_row.reason_numbers)
            + f"; est. start {estimate(queue_row.est_start, now)}.</p>"
        )
    parts.append("<h2>Timeline</h2>")
    # A notice is read with its attempt's end: once the work left, its deadline is history.
    ends: dict[int, TimelineEvent] = {}
    for e in events:
        if e.kind in _END_KINDS:
            ends.setdefault(e.attempt, e)
    # In time order (log order for equal times): a protection end is recorded with the
    # placement but happens later.
    items = [_event_item(e, now, ends.get(e.attempt)) for e in sorted(events, key=lambda e: e.at)]
    parts.append('<ol class="timeline" id="timeline">' + "\n".join(items) + "</ol>")
    data: dict[str, Any] = {
        "workload_id": workload_id,
        "state": status.state if status is not None else None,
        "status": msgspec.to_builtins(status) if status is not None else None,
        "events": [
            {"at": e.at, "kind": e.kind, "attempt": e.attempt, "detail": _jsonable(e.detail)}
            for e in events
        ],
    }
    return PageView("workload", f"Workload {workload_id}", "\n".join(parts), data, now)


_EVENT_TITLE = {
    "submitted": "submitted",
    "placed": "placed",
    "started": "started",
    "protected-until": "protected until",
    "notice": "preemption notice",
    "preempted": "preempted",
    "requeued": "requeued",
    "completed": "completed",
    "failed": "failed",
    "cancel-requested": "cancel requested",
    "cancelled": "cancelled",
}


_END_KINDS = frozenset({"preempted", "completed", "failed", "cancelled"})
"""Timeline kinds that end an attempt."""


def _ranking_text(d: Mapping[str, object]) -> list[str]:
    """The Fair Tree side of a notice: each allocation's window usage and fairshare factor
    (1 = served first); a notice recorded before the factor travelled gives the rank."""
    out: list[str] = []
    legend = " (1 = served first)"
    for who, label in (("victim", "its allocation"), ("preemptor", "")):
        usage, rank = d.get(f"{who}_window_gpu_s"), d.get(f"{who}_rank")
        factor = d.get(f"{who}_fairshare")
        name = d.get("preemptor_allocation") if who == "preemptor" else None
        if not (_is_number(usage) or _is_number(rank) or _is_number(factor)):
            continue
        subject = label or (f"the preemptor's allocation {name}" if name else "the preemptor's")
        parts = []
        if _is_number(usage):
            parts.append(f"used {gpu_h_cell(float(usage) / 3600)} GPU-h in the window")
        if _is_number(factor):
            parts.append(f"fairshare factor {float(factor):.3f}{legend}")
            legend = ""
        elif _is_number(rank):
            parts.append(f"Fair Tree rank {int(float(rank))} (the highest is served first)")
        out.append(f"{escape(str(subject))} {', '.join(parts)}")
    return out


def _deadline_text(deadline: float, end: TimelineEvent | None, now: float) -> str:
    """A notice's deadline: still ahead, passed with no end in the log yet, or met (when
    the attempt ended, and how)."""
    if end is None:
        verb = "must" if deadline > now else "had to"
        return f"{verb} leave by {when(deadline, now)}"
    gap = end.at - deadline
    side = (
        "at its deadline"
        if abs(gap) < 1
        else f"{format_duration(abs(gap))} {'after' if gap > 0 else 'before'} its deadline"
    )
    return f"left ({escape(_EVENT_TITLE.get(end.kind, end.kind))}) {when(end.at, now)}, {side}"


def _event_item(e: TimelineEvent, now: float, end: TimelineEvent | None = None) -> str:
    """One timeline entry: when, what, and the numbers behind it (reason codes with their
    meaning, the preemptor as a link, deadlines as times). ``end``: the event that ended
    this entry's attempt, if any (a notice then says the work left)."""
    d = e.detail
    attrs = f' data-event-kind="{escape(e.kind)}" data-attempt="{e.attempt}"'
    text: list[str] = []
    shown: set[str] = set()
    reason = d.get("reason")
    if e.kind in ("notice", "preempted") and isinstance(reason, str) and reason:
        attrs += f' data-reason="{escape(reason)}"'
        explained = PREEMPT_TEXT.get(reason, "")
        text.append(
            f'<code class="reason">{escape(reason)}</code>'
            + (f": {escape(explained)}" if explained else "")
        )
        shown.add("reason")
    preemptor = d.get("preemptor")
    if isinstance(preemptor, str) and preemptor:
        attrs += f' data-preemptor="{escape(preemptor)}"'
        text.append(f'for <span class="preemptor">{workload_link(preemptor)}</span>')
    shown.add("preemptor")
    held, entitled = d.get("victim_held_gpus"), d.get("victim_entitlement_gpus")
    unallocated = d.get("allocated") is False or (
        "allocated" not in d and reason == "displaced-unallocated"
    )
    if e.kind == "notice" and unallocated:
        text.append(
            "it is unallocated work (free, entitled to nothing: any allocated work "
            "may take its GPUs)"
        )
        shown |= {"victim_held_gpus", "victim_entitlement_gpus", "allocated"}
    elif _is_number(held) and _is_number(entitled):
        text.append(f"its allocation held {float(held):g} of {float(entitled):.1f} entitled GPUs")
        shown |= {"victim_held_gpus", "victim_entitlement_gpus", "allocated"}
    text += _ranking_text(d)
    shown |= {
        "victim_window_gpu_s",
        "victim_rank",
        "victim_fairshare",
        "preemptor_allocation",
        "preemptor_window_gpu_s",
        "preemptor_rank",
        "preemptor_fairshare",
    }
    deadline = d.get("grace_deadline")
    if _is_number(deadline):
        text.append(_deadline_text(float(deadline), end, now))
        shown.add("grace_deadline")
    hosts = d.get("assignment")
    if isinstance(hosts, list) and hosts:
        text.append("on " + escape(", ".join(_assignment_text(a) for a in hosts)))
        shown |= {"assignment", "hosts"}
    if e.kind == "submitted":
        text.append(_submitted_text(d))
        shown |= {"allocation", "user", "gpus", "kind", "priority", "allocated"}
    for key, label in (("waited_s", "waited"), ("min_runtime_s", "minimum runtime")):
        value = d.get(key)
        if _is_number(value):
            text.append(f"{label} {format_duration(float(value))}")
        shown.add(key)
    gpu_s = d.get("gpu_seconds")
    if _is_number(gpu_s):
        text.append(f"ran {float(gpu_s):,.0f} GPU-seconds")
        shown.add("gpu_seconds")
    requeue = d.get("requeue")
    if isinstance(requeue, bool):
        text.append("will be requeued (resumable)" if requeue else "will not be requeued")
        shown.add("requeue")
    # In the JSON, not worth a reader's time here: the fencing epoch, and the GPU count the
    # facts above already give.
    shown |= {"epoch", "gpus"}
    rest = ", ".join(
        f"{escape(str(k))}={escape(_short(v))}"
        for k, v in sorted(d.items())
        if k not in shown and v not in (None, "")
    )
    if rest:
        text.append(f'<span class="detail">{rest}</span>')
    title = _EVENT_TITLE.get(e.kind, e.kind)
    return (
        f'<li{attrs}><span class="when">{when(e.at, now)}</span>'
        f"<b>{escape(title)}</b>"
        + (f" (attempt {e.attempt})" if e.attempt else "")
        + (": " + "; ".join(text) if text else "")
        + "</li>"
    )


def _submitted_text(d: Mapping[str, object]) -> str:
    owner = d.get("allocation") or "unallocated"
    free = "" if d.get("allocated") else " (unallocated: free, preemptible)"
    return escape(
        f"{d.get('gpus')} GPUs for {owner}{free} by {d.get('user')}, "
        f"kind {d.get('kind')}, priority {d.get('priority')}"
    )


def _assignment_text(item: object) -> str:
    if isinstance(item, dict):
        gpus = item.get("gpus")
        return f"{item.get('host')}:{len(gpus) if isinstance(gpus, list) else '?'} GPUs"
    return str(item)


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# ------------------------------------------------------------------------------ helpers


def _short(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _jsonable(detail: Mapping[str, object]) -> dict[str, object]:
    """An event's detail as JSON values: nested dicts and lists stay JSON objects and
    arrays (an assignment is ``[{"host": ..., "gpus": [...]}]``), not their Python repr."""
    return {str(k): _json_value(v) for k, v in detail.items()}


def _json_value(v: object) -> object:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN or infinity
    if v is None or isinstance(v, str | int | float | bool):
        return v
    if isinstance(v, Mapping):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_value(x) for x in v]
    if isinstance(v, msgspec.Struct):
        return _json_value(msgspec.to_builtins(v))
    return str(v)
