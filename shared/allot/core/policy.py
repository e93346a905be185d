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

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from allot.core.decisions import PreemptReason
from allot.core.errors import ValidationError
from allot.core.model import DEFAULT_GRACE_S, Running, Workload
from allot.core.preemption import VictimRule
from allot.core.state import DEFAULT_POOL, ClusterState, PendingQueue

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
    ordering: Ordering | None = None  # None: Fair Tree
    victims: Victims | None = None  # a plugged-in ordering's preemption rule

    def __post_init__(self) -> None:
        if self.grace_s < 0:
            raise ValidationError("grace_s", f"must be >= 0, got {self.grace_s}")
        if self.victims is not None and self.ordering is None:
            raise ValidationError("victims", "Fair Tree has its own: plug in an ordering too")

    @property
    def fair_tree(self) -> bool:
        return self.ordering is None

    @property
    def preempts(self) -> bool:
        """Whether a request may preempt (drains move work regardless)."""
        return self.preemption and (self.ordering is None or self.victims is not None)


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

POLICIES = ("fairshare", "fairshare-window", "fifo")
"""The policies of the placement service (the simulator adds its baselines)."""


def make_policy(name: str, grace_s: int) -> Policy:
    if name == "fairshare":
        return Policy(entitlement_tier=True, grace_s=grace_s)
    if name == "fairshare-window":
        return Policy(entitlement_tier=False, grace_s=grace_s)
    if name == "fifo":
        return Policy(preemption=False, grace_s=grace_s, ordering=FIFO)
    raise ValidationError("policy", f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
