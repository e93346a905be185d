"""The dashboard's pages about the cluster: fair share, queue, hosts, owed vs delivered.

Each function takes what the service fetched (placement and ranking replies, the log
timeline's history) and returns a ``PageView`` (``allot.services.dashboard.frame``). Charts
are ``allot.render.svgcharts``, the code of the simulator's report.html: inline SVG drawn
here, nothing fetched.

Stable hooks: ``tr[data-workload-id][data-position][data-reason]`` in queue order
(``#queue``); ``#served-order [data-served-allocation]``, the allocations in the order they
are served (``~``: unallocated work); ``tr[data-allocation]`` (fair share with
``td[data-held]``, ``td[data-entitlement]`` and ``td[data-fairshare]``; owed with
``td[data-owed]``, ``td[data-delivered]`` and ``td[data-idle]`` per ``data-window``);
``tr[data-idle-workload]`` (``#idle``: runs flagged idle now, on the owed page);
``[data-chart-allocation]`` (with ``data-chart-from-s``: how many seconds back the axis
starts) and ``[data-chart-window]`` around charts; ``#window`` (the chart window chosen);
``tr[data-host][data-state]`` with ``data-deadline`` on draining hosts, ``data-lane="short"``
on the short lane's, and ``li[data-drain-host]`` (``#drains``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

import msgspec

from allot.core.duration_text import format_duration
from allot.eventlog.idle_book import Stretch
from allot.proto import messages as m
from allot.proto.subjects import UNALLOCATED
from allot.render.live_format import gpu_h_cell, gpu_hours
from allot.render.svgcharts import Series, bar_chart, line_chart
from allot.services.dashboard.frame import (
    PageView,
    clock,
    error_banners,
    estimate,
    num,
    pct,
    reason_cell,
    table,
    when,
    workload_link,
)

WINDOWS: dict[str, tuple[float, int]] = {
    "7d": (7 * 86400.0, 3600),
    "1d": (86400.0, 600),
    "1h": (3600.0, 60),
}
"""Fair-share chart windows: name -> (window seconds, bucket seconds)."""
DEFAULT_WINDOW = "7d"
"""The chart window of a history longer than every window."""


def pick_window(history_s: float) -> str:
    """The shortest chart window that holds the whole history (the log's first record to
    now), so a young stack's minutes are not squeezed into a week's last pixel."""
    for name, (window_s, _) in sorted(WINDOWS.items(), key=lambda kv: kv[1][0]):
        if history_s <= window_s:
            return name
    return DEFAULT_WINDOW


# ------------------------------------------------------------------------------ fair share


def fairshare_page(
    now: float,
    ranking: m.RankingUpdated | None,
    allocations: m.AllocationsSnapshot | None,
    series: tuple[list[float], dict[str, list[float]], dict[str, list[float]]] | None,
    *,
    window: str,
    first: float | None = None,
    picked: bool = False,
    errors: Sequence[str] = (),
) -> PageView:
    """The budget tree with shares and Fair Tree's fairshare factor (ranking), held GPUs vs
    entitlement now (placement), and held vs entitlement over ``window`` (the log's series,
    which start at its first record when that is later than the window's start).
    ``picked``: the window was chosen from the history that starts at ``first``
    (``pick_window``), not asked for."""
    by_alloc = {r.allocation: r for r in allocations.rows} if allocations is not None else {}
    parts = [error_banners(errors)]
    if allocations is not None:
        parts.append(
            f'<p class="note" id="capacity">{allocations.healthy_gpus} GPUs on healthy hosts '
            f"of {allocations.total_gpus}. Entitlement = effective share × healthy GPUs; an "
            "allocation holding less than its entitlement is served first.</p>"
        )
    heads = (
        ("node", "l"),
        ("shares", ""),
        ("norm. shares", ""),
        ("effective share", ""),
        ("usage (GPU-h charged in the window)", ""),
        ("effective usage", ""),
        ("level FS", ""),
        ("fairshare factor (1 = served first)", ""),
        ("held GPUs", ""),
        ("entitlement GPUs", ""),
        ("pending", ""),
    )
    rows: list[str] = []
    seen: set[str] = set()
    for node in ranking.nodes if ranking is not None else ():
        depth = node.path.count("/") - 1
        alloc = by_alloc.get(node.name) if node.leaf else None
        seen.add(node.name)
        attrs = f' data-allocation="{escape(node.name)}"' if node.leaf else ' data-node="1"'
        rows.append(
            f"<tr{attrs}>"
            f'<td class="l" style="padding-left:{8 + 16 * max(depth, 0)}px">'
            f"{'' if node.leaf else '▸ '}{escape(node.name)}</td>"
            f"<td>{'parent' if node.raw_shares is None else node.raw_shares}</td>"
            f"<td>{num(node.norm_shares, 3)}</td>"
            f"<td>{pct(alloc.effective_share) if alloc else ''}</td>"
            f"<td>{gpu_hours(node.raw_usage)}</td>"
            f"<td>{num(node.effective_usage, 3)}</td>"
            f"<td>{escape(_level_fs(node.level_fs))}</td>"
            f'<td data-fairshare="{num(node.fairshare, 6)}">{num(node.fairshare, 3)}</td>'
            + _held_cells(alloc)
            + "</tr>"
        )
    for name, alloc in sorted(by_alloc.items()):  # placement knows it, ranking did not say
        if name not in seen:
            rows.append(
                f'<tr data-allocation="{escape(name)}"><td class="l">{escape(name)}</td>'
                + "<td></td>" * 2
                + f"<td>{pct(alloc.effective_share)}</td>"
                + "<td></td>" * 4
                + _held_cells(alloc)
                + "</tr>"
            )
    parts.append(table(heads, rows, table_id="tree"))
    if ranking is not None:
        parts.append(
            f'<p class="note" id="fairshare-order">Fair Tree ranking of '
            f"{when(ranking.at, now)} over a usage window of "
            f"{format_duration(ranking.window_s)}, with the usage charged by then (accounting "
            "charges running work in whole slots, so it lags the owed page's figures). "
            "Within a tier (allocations under their entitlement first, then those at or "
            "over it), the allocation with the highest "
            "<b>fairshare factor</b> is served first: 1 = served first (it has used the "
            "least of its share, level by level down the tree), falling towards 0 for the "
            "allocation that used the most. The queue page shows the tiers and the order.</p>"
        )
    parts.append(_window_links(window, now, first if picked else None))
    parts.append(_held_charts(now, series, window))
    data = {
        "ranking": msgspec.to_builtins(ranking) if ranking is not None else None,
        "allocations": msgspec.to_builtins(allocations) if allocations is not None else None,
        "window": window,
    }
    return PageView("fairshare", "Fair share", "\n".join(parts), data, now)


def _held_cells(alloc: m.AllocationRow | None) -> str:
    if alloc is None:
        return "<td></td>" * 3
    cls = "over" if alloc.held_gpus >= alloc.entitlement_gpus > 0 else "under"
    return (
        f'<td class="{cls}" data-held="{alloc.held_gpus}">{alloc.held_gpus}</td>'
        f'<td data-entitlement="{alloc.entitlement_gpus:.3f}">'
        f"{num(alloc.entitlement_gpus, 1)}</td>"
        f"<td>{alloc.pending_workloads} ({alloc.pending_gpus} GPUs)</td>"
    )


def _window_links(window: str, now: float, picked_from: float | None) -> str:
    links = " · ".join(
        f"<strong>{name}</strong>" if name == window else f'<a href="/?window={name}">{name}</a>'
        for name in WINDOWS
    )
    why = (
        f" (picked to hold the whole history: the log starts {format_duration(now - picked_from)}"
        " ago)"
        if picked_from is not None and picked_from <= now
        else ""
    )
    return (
        f"<h2>Held vs entitlement, last {escape(window)}</h2>\n"
        f'<p id="window">window: {links}{why}</p>'
    )


def _held_charts(
    now: float,
    series: tuple[list[float], dict[str, list[float]], dict[str, list[float]]] | None,
    window: str,
) -> str:
    if series is None:
        return '<p class="note">No history yet.</p>'
    xs, held, entitled = series
    if not xs:
        return '<p class="note">No history yet.</p>'
    bucket_s = WINDOWS[window][1]
    # The axis starts where the buckets do: at the log's first record when that is later
    # than the window's start (``LogTimeline.held_series``), so a stack started minutes ago
    # is not drawn in the last pixel of a week.
    shown_s = now - xs[0]
    unit, label = _axis_unit(shown_s)
    # Each bucket's mean is a step from its start to its end (the last ends now): a
    # minute-old stack's one bucket is a visible line, not a lone point.
    x = [(edge - now) / unit for t in xs for edge in (t, min(t + bucket_s, now))]

    def steps(values: list[float]) -> list[float]:
        return [v for v in values for _ in (0, 1)]

    charts = []
    for name in sorted(set(held) | set(entitled)):
        charts.append(
            f'<div data-chart-allocation="{escape(name)}" data-chart-from-s="{shown_s:.0f}">'
            + line_chart(
                x,
                [
                    Series("held GPUs", steps(held.get(name, []))),
                    Series("entitlement", steps(entitled.get(name, [])), dashed=True),
                ],
                title=name,
                x_label=label,
                y_label="GPUs (mean per bucket)",
                width=440,
                height=220,
            )
            + "</div>"
        )
    note = (
        f'<p class="note">Mean GPUs held per {format_duration(bucket_s)} bucket (solid) '
        "against the entitlement then (dashed: effective share × mean healthy GPUs), from "
        "the log.</p>"
    )
    return note + '<div class="grid">' + "\n".join(charts) + "</div>"


def _axis_unit(span_s: float) -> tuple[float, str]:
    """Days for a span over two days, hours over two hours, else minutes."""
    if span_s > 2 * 86400:
        return 86400.0, "days (0 = now)"
    if span_s > 2 * 3600:
        return 3600.0, "hours (0 = now)"
    return 60.0, "minutes (0 = now)"


# ------------------------------------------------------------------------------ queue


def queue_page(now: float, queue: m.QueueSnapshot | None, errors: Sequence[str] = ()) -> PageView:
    """Pending work in the placement leader's order, each position's inputs and reason."""
    parts = [error_banners(errors)]
    if queue is None:
        data: dict[str, Any] = {"order": [], "total": None}
        return PageView("queue", "Queue", "\n".join(parts), data, now)
    parts.append(
        f'<p id="queue-summary">{queue.total} pending; {queue.free_gpus} GPUs free; '
        f"order of the placement leader (epoch {queue.epoch}) at {when(queue.at, now)}"
        + (f"; showing the first {len(queue.rows)}" if len(queue.rows) < queue.total else "")
        + ".</p>"
    )
    parts.append(_priority_now(queue))
    heads = (
        ("position", ""),
        ("workload", "l"),
        ("allocation", "l"),
        ("user", "l"),
        ("GPUs", ""),
        ("tier", "l"),
        ("fairshare factor", ""),
        ("priority", ""),
        ("age", ""),
        ("reason", "l"),
        ("est. start (estimate)", "l"),
    )
    rows = []
    for r in queue.rows:
        reason = r.reason or ""
        rows.append(
            f'<tr data-workload-id="{escape(r.workload_id)}" data-position="{r.position}" '
            f'data-reason="{escape(reason)}">'
            f"<td>{r.position}</td>"
            f'<td class="l">{workload_link(r.workload_id)}</td>'
            f'<td class="l">{escape(r.allocation or "(unallocated)")}</td>'
            f'<td class="l">{escape(r.user)}</td>'
            f"<td>{r.gpus}</td>"
            f'<td class="l">{escape(r.tier)}</td>'
            f"<td>{num(r.fairshare, 3)}</td>"
            f"<td>{r.priority}</td>"
            f"<td>{format_duration(max(0.0, queue.at - r.submitted_at))}</td>"
            f'<td class="l">{reason_cell(reason, r.why, r.reason_numbers)}</td>'
            f'<td class="l est">{estimate(r.est_start, queue.at)}</td>'
            "</tr>"
        )
    parts.append(table(heads, rows, table_id="queue"))
    if not queue.rows:
        parts.append('<p id="queue-empty">Nothing is waiting.</p>')
    parts.append(
        '<p class="note">Reason codes: <code>docs/reasons.md</code>. Estimated starts are '
        "estimates: the deadline or protection end the reason names, or the next moment "
        "anything can change; running work declares no time limit, so most waits have no "
        "bound.</p>"
    )
    data = {
        "order": [r.workload_id for r in queue.rows],
        "total": queue.total,
        "queue": msgspec.to_builtins(queue),
    }
    return PageView("queue", "Queue", "\n".join(parts), data, queue.at)


def _priority_now(queue: m.QueueSnapshot) -> str:
    """What decides a position, said with the numbers of this snapshot: the allocations in
    the order the leader serves them (where each first appears in the queue), each with
    the tier and fairshare factor that put it there."""
    tiers = {"under-entitlement": 0, "over-entitlement": 0, "unallocated": 0}
    served: dict[str | None, m.QueueRow] = {}
    for r in queue.rows:
        tiers[r.tier] += 1
        served.setdefault(r.allocation, r)
    order = ", ".join(
        f'<span data-served-allocation="{escape(r.allocation or UNALLOCATED)}">'
        + (
            f"{escape(r.allocation)} ({escape(r.tier)}, factor {num(r.fairshare, 3)})"
            if r.allocation is not None
            else "unallocated work"
        )
        + "</span>"
        for r in list(served.values())[:9]
    )
    return (
        '<h2>What priority means now</h2><p id="priority-now">'
        "Work is served in <b>position</b> order, 1 = served first. A position is decided "
        "by, in order: the <b>tier</b> (allocations holding less than their entitlement, "
        "then those at or over it, then unallocated work, which only ever runs on idle "
        "GPUs and never preempts); within a tier, the allocation's <b>fairshare factor</b> "
        "(1 = served first: it has used the least of its share over the usage window); "
        "then, inside an allocation, the user's <b>priority</b> (−1000..1000, higher "
        "first) and <b>age</b> (earlier submission first). A user priority never moves "
        "work past another tier or an allocation with a higher factor. Work that does not "
        "fit is passed over, so a position is an order of consideration, not a promise. "
        f"Now: {tiers['under-entitlement']} pending under entitlement, "
        f"{tiers['over-entitlement']} over, {tiers['unallocated']} unallocated"
        + (f'; served in this order: <span id="served-order">{order}</span>' if order else "")
        + ".</p>"
    )


# ------------------------------------------------------------------------------ hosts


@dataclass(frozen=True, slots=True)
class DrainDeadline:
    """When a draining host will be empty at the latest, as far as the log says: the latest
    of its workloads' protection ends (work not yet under notice is noticed then and gets
    the grace period) and notice deadlines. None: nothing runs there."""

    host: str
    deadline: float | None
    workloads: tuple[tuple[str, float, str], ...] = ()
    """(workload, time, "protected until" or "notice deadline") per workload."""


def hosts_page(
    now: float,
    hosts: m.HostsSnapshot | None,
    deadlines: Mapping[str, DrainDeadline],
    *,
    labels: Mapping[str, str] | None = None,
    errors: Sequence[str] = (),
) -> PageView:
    """Host states and free GPUs (placement leader); drains and their deadlines, and what
    each workload is (``labels``: workload -> short text), from the log."""
    labels = labels or {}
    parts = [error_banners(errors)]
    if hosts is None:
        return PageView("hosts", "Hosts", "\n".join(parts), {"hosts": None}, now)
    counts: dict[str, int] = {}
    gpus: dict[str, int] = {}
    for h in hosts.hosts:
        counts[h.state] = counts.get(h.state, 0) + 1
        gpus[h.state] = gpus.get(h.state, 0) + h.gpus
    free = sum(h.free_gpus for h in hosts.hosts if h.state == "healthy")
    summary = ", ".join(f"{n} {s} ({gpus[s]} GPUs)" for s, n in sorted(counts.items()))
    parts.append(
        f'<p id="hosts-summary">{len(hosts.hosts)} hosts: {escape(summary or "none")}; '
        f"{free} GPUs free on healthy hosts; at {when(hosts.at, now)}.</p>"
    )
    draining = [h for h in hosts.hosts if h.state == "draining"]
    if draining:
        parts.append("<h2>Drains</h2>")
        items = []
        for h in draining:
            dl = deadlines.get(h.host)
            if dl is None or dl.deadline is None:
                empty = "empty: drained at the next cycle"
            else:
                empty = f"empty by {when(dl.deadline, now)} at the latest"
            detail = (
                "; ".join(
                    f"{workload_link(w)} {escape(kind)} {when(t, now)}"
                    for w, t, kind in (dl.workloads if dl else ())
                )
                or "no work"
            )
            items.append(
                f'<li data-drain-host="{escape(h.host)}"><b>{escape(h.host)}</b>: {empty} '
                f"({detail})</li>"
            )
        parts.append('<ul id="drains">' + "\n".join(items) + "</ul>")
        parts.append(
            '<p class="note">A draining host takes no new work; work past its protection '
            "gets a notice and the grace period. The deadline is the latest protection end "
            "or notice deadline of its work (add the grace period for work whose protection "
            "ends later).</p>"
        )
    heads = (
        ("host", "l"),
        ("state", "l"),
        ("GPUs", ""),
        ("free", ""),
        ("lane", "l"),
        ("drain deadline", "l"),
        ("workloads", "l"),
    )
    rows = []
    for h in hosts.hosts:
        dl = deadlines.get(h.host) if h.state == "draining" else None
        attrs = f' data-deadline="{dl.deadline:.3f}"' if dl is not None and dl.deadline else ""
        if h.short_lane:
            attrs += ' data-lane="short"'

        rows.append(
            f'<tr data-host="{escape(h.host)}" data-state="{escape(h.state)}"{attrs}>'
            f'<td class="l">{escape(h.host)}</td><td class="l">{escape(h.state)}</td>'
            f"<td>{h.gpus}</td><td>{h.free_gpus}</td>"
            f'<td class="l">{"short" if h.short_lane else ""}</td>'
            f'<td class="l">{when(dl.deadline, now) if dl and dl.deadline else ""}</td>'
            f'<td class="l">{"<br>".join(_labelled(w, labels) for w in h.workloads)}</td>'
            "</tr>"
        )
    parts.append(table(heads, rows, table_id="hosts"))
    data = {
        "hosts": msgspec.to_builtins(hosts),
        "drain_deadlines": {
            k: v.deadline for k, v in deadlines.items() if k in {h.host for h in draining}
        },
    }
    return PageView("hosts", "Hosts", "\n".join(parts), data, hosts.at)


# ------------------------------------------------------------------------------ owed


def owed_page(
    now: float,
    windows: Sequence[tuple[str, m.OwedSnapshot]],
    errors: Sequence[str] = (),
    goodput: Sequence[tuple[str, Mapping[str, Any]]] = (),
    idle: Sequence[Stretch] = (),
) -> PageView:
    """Owed vs delivered GPU-hours per allocation for each (label, snapshot) window:
    ``allot owed``'s numbers, computed from the log as the simulator's report does, with
    the GPU-hours held while flagged idle; the runs flagged idle now (``idle``, the ones the
    viewer may see); then, per (label, ``allot.sim.report.unallocated_goodput``) window,
    what unallocated work got out of its attempts."""
    parts = [error_banners(errors)]
    parts.append(
        '<p class="note">GPU-hours from the log up to now, running work included. Owed, '
        "per hour and allocation: min(effective share × healthy GPU-hours, allocated demand "
        "running or waiting); delivered: min(allocated GPU-hours run, from each placement, "
        "owed). Unallocated time is never delivered. The same computation as the "
        "simulator's report (<code>allot.sim.report</code>). Not the usage accounting has "
        "charged (the fair share page, <code>allot accounting usage</code>): that counts "
        "from each run's reported start in whole slots, running work a slot or so behind."
        "</p>"
    )
    names = sorted({r.allocation for _, snap in windows for r in snap.rows})
    by = [{r.allocation: r for r in snap.rows} for _, snap in windows]
    heads: list[tuple[str, str]] = [("allocation", "l"), ("effective share", "")]
    for label, _ in windows:
        heads += [(f"owed GPU-h ({label})", ""), (f"delivered GPU-h ({label})", "")]
        heads += [(f"delivered/owed ({label})", ""), (f"idle GPU-h ({label})", "")]
    rows = []
    for name in names:
        share = next((b[name].effective_share for b in by if name in b), 0.0)
        cells = [f'<td class="l">{escape(name)}</td><td>{pct(share)}</td>']
        for (label, _), b in zip(windows, by, strict=True):
            r = b.get(name)
            key = escape(label)
            cells.append(
                f'<td data-window="{key}" data-owed="{r.owed_gpu_h if r else 0.0!r}">'
                f"{_gpu_h(r.owed_gpu_h if r else 0.0)}</td>"
                f'<td data-window="{key}" data-delivered="{r.delivered_gpu_h if r else 0.0!r}">'
                f"{_gpu_h(r.delivered_gpu_h if r else 0.0)}</td>"
                f"<td>{_ratio_cell(r.ratio if r else None)}</td>"
                f'<td data-window="{key}" data-idle="{r.idle_gpu_h if r else 0.0!r}">'
                f"{_gpu_h(r.idle_gpu_h if r else 0.0)}</td>"
            )
        rows.append(f'<tr data-allocation="{escape(name)}">' + "".join(cells) + "</tr>")
    overall = ['<td class="l"><b>overall</b></td><td></td>']
    for _, snap in windows:
        owed = sum(r.owed_gpu_h for r in snap.rows)
        delivered = sum(r.delivered_gpu_h for r in snap.rows)
        overall.append(
            f"<td>{_gpu_h(owed)}</td><td>{_gpu_h(delivered)}</td>"
            f"<td>{_ratio_cell(snap.overall)}</td>"
            f"<td>{_gpu_h(sum(r.idle_gpu_h for r in snap.rows))}</td>"
        )
    rows.append('<tr data-overall="1">' + "".join(overall) + "</tr>")
    parts.append(table(tuple(heads), rows, table_id="owed"))
    parts.append(_idle_table(idle, now))
    charts = []
    for label, snap in windows:
        labels: list[str] = []
        values: list[float] = []
        for r in sorted(snap.rows, key=lambda r: r.allocation):
            labels += [f"{r.allocation} owed", f"{r.allocation} delivered"]
            values += [r.owed_gpu_h, r.delivered_gpu_h]
        charts.append(
            f'<div data-chart-window="{escape(label)}">'
            + bar_chart(
                labels,
                values,
                title=f"Owed and delivered GPU-hours, {label} (since {clock(snap.since)})",
                x_label="GPU-hours",
                width=560,
                value_format="{:.3g}",
            )
            + "</div>"
        )
    parts.append('<div class="grid">' + "\n".join(charts) + "</div>")
    if goodput:
        parts.append(_goodput_table(goodput))
    data = {
        "windows": {label: msgspec.to_builtins(snap) for label, snap in windows},
        "unallocated_goodput": {label: dict(g) for label, g in goodput},
        "idle": [
            {
                "workload_id": x.workload_id,
                "allocation": x.allocation,
                "attempt": x.attempt,
                "gpus": x.gpus,
                "idle_since": x.since,
                "flagged_at": x.flagged_at,
                "peak_pct": x.peak_pct,
                "reason": x.reason,
            }
            for x in idle
        ],
    }
    return PageView("owed", "Owed vs delivered", "\n".join(parts), data, now)


def _idle_table(idle: Sequence[Stretch], now: float) -> str:
    """The runs flagged idle now (``allot idle``): allocated GPUs nobody uses."""
    head = "<h2>Idle allocated work</h2>"
    if not idle:
        return head + '<p class="note" id="idle-none">No allocated work is flagged idle.</p>'
    heads = (
        ("workload", "l"),
        ("allocation", "l"),
        ("GPUs", ""),
        ("idle since", "l"),
        ("idle GPU-h so far", ""),
        ("highest %", ""),
        ("reason", "l"),
    )
    rows = [
        f'<tr data-idle-workload="{escape(x.workload_id)}">'
        f'<td class="l">{workload_link(x.workload_id)}</td>'
        f'<td class="l">{escape(x.allocation)}</td><td>{x.gpus}</td>'
        f'<td class="l">{when(x.since, now)}</td>'
        f"<td>{_gpu_h(x.gpu_seconds(x.since, now) / 3600.0)}</td>"
        f"<td>{x.peak_pct:.1f}</td>"
        f'<td class="l">{escape(x.reason)}</td></tr>'
        for x in idle
    ]
    return head + table(heads, rows, table_id="idle")


def _goodput_table(goodput: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Unallocated goodput per window: GPU-hours in attempts longer than the start-up
    allowance, of all unallocated GPU-hours, and how often one workload is preempted."""
    rows = []
    for label, g in goodput:
        mean = g.get("preemptions_per_minute_mean")
        rows.append(
            f'<tr data-goodput-window="{escape(label)}"><td class="l">{escape(label)}</td>'
            f"<td>{_gpu_h(float(g['gpu_h']))}</td><td>{_gpu_h(float(g['goodput_gpu_h']))}</td>"
            f"<td>{_ratio_cell(g.get('goodput_fraction'))}</td>"
            f"<td>{g['attempts']}</td><td>{g['short_attempts']}</td>"
            f"<td>{'-' if mean is None else f'{mean:.3f}'}</td></tr>"
        )
    allowance = int(goodput[0][1]["startup_allowance_s"])
    heads = (
        ("window", "l"),
        ("unallocated GPU-h", ""),
        (f"in attempts > {allowance} s", ""),
        ("goodput", ""),
        ("attempts", ""),
        (f"attempts <= {allowance} s", ""),
        ("notices / workload-minute", ""),
    )
    note = (
        '<h2>Unallocated goodput</h2><p class="note">Unallocated work is preempted at any '
        f"moment; an attempt shorter than {allowance} s is taken as start-up only (no useful "
        "work). The same computation as the simulator's report.</p>"
    )
    return note + table(heads, rows, table_id="unallocated-goodput")


# ------------------------------------------------------------------------------ helpers


def _labelled(workload_id: str, labels: Mapping[str, str]) -> str:
    label = labels.get(workload_id)
    return workload_link(workload_id) + (f" ({escape(label)})" if label else "")


def _gpu_h(value: float) -> str:
    """GPU-hours as every usage column shows them; thousands grouped past 100."""
    return gpu_h_cell(value) if abs(value) < 100 else f"{value:,.0f}"


def _ratio_cell(value: float | None) -> str:
    if value is None:
        return "-"
    cls = "over" if value < 0.95 else "under"
    return f'<span class="{cls}">{100 * value:.1f}%</span>'


def _level_fs(value: float | str | None) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else f"{value:.3f}"
