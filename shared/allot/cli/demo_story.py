"""``allot demo``'s narration, built from what the demo saw: the preemption notices it
received, the workloads' states the placement leader reported and the queue's reasons.
Nothing here says what should happen; a notice it did not see is not told.

Inputs: ``works`` names the workloads the demo submitted (id -> ``Work``: a label, its
allocation, its GPUs); notices in the order they arrived; ``WorkloadStatus`` answers.
Outputs: lines of text, pure (no I/O, no clock), so tests feed them recorded events.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from allot.proto import messages as m

REASON_WORDS = {
    "displaced-unallocated": "unallocated work gives way to allocated work",
    "reclaimed-for-entitlement": "reclaimed: the asker's allocation held less than its entitlement",
    "better-ranked": "for better-ranked work (a higher fairshare factor)",
    "host-drain": "its host is draining",
    "higher-class": "for work of a higher class",
    "idle": "its GPUs sat idle past its protection (the idle policy preempts)",
}
"""A notice's reason code in words (the codes are in docs/reasons.md)."""


@dataclass(frozen=True)
class Work:
    """A workload the demo submitted: ``label`` names it in the story (``nlp's first
    run``); ``allocation`` None for unallocated work."""

    label: str
    allocation: str | None
    gpus: int


def label(workload_id: str | None, works: Mapping[str, Work]) -> str:
    """The demo's name for a workload, or its id and nothing more for one it did not
    submit (a stack given by URL may run others' work)."""
    if workload_id is None:
        return "an unknown request"
    work = works.get(workload_id)
    return work.label if work is not None else f"workload {workload_id}"


def notice_line(notice: m.PreemptionNotice, works: Mapping[str, Work]) -> str:
    """One notice as it arrives: who must leave, for whom, why, by when."""
    who = label(notice.workload_id, works)
    alloc = notice.allocation or "unallocated"
    line = (
        f"NOTICE  {who} ({alloc}, {notice.gpus} GPUs) must leave within "
        f"{max(0.0, notice.grace_deadline - notice.at):.0f} s: {notice.reason}"
    )
    if notice.preemptor is not None:
        asker = label(notice.preemptor, works)
        if notice.preemptor not in works and notice.preemptor_allocation:
            # Its submission's answer may come after the notice it set off.
            asker = f"{notice.preemptor_allocation}'s {asker}"
        line += f", for {asker}"
    return line


def notice_story(
    notice: m.PreemptionNotice, works: Mapping[str, Work], was_victim: bool = False
) -> str:
    """A notice told as a sentence, with the numbers it carried. ``was_victim``: the asker
    had itself been preempted before (a reclaim that a reclaim set off)."""
    victim = label(notice.workload_id, works)
    asker = label(notice.preemptor, works) if notice.preemptor else "no one named"
    if was_victim:
        asker += ", requeued after its own preemption,"
    text = f"{asker} preempted {victim} ({notice.gpus} GPUs): " + REASON_WORDS.get(
        notice.reason, notice.reason
    )
    if notice.allocation is not None and notice.reason != "displaced-unallocated":
        text += (
            f"; {notice.allocation} held {notice.victim_held_gpus} GPUs, "
            f"{notice.victim_entitlement_gpus:.1f} entitled"
        )
    return text


def outcome(status: m.WorkloadStatus | None) -> str:
    """What became of a noticed workload, as the leader reports it now."""
    if status is None or status.state == "unknown":
        return "its state is unknown"
    if status.state == "pending":
        if status.requeued_at is not None:
            return f"requeued, waiting (attempt {status.attempt} ended)"
        return "waiting"
    if status.state == "running":
        if status.attempt > 1:
            return f"requeued and running again (attempt {status.attempt})"
        return "still running"
    if status.state == "noticed":
        return "under notice, leaving"
    return f"ended: {status.state}"


def step_story(
    notices: Sequence[m.PreemptionNotice],
    works: Mapping[str, Work],
    states: Mapping[str, m.WorkloadStatus],
    earlier: Sequence[m.PreemptionNotice] = (),
) -> list[str]:
    """What the notices of one step did: each preemption (in arrival order) and what
    became of its victim. An asker that was itself a victim before (``earlier`` notices or
    this step's) is said to be so: a chain of reclaims reads as one."""
    if not notices:
        return ["no preemption notices"]
    victims = {n.workload_id for n in earlier}
    lines = []
    for n in notices:
        story = notice_story(n, works, was_victim=n.preemptor in victims)
        lines.append(f"{story} -> now {outcome(states.get(n.workload_id))}")
        victims.add(n.workload_id)
    return lines


def waiting_story(
    workload_id: str,
    row: m.QueueRow | None,
    status: m.WorkloadStatus | None,
    works: Mapping[str, Work],
) -> str:
    """Why one workload waits, in the queue's own words (its reason code and ``why``), or
    what it does instead when it does not wait."""
    who = label(workload_id, works)
    if row is not None:
        return f"{who} waits at position {row.position}: {row.reason}: {row.why}"
    return f"{who} does not wait: it is {status.state if status else 'unknown'}"


def summary(
    notices: Sequence[m.PreemptionNotice],
    works: Mapping[str, Work],
    states: Mapping[str, m.WorkloadStatus],
) -> list[str]:
    """The whole run from its notices: how many of each reason, whose work took GPUs from
    whose (each pair once, with a count) and each victim's state at the end."""
    if not notices:
        return ["no preemption notices were seen"]
    counts = Counter(n.reason for n in notices)
    pairs = Counter(
        (
            _owner(n.preemptor, works, n.preemptor_allocation),
            _owner(n.workload_id, works, n.allocation),
        )
        for n in notices
    )
    lines = [
        f"{len(notices)} preemption notices: "
        + ", ".join(f"{count} {reason}" for reason, count in counts.items())
    ]
    lines += [
        f"  {asker} took GPUs from {victim}" + (f" ({count} notices)" if count > 1 else "")
        for (asker, victim), count in pairs.items()
    ]
    lines.append("each preempted workload now:")
    victims = dict.fromkeys(n.workload_id for n in notices)
    lines += [f"  {label(w, works)}: {outcome(states.get(w))}" for w in victims]
    return lines


def _owner(workload_id: str | None, works: Mapping[str, Work], allocation: str | None) -> str:
    """Whose work it is: its allocation's name, or ``unallocated work``."""
    if workload_id is None:
        return "no requester (a drain)"
    work = works.get(workload_id) if workload_id is not None else None
    alloc = work.allocation if work is not None else allocation
    return f"{alloc}'s work" if alloc is not None else "unallocated work"
