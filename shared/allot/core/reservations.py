"""Reservations: when and where a large request that cannot start now will start.

Minimum-runtime protection leaves few moments when many GPUs are preemptible at once; left
alone, every host that frees up is taken by smaller work, protected again, and a gang
waits for an accident (the seeds' "capacity fragmentation"). A reservation plans the gang's
start the way Slurm's backfill plans its top job's: on the hosts that become available
soonest, at the time they do, and keeps newer work from pushing that time back.

``plan_reservation(view, pool, gpus, rule)`` picks the hosts. A host is *available* at
``ready_at``: now when every occupant may already be moved (free GPUs, unallocated work,
work under notice nobody claimed, work the request's ``rule`` may preempt and past its
protection), else the latest protection end among the occupants the rule may take once
protected no more. A host with an occupant the rule never takes (the requester's own
allocation, an allocation at or below its entitlement, work another request holds) is not
a candidate. A gang of ``g`` GPUs on hosts of ``G`` takes the ``g // G`` whole hosts
available soonest (ties: fewer GPU-hours of work lost by the victims, then host order) and
the remainder on the host where enough GPUs are available soonest; the reservation's time
is the latest of those.

The cycle (``allot.core.cycle``) then holds the hosts: their free GPUs go only to allocated
work whose protection ends by the reservation's time (backfill, which it may still preempt
then) and, once every allocated request has been considered, to unallocated work (which
any request may preempt at once); their occupants are no other request's victims. At the
time, the request's ordinary preemption plan finds the hosts past protection. Reservations
are recomputed every cycle, so one made stale by an end or a new arrival simply moves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from allot.core.placement import ClusterView
from allot.core.preemption import VictimRule
from allot.core.running import Running
from allot.core.state import gpus_on, schedulable


@dataclass(frozen=True, slots=True)
class _Option:
    ready_at: float
    lost: float  # GPU-seconds of work done by the victims so far (lost if not checkpointed)
    index: int
    host: str
    victims: tuple[Running, ...]  # occupants that will have to leave
    free: tuple[int, ...]


def plan_reservation(
    view: ClusterView, pool: str, gpus: int, rule: VictimRule
) -> tuple[float, tuple[_Option, ...]] | None:
    """``(start_at, options)``: when and on which hosts ``gpus`` GPUs become available to a
    request whose victims ``rule`` (protection ignored) allows; None when no set of hosts
    ever will without other work leaving first."""
    st = view.st
    largest = st.pool_max_gpus.get(pool)
    if largest is None:
        return None
    whole_count, rest = divmod(gpus, largest) if gpus > largest else (0, gpus)
    held = view.victim_held
    whole: list[_Option] = []
    parts: list[_Option] = []
    for idx, host_id in enumerate(st.host_ids):
        host = st.host(host_id)
        if st.pool_of[host_id] != pool or not schedulable(host):
            continue
        if whole_count and host.gpus == largest:
            option = _host_ready(view, host_id, idx, host.gpus, rule=rule, held=held)
            if option is not None:
                whole.append(option)
        if rest and host.gpus >= rest:
            option = _host_ready(view, host_id, idx, rest, rule=rule, held=held)
            if option is not None:
                parts.append(option)
    whole.sort(key=lambda o: (o.ready_at, o.lost, o.index))
    chosen = whole[:whole_count]
    if len(chosen) < whole_count:
        return None
    if rest:
        taken = {o.host for o in chosen}
        extra = min(
            (o for o in parts if o.host not in taken),
            key=lambda o: (o.ready_at, o.lost, o.index),
            default=None,
        )
        if extra is None:
            return None
        chosen.append(extra)
    return max(o.ready_at for o in chosen), tuple(chosen)


def _host_ready(
    view: ClusterView,
    host_id: str,
    index: int,
    need: int,
    *,
    rule: VictimRule,
    held: Mapping[str, int],
) -> _Option | None:
    """When ``need`` GPUs of ``host_id`` are available: free ones first, then occupants by
    the time they may be moved (now for unallocated work and unclaimed notices, else the
    end of their protection); None if the movable occupants never free enough."""
    free = view.free_of(host_id)
    got = len(free)
    now = view.now
    movable: list[tuple[float, float, str, Running]] = []
    for wid, run in view.st.on_host[host_id].items():
        if wid in view.earmarked or wid in view.claimed:
            continue
        if view.terminating(run) or not run.allocated:
            ready = now
        elif rule.key(run, held) is None:
            continue
        else:
            ready = max(now, run.protected_until)
        lost = run.gpus * max(0.0, ready - run.start_time)
        movable.append((ready, lost, wid, run))
    movable.sort(key=lambda m: (m[0], m[2]))
    ready_at = now
    lost = 0.0
    victims: list[Running] = []
    for ready, run_lost, _, run in movable:
        if got >= need:
            break
        got += gpus_on(run, host_id)
        ready_at = max(ready_at, ready)
        lost += run_lost
        victims.append(run)
    if got < need:
        return None
    return _Option(ready_at, lost, index, host_id, tuple(victims), tuple(free))
