"""``allot demo`` tells what it saw, not what it expected (issue 36): its lines are built
from the notices received and the states the leader reported. The events below are those
of a recorded run: speech's request took GPUs from vision, whose requeued run
then took GPUs from search and nlp, where the old narration announced one reclaim from
"the allocation most over its entitlement (nlp)"."""

from __future__ import annotations

import pytest

from allot.cli.demo_cmd import processes_text
from allot.cli.demo_story import (
    Work,
    notice_line,
    step_story,
    summary,
    waiting_story,
)
from allot.proto import messages as m

WORKS = {
    "wfill1": Work("batch's filler 1", None, 8),
    "wnlp1": Work("nlp's first run", "nlp", 16),
    "wvis": Work("vision's run", "vision", 8),
    "wsearch": Work("search's run", "search", 8),
    "wspeech": Work("speech's run", "speech", 4),
}


def notice(
    victim: str,
    preemptor: str | None,
    reason: str = "reclaimed-for-entitlement",
    *,
    held: int = 8,
    entitled: float = 5.8,
    preemptor_allocation: str | None = None,
) -> m.PreemptionNotice:
    work = WORKS.get(victim)
    return m.PreemptionNotice(
        workload_id=victim,
        allocation=work.allocation if work else None,
        at=100.0,
        reason=reason,  # type: ignore[arg-type]
        grace_deadline=103.0,
        requeue=True,
        gpus=work.gpus if work else 8,
        preemptor=preemptor,
        preemptor_allocation=preemptor_allocation,
        victim_held_gpus=held,
        victim_entitlement_gpus=entitled,
    )


def status(workload: str, state: str, attempt: int = 1, requeued: bool = False) -> m.WorkloadStatus:
    return m.WorkloadStatus(
        workload_id=workload,
        state=state,  # type: ignore[arg-type]
        attempt=attempt,
        requeued_at=110.0 if requeued else None,
    )


RECLAIM_CHAIN = [
    notice("wvis", "wspeech"),
    notice("wsearch", "wvis", held=8, entitled=6.4),
    notice("wnlp1", "wvis", held=16, entitled=9.6),
]
STATES_AFTER = {
    "wvis": status("wvis", "pending", 1, requeued=True),
    "wsearch": status("wsearch", "running", 2),
    "wnlp1": status("wnlp1", "pending", 1, requeued=True),
}


def test_a_chain_of_reclaims_is_told_as_it_happened_with_each_victims_fate() -> None:
    lines = step_story(RECLAIM_CHAIN, WORKS, STATES_AFTER)
    assert lines == [
        "speech's run preempted vision's run (8 GPUs): reclaimed: the asker's allocation "
        "held less than its entitlement; vision held 8 GPUs, 5.8 entitled -> now requeued, "
        "waiting (attempt 1 ended)",
        "vision's run, requeued after its own preemption, preempted search's run (8 GPUs): "
        "reclaimed: the asker's allocation held less than its entitlement; search held 8 "
        "GPUs, 6.4 entitled -> now requeued and running again (attempt 2)",
        "vision's run, requeued after its own preemption, preempted nlp's first run (16 "
        "GPUs): reclaimed: the asker's allocation held less than its entitlement; nlp held "
        "16 GPUs, 9.6 entitled -> now requeued, waiting (attempt 1 ended)",
    ]
    assert not any("most over its entitlement" in line for line in lines)


def test_an_asker_preempted_in_an_earlier_step_is_said_to_be_requeued() -> None:
    earlier = [notice("wvis", "wspeech")]
    [line] = step_story([notice("wsearch", "wvis")], WORKS, STATES_AFTER, earlier)
    assert line.startswith("vision's run, requeued after its own preemption, preempted")


@pytest.mark.parametrize(
    ("notices", "expected"),
    [
        pytest.param([], ["no preemption notices were seen"], id="nothing-seen-nothing-told"),
        pytest.param(
            [notice("wfill1", "wnlp1", "displaced-unallocated"), *RECLAIM_CHAIN],
            [
                "4 preemption notices: 1 displaced-unallocated, 3 reclaimed-for-entitlement",
                "  nlp's work took GPUs from unallocated work",
                "  speech's work took GPUs from vision's work",
                "  vision's work took GPUs from search's work",
                "  vision's work took GPUs from nlp's work",
                "each preempted workload now:",
                "  batch's filler 1: its state is unknown",
                "  vision's run: requeued, waiting (attempt 1 ended)",
                "  search's run: requeued and running again (attempt 2)",
                "  nlp's first run: requeued, waiting (attempt 1 ended)",
            ],
            id="fillers-then-a-reclaim-chain",
        ),
        pytest.param(
            [notice("wfill1", "wnlp1", "displaced-unallocated")] * 2,
            [
                "2 preemption notices: 2 displaced-unallocated",
                "  nlp's work took GPUs from unallocated work (2 notices)",
                "each preempted workload now:",
                "  batch's filler 1: its state is unknown",
            ],
            id="one-pair-counted-once",
        ),
    ],
)
def test_the_summary_counts_what_was_received(
    notices: list[m.PreemptionNotice], expected: list[str]
) -> None:
    assert summary(notices, WORKS, STATES_AFTER) == expected


def test_a_notice_for_a_request_not_yet_answered_names_the_askers_allocation() -> None:
    """The notice can arrive before the submission's answer that names its preemptor."""
    line = notice_line(
        notice("wfill1", "wnew", "displaced-unallocated", preemptor_allocation="vision"), WORKS
    )
    assert line == (
        "NOTICE  batch's filler 1 (unallocated, 8 GPUs) must leave within 3 s: "
        "displaced-unallocated, for vision's workload wnew"
    )


def test_why_work_waits_is_the_queues_own_reason() -> None:
    row = m.QueueRow(
        position=1,
        workload_id="wnlp2",
        allocation="nlp",
        user="ann",
        gpus=8,
        kind="training",
        tier="over-entitlement",
        sort_metric=1.0,
        submitted_at=1.0,
        reason="over-entitlement",
        why="nlp holds 16 of 9.6 entitled GPUs",
    )
    works = {"wnlp2": Work("nlp's second run", "nlp", 8)}
    assert waiting_story("wnlp2", row, None, works) == (
        "nlp's second run waits at position 1: over-entitlement: nlp holds 16 of 9.6 entitled GPUs"
    )
    placed = status("wnlp2", "running")
    assert waiting_story("wnlp2", None, placed, works) == (
        "nlp's second run does not wait: it is running"
    )


def test_the_demo_counts_the_processes_it_started() -> None:
    names = ["intake", "accounting", "placement-1", "placement-2", "agent-fake-a"]
    assert processes_text(names) == (
        "5 processes (4 service processes: intake, accounting, placement-1, placement-2; "
        "1 fake agent)"
    )
