"""Who an allocated request may preempt under Fair Tree (rule 8 of the design), and when it
*reclaims*. The cycle plans with these rules and the reasons explain with them.

Inputs: per allocation, GPUs held (``held``) and the entitlement (effective share x GPUs on
healthy hosts); the Fair Tree order keys (smaller is served first); the request's GPUs.

A request reclaims when its allocation holds less than its entitlement and at least half
of the request is owed room: ``held < entitlement and held + gpus / 2 <= entitlement``.
A reclaiming request may take any over-entitlement allocation's unprotected work, except
a gang (a run over several hosts) larger than that allocation's entitlement when taking it
leaves the allocation below its entitlement (``Policy.keep_large_gangs``; every such gang
with ``keep_gangs_at_entitlement``); any other takes only worse-ranked over-entitlement
work that leaves its allocation at its entitlement (with the tier off: any worse-ranked
work). Unallocated work is every allocated request's victim.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from allot.core.decisions import PreemptReason
from allot.core.running import Running

WORST_ORDER = 1 << 30
"""Fair Tree order key of an allocation missing from the ranking: served last."""


def reclaims(held: int, entitlement: float, gpus: int) -> bool:
    """Reclaim-for-entitlement: the allocation is below its entitlement and at least half
    of the request is owed room. A request mostly beyond it competes by Fair Tree rank like
    tier 1: reclaiming would push its allocation far over and make it the next victim;
    requiring all of it to be owed would starve the runs bigger than what is left owed
    (docs/decisions/0001-reclaim-half-the-request.md)."""
    return held < entitlement and held + gpus / 2 <= entitlement


def largest_reclaim(held: int, entitlement: float) -> float:
    """The largest request that ``reclaims`` (``gpus <= 2 * (entitlement - held)``), -1
    when none does: the cycle's preemption bounds keep reclaiming requests apart."""
    if held < entitlement:
        return float(math.floor(2 * (entitlement - held)))
    return -1.0


class TakeableAllocations:
    """The allocations whose past-protection work some Fair Tree request may take at all
    (GPUs held, and with the tier on held beyond the entitlement), worst ranked first, for
    one cycle's ``ClusterView.victim_held``. That mapping only falls within a cycle (a
    notice charges its victim's allocation), so an allocation that stops qualifying never
    qualifies again: it is dropped from the front when met there. ``FairShareRule``'s
    early exit reads the front instead of every allocation (O(1) amortized, not
    O(allocations) per request)."""

    def __init__(
        self,
        held: Mapping[str, int],
        order: Mapping[str, int],
        entitlement: Mapping[str, float],
        entitlement_tier: bool,
    ) -> None:
        self.held = held
        self._entitlement = entitlement
        self._tier = entitlement_tier
        self._worst_first = sorted(
            (a for a in held if self._qualifies(a)),
            key=lambda a: (-order.get(a, WORST_ORDER), a),
        )
        self._at = 0

    def _qualifies(self, alloc: str) -> bool:
        held = self.held.get(alloc, 0)
        return held > 0 and (not self._tier or held - self._entitlement.get(alloc, 0.0) > 0)

    def worst_besides(self, requester: str) -> str | None:
        """The worst-ranked allocation that still qualifies, other than ``requester``."""
        items = self._worst_first
        at = self._at
        while at < len(items) and not self._qualifies(items[at]):
            at += 1
        self._at = at
        for i in range(at, len(items)):
            alloc = items[i]
            if alloc != requester and self._qualifies(alloc):
                return alloc
        return None


