"""What a scheduling cycle decides: plain frozen values, never sent by the core."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from allot.core.model import Assignment, HostState, Workload


class PreemptReason(StrEnum):
    DISPLACED_UNALLOCATED = "displaced-unallocated"  # victim was free (unallocated) work
    RECLAIMED_FOR_ENTITLEMENT = "reclaimed-for-entitlement"  # requester below its entitlement
    BETTER_RANKED = "better-ranked"  # requester's allocation ranks better in Fair Tree
    HOST_DRAIN = "host-drain"  # the host is unhealthy and the protection ended
    RESERVATION = "reservation"  # its host was reserved for a large request, now due
    HIGHER_CLASS = "higher-class"  # the simulator's legacy priority baseline only
    IDLE = "idle"  # flagged idle under a policy that preempts it, past its protection


@dataclass(frozen=True, slots=True)
class Placement:
    workload: Workload
    assignment: Assignment


@dataclass(frozen=True, slots=True)
class Preemption:
    """A notice: the victim must leave by ``preempt_at`` (now + grace); its GPUs are free then.

    The numbers behind the decision travel with it: the victim allocation's held GPUs and
    entitlement at decision time, and the requester (``preemptor``) for reclaims.
    """

    workload_id: str
    allocation: str | None
    gpus: int
    reason: PreemptReason
    preempt_at: float
    requeue: bool
    preemptor: str | None = None
    victim_held_gpus: int = 0
    victim_entitlement_gpus: float = 0.0


@dataclass(frozen=True, slots=True)
class Reservation:
    """Request ``workload_id`` is planned to start at ``start_at`` on ``hosts``; ``gpus``
    is what the hosts hold for it (whole hosts, plus the remainder's GPUs)."""

    workload_id: str
    allocation: str | None
    start_at: float
    hosts: tuple[str, ...]
    gpus: int


@dataclass(frozen=True, slots=True)
class RoomHold:
    """Free GPUs a cycle held for request ``workload_id`` from its start (decision 0059):
    what its victims left and what its plan took beside them, no other request's until its
    turn; held at most until ``until`` (its victims' last notice deadline + the grace)."""

    workload_id: str
    gpus: Assignment
    until: float


@dataclass(frozen=True, slots=True)
class HostTransition:
    host: str
    state: HostState


@dataclass(frozen=True, slots=True)
class CycleResult:
    """``next_wakeup``: the earliest later moment at which a cycle could decide something new
    without any new event (a protection or a drain deadline lapsing). Callers also run a cycle
    after every event (arrival, end of a workload, host change) and must end each noticed
    workload at its ``preempt_at``."""

    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    transitions: tuple[HostTransition, ...] = ()
    next_wakeup: float | None = None
    # requester id -> ids of workloads under notice whose GPUs it waits for
    waiting_on: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # large requests that cannot start yet: where and when they will (still held at the
    # end of the cycle; ``allot.core.reservations``)
    reservations: tuple[Reservation, ...] = ()
    # free GPUs held for requests whose notices freed them, as the cycle began its walk
    rooms: tuple[RoomHold, ...] = ()
