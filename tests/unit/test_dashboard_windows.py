"""The fair share page's charts: the window is picked from the history when none is asked
for, the axis is in a unit the history fits, and a young stack's one bucket is a line, so
its minutes are not squeezed into the last pixel of a week (the series start at the log's
first record: ``tests/unit/test_timeline.py``)."""

from __future__ import annotations

import re

import pytest

from allot.services.dashboard.pages import WINDOWS, fairshare_page, pick_window

NOW = 1_800_000_000.0

Series3 = tuple[list[float], dict[str, list[float]], dict[str, list[float]]]


@pytest.mark.parametrize(
    ("history_s", "window"),
    [
        (0.0, "1h"),
        (300.0, "1h"),
        (3600.0, "1h"),
        (3601.0, "1d"),
        (3 * 86400.0, "7d"),
        (30 * 86400.0, "7d"),
    ],
    ids=[
        "no-history-the-shortest",
        "five-minutes-an-hour",
        "an-hour-exactly-an-hour",
        "just-over-an-hour-a-day",
        "three-days-a-week",
        "a-month-the-longest",
    ],
)
def test_the_window_is_the_shortest_that_holds_the_history(history_s: float, window: str) -> None:
    assert pick_window(history_s) == window


def series(since: float, bucket_s: float) -> Series3:
    """Buckets from ``since`` to NOW (the last partial), nlp holding 4 GPUs throughout."""
    xs = []
    t = since
    while t < NOW:
        xs.append(t)
        t += bucket_s
    return xs, {"nlp": [4.0] * len(xs)}, {"nlp": [8.0] * len(xs)}


def chart_starts(html: str) -> set[str]:
    return set(re.findall(r'data-chart-from-s="(\d+)"', html))


@pytest.mark.parametrize(
    ("since_s", "unit"),
    [(600.0, "minutes"), (7200.0, "minutes"), (7201.0, "hours"), (3 * 86400.0, "days")],
    ids=["ten-minutes", "two-hours-in-minutes", "over-two-hours-in-hours", "three-days-in-days"],
)
def test_a_weeks_chart_spans_the_history_in_a_unit_it_fits(since_s: float, unit: str) -> None:
    page = fairshare_page(
        NOW, None, None, series(NOW - since_s, 3600.0), window="7d", first=NOW - since_s
    ).html
    assert chart_starts(page) == {f"{since_s:.0f}"}
    assert f"{unit} (0 = now)" in page


def test_a_minute_old_stack_draws_a_line_not_a_lone_point() -> None:
    """One bucket of history: its mean is a step from the first record to now."""
    page = fairshare_page(
        NOW, None, None, series(NOW - 20.0, WINDOWS["1h"][1]), window="1h", first=NOW - 20.0
    ).html
    lines = re.findall(r'<polyline [^>]*points="([^"]*)"', page)
    assert lines and all(len(points.split()) == 2 for points in lines), lines


def test_a_picked_window_says_why() -> None:
    history = series(NOW - 300.0, 60.0)
    page = fairshare_page(
        NOW, None, None, history, window="1h", first=NOW - 300.0, picked=True
    ).html
    window = re.search(r'<p id="window">.*?</p>', page)
    assert window is not None and "<strong>1h</strong>" in window.group()
    assert "picked to hold the whole history: the log starts 5.0m ago" in window.group()
    asked = fairshare_page(NOW, None, None, history, window="1h", first=NOW - 300.0).html
    assert "picked" not in asked
