"""Render report.json as one self-contained HTML page.

Input: the dict from ``allot.sim.report.build_report`` (or report.json loaded back).
Output: an HTML5 document with inline CSS and inline SVG charts from
``allot.render.svgcharts``; no scripts, no fonts, no links, no request to anywhere. The page
has no timestamp and walks dicts in sorted (or fixed) order, never in input order, so the
same report gives the same bytes, whether built in memory or loaded back from JSON.

Sections: summary table; owed vs delivered (overall, per allocation and per program
tables, then one small chart per allocation with cumulative owed and delivered GPU-hours
over the observed period); occupancy and unallocated share over time (averaged over
groups of buckets when there are more than 720); preemptions over time (bars per bucket,
or per day when there are more than 168 buckets); work lost to preemption (when the report
models checkpointing: the settings per kind, GPU-hours lost overall, per allocation and
per kind); queue wait (table by kind and by size,
CDF per kind on a log time axis); the Fair Tree fairshare factor per allocation at the end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

from allot.core.duration_text import format_duration
from allot.render.svgcharts import Series, bar_chart, cdf_chart, column_chart, line_chart

_SIZE_ORDER = ("1", "2-8", "9-63", "64+")  # report.json sorts keys; the table should not

_CSS = """
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1320px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f3f3f3; }
.grid { display: flex; flex-wrap: wrap; gap: 8px; }
.note { color: #555; font-size: 13px; max-width: 900px; }
.low { color: #b00; font-weight: bold; }
"""


def render_html(report: Mapping[str, object]) -> str:
    """The whole page for ``report`` (see the module docstring)."""
    policy = str(report.get("policy", ""))
    title = f"Allot simulation report: {policy} ({_origin(report)})"
    body = [
        f"<h1>{escape(title)}</h1>",
        _summary(report),
        _owed_delivered(report),
        _occupancy(report),
        _preemptions(report),
        _lost(report),
        _waits(report),
        _fairshare(report),
    ]
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(part for part in body if part)
        + "\n</body>\n</html>\n"
    )


# --- sections -------------------------------------------------------------------------


def _origin(report: Mapping[str, object]) -> str:
    """``scenario ai2 seed 1, simulation seed 0``: where the trace came from, when known."""
    scenario = _d(report.get("scenario"))
    made = ""
    if scenario:
        made = f"scenario {scenario.get('name', '?')} seed {scenario.get('seed', '?')}, "
    return f"{made}simulation seed {report.get('seed', '')}"


def _wait_cell(stats: object) -> str:
    """``p50 / p90 (n)`` of a wait stats block."""
    st = _d(stats)
    if not st.get("n"):
        return "-"
    p50, p90 = (format_duration(_f(st.get(q))) for q in ("p50", "p90"))
    return f"{p50} / {p90} ({_int(st.get('n'))})"


def _summary(report: Mapping[str, object]) -> str:
    od = _d(report.get("owed_delivered"))
    waits = _d(report.get("wait_s"))
    rows = [
        ("policy", escape(str(report.get("policy", "")))),
        ("made from", escape(_origin(report))),
        ("wait of allocated work, p50 / p90 (jobs)", _wait_cell(waits.get("allocated"))),
        ("wait of unallocated work, p50 / p90 (jobs)", _wait_cell(waits.get("unallocated"))),
        (
            "span = submissions + drain",
            " + ".join(format_duration(_f(report.get(k))) for k in ("submissions_s", "drain_s"))
            + f" = {format_duration(_f(report.get('span_s')))}",
        ),
        ("workloads", _int(report.get("workloads"))),
        ("completed", _int(report.get("completed"))),
        ("preemptions", _int(report.get("preemptions"))),
        ("requeues", _int(report.get("requeues"))),
        *_lost_summary(report),
        ("occupancy (span)", _pct(_f(report.get("occupancy")))),
        ("occupancy (observed period)", _pct(_f(report.get("occupancy_observed")))),
        ("unallocated share of delivered GPU time", _pct(_f(report.get("unallocated_fraction")))),
        ("owed GPU-hours delivered (overall)", _pct(_f(od.get("overall")))),
        (
            "allocations at or above 95% of owed",
            f"{_int(od.get('teams_at_or_above_095'))} of {_int(od.get('teams'))}",
        ),
    ]
    return "<h2>Summary</h2>\n" + _table(("figure", "value"), rows)


def _owed_delivered(report: Mapping[str, object]) -> str:
    od = _d(report.get("owed_delivered"))
    fairshare = _d(report.get("final_fairshare"))
    parts = [
        "<h2>Owed vs delivered</h2>",
        '<p class="note">Owed, per hour and allocation: min(effective share x healthy '
        "GPU-hours, allocated demand running or waiting); delivered: min(allocated GPU-hours "
        "run, owed); summed over the observed period (first to last submission). Unallocated "
        "time is never delivered.</p>",
    ]
    alloc_rows = []
    for name, entry in sorted(_d(od.get("by_allocation")).items()):
        e = _d(entry)
        alloc_rows.append(
            (
                escape(name),
                _num(_f(e.get("owed_gpu_h")), 1),
                _num(_f(e.get("delivered_gpu_h")), 1),
                _ratio_cell(_f(e.get("ratio"))),
                _num(_f(fairshare.get(name)), 3),
            )
        )
    parts.append(
        _table(("allocation", "owed GPU-h", "delivered GPU-h", "ratio", "fairshare"), alloc_rows)
    )
    program_rows = [
        (
            escape(name),
            _num(_f(_d(entry).get("owed_gpu_h")), 1),
            _num(_f(_d(entry).get("delivered_gpu_h")), 1),
            _ratio_cell(_f(_d(entry).get("ratio"))),
        )
        for name, entry in sorted(_d(od.get("by_program")).items())
    ]
    parts.append(_table(("program", "owed GPU-h", "delivered GPU-h", "ratio"), program_rows))

    ts = _d(report.get("timeseries"))
    owed = _d(ts.get("owed_gpu_h"))
    delivered = _d(ts.get("delivered_gpu_h"))
    scale, unit = _time_unit(ts)
    charts = []
    for name in sorted(owed):
        o = _cumulative(_floats(owed[name]))
        dl = _cumulative(_floats(delivered.get(name)))
        xs = [i * scale for i in range(len(o))]  # o[0] = 0.0 at the start
        charts.append(
            line_chart(
                xs,
                [Series("owed", o, color="#999999", dashed=True), Series("delivered", dl)],
                title=name,
                x_label=unit,
                y_label="GPU-h (cumulative)",
                width=320,
                height=180,
                max_points=300,
                x_min=0.0,
            )
        )
    if charts:
        parts.append('<div class="grid">\n' + "\n".join(charts) + "\n</div>")
    return "\n".join(parts)


def _occupancy(report: Mapping[str, object]) -> str:
    ts = _d(report.get("timeseries"))
    cap = _floats(ts.get("capacity_gpu_h"))
    busy = _floats(ts.get("busy_gpu_h"))
    share = _floats(ts.get("unallocated_share"))
    unalloc = [(s or 0.0) * (b or 0.0) for s, b in zip(share, busy, strict=False)]
    group = max(1, math.ceil(len(cap) / 720))
    occ: list[float | None] = []
    uns: list[float | None] = []
    for k in range(0, len(cap), group):
        c = sum(x or 0.0 for x in cap[k : k + group])
        b = sum(x or 0.0 for x in busy[k : k + group])
        u = sum(unalloc[k : k + group])
        occ.append(b / c if c > 0 else None)
        uns.append(u / b if b > 0 else None)
    scale, unit = _time_unit(ts)
    observed = _f(ts.get("observed_buckets")) or 0.0
    xs = [min(k + group, len(cap)) * scale for k in range(0, len(cap), group)]
    note = f" (averaged over {group} buckets)" if group > 1 else ""
    chart = line_chart(
        xs,
        [Series("occupancy", occ), Series("unallocated share", uns)],
        title=f"Occupancy and unallocated share{note}",
        x_label=unit,
        y_max=1.0,
        width=900,
        x_min=0.0,
        marker=(observed * scale, "last submission") if 0 < observed < len(cap) else None,
    )
    return "<h2>Occupancy</h2>\n" + chart


def _preemptions(report: Mapping[str, object]) -> str:
    ts = _d(report.get("timeseries"))
    counts = [x or 0.0 for x in _floats(ts.get("preemptions"))]
    bucket_s = _f(ts.get("bucket_s")) or 3600.0
    group = 1
    if len(counts) > 168:
        group = max(1, round(86400 / bucket_s))
    group = max(group, math.ceil(len(counts) / 400))
    bars = [sum(counts[k : k + group]) for k in range(0, len(counts), group)]
    scale, unit = _time_unit(ts)
    per = "day" if group * bucket_s == 86400 else f"{format_duration(group * bucket_s)}"
    chart = column_chart(
        bars,
        title=f"Preemption notices per {per}",
        x_step=group * scale,
        x_label=unit,
        y_label="notices",
        width=900,
    )
    return "<h2>Preemptions</h2>\n" + chart


def _lost_summary(report: Mapping[str, object]) -> list[tuple[str, str]]:
    lost = _d(report.get("lost_to_preemption"))
    if not lost:
        return []
    share = _f(lost.get("of_busy"))
    of_busy = "" if share is None else f" ({_pct(share)} of GPU-hours run)"
    return [("GPU-hours lost to preemption", _num(_f(lost.get("gpu_h")), 1) + of_busy)]


def _lost(report: Mapping[str, object]) -> str:
    lost = _d(report.get("lost_to_preemption"))
    if not lost:
        return ""
    settings = _d(report.get("checkpointing"))
    setting_rows = []
    for kind in sorted(settings, key=lambda k: (k != "*", k)):
        cp = _d(settings[kind])
        every = _f(cp.get("every_s"))
        setting_rows.append(
            (
                escape("every other kind" if kind == "*" else kind),
                "-" if every is None else format_duration(every),
                "yes" if cp.get("on_notice") else "no",
                format_duration(_f(cp.get("save_s"))),
                format_duration(_f(cp.get("restore_s"))),
            )
        )
    alloc_rows = [
        (escape(name), _num(_f(_d(e).get("gpu_h")), 1), _pct(_f(_d(e).get("of_run"))))
        for name, e in sorted(_d(lost.get("by_allocation")).items())
    ]
    kind_rows = [
        (escape(kind), _num(_f(v), 1)) for kind, v in sorted(_d(lost.get("by_kind")).items())
    ]
    figures = [
        ("GPU-hours lost", _num(_f(lost.get("gpu_h")), 1)),
        ("of which allocated work", _num(_f(lost.get("allocated_gpu_h")), 1)),
        ("of which unallocated work", _num(_f(lost.get("unallocated_gpu_h")), 1)),
        ("of which restoring", _num(_f(lost.get("restore_gpu_h")), 1)),
        ("share of GPU-hours run", _pct(_f(lost.get("of_busy")))),
        ("preempted attempts", _int(lost.get("preempted_attempts"))),
        ("saved on notice", _int(lost.get("saved_on_notice"))),
        ("notice too short to save", _int(lost.get("notice_too_short"))),
        ("GPU-hours in periodic saves (not lost)", _num(_f(lost.get("periodic_save_gpu_h")), 1)),
    ]
    return "\n".join(
        [
            "<h2>Work lost to preemption</h2>",
            '<p class="note">Lost: a preempted attempt\'s work since its last checkpoint, its '
            "save on notice and its restore; a non-resumable workload's whole attempt. "
            "Checkpointing per kind:</p>",
            _table(("kind", "save every", "save on notice", "save", "restore"), setting_rows),
            _table(("figure", "value"), figures),
            _table(("allocation", "lost GPU-h", "of its GPU-hours run"), alloc_rows),
            _table(("kind", "lost GPU-h"), kind_rows),
        ]
    )


def _waits(report: Mapping[str, object]) -> str:
    w = _d(report.get("wait_s"))
    heads = ("jobs", "n", "never started", "mean", "p50", "p90", "p99")
    rows = [_wait_row("all", _d(w.get("all")))]
    rows += [_wait_row(f"kind {k}", _d(v)) for k, v in sorted(_d(w.get("by_kind")).items())]
    by_size = _d(w.get("by_size"))
    sizes = sorted(by_size, key=lambda k: (_SIZE_ORDER.index(k) if k in _SIZE_ORDER else 99, k))
    rows += [_wait_row(f"{k} GPUs", _d(by_size[k])) for k in sizes]
    cdf = {k: _floats(v) for k, v in sorted(_d(w.get("cdf_by_kind")).items())}
    parts = [
        "<h2>Queue wait</h2>",
        '<p class="note">Wait = first start - submit; jobs that never started count until '
        "the end of the run. Percentiles are nearest-rank.</p>",
        _table(heads, rows),
    ]
    if cdf:
        parts.append(cdf_chart(cdf, title="Wait-time CDF per kind", x_label="wait", width=900))
    return "\n".join(parts)


def _wait_row(label: str, stats: Mapping[str, object]) -> tuple[str, ...]:
    return (
        escape(label),
        _int(stats.get("n")),
        _int(stats.get("never_started")),
        format_duration(_f(stats.get("mean"))),
        format_duration(_f(stats.get("p50"))),
        format_duration(_f(stats.get("p90"))),
        format_duration(_f(stats.get("p99"))),
    )


def _fairshare(report: Mapping[str, object]) -> str:
    fs = sorted(_d(report.get("final_fairshare")).items())
    if not fs:
        return "<h2>Fairshare at the end</h2>\n<p>No fairshare factors recorded.</p>"
    labels = [name for name, _ in fs]
    values = [_f(v) or 0.0 for _, v in fs]
    chart = bar_chart(
        labels, values, title="Fair Tree fairshare factor per allocation (end of run)", width=900
    )
    return "<h2>Fairshare at the end</h2>\n" + chart


# --- helpers --------------------------------------------------------------------------


def _table(heads: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``heads`` are escaped here; cells arrive already escaped or formatted."""
    head = "".join(f"<th>{escape(h)}</th>" for h in heads)
    body = "\n".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def _time_unit(ts: Mapping[str, object]) -> tuple[float, str]:
    """Scale from bucket index to the x axis, and its label: days when the span is over
    two days, else hours."""
    bucket_s = _f(ts.get("bucket_s")) or 3600.0
    buckets = _f(ts.get("buckets")) or 0.0
    if buckets * bucket_s > 2 * 86400:
        return bucket_s / 86400, "days since first submission"
    return bucket_s / 3600, "hours since first submission"


def _cumulative(values: Sequence[float | None]) -> list[float | None]:
    """Running sums, starting with 0.0 before the first value."""
    out: list[float | None] = [0.0]
    acc = 0.0
    for v in values:
        acc += v or 0.0
        out.append(acc)
    return out


def _d(value: object) -> dict[str, object]:
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else {}


def _f(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _floats(value: object) -> list[float | None]:
    return [_f(v) for v in value] if isinstance(value, list | tuple) else []


def _int(value: object) -> str:
    v = _f(value)
    return "-" if v is None else f"{v:,.0f}"


def _num(value: float | None, decimals: int) -> str:
    return "-" if value is None else f"{value:,.{decimals}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ratio_cell(value: float | None) -> str:
    if value is None:
        return "-"
    cls = ' class="low"' if value < 0.95 else ""
    return f"<span{cls}>{100 * value:.1f}%</span>"
