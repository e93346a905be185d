"""The wire form of the leader's answers, as pure functions of the fold (and the last
ranking): queue rows, ``allot prio`` rows, allocations, hosts, a workload's status, the
allocation a per-allocation query names, and an answer cut to fit one NATS message.
``queries`` reads the state and sends what these return."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

import msgspec

from allot.core.budgets import BudgetTree
from allot.core.errors import ValidationError
from allot.core.model import HostState
from allot.core.queue_view import TIER_NAMES, UNALLOCATED, QueueEntry
from allot.core.reasons import PrioRow, Why, estimated_start
from allot.core.state import SHORT_LANE_POOL
from allot.eventlog.last_ranking import LastRanking
from allot.eventlog.logfold import TERMINAL, LogFold, WorkloadRecord
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s

MAX_REASON_NUMBERS = 16

_ENC = msgspec.json.Encoder()


def queue_row(e: QueueEntry, why: Why | None, now: float, ranking: LastRanking) -> m.QueueRow:
    """``allot queue``: one pending workload, its position and why it waits. ``est_start``
    is an ESTIMATE (``estimated_start``: the notice deadline, the protection end, or now)."""
    w = e.workload
    est = estimated_start(why, now) if why is not None else None
    return m.QueueRow(
        position=e.position,
        workload_id=w.id,
        allocation=w.allocation,
        user=w.user,
        gpus=w.gpus,
        kind=w.kind,
        tier=TIER_NAMES[e.tier],  # type: ignore[arg-type]
        rank=ranking.rank_of.get(w.allocation or ""),
        fairshare=ranking.fairshare.get(w.allocation or ""),
        sort_metric=_sort_metric(e, ranking.fairshare),
        priority=w.priority,
        submitted_at=w.submit_time,
        why=_text(why.text) if why is not None else "",
        reason=why.code.value if why is not None else "",
        reason_numbers=_wire_numbers(why.numbers) if why is not None else {},
        est_start=None if est is None else min(max(est, 0.0), m.MAX_TIME),
    )


def _sort_metric(entry: QueueEntry, fairshare: Mapping[str, float]) -> float:
    """Tier index plus (1 - Fair Tree factor): smaller is served first."""
    if entry.tier == UNALLOCATED or entry.workload.allocation is None:
        return float(UNALLOCATED)
    return entry.tier + (1.0 - fairshare.get(entry.workload.allocation, 0.0))


def free_gpus(fold: LogFold) -> int:
    """Free GPUs on schedulable hosts."""
    st = fold.state
    return sum(len(f) for h, f in st.free.items() if st.host(h).schedulable)


def prio_rows(rows: Sequence[PrioRow]) -> tuple[m.PrioRow, ...]:
    """``allot prio``: the core's ``priority_breakdown`` rows on the wire, the first
    ``MAX_QUEUE_ROWS``."""
    return tuple(
        m.PrioRow(
            position=r.position,
            workload_id=r.workload_id,
            allocation=r.allocation,
            user=r.user,
            gpus=r.gpus,
            tier=r.tier,
            tier_name=r.tier_name,
            held=r.held,
            entitlement=max(0.0, r.entitlement),
            order_key=r.order_key,
            rank=r.rank,
            fairshare=r.fairshare,
            priority=r.priority,
            age_s=max(0.0, r.age_s),
        )
        for r in rows[: m.MAX_QUEUE_ROWS]
    )


def allocations(fold: LogFold, at: float) -> m.AllocationsSnapshot:
    """Per leaf of the budget tree: its effective share, entitlement (effective share x
    GPUs on healthy hosts, what the cycle's tiers use), the GPUs its allocated work
    holds now (including work under notice) and its allocated work still pending."""
    st = fold.state
    tree = fold.tree
    shares = fold.shares()
    healthy = st.healthy_gpus
    rows = []
    for leaf in tree.leaves() if tree is not None else ():
        share = min(1.0, max(0.0, shares.get(leaf, 0.0)))
        pending = [w for _, w in fold.queue.groups.get(leaf, ())]
        rows.append(
            m.AllocationRow(
                allocation=leaf,
                effective_share=share,
                entitlement_gpus=share * healthy,
                held_gpus=st.held.get(leaf, 0),
                pending_workloads=len(pending),
                pending_gpus=sum(w.gpus for w in pending),
            )
        )
    return m.AllocationsSnapshot(
        at=at,
        healthy_gpus=healthy,
        total_gpus=sum(h.gpus for h in st.hosts),
        rows=tuple(rows),
    )


def workload_status(fold: LogFold, rec: WorkloadRecord, position: int | None) -> m.WorkloadStatus:
    """``allot status``: where ``rec`` is now. A running workload shows its current attempt;
    an ended one (completed, failed, cancelled, preempted) its last attempt's start and
    hosts and how it ended, like ``sacct``; a pending one neither."""
    run = fold.state.running.get(rec.workload.id)
    ended = rec.status in TERMINAL
    shown = run is not None or ended  # a requeued workload's last run is not its present
    requeued = rec.status == "pending" and rec.attempt > 0
    return m.WorkloadStatus(
        workload_id=rec.workload.id,
        state=rec.status,
        allocation=rec.workload.allocation,
        user=rec.workload.user,
        gpus=rec.workload.gpus,
        attempt=rec.attempt,
        submitted_at=rec.workload.submit_time,
        started_at=rec.started_at if shown else None,
        run_started_at=rec.run_started_at if shown else None,
        # Unallocated work is never protected (its protection end is its start).
        protected_until=run.protected_until if run is not None and run.allocated else None,
        preempt_at=rec.preempt_at,
        assignment=(tuple(m.HostGpus(host=h, gpus=g) for h, g in rec.assignment) if shown else ()),
        position=position,
        ended_at=rec.ended_at if ended else None,
        exit_code=rec.exit_code if ended else None,
        reason=rec.end_reason if ended else "",
        cancelled_by=rec.ended_by if ended else None,
        requeued_at=rec.requeued_at if requeued else None,
        requeue_reason=rec.requeue_reason if requeued else "",
        command=rec.command,
        env_names=tuple(sorted(rec.env)),
        checkpoints=rec.checkpoints,  # issue 40: empty for work without the protocol
        checkpoint_dir=rec.checkpoint_dir,
        kind=rec.workload.kind,
    )


HOSTS_PER_PAGE = 4096
"""Rows a hosts page is built from before it is trimmed to one NATS message (a row is
~150 bytes, more with many workloads on the host)."""


def host_rows(
    fold: LogFold, after: str | None = None, limit: int | None = None
) -> tuple[m.HostRow, ...]:
    """``allot hosts``: each host's state, free GPUs and work, and for a draining or
    drained one the drain that put it there (reason, operator, time; like ``sinfo -R``),
    in id order: those after ``after``, at most ``limit``."""
    st = fold.state
    rows: list[m.HostRow] = []
    start = 0 if after is None else bisect.bisect_right(st.host_ids, after)
    stop = len(st.host_ids) if limit is None else min(len(st.host_ids), start + limit)
    for h in st.host_ids[start:stop]:
        host = st.host(h)
        drain = fold.drains.get(h) if host.state is not HostState.HEALTHY else None
        rows.append(
            m.HostRow(
                host=h,
                state=host.state.value,
                gpus=host.gpus,
                free_gpus=len(st.free[h]),
                workloads=tuple(sorted(st.on_host[h]))[:1024],
                drain_reason=drain.reason if drain is not None else "",
                drain_by=drain.by if drain is not None else None,
                drain_at=drain.at if drain is not None else None,
                short_lane=st.pool_of[h] == SHORT_LANE_POOL,
            )
        )
    return tuple(rows)


def query_scope(subject: str, query: str, tree: BudgetTree | None) -> str | None:
    """The allocation token of a per-allocation query subject (``<query>.<token>``), None
    for the cluster-wide one. A token that is neither ``~`` (unallocated work) nor a leaf
    of ``tree`` raises ``ValidationError`` naming ``allocation``: its answer would be
    empty, as that of an allocation with nothing pending."""
    if not subject.startswith(query + "."):
        return None
    token = subject[len(query) + 1 :]
    if token == s.UNALLOCATED or (tree is not None and tree.is_leaf(token)):
        return token
    if tree is None:
        raise ValidationError("allocation", f"no allocation {token!r}: no budget tree is set yet")
    known = ", ".join(tree.leaves()[:20])
    if token in tree.index.position:  # work is submitted to leaves only
        raise ValidationError(
            "allocation", f"{token!r} is an account, not an allocation (allocations: {known})"
        )
    raise ValidationError(
        "allocation", f"no allocation {token!r} in the budget tree (allocations: {known})"
    )


def hosts_page(fold: LogFold, query: m.HostsQuery, now: float, limit: int) -> bytes:
    """``HostsSnapshot``: the hosts after ``query.after``, as many as ``limit`` bytes hold
    (10,000 hosts' rows are more than NATS's 1 MiB), and how many hosts there are."""
    rows = host_rows(fold, query.after, HOSTS_PER_PAGE)
    total = len(fold.state.host_ids)

    def page(n: int) -> m.HostsSnapshot:
        return m.HostsSnapshot(at=now, hosts=rows[:n], total=total)

    return codec.encode_within(page, len(rows), limit)


def _text(text: str) -> str:
    """Within the wire's text limit (a gang's host list can be long)."""
    if len(text) <= m.MAX_TEXT_LEN:
        return text
    return text[: m.MAX_TEXT_LEN - 3] + "..."


def _wire_numbers(numbers: Mapping[str, float | int | str]) -> dict[str, float | int | str]:
    """``QueueRow.reason_numbers``: at most 16 entries, strings within the text limit, and
    a non-finite float (none is expected) as text, since JSON has no infinity."""
    out: dict[str, float | int | str] = {}
    for name, value in list(numbers.items())[:MAX_REASON_NUMBERS]:
        if isinstance(value, str):
            out[name] = _text(value)
        elif isinstance(value, float) and not math.isfinite(value):
            out[name] = str(value)
        else:
            out[name] = value
    return out
