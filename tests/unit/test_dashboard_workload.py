"""The workload page's preemption notice: the Fair Tree numbers come as the fairshare factor
(1 = served first)."""

from __future__ import annotations

from typing import Any

from allot.live.dashboard_workload import workload_page
from allot.live.timeline import TimelineEvent

T = 1_800_000_000.0
DEADLINE = T + 120


def notice(**detail: Any) -> TimelineEvent:
    base: dict[str, Any] = {
        "reason": "reclaimed-for-entitlement",
        "preemptor": "req",
        "grace_deadline": DEADLINE,
        "requeue": True,
        "gpus": 4,
        "allocated": True,
        "victim_held_gpus": 8,
        "victim_entitlement_gpus": 4.8,
    }
    return TimelineEvent(T, "notice", 1, base | detail)


def submitted(allocated: bool) -> TimelineEvent:
    detail = {"allocation": "nlp", "user": "ann", "gpus": 4, "allocated": allocated}
    return TimelineEvent(T - 60, "submitted", 0, detail)


def notice_text(events: list[TimelineEvent], now: float) -> str:
    html = workload_page(now, "w", None, events).html
    start = html.index('data-event-kind="notice"')
    return html[start : html.index("</li>", start)]


def test_fair_tree_numbers_are_the_factor_or_a_rank_with_its_direction() -> None:
    text = notice_text([notice(victim_window_gpu_s=7200.0, victim_fairshare=0.4, victim_rank=2)], T)
    assert "used 2.0 GPU-h in the window, fairshare factor 0.400 (1 = served first)" in text
    assert "rank" not in text, text
    # Recorded before the factor travelled: the rank, with which way it counts.
    text = notice_text([notice(victim_window_gpu_s=7200.0, victim_rank=2)], T)
    assert "Fair Tree rank 2 (the highest is served first)" in text, text
