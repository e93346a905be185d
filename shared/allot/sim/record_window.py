"""A ``SimRecord`` cut to a time window, so a report covers that window only (``allot
whatif`` reports the replay of a log's window over the window itself: work whose demand is
unknown runs past its end, ``allot.eventlog.window_history``).

``window_record(record, start, end)`` keeps, clipped to ``[start, end]``: segments and
waits (what lies outside is dropped), notices issued inside, the healthy-capacity step
function (its value at ``start``, then each change inside), and every job submitted by
``end``, as it stood at ``end``: a start or an end after it is unknown (None), and a job
not ended by then is ``running`` if it held GPUs at ``end``, else ``pending``.
``requeues`` counts the notices inside that requeue their victim (the requeue itself
follows at the grace deadline). The observed period is the whole window
(``first_submit = start``, ``last_submit = end_time = end``). Shares, programs, usage,
the final fairshare and the reservations' figures are the whole run's. No I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace

from allot.core.errors import ValidationError
from allot.sim.record import CapacityChange, JobOutcome, SimRecord


def window_record(record: SimRecord, start: float, end: float) -> SimRecord:
    """``record`` cut to ``[start, end]`` (see the module docstring)."""
    if not start < end:
        raise ValidationError("window", f"must end after it starts ({start:g} >= {end:g})")
    segments = [
        replace(s, start=max(s.start, start), end=min(s.end, end))
        for s in record.segments
        if min(s.end, end) > max(s.start, start)
    ]
    waits = [
        replace(w, start=max(w.start, start), end=min(w.end, end))
        for w in record.waits
        if min(w.end, end) > max(w.start, start)
    ]
    preemptions = [p for p in record.preemptions if start <= p.time <= end]
    holding = {s.workload_id for s in record.segments if s.start <= end < s.end}
    return replace(
        record,
        first_submit=start,
        last_submit=end,
        end_time=end,
        segments=segments,
        waits=waits,
        preemptions=preemptions,
        requeues=sum(1 for p in preemptions if p.requeued),
        capacity=_capacity(record.capacity, start, end),
        jobs=[_as_at(job, end, holding) for job in record.jobs if job.submit_time <= end],
    )


def _as_at(job: JobOutcome, end: float, holding: set[str]) -> JobOutcome:
    if job.end_time is not None and job.end_time <= end:
        return job
    first_start = (
        job.first_start if job.first_start is not None and job.first_start <= end else None
    )
    state = "running" if job.workload_id in holding else "pending"
    return replace(job, first_start=first_start, end_time=None, state=state)


def _capacity(changes: list[CapacityChange], start: float, end: float) -> list[CapacityChange]:
    """The step function on ``[start, end]``: its value at ``start``, then each change.

    The engine records the capacity it starts with at the first submission, before any
    health event; events earlier than that (a host down at the window's start when nothing
    arrives at it) come after it in the list and replace it, as they did in the run."""
    if len(changes) > 1 and changes[1].time < changes[0].time:
        changes = changes[1:]
    ordered = sorted(changes, key=lambda c: c.time)  # stable: ties keep order
    k = bisect_right([c.time for c in ordered], start)
    at_start = ordered[k - 1].healthy_gpus if k else (ordered[0].healthy_gpus if ordered else 0)
    return [CapacityChange(start, at_start), *(c for c in ordered[k:] if c.time <= end)]
