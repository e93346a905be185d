"""render_html and the SVG primitives: one self-contained, deterministic page with every
chart, no outside references, and escaped names."""

from __future__ import annotations

import json
import re

import pytest

from allot.render.svgcharts import Series, bar_chart, cdf_chart, column_chart, line_chart
from allot.sim.html import render_html as render
from allot.sim.record import CapacityChange, JobOutcome, Preemption, Segment, SimRecord, Waiting
from allot.sim.report import build_report

H = 3600.0


def sample_report(
    allocations: tuple[str, ...] = ("nlp", "vision", "robotics"),
) -> dict[str, object]:
    rec = SimRecord(
        policy="fairshare", seed=3, first_submit=0.0, last_submit=30 * H, end_time=40 * H
    )
    rec.capacity = [CapacityChange(0.0, 16), CapacityChange(10 * H, 8), CapacityChange(12 * H, 16)]
    rec.effective_shares = {a: 1 / len(allocations) for a in allocations}
    rec.programs = dict.fromkeys(allocations, "lab")
    rec.final_fairshare = {a: (i + 1) / len(allocations) for i, a in enumerate(allocations)}
    for i, a in enumerate(allocations):
        rec.segments.append(Segment(f"{a}-run", a, True, 4, i * H, 35 * H))
        rec.segments.append(Segment(f"{a}-free", a, False, 2, 5 * H, 20 * H))
        rec.waits.append(Waiting(f"{a}-wait", a, True, 4, 0.0, 6 * H))
        rec.preemptions.append(Preemption((i + 2) * H, f"{a}-free", a, 2, "fairshare", True))
        for k, kind in enumerate(("debug", "training", "interactive")):
            rec.jobs.append(
                JobOutcome(
                    f"{a}-{kind}",
                    a,
                    kind,
                    2**k,
                    float(k),
                    float(k) + 30 * (i + k + 1),
                    None,
                    "completed",
                )
            )
    return build_report(rec)


def test_page_has_every_chart_as_inline_svg() -> None:
    page = render(sample_report())
    assert page.startswith("<!DOCTYPE html>")
    # 3 small multiples + occupancy + preemptions + wait CDF + fairshare
    assert page.count("<svg") == 3 + 4
    for heading in (
        "Summary",
        "Owed vs delivered",
        "Occupancy",
        "Preemptions",
        "Queue wait",
        "Fairshare",
    ):
        assert f"<h2>{heading}" in page
    assert "<polyline" in page
    assert "<rect" in page


def test_page_makes_no_outside_request() -> None:
    page = render(sample_report())
    assert "http" not in page
    assert not re.search(r"""(src|href)\s*=""", page)
    assert "<script" not in page
    assert "@import" not in page
    assert "url(" not in page


def test_page_is_deterministic_and_survives_a_json_round_trip() -> None:
    report = sample_report()
    again = json.loads(json.dumps(report, sort_keys=True, indent=2))
    assert render(report) == render(sample_report()) == render(again)


def test_names_are_escaped() -> None:
    page = render(sample_report(("<b>bold</b>", "a&b")))
    assert "<b>bold</b>" not in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    assert "a&amp;b" in page


def test_summary_shows_the_headline_numbers() -> None:
    report = sample_report()
    page = render(report)
    od = report["owed_delivered"]
    assert isinstance(od, dict)
    assert f"{100 * od['overall']:.1f}%" in page
    assert f"{od['teams_at_or_above_095']} of {od['teams']}" in page


def test_an_empty_report_renders() -> None:
    rec = SimRecord(policy="fifo", seed=0, first_submit=0.0, last_submit=0.0, end_time=0.0)
    page = render(build_report(rec))
    assert "No fairshare factors recorded" in page
    assert page.endswith("</html>\n")


# --- the primitives -------------------------------------------------------------------


def test_line_chart_breaks_lines_at_none() -> None:
    svg = line_chart([0, 1, 2, 3, 4], [Series("s", [1.0, 2.0, None, 3.0, 4.0])], title="t")
    assert svg.count("<polyline") == 2
    assert svg.startswith("<svg") and svg.endswith("</svg>")


def test_line_chart_thins_long_series_but_keeps_the_last_point() -> None:
    xs = [float(i) for i in range(1000)]
    svg = line_chart(xs, [Series("s", xs)], title="t", max_points=100)
    points = re.search(r'points="([^"]*)"', svg)
    assert points is not None
    coords = points.group(1).split()
    assert len(coords) <= 101
    right_edge = 640 - 16
    assert coords[-1].startswith(f"{right_edge:.1f},")


@pytest.mark.parametrize(
    ("chart", "marker"),
    [
        pytest.param(lambda: bar_chart(["a", "b"], [0.5, 1.0], title="bars"), "<rect", id="bar"),
        pytest.param(lambda: column_chart([0.0, 3.0, 1.0], title="cols"), "<rect", id="column"),
        pytest.param(
            lambda: cdf_chart({"debug": [0.0, 5.0, 60.0, 3600.0]}, title="cdf"),
            "<polyline",
            id="cdf",
        ),
        pytest.param(lambda: line_chart([], [], title="empty"), "<svg", id="empty-line-chart"),
        pytest.param(lambda: column_chart([], title="empty"), "<svg", id="empty-column-chart"),
    ],
)
def test_primitives_draw_without_outside_references(chart: object, marker: str) -> None:
    assert callable(chart)
    svg = chart()
    assert isinstance(svg, str)
    assert marker in svg
    assert "http" not in svg
    assert svg == chart()


def test_column_chart_skips_empty_bars() -> None:
    svg = column_chart([0.0, 3.0, 0.0, 1.0], title="t")
    assert svg.count('fill="#4e79a7"') == 2
