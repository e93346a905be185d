"""deploy/grafana/allot-dashboard.json: importable, and every query reads metrics /metrics
really exports (names taken from ``render_metrics`` output, not from a list kept by hand)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from test_metrics import ALLOWED_LABELS, exported_families, exported_series

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "allot-dashboard.json"
DS_UID = "${DS_PROMETHEUS}"
METRIC = re.compile(r"\ballot_[a-zA-Z0-9_]+")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # panels inside collapsed rows
    return out


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and templating query."""
    out = [
        (f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"])
        for p in all_panels(dashboard)
        for t in p.get("targets", [])
    ]
    out += [(f"variable {v['name']}", v["query"]) for v in dashboard["templating"]["list"]]
    return out


def test_it_is_an_importable_dashboard_with_a_prometheus_input(dashboard: dict[str, Any]) -> None:
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]
    inputs = {i["name"]: i for i in dashboard["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["type"] == "datasource"
    assert inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    for p in all_panels(dashboard):
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": DS_UID}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == DS_UID, p["title"]


def test_panel_ids_and_ref_ids_are_unique(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids))
    for p in all_panels(dashboard):
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs)), p["title"]


def test_panels_fit_the_grid_without_overlapping(dashboard: dict[str, Any]) -> None:
    taken: dict[tuple[int, int], str] = {}
    for p in all_panels(dashboard):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, f"{p['title']!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = p["title"]


def test_every_query_reads_only_metrics_that_are_exported(dashboard: dict[str, Any]) -> None:
    exported = exported_series()
    for where, expr in queries(dashboard):
        names = set(METRIC.findall(expr))
        assert names, f"{where}: no allot_ metric in {expr!r}"
        assert names <= exported, f"{where}: {sorted(names - exported)} not exported"


def test_every_query_groups_and_filters_only_by_exported_labels(
    dashboard: dict[str, Any],
) -> None:
    for where, expr in queries(dashboard):
        labels = {x.strip() for g in GROUPING.findall(expr) for x in g.split(",") if x.strip()}
        labels |= set(MATCHER.findall(expr))
        assert labels <= ALLOWED_LABELS, f"{where}: {sorted(labels - ALLOWED_LABELS)}"


def test_every_exported_metric_is_on_some_panel(dashboard: dict[str, Any]) -> None:
    used = {n for _, expr in queries(dashboard) for n in METRIC.findall(expr)}
    for family, typ in exported_families().items():
        series = {f"{family}_bucket"} if typ == "histogram" else {family}
        assert series & used, f"{family} is exported but on no panel"


@pytest.mark.parametrize(
    ("quantile", "metric"),
    [
        ("0.5", "allot_queue_wait_seconds_bucket"),
        ("0.95", "allot_queue_wait_seconds_bucket"),
        ("0.99", "allot_scheduling_cycle_duration_seconds_bucket"),
    ],
)
def test_latency_panels_take_quantiles_of_the_histograms(
    dashboard: dict[str, Any], quantile: str, metric: str
) -> None:
    exprs = [e for _, e in queries(dashboard)]
    pattern = re.compile(
        rf"histogram_quantile\(\s*{re.escape(quantile)}\s*,\s*sum by \(le\)\s*"
        rf"\(rate\({metric}\["
    )
    assert any(pattern.search(e) for e in exprs), (quantile, metric)


def test_held_and_window_panels_say_which_clock_they_show(dashboard: dict[str, Any]) -> None:
    for p in all_panels(dashboard):
        exprs = " ".join(t["expr"] for t in p.get("targets", []))
        if "held_gpus" in exprs:
            assert "now" in p["title"].lower(), p["title"]
        if "window_usage" in exprs:
            assert "window" in p["title"].lower(), p["title"]
