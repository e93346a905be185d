"""Policies: the knobs one scheduling entry point is run with, and what may be plugged in.

Allot's own policy is Fair Tree (``ordering=None``): the queue order, preemption rules and
earmarks of ``allot.core.cycle``. A policy may instead plug in an ``Ordering`` (the order
work is considered in, and the pool it runs in) and ``Victims`` (whom a request may preempt,
and when a drain moves work): ``FIFO`` below, which the placement service offers, and the
simulator's baselines (``allot.sim.baselines``). A plugged-in policy runs through the same
``run_cycle`` (same placement, gang rules, grace periods and drains) and preempts only
through its own ``victims``; none means it never preempts for a request
(docs/decisions/0002-baselines-plug-into-the-cycle.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Protocol

from allot.core.decisions import PreemptReason
from allot.core.errors import ValidationError
from allot.core.model import (
    DEFAULT_GRACE_S,
    DEFAULT_UNALLOCATED_GRACE_S,
    MAX_MIN_RUNTIME_S,
    Workload,
)
from allot.core.preemption import VictimRule
from allot.core.running import Running
from allot.core.state import DEFAULT_POOL, FREED_KEPT_S, ClusterState, PendingQueue

Reach = Callable[[str], float]
"""``reach(pool)``: the fewest GPUs a request of that pool can no longer be placed or
preempted for in this cycle (a bound that only falls as the cycle goes on)."""


class Ordering(Protocol):
    def key(self, w: Workload) -> tuple[object, ...]:
        """Sort key of the order (smaller first): what ``allot queue`` and ``allot prio``
        show."""

    def pool(self, w: Workload, st: ClusterState) -> str:
        """The pool of hosts ``w`` may run on (``ClusterState`` pools)."""

    def walk(self, queue: PendingQueue, st: ClusterState, reach: Reach) -> Iterator[Workload]:
        """The pending work in the order a cycle considers it. ``reach`` is read afresh
        after each workload yielded; a walk may leave out, or stop before, work that asks
        for at least ``reach`` of its pool (the cycle passes over such work anyway)."""


class RequestRule(VictimRule, Protocol):
    def reason(self, victim: Running) -> PreemptReason:
        """Why ``victim`` is preempted for this request (carried by the notice)."""


class Victims(Protocol):
    def rule(self, w: Workload, now: float) -> RequestRule:
        """Whom request ``w`` may preempt, and why."""

    def drain_at(self, run: Running, now: float) -> float | None:
        """When a draining host's ``run`` gets its notice (not before ``now``); None: never."""


@dataclass(frozen=True, slots=True)
class Policy:
    # Fair Tree: pending work of allocations below their entitlement sorts first (the
    # "entitlement tier"); off = rank by Fair Tree over the window alone.
    entitlement_tier: bool = True
    preemption: bool = True
    grace_s: int = DEFAULT_GRACE_S
    # Grace of unallocated victims; None: ``grace_s`` (the baselines, which know no
    # unallocated work).
    unallocated_grace_s: int | None = None
    # GPUs that came free less than this ago are left to allocated work (which arrives all
    # the time under load) rather than started with unallocated work it would preempt at
    # once (churn: attempts too short to pass their start-up).
    unallocated_settle_s: float = 0.0
    # Work requeued by a notice for another request may displace only unallocated work
    # for this long after the notice's deadline (no cascade of reclaims).
    requeue_hold_s: float = 3600.0
    # Reservations for large work (``allot.core.reservations``; Fair Tree only): at most
    # ``max_reservations`` a cycle, holding at most ``reservation_max_share`` of the healthy
    # GPUs, for requests of at least ``reservation_min_gpus`` (and a whole host) whose
    # allocation is below its entitlement or that waited ``reservation_after_s``.
    reservations: bool = True
    reservation_min_gpus: int = 64
    max_reservations: int = 2
    reservation_max_share: float = 0.5
    reservation_after_s: float = 3600.0
    # A reclaim may not take a gang (a run over several hosts) larger than its allocation's
    # entitlement when it would leave the allocation below its entitlement
    # (``FairShareRule.key``): a team whose share is smaller than one gang keeps it
    # (decision 0067). ``keep_gangs_at_entitlement`` keeps every gang so: more owed time
    # delivered, longer waits for small work (decision 0065).
    keep_large_gangs: bool = True
    keep_gangs_at_entitlement: bool = False
    # The short lane (hosts named by ``ClusterState(short_lane=...)``): besides unallocated
    # work, only allocated requests of at most ``short_lane_max_gpus`` GPUs protected for at
    # most ``short_lane_max_protection_s`` start there. When allocated work fills the rest of
    # the cluster, such short work still finds free GPUs or an unallocated victim (its short
    # grace) instead of waiting out an allocated victim's (decision 0066).
    short_lane_max_gpus: int = 2
    short_lane_max_protection_s: int = 900
    ordering: Ordering | None = None  # None: Fair Tree
    victims: Victims | None = None  # a plugged-in ordering's preemption rule

    def __post_init__(self) -> None:
        if self.grace_s < 0:
            raise ValidationError("grace_s", f"must be >= 0, got {self.grace_s}")
        if (
            self.unallocated_grace_s is not None
            and not 0 <= self.unallocated_grace_s <= self.grace_s
        ):
            raise ValidationError(
                "unallocated_grace_s",
                f"must be in [0, grace_s={self.grace_s}], got {self.unallocated_grace_s}",
            )
        check_unallocated_knobs(
            "unallocated_grace_s",
            self.grace_of(allocated=False),
            "unallocated_settle_s",
            self.unallocated_settle_s,
        )
        if self.max_reservations < 0:
            raise ValidationError("max_reservations", f"must be >= 0, got {self.max_reservations}")
        if not 0 <= self.reservation_max_share <= 1:
            raise ValidationError(
                "reservation_max_share", f"must be in [0, 1], got {self.reservation_max_share}"
            )
        if not 0 <= self.reservation_after_s < float("inf"):
            raise ValidationError(
                "reservation_after_s", f"must be >= 0 and finite, got {self.reservation_after_s}"
            )
        if self.short_lane_max_gpus < 0:
            raise ValidationError(
                "short_lane_max_gpus", f"must be >= 0, got {self.short_lane_max_gpus}"
            )
        if not 0 <= self.short_lane_max_protection_s <= MAX_MIN_RUNTIME_S:
            raise ValidationError(
                "short_lane_max_protection_s",
                f"must be in [0, {MAX_MIN_RUNTIME_S}], got {self.short_lane_max_protection_s}",
            )
        if self.victims is not None and self.ordering is None:
            raise ValidationError("victims", "Fair Tree has its own: plug in an ordering too")

    @property
    def fair_tree(self) -> bool:
        return self.ordering is None

    def check_short_lane(self, hosts: Collection[str], field: str) -> None:
        """Refuse a short lane (``hosts``) under a policy that has none, naming ``field``."""
        if hosts and self.ordering is not None:
            raise ValidationError(
                field, "only Fair Tree policies have a short lane; this policy has none"
            )

    def short(self, w: Workload) -> bool:
        """Whether allocated ``w`` may start in the short lane."""
        return (
            w.allocated
            and w.gpus <= self.short_lane_max_gpus
            and w.min_runtime_s <= self.short_lane_max_protection_s
        )

    def grace_of(self, allocated: bool) -> int:
        """The grace period a victim gets: allocated or not."""
        if allocated or self.unallocated_grace_s is None:
            return self.grace_s
        return self.unallocated_grace_s

    @property
    def preempts(self) -> bool:
        """Whether a request may preempt (drains move work regardless)."""
        return self.preemption and (self.ordering is None or self.victims is not None)


