"""The workload page's preemption notice, read with the rest of its attempt: a deadline
the work has met is history, an unallocated victim is said to be unallocated, and the Fair
Tree numbers come as the fairshare factor (1 = served first)."""

from __future__ import annotations

from typing import Any

import pytest

from allot.eventlog.timeline import TimelineEvent
from allot.services.dashboard.workload import workload_page

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


@pytest.mark.parametrize(
    ("ends", "now", "said", "not_said"),
    [
        ([], T + 10, "must leave by", "left ("),
        ([], DEADLINE + 30, "had to leave by", "must leave"),
        ([TimelineEvent(T + 100, "preempted", 1, {})], T + 110, "left (preempted)", "must leave"),
        ([TimelineEvent(T + 100, "preempted", 1, {})], T + 110, "20s before its deadline", "in "),
        ([TimelineEvent(T + 125, "completed", 1, {})], T + 130, "5s after its deadline", "must"),
    ],
    ids=[
        "deadline-ahead-must-leave",
        "deadline-passed-no-end-yet-had-to",
        "left-early-says-it-left",
        "left-early-says-by-how-much",
        "ended-late-says-after",
    ],
)
def test_a_notice_says_whether_the_work_has_left(
    ends: list[TimelineEvent], now: float, said: str, not_said: str
) -> None:
    text = notice_text([submitted(True), notice(), *ends], now)
    assert said in text and not_said not in text, text


def test_a_later_attempts_end_does_not_answer_an_earlier_notice() -> None:
    later = TimelineEvent(T + 500, "completed", 2, {})
    text = notice_text([submitted(True), notice(), later], T + 10)
    assert "must leave by" in text, text


def test_an_unallocated_victim_is_said_to_be_unallocated_not_held_0_of_0() -> None:
    detail = {
        "reason": "displaced-unallocated",
        "allocated": False,
        "victim_held_gpus": 0,
        "victim_entitlement_gpus": 0.0,
    }
    text = notice_text([submitted(False), notice(**detail)], T + 10)
    assert "unallocated work" in text and "held 0 of" not in text, text
    # A notice recorded before ``allocated`` travelled: the reason says it.
    old = notice(**detail)
    del old.detail["allocated"]
    text = notice_text([old], T + 10)
    assert "unallocated work" in text and "held 0 of" not in text, text


def test_fair_tree_numbers_are_the_factor_or_a_rank_with_its_direction() -> None:
    text = notice_text([notice(victim_window_gpu_s=7200.0, victim_fairshare=0.4, victim_rank=2)], T)
    assert "used 2.00 GPU-h in the window, fairshare factor 0.400 (1 = served first)" in text
    assert "rank" not in text, text
    # A young stack's usage keeps its digits, as every usage column does.
    text = notice_text([notice(victim_window_gpu_s=36.0, victim_fairshare=1.0)], T)
    assert "used 0.0100 GPU-h in the window" in text, text
    # Recorded before the factor travelled: the rank, with which way it counts.
    text = notice_text([notice(victim_window_gpu_s=7200.0, victim_rank=2)], T)
    assert "Fair Tree rank 2 (the highest is served first)" in text, text
