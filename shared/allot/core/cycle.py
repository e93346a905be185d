"""The one scheduling entry point: ``run_cycle(snapshot, policy, now) -> CycleResult``.

The placement service and the simulator both call it; nothing else decides placements,
preemptions or drains. It reads a snapshot and returns decisions; it changes nothing.

A cycle, in order:

1. **Drains.** Every DRAINING host: each workload on it gets a notice (reason host-drain) at
   max(now, its protection end); an empty draining host becomes DRAINED.
2. **Queue order** (FAIRSHARE). Allocated work before unallocated work. Among allocated
   work, tier 0 is work of allocations holding fewer GPUs than their entitlement
   (effective share x GPUs on healthy hosts), tier 1 the rest (one tier when
   ``entitlement_tier`` is off). Inside a tier: the allocation's Fair Tree order over the
   window, then (inside one allocation) user priority, submit time, id. Unallocated work:
   FIFO. The tier is re-read as a cycle places work, so an allocation that reaches its
   entitlement mid-cycle drops to tier 1 for the rest of the cycle.
3. **Placement**, workload by workload in that order: best fit on free GPUs (see
   ``allot.core.placement``); work that does not fit is passed over, not blocking the queue.
4. **Preemption** for allocated work that does not fit (see ``allot.core.preemption``):
   a minimal set of unprotected victims on the best host(s); the notices take effect after
   the grace period, the GPUs they free (and the free GPUs beside them) are reserved for
   the requester for the rest of the cycle. GPUs already under notice are claimed first,
   so a requester waiting out a grace period does not cause new preemptions; work under
   notice for a request still pending stays that request's in later cycles (the notice
   names it: ``ClusterState.noticed_for``), so no other request takes it. A request
   *reclaims* (may take any over-entitlement allocation's unprotected work) when its
   allocation holds less than its entitlement and at least half of the request is owed
   room (held + gpus / 2 <= entitlement); otherwise it may take only worse-ranked
   over-entitlement work (and unallocated work).
5. **Earmarks.** A reclaiming request blocked only by protected work reserves the hosts
   it will get when that protection lapses: their free GPUs go to no other allocated work
   and their occupants are nobody else's victims this cycle. Unallocated work may fill the
   free GPUs once every allocated request has been considered.

Cost. A cycle touches only the queue heads it needs: each allocation's queue is kept
sorted by ``PendingQueue``, and two monotone bounds end the walk early. Within one cycle
free GPUs only shrink, so once a request of g GPUs fails to fit, every later request of
>= g GPUs fails too; likewise victim sets only shrink down the order, so a failed
preemption plan of g GPUs in a tier rules out later requests of >= g in that tier.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from allot.core.decisions import (
    CycleResult,
    HostTransition,
    Placement,
    Preemption,
    PreemptReason,
)
from allot.core.model import HostState, Running, Workload
from allot.core.placement import ClusterView
from allot.core.policy import Mode, Policy
from allot.core.preemption import VictimRule, plan_preemption
from allot.core.state import DEFAULT_POOL, ClusterState, PendingQueue

_ReasonFn = Callable[[Running], PreemptReason]

# Keys of the monotone preemption bounds: (tier, reclaims).
_TIER0_RECLAIM = (0, True)
_TIER0_RANKED = (0, False)
_TIER1_RANKED = (1, False)

WORST_ORDER = 1 << 30
"""Fair Tree order key of an allocation missing from the ranking: served last."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The inputs of one cycle. ``shares``: effective share per allocation (the budget tree's
    product of normalised shares); ``order``: Fair Tree order key per allocation, smaller is
    served first (``Ranking.order_key``); both are ignored by the baselines."""

    cluster: ClusterState
    queue: PendingQueue
    shares: Mapping[str, float]
    order: Mapping[str, int]


def run_cycle(snapshot: Snapshot, policy: Policy, now: float) -> CycleResult:
    return _Cycle(snapshot, policy, now).run()


class _Cycle:
    def __init__(self, snapshot: Snapshot, policy: Policy, now: float) -> None:
        self.st = snapshot.cluster
        self.queue = snapshot.queue
        self.shares = snapshot.shares
        self.order = snapshot.order
        self.policy = policy
        self.now = now
        self.view = ClusterView(self.st, now)
        capacity = self.st.healthy_gpus
        self.entitlement = {a: s * capacity for a, s in self.shares.items()}
        self.held = dict(self.st.held)  # grows as this cycle places allocated work
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.waiting_on: list[tuple[str, tuple[str, ...]]] = []
        self.wakeups: list[float] = []
        self.blocked_allocated = False
        self.shielded_by_team: dict[str, int] = {}
        # Hot-loop constants.
        self._fairshare = policy.mode is Mode.FAIRSHARE
        self._tiered = self._fairshare and policy.entitlement_tier
        self._preempts = policy.preempts
        self._partitioned = policy.mode is Mode.PARTITIONED
        # Two monotone bounds (see the module docstring): within one cycle free GPUs only
        # shrink, so once g GPUs failed to fit in a pool, >= g never fits there again; and
        # victim sets only shrink down the queue order (tier 0's victims include tier 1's;
        # a worse-ranked requester may take fewer; a lower legacy class fewer still), so
        # once a plan for g GPUs failed, no later request of >= g can find one.
        self.place_bound: dict[str, float] = {}
        self._tiers: dict[str, int] = {}  # tier per allocation, until its held GPUs change
        self._rules: dict[tuple[str, bool, bool], _FairShareRule] = {}  # immutable per cycle
        self.preempt_bound: dict[object, float] = {}
        self.earmarked_for: set[str] = set()  # allocations that earmarked GPUs this cycle
        self._due_earmarks: list[tuple[Workload, str, VictimRule]] = []  # not planned yet
        self._room_base: tuple[float, dict[str, int], dict[str | None, int]] | None = None
        self._own_victims: dict[str, list[Running]] = {}  # see ``_hold_own_victims``

    # ------------------------------------------------------------------ driver
    def run(self) -> CycleResult:
        transitions = self._drains()
        if len(self.queue):
            if self.policy.mode is Mode.PRIORITY:
                self._count_shielded()
            self._hold_own_victims()
            self._schedule()
        if self.blocked_allocated and self.policy.preempts:
            t = self.st.next_protection_end(self.now)
            if t is not None:
                self.wakeups.append(t)
        self.wakeups.extend(p.preempt_at for p in self.preemptions if p.preempt_at > self.now)
        return CycleResult(
            placements=tuple(self.placements),
            preemptions=tuple(self.preemptions),
            transitions=tuple(transitions),
            next_wakeup=min(self.wakeups) if self.wakeups else None,
            waiting_on=tuple(self.waiting_on),
        )

    # ------------------------------------------------------------------ drains
    def _drains(self) -> list[HostTransition]:
        transitions: list[HostTransition] = []
        for host_id in sorted(self.st.draining):
            occupants = sorted(self.st.on_host[host_id])
            if not occupants:
                transitions.append(HostTransition(host_id, HostState.DRAINED))
                continue
            for wid in occupants:
                run = self.st.running[wid]
                if run.preempt_at is not None or wid in self.view.noticed:
                    continue
                if self.policy.mode is Mode.PRIORITY:
                    if run.shielded:
                        continue  # legacy: opted-out work blocks the drain until it ends
                    due = self.now
                else:
                    due = max(self.now, run.protected_until)
                if due > self.now:
                    self.wakeups.append(due)
                    continue
                self._notice(run, PreemptReason.HOST_DRAIN, preemptor=None)
        return transitions

    # -------------------------------------------------------------- scheduling
    def _schedule_fifo(self) -> None:
        """FIFO and partitioned baselines: one queue by submit time; a workload that does
        not fit is passed over (backfill); the walk stops once nothing left can fit."""
        items = self.queue.fifo
        suffix_min = self.queue.fifo_suffix_min_gpus()
        pools = self.st.by_free
        for pos, (_, w) in enumerate(items):
            bound = max((self.place_bound.get(p, math.inf) for p in pools), default=0.0)
            if suffix_min[pos] >= bound:
                break
            pool = self._pool(w)
            if w.gpus < self.place_bound.get(pool, math.inf):
                self._consider(w)

    def _schedule(self) -> None:
        if self.policy.mode in (Mode.FIFO, Mode.PARTITIONED):
            self._schedule_fifo()
            return
        groups = self.queue.groups
        heads: list[tuple[tuple[object, ...], int, str | None]] = []
        cursor: dict[str | None, int] = {}
        for seq, group in enumerate(sorted(groups, key=lambda g: (g is None, g or ""))):
            cursor[group] = 0
            heads.append((self._head_key(group, 0), seq, group))
        heapq.heapify(heads)
        while heads:
            _, seq, group = heapq.heappop(heads)
            if group is None and self._fairshare:
                self._plan_due_earmarks()
                self.view.release_earmarks()  # allocated work is done: free work may fill
            items = groups[group]
            pos = cursor[group]
            dead = self._dead_bounds(group)
            if dead is not None:
                # An item of g GPUs can neither fit nor preempt any more when
                # g >= (a if g <= limit else b) (see ``_dead_bounds``).
                a, b, limit = dead
                low = self.queue.min_gpus_from(group, pos)
                if (
                    low >= max(a, b)
                    or (low > limit and low >= b)
                    or (low >= a and self.queue.max_gpus_from(group, pos) <= limit)
                ):
                    self.blocked_allocated |= group is not None
                    continue  # nothing left in this group can happen this cycle
                start, end = pos, len(items)
                while pos < end and items[pos][1].gpus >= (a if items[pos][1].gpus <= limit else b):
                    pos += 1
                if pos == end:
                    self.blocked_allocated |= group is not None
                    continue
                if pos != start:
                    self.blocked_allocated |= group is not None
                    cursor[group] = pos  # the head moved: re-sort the group by its new head
                    heapq.heappush(heads, (self._head_key(group, pos), seq, group))
                    continue
            self._consider(items[pos][1])
            pos += 1
            cursor[group] = pos
            if pos < len(items):
                heapq.heappush(heads, (self._head_key(group, pos), seq, group))

    def _dead_bounds(self, group: str | None) -> tuple[float, float, float] | None:
        """``(a, b, limit)``: an item of this group asking for g GPUs can neither be placed
        nor preempt for any more in this cycle when g >= a (if g <= limit) or g >= b (if
        g > limit). ``limit`` is the largest request that reclaims (tier 0 only, see
        ``_reclaims``; -1 otherwise): reclaiming and ranked requests have separate
        preemption bounds. None when the group's items do not share one pool (unallocated
        work under the partitioned baseline): each item is then considered on its own."""
        if self._partitioned and group is None:
            return None
        pool = group if self._partitioned and group in self.st.by_free else DEFAULT_POOL
        assert pool is not None
        bound = self.place_bound.get(pool, math.inf)
        if not (self._preempts and (group is not None or not self._fairshare)):
            return (bound, bound, -1.0)
        pb = self.preempt_bound
        if not self._fairshare:
            bound = max(bound, pb.get(None, math.inf))
            return (bound, bound, -1.0)
        assert group is not None
        if self._tier(group) == 1:
            bound = max(bound, pb.get(_TIER1_RANKED, math.inf))
            return (bound, bound, -1.0)
        limit = -1.0
        if self._tiered:
            held = self.held.get(group, 0)
            entitlement = self.entitlement.get(group, 0.0)
            if held < entitlement:
                limit = float(math.floor(2 * (entitlement - held)))
        return (
            max(bound, pb.get(_TIER0_RECLAIM, math.inf)),
            max(bound, pb.get(_TIER0_RANKED, math.inf)),
            limit,
        )

    def _reclaims(self, w: Workload) -> bool:
        """Reclaim-for-entitlement applies to a request of an allocation below its
        entitlement when at least half of the request is owed room:
        held + gpus / 2 <= entitlement. A request mostly beyond the entitlement competes by
        Fair Tree rank like tier 1: letting it reclaim would push its allocation far over
        and make it the next victim (the lumpy overshoot that makes allocations thrash);
        requiring all of it to fit would starve the runs bigger than what is left owed
        (measured on the Ai2-like month: all-of-it 0.93 owed->delivered with 11/15 teams
        at 0.95, half-of-it 0.98 with 15/15).
        """
        if not self._tiered or w.allocation is None:
            return False
        alloc = w.allocation
        held = self.held.get(alloc, 0)
        entitlement = self.entitlement.get(alloc, 0.0)
        return held < entitlement and held + w.gpus / 2 <= entitlement

    def _bound_key(self, w: Workload) -> object:
        """Requests whose victim sets shrink down the queue order share a bound (see
        ``preempt_bound``): legacy requests all; FAIRSHARE ones per (tier, reclaims)."""
        if not self._fairshare:
            return None
        assert w.allocation is not None
        return (self._tier(w.allocation), self._reclaims(w))

    def _head_key(self, group: str | None, pos: int) -> tuple[object, ...]:
        w = self.queue.groups[group][pos][1]
        if self._fairshare:
            if group is None:
                return (1, 0, 0, w.submit_time, "")
            return (0, self._tier(group), self.order.get(group, WORST_ORDER), w.submit_time, group)
        if self.policy.mode is Mode.PRIORITY:
            return (-w.priority, w.submit_time, w.id)
        return (w.submit_time, w.id)

    def _tier(self, allocation: str) -> int:
        if not self._tiered:
            return 0
        tier = self._tiers.get(allocation)
        if tier is None:
            below = self.held.get(allocation, 0) < self.entitlement.get(allocation, 0.0)
            tier = self._tiers[allocation] = 0 if below else 1
        return tier

    def _pool(self, w: Workload) -> str:
        if self._partitioned and w.allocation in self.st.by_free:
            return w.allocation
        return DEFAULT_POOL

    def _hold_own_victims(self) -> None:
        """Work under notice for a request still pending is that request's, from one cycle
        to the next: claimed for it before the walk, given back to it when its turn comes
        (``_consider``). Without this each cycle plans afresh, and an earlier request could
        take the GPUs a later one's notices freed, which then preempted more (found
        2026-12-03: a 12-GPU and an 8-GPU request, 20 GPUs noticed, then one more 4-GPU run
        preempted when the first victim left)."""
        own: dict[str, list[Running]] = {}
        for wid, for_id in sorted(self.st.noticed_for.items()):
            run = self.st.running.get(wid)
            if run is not None and for_id in self.queue:
                own.setdefault(for_id, []).append(run)
        if own:
            self.view.reserve([r for runs in own.values() for r in runs], ())
        self._own_victims = own

    def _consider(self, w: Workload) -> None:
        """Place ``w``, or plan room for it by preemption, or record why neither."""
        pool = self._pool(w) if self._partitioned else DEFAULT_POOL
        gpus = w.gpus
        may_preempt = self._preempts and (w.allocated or not self._fairshare)
        own = self._own_victims.pop(w.id, None)
        if own:
            self.view.unclaim(own)
        if gpus < self.place_bound.get(pool, math.inf):
            self._plan_due_earmarks()
            assignment = self.view.find_fit(pool, gpus)
            if assignment is not None:
                self.view.take(assignment)
                self.placements.append(Placement(w, assignment, self._shield(w)))
                if w.allocated:
                    alloc = w.allocation
                    assert alloc is not None
                    self.held[alloc] = self.held.get(alloc, 0) + gpus
                    self._tiers.pop(alloc, None)
                return
            self.place_bound[pool] = gpus
        if not may_preempt:
            self.blocked_allocated |= w.allocated
            return
        bound_key = self._bound_key(w)
        # The bound assumes victim sets only shrink down the order; a request's own work
        # under notice adds to its set alone.
        if not own and gpus >= self.preempt_bound.get(bound_key, math.inf):
            self.blocked_allocated |= w.allocated
            return
        room = self._room_upper_bound(w)
        plan = None
        if room >= gpus:
            self._plan_due_earmarks()
            plan = plan_preemption(self.view, pool, gpus, self._victim_rule(w))
        if plan is None:
            self.preempt_bound[bound_key] = gpus
            self.blocked_allocated |= w.allocated
            if room >= gpus:  # an earmark plan could not find more room than this either
                self._earmark(w, pool)
            return
        reason_for = self._reason_for(w)
        for victim in plan.new_victims:
            self._notice(victim, reason_for(victim), preemptor=w.id)
        self.view.reserve(plan.victims, plan.free_taken)
        waited = tuple(sorted(r.workload.id for r in plan.victims))
        if waited:
            self.waiting_on.append((w.id, waited))

    # ------------------------------------------------------------- preemption
    def _room_upper_bound(self, w: Workload) -> float:
        """More GPUs than any preemption plan for ``w`` can find (a cheap test that skips
        hopeless plans; it changes no decision): free GPUs on schedulable hosts, plus all
        unallocated work, plus everything held by other allocations above their
        entitlement, plus work already under notice, all as of the cycle's start (room
        only shrinks during a cycle). FAIRSHARE only; the baselines get infinity."""
        if not self._fairshare or w.allocation is None:
            return math.inf
        if self._room_base is None:
            st = self.st
            free = sum(
                size * len(hosts)
                for buckets in st.by_free.values()
                for size, hosts in enumerate(buckets)
            )
            unallocated = st.running_gpus - sum(st.held.values())
            over = {a: h for a, h in st.held.items() if h > self.entitlement.get(a, 0.0) and h > 0}
            noticed: dict[str | None, int] = {}
            for wid in st.noticed:
                run = st.running[wid].workload
                key = run.allocation if run.allocated else None
                noticed[key] = noticed.get(key, 0) + run.gpus
            self._room_base = (free + unallocated + sum(over.values()), over, noticed)
        base, over, noticed = self._room_base
        own = w.allocation
        room = base - over.get(own, 0)
        # Noticed work of allocations not counted above (unallocated is counted already).
        room += sum(g for a, g in noticed.items() if a is not None and a not in over)
        return room

    def _earmark(self, w: Workload, pool: str) -> None:
        """A reclaiming request blocked only by protected work holds the room it will get
        when that protection ends: the free GPUs on those hosts go to no other allocated
        work this cycle, and the work on them is no other request's victim (unallocated
        work may fill the free GPUs; it can leave at any moment). Unallocated work counts
        as room in the earmark's plan, so the earmark stays on the same hosts when fillers
        move onto them (otherwise the earmark and other requests trade GPUs back and forth).
        Without this, freed GPUs go to over-entitlement work that does fit, each placement
        is protected again, and the owed request waits for hours. One earmark per
        allocation per cycle bounds the cost.

        The plan itself is deferred until something reads the view (see
        ``_plan_due_earmarks``)."""
        alloc = w.allocation
        if alloc is None or alloc in self.earmarked_for or not self._reclaims(w):
            return
        self.earmarked_for.add(alloc)
        self._due_earmarks.append((w, pool, self._victim_rule(w, ignore_protection=True)))

    def _plan_due_earmarks(self) -> None:
        """Plan the earmarks deferred so far, in the order they were asked for. Called
        before every read of the view's free GPUs or victims (a fit, a preemption plan,
        the release before unallocated work), so every decision sees exactly the view an
        immediate plan would have left, and the cycle decides the same. What it saves: an
        earmark plan scans every host whose work could move (as if unprotected), and when
        nothing after it reads the view (a full cluster whose later requests the bounds
        rule out, the usual state under load) it is never needed at all."""
        for w, pool, rule in self._due_earmarks:
            plan = plan_preemption(self.view, pool, w.gpus, rule)
            if plan is not None:
                self.view.earmark(plan.victims, plan.free_taken)
        self._due_earmarks.clear()

    def _victim_rule(self, w: Workload, *, ignore_protection: bool = False) -> VictimRule:
        if self.policy.mode is Mode.PRIORITY:
            return _LegacyRule(w.priority, self.now)
        alloc = w.allocation
        assert alloc is not None
        key = (alloc, self._reclaims(w), ignore_protection)
        rule = self._rules.get(key)
        if rule is None:
            rule = self._rules[key] = self._fairshare_rule(alloc, key[1], ignore_protection)
        return rule

    def _fairshare_rule(
        self, alloc: str, reclaims: bool, ignore_protection: bool
    ) -> _FairShareRule:
        return _FairShareRule(
            requester=alloc,
            requester_order=self.order.get(alloc, WORST_ORDER),
            under_entitlement=reclaims,
            entitlement_tier=self.policy.entitlement_tier,
            order=self.order,
            entitlement=self.entitlement,
            now=self.now,
            ignores_protection=ignore_protection,
        )

    def _reason_for(self, w: Workload) -> _ReasonFn:
        if self.policy.mode is Mode.PRIORITY:
            return lambda _victim: PreemptReason.HIGHER_CLASS
        under = self._reclaims(w)

        def reason(victim: Running) -> PreemptReason:
            if not victim.workload.allocated:
                return PreemptReason.DISPLACED_UNALLOCATED
            if under:
                return PreemptReason.RECLAIMED_FOR_ENTITLEMENT
            return PreemptReason.BETTER_RANKED

        return reason

    def _notice(self, run: Running, reason: PreemptReason, preemptor: str | None) -> None:
        w = run.workload
        at = self.now + self.policy.grace_s
        self.view.notice(run, at)
        alloc = w.allocation if w.allocated else None
        self.preemptions.append(
            Preemption(
                workload_id=w.id,
                allocation=alloc,
                gpus=w.gpus,
                reason=reason,
                preempt_at=at,
                requeue=w.resumable,
                preemptor=preemptor,
                victim_held_gpus=self.st.held.get(alloc, 0) if alloc else 0,
                victim_entitlement_gpus=self.entitlement.get(alloc, 0.0) if alloc else 0.0,
            )
        )

    # ----------------------------------------------------------------- legacy
    def _count_shielded(self) -> None:
        for run in self.st.running.values():
            if run.shielded and run.workload.allocation is not None:
                team = run.workload.allocation
                self.shielded_by_team[team] = self.shielded_by_team.get(team, 0) + run.workload.gpus

    def _shield(self, w: Workload) -> bool:
        if self.policy.mode is not Mode.PRIORITY or not w.opt_out or w.allocation is None:
            return False
        cap = (self.policy.protected_gpu_cap or {}).get(w.allocation)
        used = self.shielded_by_team.get(w.allocation, 0)
        if cap is not None and used + w.gpus > cap:
            return False
        self.shielded_by_team[w.allocation] = used + w.gpus
        return True


@dataclass(frozen=True, slots=True)
class _FairShareRule:
    """Who an allocated FAIRSHARE request may preempt (rule 8 of the design):

    - unallocated work, always (class 1);
    - allocated work past its protection, of *another* allocation, which is above its
      entitlement (with the tier on): any such for a requester below its entitlement; only
      worse-ranked ones (larger Fair Tree order key) for a requester at or above it. With the
      tier off: past-protection work of worse-ranked allocations.

    Preference among victims: unallocated first, then the most GPUs over entitlement, then
    the least work lost (GPUs x time since start), then id.
    """

    requester: str
    requester_order: int
    under_entitlement: bool
    entitlement_tier: bool
    order: Mapping[str, int]
    entitlement: Mapping[str, float]
    now: float
    ignores_protection: bool = False  # earmarking: plan as if protection had ended
    unallocated_first: bool = True  # the planner may try unallocated victims on their own

    def may_take_allocated(self, victim_held: Mapping[str, int]) -> bool:
        for alloc, held in victim_held.items():
            if alloc == self.requester or held <= 0:
                continue
            over = held - self.entitlement.get(alloc, 0.0)
            worse = self.order.get(alloc, WORST_ORDER) > self.requester_order
            if self.entitlement_tier:
                if over > 0 and (self.under_entitlement or worse):
                    return True
            elif worse:
                return True
        return False

    def key(self, run: Running, victim_held: Mapping[str, int]) -> tuple[object, ...] | None:
        w = run.workload
        lost = w.gpus * (self.now - run.start_time)
        if not w.allocated:
            # Earmarking: unallocated work is as good as free room (it may leave at any
            # moment), so an earmark stays on the same hosts when fillers move onto them.
            return (0 if self.ignores_protection else 1, 0.0, lost, w.id)
        if self.now < run.protected_until and not self.ignores_protection:
            return None
        alloc = w.allocation
        assert alloc is not None
        if alloc == self.requester:
            return None
        over = victim_held.get(alloc, 0) - self.entitlement.get(alloc, 0.0)
        worse = self.order.get(alloc, WORST_ORDER) > self.requester_order
        if self.entitlement_tier:
            if over <= 0:
                return None
            if not (self.under_entitlement or worse):
                return None
        elif not worse:
            return None
        # A requester at or above its own entitlement may take only what the victim holds
        # beyond its entitlement: pushing the victim below it makes the victim's work the
        # first in line for the freed GPUs (tier 0), and the requester never gets them
        # (seen live: a 16-GPU run preempted every min_runtime for the same requester).
        if self.entitlement_tier and not self.under_entitlement and over < w.gpus:
            return None
        # Prefer victims whose allocation stays at or above its entitlement: taking more
        # only turns the victim into the next reclaimer.
        overshoot = 0 if over >= w.gpus else 1
        return (2, overshoot, -over, lost, w.id)

    def keeps_eligible(self, run: Running, victim_held: Mapping[str, int]) -> bool:
        """Taking several victims from one allocation: stop once it is no longer over."""
        w = run.workload
        if not w.allocated or not self.entitlement_tier:
            return True
        alloc = w.allocation
        assert alloc is not None
        return victim_held.get(alloc, 0) > self.entitlement.get(alloc, 0.0)


@dataclass(frozen=True, slots=True)
class _LegacyRule:
    """Legacy priority: preempt unshielded work of a strictly lower class, lowest first."""

    requester_class: int
    now: float
    ignores_protection: bool = True  # the legacy system had no minimum-runtime contract

    def key(self, run: Running, victim_held: Mapping[str, int]) -> tuple[object, ...] | None:
        w = run.workload
        if run.shielded or w.priority >= self.requester_class:
            return None
        return (1 + w.priority, 0.0, w.gpus * (self.now - run.start_time), w.id)

    def keeps_eligible(self, run: Running, victim_held: Mapping[str, int]) -> bool:
        return True

    def may_take_allocated(self, victim_held: Mapping[str, int]) -> bool:
        return True