class FairShareVictims:
    """The inputs of rule 8 one cycle shares among its requests; ``rule`` is one request's.

    A plain class, not a frozen dataclass: its ``__init__`` is written out so that the
    compiled core compiles it (the dataclass one stays interpreted, decision 0070). Its
    fields are ``Final``: nothing assigns them after ``__init__``."""

    __slots__ = (
        "entitlement",
        "entitlement_tier",
        "keep_gangs",
        "keep_large_gangs",
        "now",
        "order",
        "takeable",
    )

    def __init__(
        self,
        order: Mapping[str, int],
        entitlement: Mapping[str, float],
        entitlement_tier: bool,
        now: float,
        *,
        keep_gangs: bool = False,
        keep_large_gangs: bool = False,
        takeable: TakeableAllocations | None = None,
    ) -> None:
        self.order: Final = order
        self.entitlement: Final = entitlement
        self.entitlement_tier: Final = entitlement_tier
        self.now: Final = now
        self.keep_gangs: Final = keep_gangs  # ``Policy.keep_gangs_at_entitlement``
        self.keep_large_gangs: Final = keep_large_gangs  # ``Policy.keep_large_gangs``
        self.takeable: Final = takeable  # over the cycle's ``victim_held``

    def rule(
        self,
        requester: str,
        reclaiming: bool,
        *,
        ignore_protection: bool = False,
        allocated_victims: bool = True,
        for_reservation: bool = False,
    ) -> FairShareRule:
        return FairShareRule(
            requester=requester,
            requester_order=self.order.get(requester, WORST_ORDER),
            under_entitlement=reclaiming,
            entitlement_tier=self.entitlement_tier,
            order=self.order,
            entitlement=self.entitlement,
            now=self.now,
            ignores_protection=ignore_protection,
            allocated_victims=allocated_victims,
            for_reservation=for_reservation,
            keep_gangs=self.keep_gangs,
            keep_large_gangs=self.keep_large_gangs,
            takeable=self.takeable,
        )


