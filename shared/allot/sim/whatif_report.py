"""What a proposed budget tree would have changed: two replays of one history, side by side
(``allot whatif``).

Input: per side (``SIDES``: the current tree, the proposed one) the report
(``allot.sim.report.build_report``) of its replay cut to the window
(``allot.sim.record_window``) and that cut record.

* ``whatif_figures(reports, records)``: the figures ``allot whatif`` prints and writes
  (report.json), per side: ``by_allocation[a]``: ``owed_gpu_h``, ``delivered_gpu_h`` and
  ``ratio`` (the report's owed vs delivered), ``wait_p50_s`` and ``wait_p90_s`` (the
  report's waits of the allocation's jobs: unallocated jobs that name an allocation count
  under it, the others under ``(none)``), ``preemptions`` (notices to its jobs);
  ``waits_by_kind[k]``: ``n``, ``p50_s``, ``p90_s``; ``summary``: what
  ``allot simulate --compare`` shows (``allot.sim.compare.summary``).
* ``whatif_text(figures)``: one row per allocation, each cell ``current -> proposed``, then
  the waits by kind.
* ``whatif_html(figures, reports, title, note)``: ``compare.html``'s page (each side's
  column linking ``<side>/report.html``) with the two tables ahead of it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from html import escape
from typing import Any

from allot.core.duration_text import format_duration
from allot.render.live_format import Column, gpu_h_cell, render_table
from allot.sim.compare import render_compare_html, summary
from allot.sim.record import SimRecord
from allot.sim.report import UNALLOCATED_KEY

SIDES = ("current", "proposed")

Json = dict[str, Any]


def whatif_figures(reports: Mapping[str, Json], records: Mapping[str, SimRecord]) -> Json:
    """See the module docstring; ``reports`` and ``records`` are keyed by ``SIDES``."""
    by_allocation: dict[str, Json] = {}
    by_kind: dict[str, Json] = {}
    for side in SIDES:
        report, record = reports[side], records[side]
        owed = report["owed_delivered"]["by_allocation"]
        waits = report["wait_s"]["by_allocation"]
        allocation_of = {j.workload_id: j.allocation or UNALLOCATED_KEY for j in record.jobs}
        noticed = Counter(
            allocation_of.get(p.workload_id, UNALLOCATED_KEY) for p in record.preemptions
        )
        for name in sorted(set(owed) | set(waits) | set(noticed)):
            row = owed.get(name) or {}
            wait = waits.get(name) or {}
            by_allocation.setdefault(name, {})[side] = {
                "owed_gpu_h": row.get("owed_gpu_h"),
                "delivered_gpu_h": row.get("delivered_gpu_h"),
                "ratio": row.get("ratio"),
                "wait_p50_s": wait.get("p50"),
                "wait_p90_s": wait.get("p90"),
                "preemptions": noticed.get(name, 0),
            }
        for kind, stats in report["wait_s"]["by_kind"].items():
            by_kind.setdefault(kind, {})[side] = {
                "n": stats["n"],
                "p50_s": stats["p50"],
                "p90_s": stats["p90"],
            }
    return {
        "by_allocation": dict(sorted(by_allocation.items())),
        "waits_by_kind": dict(sorted(by_kind.items())),
        "summary": {side: summary(reports[side]) for side in SIDES},
    }


def _pair(row: Mapping[str, Any], show: Callable[[Mapping[str, Any]], str]) -> str:
    """``current -> proposed`` of one figure (``-`` for a side that lacks the row)."""
    return " -> ".join(show(row[side]) if side in row else "-" for side in SIDES)


def _gpu_h(key: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda side: gpu_h_cell(side.get(key))


def _waits(p50: str, p90: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda side: f"{format_duration(side.get(p50))}/{format_duration(side.get(p90))}"


def _count(side: Mapping[str, Any]) -> str:
    return str(side.get("preemptions", 0))


ALLOCATION_COLUMNS = (
    Column("ALLOCATION"),
    Column("OWED GPU-h", ">"),
    Column("DELIVERED GPU-h", ">"),
    Column("WAIT p50/p90", ">"),
    Column("PREEMPTIONS", ">"),
)
KIND_COLUMNS = (Column("KIND"), Column("JOBS", ">"), Column("WAIT p50/p90", ">"))


def _allocation_rows(figures: Json) -> list[tuple[str, ...]]:
    return [
        (
            name,
            _pair(row, _gpu_h("owed_gpu_h")),
            _pair(row, _gpu_h("delivered_gpu_h")),
            _pair(row, _waits("wait_p50_s", "wait_p90_s")),
            _pair(row, _count),
        )
        for name, row in figures["by_allocation"].items()
    ]


def _kind_rows(figures: Json) -> list[tuple[str, ...]]:
    return [
        (kind, _pair(row, lambda side: str(side.get("n", 0))), _pair(row, _waits("p50_s", "p90_s")))
        for kind, row in figures["waits_by_kind"].items()
    ]


def whatif_text(figures: Json) -> str:
    """The printed comparison: each cell is ``current -> proposed``."""
    return "\n".join(
        [
            f"per allocation ({' -> '.join(SIDES)}):",
            render_table(ALLOCATION_COLUMNS, _allocation_rows(figures)),
            "",
            f"waits by kind ({' -> '.join(SIDES)}):",
            render_table(KIND_COLUMNS, _kind_rows(figures)),
        ]
    )


def whatif_html(figures: Json, reports: Mapping[str, Json], title: str, note: str) -> str:
    """The page: the two tables, then ``allot simulate --compare``'s figures."""
    tables = [
        ("Per allocation (current -> proposed)", ALLOCATION_COLUMNS, _allocation_rows(figures)),
        ("Waits by kind (current -> proposed)", KIND_COLUMNS, _kind_rows(figures)),
    ]
    parts = []
    for heading, columns, rows in tables:
        head = "".join(f"<th>{escape(c.title)}</th>" for c in columns)
        body = "\n".join(
            "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
        )
        parts.append(
            f"<h2>{escape(heading)}</h2>\n<table>\n<thead><tr>{head}</tr></thead>\n"
            f"<tbody>\n{body}\n</tbody>\n</table>\n"
        )
    parts.append("<h2>Every figure</h2>\n")
    return render_compare_html(
        {side: reports[side] for side in SIDES}, title=title, note=note, before="".join(parts)
    )
