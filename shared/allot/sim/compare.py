"""The figures that compare policies: one summary per report (``compare.json``), the
side-by-side table ``allot simulate`` prints, and ``compare.html`` (the same table, one
column per policy, linking each policy's own report page)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from allot.core.duration_text import format_duration


def summary(report: Mapping[str, Any]) -> dict[str, Any]:
    od = report["owed_delivered"]
    waits = report["wait_s"]
    return {
        "workloads": report["workloads"],
        "completed": report["completed"],
        "preemptions": report["preemptions"],
        "requeues": report["requeues"],
        "preemptions_per_1000_gpu_h": (report.get("preemption_rate") or {}).get("per_1000_gpu_h"),
        "unallocated_goodput": (report.get("unallocated_goodput") or {}).get("goodput_fraction"),
        "reserved_workloads": (report.get("reservations") or {}).get("workloads"),
        "reservation_idle_gpu_h": (report.get("reservations") or {}).get("idle_gpu_h"),
        "occupancy": report["occupancy"],
        "occupancy_observed": report.get("occupancy_observed"),
        "unallocated_fraction": report["unallocated_fraction"],
        "unallocated_fraction_observed": report.get("unallocated_fraction_observed"),
        "owed_delivered": od["overall"],
        "teams_at_or_above_095": od.get("teams_at_or_above_095"),
        "teams": od.get("teams"),
        "submissions_s": report.get("submissions_s"),
        "drain_s": report.get("drain_s"),
        "wait_p50_allocated_s": (waits.get("allocated") or {}).get("p50"),
        "wait_p90_allocated_s": (waits.get("allocated") or {}).get("p90"),
        "wait_p50_unallocated_s": (waits.get("unallocated") or {}).get("p50"),
        "wait_p90_unallocated_s": (waits.get("unallocated") or {}).get("p90"),
        "wait_p50_s": waits["all"]["p50"],
        "wait_p90_s": waits["all"]["p90"],
        "wait_p99_s": waits["all"]["p99"],
        "wait_mean_s": waits["all"]["mean"],
        "jct_mean_s": (report.get("jct_s") or {}).get("mean"),
        "never_started": waits["all"].get("never_started"),
        "debug_wait_p90_s": (waits["by_kind"].get("debug") or {}).get("p90"),
        "wait_p90_64plus_s": (waits["by_size"].get("64+") or {}).get("p90"),
        "by_allocation": {name: row["ratio"] for name, row in sorted(od["by_allocation"].items())},
        "wait_by_allocation": {
            name: {q: row[q] for q in ("mean", "p90", "p99")}
            for name, row in sorted(waits.get("by_allocation", {}).items())
        },
    }


def cell(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "ratio":
        return f"{value:.3f}"
    if kind == "num":
        return f"{value:.1f}"
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "dur":
        return format_duration(float(value))
    return f"{value:,}" if isinstance(value, int) else str(value)


ROWS: Sequence[tuple[str, str, str]] = (
    ("workloads", "workloads", "int"),
    ("completed", "completed", "int"),
    ("preemptions", "preemptions", "int"),
    ("requeues", "requeues", "int"),
    ("preemptions / 1,000 GPU-h", "preemptions_per_1000_gpu_h", "num"),
    ("unallocated goodput", "unallocated_goodput", "pct"),
    ("reserved workloads", "reserved_workloads", "int"),
    ("reservation idle GPU-h", "reservation_idle_gpu_h", "num"),
    ("occupancy (span)", "occupancy", "pct"),
    ("occupancy (observed)", "occupancy_observed", "pct"),
    ("unallocated (span)", "unallocated_fraction", "pct"),
    ("unallocated (observed)", "unallocated_fraction_observed", "pct"),
    ("owed->delivered", "owed_delivered", "ratio"),
    ("teams >= 0.95", "teams_ok", "str"),
    ("submissions span", "submissions_s", "dur"),
    ("drain after them", "drain_s", "dur"),
    ("allocated wait p50", "wait_p50_allocated_s", "dur"),
    ("allocated wait p90", "wait_p90_allocated_s", "dur"),
    ("unallocated wait p50", "wait_p50_unallocated_s", "dur"),
    ("unallocated wait p90", "wait_p90_unallocated_s", "dur"),
    ("wait p50 (all)", "wait_p50_s", "dur"),
    ("wait p90 (all)", "wait_p90_s", "dur"),
    ("wait p99 (all)", "wait_p99_s", "dur"),
    ("wait mean (all)", "wait_mean_s", "dur"),
    ("JCT mean", "jct_mean_s", "dur"),
    ("never started", "never_started", "int"),
    ("debug wait p90", "debug_wait_p90_s", "dur"),
    ("64+ GPU wait p90", "wait_p90_64plus_s", "dur"),
)


def render_summary(reports: Mapping[str, Mapping[str, Any]]) -> str:
    """The side-by-side table printed after a run (one column per policy), then the
    owed-vs-delivered ratio per allocation."""
    summaries = {name: summary(r) for name, r in reports.items()}
    for s in summaries.values():
        s["teams_ok"] = f"{s['teams_at_or_above_095']}/{s['teams']}"
    names = list(summaries)
    width = max(12, *(len(n) + 2 for n in names))
    lines = [f"{'':<22}" + "".join(f"{n:>{width}}" for n in names)]
    for label, key, kind in ROWS:
        cells = "".join(f"{cell(summaries[n].get(key), kind):>{width}}" for n in names)
        lines.append(f"{label:<22}{cells}")
    allocations = sorted({a for s in summaries.values() for a in s["by_allocation"]})
    if allocations:
        lines.append("")
        lines.append(f"{'owed->delivered by allocation':<22}")
        for alloc in allocations:
            cells = "".join(
                f"{cell(summaries[n]['by_allocation'].get(alloc), 'ratio'):>{width}}" for n in names
            )
            lines.append(f"  {alloc:<20}{cells}")
    waited = sorted({a for s in summaries.values() for a in s["wait_by_allocation"]})
    if waited:
        # Wider columns than the table's (three figures each): their own heading.
        wide = max(width, 24)
        lines.append("")
        lines.append(f"{'wait by allocation':<22}" + "".join(f"{n:>{wide}}" for n in names))
        lines.append(f"{'':<22}" + "".join(f"{'mean / p90 / p99':>{wide}}" for _ in names))
        for alloc in waited:
            cells = ""
            for n in names:
                row = summaries[n]["wait_by_allocation"].get(alloc) or {}
                text = " / ".join(cell(row.get(q), "dur") for q in ("mean", "p90", "p99"))
                cells += f"{text:>{wide}}"
            lines.append(f"  {alloc:<20}{cells}")
    return "\n".join(lines)


def render_compare_html(
    reports: Mapping[str, Mapping[str, Any]],
    *,
    title: str | None = None,
    note: str | None = None,
    before: str = "",
) -> str:
    """``compare.html``: the printed table as a page, each policy's column headed by a link
    to its ``<name>/report.html``. Deterministic (no timestamp), self-contained.
    ``title`` and ``note`` (plain text) replace the policies' heading and note; ``before``
    (HTML) comes ahead of the table (``allot whatif`` puts its per-allocation tables there)."""
    summaries = {name: summary(r) for name, r in reports.items()}
    names = list(summaries)
    made = next((r.get("scenario") for r in reports.values() if r.get("scenario")), None)
    origin = (
        f"scenario {escape(str(made.get('name', '?')))} seed {escape(str(made.get('seed', '?')))}"
        if isinstance(made, Mapping)
        else "a trace"
    )
    heading = escape(title) if title is not None else f"{escape(' vs '.join(names))}, side by side"
    tab = escape(title) if title is not None else f"{escape(', '.join(names))} side by side"
    intro = (
        escape(note)
        if note is not None
        else f"The same trace ({origin}) under each policy. Allocated and "
        "unallocated waits are apart: unallocated work waits by design, for free GPUs. The "
        "span is the submissions and the drain after the last of them."
    )
    head = "".join(f'<th><a href="{escape(n)}/report.html">{escape(n)}</a></th>' for n in names)
    rows = []
    for label, key, kind in ROWS:
        if key == "teams_ok":
            cells = [
                f"{s.get('teams_at_or_above_095')}/{s.get('teams')}" for s in summaries.values()
            ]
        else:
            cells = [cell(s.get(key), kind) for s in summaries.values()]
        rows.append(
            f"<tr><td>{escape(label)}</td>"
            + "".join(f"<td>{escape(c)}</td>" for c in cells)
            + "</tr>"
        )
    allocations = sorted({a for s in summaries.values() for a in s["by_allocation"]})
    for alloc in allocations:
        cells = [cell(s["by_allocation"].get(alloc), "ratio") for s in summaries.values()]
        rows.append(
            f"<tr><td>owed-&gt;delivered: {escape(alloc)}</td>"
            + "".join(f"<td>{escape(c)}</td>" for c in cells)
            + "</tr>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>Allot simulation: {tab}</title>\n"
        f"<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{heading}</h1>\n"
        f'<p class="note">{intro}</p>\n{before}'
        f"<table>\n<thead><tr><th>figure</th>{head}</tr></thead>\n<tbody>\n"
        + "\n".join(rows)
        + "\n</tbody>\n</table>\n</body>\n</html>\n"
    )


_CSS = (
    "body { font-family: sans-serif; margin: 24px; color: #222; } "
    "table { border-collapse: collapse; font-size: 13px; } "
    "th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; } "
    "th:first-child, td:first-child { text-align: left; } "
    "thead th { background: #f3f3f3; } .note { color: #555; font-size: 13px; max-width: 900px; }"
)
