"""The answer to ``allot.v1.query.owed``: owed vs delivered GPU-hours per allocation.

``owed_snapshot(timeline, query, now)`` runs ``LogTimeline.owed`` (the simulator's own
``build_report`` on the log's ``[now - window_s, now]``) and turns its ``owed_delivered``
block into an ``OwedSnapshot``: one row per allocation, sorted by name, with the
allocation's effective share of the tree current at ``now``. ``overall`` is total delivered
/ total owed (null when nothing was owed). The numbers are the report's, rounded as it
rounds them (6 decimals). Given the ``IdleBook`` of the idle records (USAGE), each row also carries
``idle_gpu_h``: GPU-hours of the allocation's flagged idle stretches within the window
(an open one up to ``now``); an allocation idle but absent from the report gets a row of
its own. ``lost_gpu_h``: GPU-hours lost to preemptions that ended within the window, from
the agents' checkpoint reports (``LogTimeline.lost_gpu_seconds``; docs/decisions/0053), an
allocation with lost work but absent from the report likewise. Pure: the caller passes
``now``.
"""

from __future__ import annotations

from allot.eventlog.idle_book import IdleBook
from allot.eventlog.timeline import LogTimeline
from allot.proto import messages as m


def owed_snapshot(
    timeline: LogTimeline, query: m.OwedQuery, now: float, idle: IdleBook | None = None
) -> m.OwedSnapshot:
    """The ``OwedSnapshot`` of ``query`` at ``now``; a window longer than the timeline's
    history raises ``ValidationError("window_s", ...)`` (reply ``CommandRejected``)."""
    owed = timeline.owed(now, query.window_s, query.bucket_s)
    shares = timeline.fold.shares()
    idle_s = {} if idle is None else idle.gpu_seconds(now - query.window_s, now)
    lost_s = timeline.lost_gpu_seconds(now - query.window_s, now)
    by_allocation = dict(owed["by_allocation"])
    for name in (idle_s.keys() | lost_s.keys()) - by_allocation.keys():
        by_allocation[name] = {"owed_gpu_h": 0.0, "delivered_gpu_h": 0.0, "ratio": None}
    rows = tuple(
        m.OwedRow(
            allocation=name,
            owed_gpu_h=row["owed_gpu_h"],
            delivered_gpu_h=row["delivered_gpu_h"],
            ratio=row["ratio"],
            # Shares sum to 1; min() only guards the last bit of a float sum.
            effective_share=min(1.0, shares.get(name, 0.0)),
            idle_gpu_h=round(idle_s.get(name, 0.0) / 3600.0, 6),
            lost_gpu_h=round(lost_s.get(name, 0.0) / 3600.0, 6),
        )
        for name, row in sorted(by_allocation.items())
    )
    return m.OwedSnapshot(
        at=now,
        since=max(0.0, now - query.window_s),  # a Timestamp is never negative
        window_s=query.window_s,
        bucket_s=query.bucket_s,
        overall=owed["overall"],
        rows=rows,
    )