def check_unallocated_knobs(
    grace_field: str, grace_s: float, settle_field: str, settle_s: float
) -> None:
    """The unallocated victims' grace (>= 0) and the settling time (0 .. ``FREED_KEPT_S``,
    what the state remembers); the error names the caller's field (a flag, a knob)."""
    if not 0 <= grace_s < math.inf:
        raise ValidationError(grace_field, f"must be >= 0 seconds, got {grace_s:g}")
    if not 0 <= settle_s <= FREED_KEPT_S:
        raise ValidationError(
            settle_field, f"must be from 0 to {FREED_KEPT_S:g} seconds, got {settle_s:g}"
        )


class Fifo:
    """One queue by submit time, then id; a workload that does not fit is passed over
    (greedy backfill) rather than blocking the queue. It lives in the core because the
    placement service offers it (``--policy fifo``)."""

    def key(self, w: Workload) -> tuple[object, ...]:
        return (w.submit_time, w.id)

    def pool(self, w: Workload, st: ClusterState) -> str:
        return DEFAULT_POOL

    def walk(self, queue: PendingQueue, st: ClusterState, reach: Reach) -> Iterator[Workload]:
        suffix_min = queue.fifo_suffix_min_gpus()
        pools = st.by_free
        for pos, (_, w) in enumerate(queue.fifo):
            if suffix_min[pos] >= max((reach(p) for p in pools), default=0.0):
                return  # nothing left fits any pool
            yield w


FIFO = Fifo()

DEFAULT_UNALLOCATED_SETTLE_S = 60.0
"""Fair Tree's ``unallocated_settle_s`` (decision 0045)."""

POLICIES = (
    "fairshare",
    "fairshare-window",
    "fairshare-no-reservations",
    "fairshare-keep-gangs",
    "fairshare-reclaim-gangs",
    "fifo",
)
"""The policies of the placement service (the simulator adds its baselines);
``fairshare-no-reservations`` is Fair Tree without reservations, for comparison;
``fairshare-keep-gangs`` is Fair Tree with ``keep_gangs_at_entitlement``;
``fairshare-reclaim-gangs`` without ``keep_large_gangs`` (every gang a reclaim's victim, as
before decision 0067), for comparison."""


def make_policy(
    name: str,
    grace_s: int,
    unallocated_grace_s: int = DEFAULT_UNALLOCATED_GRACE_S,
    unallocated_settle_s: float = DEFAULT_UNALLOCATED_SETTLE_S,
) -> Policy:
    """``unallocated_grace_s`` is capped at ``grace_s`` (a shorter grace for all wins)."""
    if name == "fifo":
        return Policy(preemption=False, grace_s=grace_s, ordering=FIFO)
    if name not in POLICIES:
        choices = ", ".join(POLICIES)
        raise ValidationError("policy", f"unknown policy {name!r}; choose from {choices}")
    return Policy(
        entitlement_tier=name != "fairshare-window",
        grace_s=grace_s,
        unallocated_grace_s=min(unallocated_grace_s, grace_s),
        unallocated_settle_s=unallocated_settle_s,
        reservations=name != "fairshare-no-reservations",
        keep_large_gangs=name != "fairshare-reclaim-gangs",
        keep_gangs_at_entitlement=name == "fairshare-keep-gangs",
    )