class FairShareRule:
    """Who an allocated request may preempt (rule 8 of the design):

    - unallocated work, always (class 1);
    - allocated work past its protection, of *another* allocation, which is above its
      entitlement (with the tier on): any such for a requester below its entitlement but a
      kept gang (``key``); only worse-ranked ones (larger Fair Tree order key) that leave
      their allocation at its entitlement for a requester at or above it. With the tier
      off: past-protection work of worse-ranked allocations.

    Preference among victims: unallocated first, then the most GPUs over entitlement, then
    the least work lost (GPUs x time since start), then id.
    """

    __slots__ = (
        "allocated_victims",
        "entitlement",
        "entitlement_tier",
        "for_reservation",
        "ignores_protection",
        "keep_gangs",
        "keep_large_gangs",
        "now",
        "order",
        "requester",
        "requester_order",
        "takeable",
        "unallocated_first",
        "under_entitlement",
    )
    # Its classes are the planner's clearing costs (1 unallocated, 2 allocated): it may read
    # hosts in ``ClusterView.clear_order`` when it respects protection.
    costs_by_kind = True

    def __init__(
        self,
        *,
        requester: str,
        requester_order: int,
        under_entitlement: bool,
        entitlement_tier: bool,
        order: Mapping[str, int],
        entitlement: Mapping[str, float],
        now: float,
        ignores_protection: bool = False,
        unallocated_first: bool = True,
        allocated_victims: bool = True,
        for_reservation: bool = False,
        keep_gangs: bool = False,
        keep_large_gangs: bool = False,
        takeable: TakeableAllocations | None = None,
    ) -> None:
        # Written out, not a frozen dataclass, so that the compiled core compiles it
        # (decision 0070); the fields are ``Final``.
        self.requester: Final = requester
        self.requester_order: Final = requester_order
        self.under_entitlement: Final = under_entitlement  # the request reclaims (``reclaims``)
        self.entitlement_tier: Final = entitlement_tier
        self.order: Final = order
        self.entitlement: Final = entitlement
        self.now: Final = now
        # Earmarking: plan as if protection had ended.
        self.ignores_protection: Final = ignores_protection
        # The planner may try unallocated victims on their own.
        self.unallocated_first: Final = unallocated_first
        # False: unallocated work only (a request requeued by another's notice: no cascade).
        self.allocated_victims: Final = allocated_victims
        self.for_reservation: Final = for_reservation  # a reservation's start: notices say so
        # A reclaim leaves a gang's allocation at its entitlement; ``keep_large_gangs`` the
        # same for gangs larger than their team's share.
        self.keep_gangs: Final = keep_gangs
        self.keep_large_gangs: Final = keep_large_gangs
        self.takeable: Final = takeable  # the cycle's, for ``may_take_allocated``

    def may_take_allocated(self, victim_held: Mapping[str, int]) -> bool:
        takeable = self.takeable
        if takeable is None or victim_held is not takeable.held:
            return any(
                held > 0 and self.may_take_from(alloc, victim_held)
                for alloc, held in victim_held.items()
            )
        if not self.allocated_victims:
            return False
        # ``may_take_from`` of the worst-ranked allocation that qualifies: a reclaim (tier
        # on) may take any of them; otherwise only worse-ranked ones, so the worst decides.
        worst = takeable.worst_besides(self.requester)
        if worst is None:
            return False
        if self.entitlement_tier and self.under_entitlement:
            return True
        return self.order.get(worst, WORST_ORDER) > self.requester_order

    def may_take_from(self, alloc: str, victim_held: Mapping[str, int]) -> bool:
        """Whether past-protection work of allocation ``alloc`` may be a victim at all
        (``key`` adds the tests on the workload itself)."""
        if not self.allocated_victims or alloc == self.requester:
            return False
        worse = self.order.get(alloc, WORST_ORDER) > self.requester_order
        if self.entitlement_tier:
            over = victim_held.get(alloc, 0) - self.entitlement.get(alloc, 0.0)
            return over > 0 and (self.under_entitlement or worse)
        return worse

    def key(self, run: Running, victim_held: Mapping[str, int]) -> tuple[object, ...] | None:
        gpus = run.gpus
        lost = gpus * (self.now - run.start_time)
        if not run.allocated:
            # Earmarking: unallocated work is as good as free room (it may leave at any
            # moment), so an earmark stays on the same hosts when fillers move onto them.
            return (0 if self.ignores_protection else 1, 0.0, lost, run.wid)
        if self.now < run.protected_until and not self.ignores_protection:
            return None
        alloc = run.allocation
        assert alloc is not None
        if not self.may_take_from(alloc, victim_held):
            return None
        entitlement = self.entitlement.get(alloc, 0.0)
        over = victim_held.get(alloc, 0) - entitlement
        # A requester at or above its own entitlement may take only what the victim holds
        # beyond its entitlement: pushing the victim below it makes the victim's work the
        # first in line for the freed GPUs (tier 0), and the requester never gets them
        # (a 16-GPU run was preempted every min_runtime for the same requester). With
        # ``keep_large_gangs`` a reclaim may not either when the victim is a gang (a run
        # over several hosts) larger than its allocation's entitlement: a team whose share
        # is smaller than one gang runs it only over its share, the next small reclaim
        # would take it, and the team would wait for a whole gang's room once more
        # (decision 0067); ``keep_gangs`` keeps every gang so (decision 0065). Victim and
        # allocation alone decide, so victim sets still shrink down the queue order.
        below = self.entitlement_tier and over < gpus  # the victim would end below its share
        if below and not self._may_leave_below(run, entitlement):
            return None
        # Prefer victims whose allocation stays at or above its entitlement: taking more
        # only turns the victim into the next reclaimer.
        overshoot = 0 if over >= gpus else 1
        return (2, overshoot, -over, lost, run.wid)

    def keeps_eligible(self, run: Running, victim_held: Mapping[str, int]) -> bool:
        """Taking several victims from one allocation: stop once it is no longer over; a
        requester at or above its entitlement takes none that would leave the allocation
        below its entitlement (``key`` tests each alone, this one after the victims before
        it), nor does a reclaim take a kept gang so."""
        if not run.allocated or not self.entitlement_tier:
            return True
        alloc = run.allocation
        assert alloc is not None
        held = victim_held.get(alloc, 0)
        entitlement = self.entitlement.get(alloc, 0.0)
        if held <= entitlement:
            return False
        return held - run.gpus >= entitlement or self._may_leave_below(run, entitlement)

    def _may_leave_below(self, run: Running, entitlement: float) -> bool:
        """Whether ``run`` may be taken though its allocation (of ``entitlement``) ends
        below its share: only by a reclaim, and never a gang the keep rules shield."""
        return self.under_entitlement and not self._keeps_gang(run, entitlement)

    def _keeps_gang(self, run: Running, entitlement: float) -> bool:
        """Whether ``run`` is a gang (over several hosts) the keep rules shield from a
        reclaim that would leave its allocation (of ``entitlement``) below its share."""
        if len(run.assignment) < 2:
            return False
        return self.keep_gangs or (self.keep_large_gangs and run.gpus > entitlement)

    def reason(self, victim: Running) -> PreemptReason:
        if not victim.allocated:
            return PreemptReason.DISPLACED_UNALLOCATED
        if self.for_reservation:
            return PreemptReason.RESERVATION
        if self.under_entitlement:
            return PreemptReason.RECLAIMED_FOR_ENTITLEMENT
        return PreemptReason.BETTER_RANKED
