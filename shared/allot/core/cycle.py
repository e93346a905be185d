"""The one scheduling entry point: ``run_cycle(snapshot, policy, now) -> CycleResult``.

The placement service and the simulator both call it; nothing else decides placements,
preemptions or drains. It reads a snapshot and returns decisions; it changes nothing.

A cycle, in order:

1. **Drains.** Every DRAINING host: each workload on it gets a notice (reason host-drain) at
   max(now, its protection end), or when the policy's plugged-in ``Victims`` say; an empty
   draining host becomes DRAINED. Then **idle runs**: each run of ``Snapshot.idle`` (flagged
   idle by a policy that preempts idle work) gets a notice (reason idle, not requeued) at
   max(now, its protection end), whatever the policy.
2. **Queue order** (Fair Tree). Allocated work before unallocated work. Among allocated
   work, tier 0 is work of allocations holding fewer GPUs than their entitlement
   (effective share x GPUs on healthy hosts), tier 1 the rest (one tier when
   ``entitlement_tier`` is off). Inside a tier: the allocation's Fair Tree order over the
   window, then (inside one allocation) user priority, submit time, id. Unallocated work:
   FIFO. The tier is re-read as a cycle places work, so an allocation that reaches its
   entitlement mid-cycle drops to tier 1 for the rest of the cycle. A policy with a
   plugged-in ``Ordering`` (``allot.core.policy``) walks the queue its own way instead.
3. **Placement**, workload by workload in that order: best fit on free GPUs (see
   ``allot.core.placement``); work that does not fit is passed over, not blocking the queue.
4. **Preemption** for allocated work that does not fit (see ``allot.core.preemption``):
   a minimal set of unprotected victims on the best host(s); the notices take effect after
   the grace period, the GPUs they free (and the free GPUs beside them) are reserved for
   the requester for the rest of the cycle. GPUs already under notice are claimed first,
   so a requester waiting out a grace period does not cause new preemptions; work under
   notice for a request still pending stays that request's in later cycles (the notice
   names it: ``ClusterState.noticed_for``), so no other request takes it. Who may be a
   victim is ``allot.core.victims`` (a request that *reclaims* may take any
   over-entitlement allocation's unprotected work but a gang larger than that
   allocation's share that would leave it below its share, any other only worse-ranked
   over-entitlement work that leaves its allocation at its share), or the plugged-in
   ``Victims`` of the policy.
5. **Earmarks.** A reclaiming request blocked only by protected work reserves the hosts
   it will get when that protection lapses: their free GPUs go to no other allocated work
   and their occupants are nobody else's victims this cycle. Unallocated work may fill the
   free GPUs once every allocated request has been considered.
6. **Reservations** (before the walk; ``allot.core.reservations``): the best-ordered
   large requests get the hosts available soonest held for them; only work that ends by
   the reservation's time may use those hosts (``_backfill``, ``_backfill_plan``), and at
   that time the request preempts there. Large requests use reservations, not earmarks.
7. **No cascades.** Work requeued by a notice for another request may displace only
   unallocated work for ``Policy.requeue_hold_s`` (``PendingQueue.held_back``). What a
   request's victims leave is its own until its turn (``PendingQueue.room_for``, held in
   ``_hold_own_victims`` with the free GPUs its plan took beside them), so no one ranked
   above it (a victim's requeued run among them) takes that room and sends it to notice
   again: one request, one round of notices.
8. **Settling.** Before unallocated work is placed, hosts whose GPUs came free less than
   ``Policy.unallocated_settle_s`` ago keep them for allocated work (``_hold_settling``).

Cost. A cycle touches only the queue heads it needs: each allocation's queue is kept
sorted by ``PendingQueue``, and two monotone bounds end the walk early. Within one cycle
free GPUs only shrink, so once a request of g GPUs fails to fit, every later request of
>= g GPUs fails too; likewise victim sets only shrink down the order, so a failed
preemption plan of g GPUs in a tier rules out later requests of >= g in that tier.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from allot.core.decisions import (
    CycleResult,
    HostTransition,
    Placement,
    Preemption,
    PreemptReason,
    Reservation,
    RoomHold,
)
from allot.core.model import Assignment, HostState, Workload
from allot.core.placement import ClusterView
from allot.core.policy import Ordering, Policy, RequestRule
from allot.core.preemption import Plan, plan_cheap, plan_preemption
from allot.core.reservations import plan_reservation
from allot.core.running import Running, is_allocated
from allot.core.state import (
    DEFAULT_POOL,
    SHORT_LANE_POOL,
    ClusterState,
    PendingQueue,
    schedulable,
)
from allot.core.victims import (
    WORST_ORDER,
    FairShareRule,
    FairShareVictims,
    TakeableAllocations,
    largest_reclaim,
    reclaims,
)

# Keys of the monotone preemption bounds under Fair Tree: (tier, reclaims).
_TIER0_RECLAIM = (0, True)
_TIER0_RANKED = (0, False)
_TIER1_RANKED = (1, False)
_UNALLOCATED_ONLY = ("unallocated-only",)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The inputs of one cycle. ``shares``: effective share per allocation (the budget tree's
    product of normalised shares; every notice carries the victim's entitlement from it);
    ``order``: Fair Tree order key per allocation, smaller is served first
    (``Ranking.order_key``); Fair Tree alone orders by them. ``idle``: running workloads
    flagged idle whose flag asks for their preemption (the health service's
    ``--idle-preempt``; docs/decisions/0055); empty unless that switch is on, and always
    in the simulator, which has no utilization."""

    cluster: ClusterState
    queue: PendingQueue
    shares: Mapping[str, float]
    order: Mapping[str, int]
    idle: frozenset[str] = frozenset()


def run_cycle(snapshot: Snapshot, policy: Policy, now: float) -> CycleResult:
    return _Cycle(snapshot, policy, now).run()


def victims_held_for(cluster: ClusterState, queue: PendingQueue) -> dict[str, list[Running]]:
    """Pending request -> its victims still running under notice (``noticed_for``): no
    other request's until its turn (``_Cycle._hold_own_victims``)."""
    own: dict[str, list[Running]] = {}
    for wid, for_id in sorted(cluster.noticed_for.items()):
        run = cluster.running.get(wid)
        if run is not None and for_id in queue:
            own.setdefault(for_id, []).append(run)
    return own


def hold_until(
    victims: Iterable[Running], left_by: float | None, now: float, grace_s: float
) -> float:
    """When a request's hold lapses at the latest: ``grace_s`` after the last deadline of
    its victims under notice and of those that left (``left_by``)."""
    deadlines = [r.preempt_at for r in victims if r.preempt_at is not None]
    if left_by is not None:
        deadlines.append(left_by)
    return max(deadlines, default=now) + grace_s


class _Cycle:
    def __init__(self, snapshot: Snapshot, policy: Policy, now: float) -> None:
        self.st = snapshot.cluster
        self.queue = snapshot.queue
        self.shares = snapshot.shares
        self.order = snapshot.order
        self.idle = snapshot.idle
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
        self.served_allocated = 0  # allocated requests placed or given a preemption plan
        # Hot-loop constants.
        self._fair_tree = policy.ordering is None
        self._tiered = self._fair_tree and policy.entitlement_tier
        self._preempts = policy.preempts
        self._fair_share = FairShareVictims(
            self.order,
            self.entitlement,
            policy.entitlement_tier,
            now,
            keep_gangs=policy.keep_gangs_at_entitlement,
            keep_large_gangs=policy.keep_large_gangs,
            takeable=TakeableAllocations(
                self.view.victim_held, self.order, self.entitlement, policy.entitlement_tier
            ),
        )
        # Two monotone bounds (see the module docstring): within one cycle free GPUs only
        # shrink, so once g GPUs failed to fit in a pool, >= g never fits there again; and
        # victim sets only shrink down the queue order (tier 0's victims include tier 1's;
        # a worse-ranked requester may take fewer; a plugged-in ordering must keep to this
        # too), so once a plan for g GPUs failed, no later request of >= g can find one.
        self.place_bound: dict[str, float] = {}
        self._tiers: dict[str, int] = {}  # tier per allocation, until its held GPUs change
        self._rules: dict[tuple[str, bool, bool, bool], FairShareRule] = {}  # immutable per cycle
        self.preempt_bound: dict[object, float] = {}
        self.earmarked_for: set[str] = set()  # allocations that earmarked GPUs this cycle
        self._due_earmarks: list[tuple[Workload, str, FairShareRule]] = []  # not planned yet
        self._left: dict[str | None, tuple[int, dict[int, int]]] = {}  # see ``_sizes_left``
        self._room_base: tuple[float, dict[str, int], dict[str | None, int]] | None = None
        self._idle_noticed: list[str] = []  # noticed for idleness this cycle
        self._own_victims: dict[str, list[Running]] = {}  # see ``_hold_own_victims``
        self._own_room: dict[str, Assignment] = {}  # the same for GPUs its victims left
        self._room_holds: list[RoomHold] = []  # ``_own_room`` as the walk began (reported)
        self.reservations: list[Reservation] = []
        # Reserved request -> (earmark handle, its reservation, the occupants held for it).
        self._held: dict[str, tuple[int, Reservation, tuple[Running, ...]]] = {}
        self._reserved_turns: set[str] = set()  # reserved requests already considered
        self._reservation_tier: dict[str, int] = {}  # its allocation's tier when planned
        # The short lane (``Policy.short``), Fair Tree's while it has a schedulable host. No
        # GPUs of the lane are free for a request of ``_lane_fit_bound`` or more any more
        # this cycle; neither free nor cheap ones for ``_lane_bound`` or more (both only
        # shrink within a cycle, whoever asks: cheap victims are any allocated request's).
        self._lane = self._fair_tree and SHORT_LANE_POOL in self.st.pool_max_gpus
        self._lane_fit_bound = math.inf
        self._lane_bound = math.inf
        self._lane_next: dict[str | None, int] = {}  # see ``_next_for_lane``
        self._short_gpus = policy.short_lane_max_gpus  # ``_short``
        self._short_protection = policy.short_lane_max_protection_s

    # ------------------------------------------------------------------ driver
    def run(self) -> CycleResult:
        transitions = self._drains()
        if self.idle:
            self._idle()
        if len(self.queue):
            self._hold_own_victims()
            if self.policy.ordering is None:
                if self._preempts and self.policy.reservations:
                    self._reserve()
                self._schedule()
            else:
                self._walk(self.policy.ordering)
        if self._preempts and self._blocked_allocated():
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
            reservations=tuple(r for r in self.reservations if r.workload_id in self._held),
            rooms=tuple(self._room_holds),
        )

    def _blocked_allocated(self) -> bool:
        """Some allocated request got neither GPUs nor a preemption plan: the cycle wants
        to run again when the next protection ends."""
        queue = self.queue
        allocated = len(queue) - len(queue.groups.get(None, ()))
        return allocated > self.served_allocated

    # ------------------------------------------------------------------ drains
    def _drains(self) -> list[HostTransition]:
        transitions: list[HostTransition] = []
        victims = self.policy.victims
        for host_id in sorted(self.st.draining):
            occupants = sorted(self.st.on_host[host_id])
            if not occupants:
                transitions.append(HostTransition(host_id, HostState.DRAINED))
                continue
            for wid in occupants:
                run = self.st.running[wid]
                if run.preempt_at is not None or wid in self.view.noticed:
                    continue
                if victims is None:
                    due: float | None = max(self.now, run.protected_until)
                else:
                    due = victims.drain_at(run, self.now)
                if due is None:
                    continue
                if due > self.now:
                    self.wakeups.append(due)
                    continue
                self._notice(run, PreemptReason.HOST_DRAIN, preemptor=None)
        return transitions

    def _idle(self) -> None:
        """Runs flagged idle for a policy that preempts them: a notice (reason idle, not
        requeued: a parked run would park again) once the protection has ended; a
        protected one wakes the cycle when it ends. The contract holds: no protected run
        is preempted, idle or not."""
        running = self.st.running
        noticed = self.view.noticed
        for wid in sorted(self.idle):
            run = running.get(wid)
            if run is None or run.preempt_at is not None or wid in noticed:
                continue
            due = run.protected_until
            if due > self.now:
                self.wakeups.append(due)
                continue
            self._notice(run, PreemptReason.IDLE, preemptor=None, requeue=False)
            self._idle_noticed.append(wid)

    # -------------------------------------------------------------- scheduling
    def _walk(self, ordering: Ordering) -> None:
        """A plugged-in ordering: its walk, passing over work out of reach of its pool."""
        st = self.st
        reach = self._reach
        for w in ordering.walk(self.queue, st, reach):
            pool = ordering.pool(w, st)
            if w.gpus < reach(pool):
                self._consider(w, pool)
        self._serve_own_room(ordering)

    def _reach(self, pool: str) -> float:
        """The fewest GPUs a plugged-in ordering's request in ``pool`` can neither be placed
        nor preempt for any more in this cycle (its preemption bound is kept per pool)."""
        bound = self.place_bound.get(pool, math.inf)
        if self._preempts:
            bound = max(bound, self.preempt_bound.get(pool, math.inf))
        return bound

    def _schedule(self) -> None:
        """Fair Tree: the allocations' queues merged by their heads (``_head_key``)."""
        groups = self.queue.groups
        heads: list[tuple[tuple[object, ...], int, str | None]] = []
        cursor: dict[str | None, int] = {}
        for seq, group in enumerate(sorted(groups, key=lambda g: (g is None, g or ""))):
            cursor[group] = 0
            heads.append((self._head_key(group, 0), seq, group))
        heapq.heapify(heads)
        # The group served goes back with its next head through ``heappushpop``: one
        # comparison while it stays first (the usual case: a group's key changes only in
        # its submit time), a push and a pop otherwise, so the same order as both.
        entry = heapq.heappop(heads) if heads else None
        while entry is not None:
            _, seq, group = entry
            nxt = self._serve_head(group, cursor)
            if nxt is not None:
                entry = heapq.heappushpop(heads, (nxt, seq, group))
            else:
                entry = heapq.heappop(heads) if heads else None
        self._serve_reserved()
        self._serve_own_room()

    def _serve_head(
        self, group: str | None, cursor: dict[str | None, int]
    ) -> tuple[object, ...] | None:
        """Consider the head of ``group`` (or move past what can no longer happen this
        cycle); the group's next head key, or None when nothing of it is left."""
        if group is None:
            self._serve_reserved()
            self._serve_own_room()
            self._plan_due_earmarks()
            self.view.release_earmarks()  # allocated work is done: free work may fill
            self._hold_settling()
        items = self.queue.groups[group]
        pos = cursor[group]
        # An item of g GPUs can neither fit nor preempt any more when
        # g >= (a if g <= limit else b) (see ``_dead_bounds``).
        a, b, limit = self._dead_bounds(group)
        # The short lane may still serve an item of fewer than ``lane`` GPUs that may start
        # there (``_lane_may``): such an item is never passed over.
        lane = self._lane_reach(group)
        left = self._sizes_left(group, pos)
        low = min(left)
        end = len(items)
        if (
            low >= max(a, b) or (low > limit and low >= b) or (low >= a and max(left) <= limit)
        ) and (low >= lane or self._next_for_lane(group, pos) == end):
            return None  # nothing left in this group can happen this cycle
        start = pos
        while pos < end:
            w = items[pos][1]
            gpus = w.gpus
            if gpus < (a if gpus <= limit else b) or (gpus < lane and self._lane_may(w)):
                break
            pos += 1
        if pos == end:
            return None
        if pos != start:
            cursor[group] = pos  # the head moved: re-sort the group by its new head
            return self._head_key(group, pos)
        self._consider(items[pos][1], DEFAULT_POOL)
        pos += 1
        cursor[group] = pos
        return self._head_key(group, pos) if pos < end else None

    def _sizes_left(self, group: str | None, pos: int) -> dict[int, int]:
        """GPU sizes (with counts) of the group's items at positions >= ``pos``: the
        queue's counts, less the items the walk has passed (the walk only moves forward,
        so each item is subtracted once per cycle)."""
        kept = self._left.get(group)
        at, sizes = (0, dict(self.queue.size_counts(group))) if kept is None else kept
        assert at <= pos, (group, at, pos)
        items = self.queue.groups[group]
        for i in range(at, pos):
            gpus = items[i][1].gpus
            sizes[gpus] -= 1
            if not sizes[gpus]:
                del sizes[gpus]
        self._left[group] = (pos, sizes)
        return sizes

    def _dead_bounds(self, group: str | None) -> tuple[float, float, float]:
        """``(a, b, limit)``: an item of this group asking for g GPUs can neither be placed
        nor preempt for any more in this cycle when g >= a (if g <= limit) or g >= b (if
        g > limit). ``limit`` is the largest request that reclaims (tier 0 only, see
        ``largest_reclaim``; -1 otherwise): reclaiming and ranked requests have separate
        preemption bounds."""
        bound = self.place_bound.get(DEFAULT_POOL, math.inf)
        if not (self._preempts and group is not None):
            return (bound, bound, -1.0)
        pb = self.preempt_bound
        if self._tier(group) == 1:
            bound = max(bound, pb.get(_TIER1_RANKED, math.inf))
            return (bound, bound, -1.0)
        limit = -1.0
        if self._tiered:
            limit = largest_reclaim(self.held.get(group, 0), self.entitlement.get(group, 0.0))
        return (
            max(bound, pb.get(_TIER0_RECLAIM, math.inf)),
            max(bound, pb.get(_TIER0_RANKED, math.inf)),
            limit,
        )

    def _short(self, w: Workload) -> bool:
        """``Policy.short`` from the cycle's copy of its limits (``Policy`` and ``Workload``
        are interpreted classes: a call of theirs per item costs the compiled walk)."""
        protection = w.min_runtime_s
        return (
            w.allocation is not None
            and 0 < protection <= self._short_protection
            and w.gpus <= self._short_gpus
        )

    def _may_start_on(self, w: Workload, host_id: str) -> bool:
        """Whether ``w`` may start on ``host_id`` as far as the short lane goes: the room a
        request's victims left on a host that has since joined the lane (placement
        restarted with another ``--short-lane``) is not held for work that may not start
        there."""
        return self.st.pool_of[host_id] != SHORT_LANE_POOL or self._lane_may(w)

    def _lane_may(self, w: Workload) -> bool:
        """Whether ``w`` may start in the short lane: unallocated work (no allocation, or no
        protection: ``Workload.allocated``) or short work."""
        return w.allocation is None or w.min_runtime_s <= 0 or self._short(w)

    def _next_for_lane(self, group: str | None, pos: int) -> int:
        """The first position >= ``pos`` of ``group`` whose item may start in the short lane
        (the group's length when none). The walk only moves forward, so each group is
        scanned once per cycle: the position found stays the answer until it is passed."""
        items = self.queue.groups[group]
        at = self._lane_next.get(group, -1)
        if at < pos:
            at = pos
            while at < len(items) and not self._lane_may(items[at][1]):
                at += 1
            self._lane_next[group] = at
        return at

    def _lane_reach(self, group: str | None) -> float:
        """The fewest GPUs the short lane can no longer give an item of ``group`` in this
        cycle (by size; ``_lane_may`` says which items may ask at all); 0 without a lane."""
        if not self._lane:
            return 0
        if group is None:
            return self._lane_fit_bound
        return min(self._short_gpus + 1, self._lane_bound)

    def _reclaims(self, w: Workload) -> bool:
        """``allot.core.victims.reclaims`` with the GPUs the allocation holds so far in this
        cycle; never with the tier off."""
        if not self._tiered or w.allocation is None:
            return False
        alloc = w.allocation
        return reclaims(self.held.get(alloc, 0), self.entitlement.get(alloc, 0.0), w.gpus)

    def _bound_key(self, w: Workload, pool: str) -> object:
        """Requests whose victim sets shrink down the queue order share a bound (see
        ``preempt_bound``): Fair Tree's per (tier, reclaims); a plugged-in ordering's per
        pool."""
        if not self._fair_tree:
            return pool
        assert w.allocation is not None
        if self._held_back(w):
            return _UNALLOCATED_ONLY  # its victims: unallocated work alone
        return (self._tier(w.allocation), self._reclaims(w))

    def _head_key(self, group: str | None, pos: int) -> tuple[object, ...]:
        return self._walk_key(group, self.queue.groups[group][pos][1])

    def _walk_key(self, group: str | None, w: Workload) -> tuple[object, ...]:
        """Where the walk meets ``w``, the head of ``group``: smaller first."""
        if group is None:
            return (1, 0, 0, w.submit_time, "")
        return (0, self._tier(group), self.order.get(group, WORST_ORDER), w.submit_time, group)

    def _tier(self, allocation: str) -> int:
        if not self._tiered:
            return 0
        tier = self._tiers.get(allocation)
        if tier is None:
            below = self.held.get(allocation, 0) < self.entitlement.get(allocation, 0.0)
            tier = self._tiers[allocation] = 0 if below else 1
        return tier

    def _hold_own_victims(self) -> None:
        """Work under notice for a request still pending is that request's, from one cycle
        to the next, and so are the GPUs such work left (``PendingQueue.room_for``): claimed
        for it before the walk, given back to it when its turn comes (``_consider``).
        Without this each cycle plans afresh, and an earlier request (the victim's own
        requeued run among them) could take the GPUs a later one's notices freed, which
        then preempts more."""
        own = victims_held_for(self.st, self.queue)
        if own:
            self.view.reserve([r for runs in own.values() for r in runs], ())
        self._own_victims = own
        # What the victims left stays the request's until every victim of that round is
        # due to have left (the notices of one round are at most ``grace_s`` apart). Every
        # request's room first, then, in the walk's order, what its plan took beside its
        # victims, and only then what a gang still lacks anywhere (whole free hosts, a
        # best-fitting remainder): no request's top-up takes another's room, nor the free
        # GPUs beside another's victims.
        grace = self.policy.grace_s
        kept_after = self.now - grace
        rooms: dict[str, Assignment] = {}
        hosts_of: dict[str, set[str]] = {}
        last_deadline: dict[str, float] = {}
        for for_id, parts in sorted(self.queue.room_for.items()):
            w = self.queue.workload(for_id)
            live = [
                (h, g)
                for deadline, h, g in parts
                if deadline > kept_after and self._may_start_on(w, h)
            ]
            room = self._still_free(live)
            if room:
                self.view.take(room)
                rooms[for_id] = room
                hosts_of[for_id] = {h for h, _ in live}
                last_deadline[for_id] = max(d for d, _, _ in parts)
                self.wakeups.append(last_deadline[for_id] + grace)
        in_order = sorted(sorted(own.keys() | rooms.keys()), key=self._queue_key)
        lacking: list[tuple[str, str, int]] = []  # (request, pool, GPUs) of gangs
        victims_of: dict[str, list[Running]] = {}
        for for_id in in_order:
            w = self.queue.workload(for_id)
            # A run lies in one pool: its first host says whether ``w`` may start there.
            victims = [r for r in own.get(for_id, ()) if self._may_start_on(w, r.assignment[0][0])]
            victims_of[for_id] = victims
            room = rooms.get(for_id, ())
            hosts = hosts_of.get(for_id, set())
            hosts.update(h for r in victims for h, _ in r.assignment)
            ordered = sorted(hosts)  # none when all it had is in a lane since named
            if ordered and self._is_gang(w.gpus, self.st.pool_of[ordered[0]]):
                beside, missing = self._gang_beside(w, room, victims, ordered)
                if missing:
                    lacking.append((for_id, self.st.pool_of[ordered[0]], missing))
            elif ordered:
                host_id, covered = self._room_host(room, victims)
                short = w.gpus - covered - sum(len(g) for h, g in room if h == host_id)
                # its plan's free GPUs there
                beside = self._free_on([host_id], short) if short > 0 else ()
            else:
                beside = ()
            self.view.take(beside)
            rooms[for_id] = room + beside
        for for_id, pool, missing in lacking:
            rest = self._gang_rest(pool, missing)
            self.view.take(rest)
            rooms[for_id] += rest
        for for_id in in_order:
            room = rooms[for_id]
            if room:
                self._own_room[for_id] = room
                until = hold_until(victims_of[for_id], last_deadline.get(for_id), self.now, grace)
                self._room_holds.append(RoomHold(for_id, room, until))

    def _gang_beside(
        self, w: Workload, room: Assignment, victims: Iterable[Running], hosts: list[str]
    ) -> tuple[Assignment, int]:
        """The free GPUs a gang's plan took beside its victims, found again in its shape
        (whole hosts of the pool's largest size, the rest on one more host): the free GPUs
        of each of its hosts that its room, its victims and those GPUs make whole; for the
        rest, only what the host its victims hold most of still lacks. With the GPUs still
        missing, which the caller finds as a fit would (``_gang_rest``) once every request
        has its own. A host a victim merely spanned gives nothing: another request's plan
        may be there."""
        cover, _ = _coverage(room, victims)
        pool = self.st.pool_of[hosts[0]]
        size = self.st.pool_max_gpus.get(pool)
        if size is None:
            return (), 0  # no schedulable host left in its pool
        whole, rest = divmod(w.gpus, size)
        parts: list[tuple[str, tuple[int, ...]]] = []
        partial: list[tuple[int, str]] = []
        for host_id in hosts:
            if not self._schedulable(host_id):
                continue
            free = tuple(self.view.free_of(host_id))
            if self.st.host(host_id).gpus == size and cover.get(host_id, 0) + len(free) == size:
                if free:
                    parts.append((host_id, free))
                whole -= 1
            elif cover.get(host_id, 0):
                partial.append((-cover[host_id], host_id))
        if whole < 0:  # a spare whole host holds the rest
            whole, rest = 0, 0
        if rest and partial:
            _, host_id = min(partial)
            if cover[host_id] + len(self.view.free_of(host_id)) >= rest:
                parts.extend(self._free_on([host_id], rest - cover[host_id]))
                rest = 0
        return tuple(parts), max(0, whole) * size + rest

    def _is_gang(self, gpus: int, pool: str) -> bool:
        """More GPUs than the pool's largest schedulable host (none left: any request)."""
        return gpus > self.st.pool_max_gpus.get(pool, 0)

    @staticmethod
    def _room_host(room: Assignment, victims: Iterable[Running]) -> tuple[str, int]:
        """The host where a one-host request's room and its victims under notice hold the
        most GPUs (its plan's host; a victim may span others), with its GPUs under notice."""
        held, under_notice = _coverage(room, victims)
        host = min(held, key=lambda h: (-held[h], h))
        return host, under_notice.get(host, 0)

    def _queue_key(self, workload_id: str) -> tuple[object, ...]:
        w = self.queue.workload(workload_id)
        return self._walk_key(PendingQueue.group_of(w), w)

    def _gang_rest(self, pool: str, gpus: int) -> Assignment:
        """Free GPUs for ``gpus`` of a gang as a fit would take them: wholly free hosts of
        the pool's largest size, lowest ids first, then the rest on the best-fitting host."""
        buckets = self.view.buckets(pool)
        if buckets is None:
            return ()
        size = self.st.pool_max_gpus[pool]
        whole, rest = divmod(gpus, size)
        chosen = buckets[size].smallest(whole)
        host_ids = [self.st.host_at[i] for i in chosen]
        parts = [(h, tuple(self.view.free_of(h))) for h in host_ids]
        if rest:
            host = self.view.best_fit(buckets, rest, exclude=chosen)
            if host is not None:
                parts.append((host, tuple(self.view.free_of(host)[:rest])))
        return tuple(parts)

    def _fit_in_room(
        self, room: Assignment, pool: str, gpus: int, *, lane: bool = False
    ) -> Assignment | None:
        """A one-host request's best fit among its room's hosts (else None): what its
        victims left is where it starts, not elsewhere with its room left idle. ``lane``:
        the short lane's hosts count too (a short request's room may be there)."""
        if self._is_gang(gpus, pool):
            return None
        fits = []
        for host_id in {h for h, _ in room}:
            free = len(self.view.free_of(host_id))
            host_pool = self.st.pool_of[host_id]
            if (host_pool == pool or (lane and host_pool == SHORT_LANE_POOL)) and free >= gpus:
                fits.append((free, host_id))
        if not fits:
            return None
        host = min(fits)[1]
        return ((host, tuple(self.view.free_of(host)[:gpus])),)

    def _still_free(self, parts: Iterable[tuple[str, tuple[int, ...]]]) -> Assignment:
        """Of ``parts``, the GPUs still free on schedulable hosts, one part per host."""
        gpus_of: dict[str, set[int]] = {}
        for host_id, gpus in parts:
            gpus_of.setdefault(host_id, set()).update(gpus)
        room = []
        for host_id, left in sorted(gpus_of.items()):
            if self._schedulable(host_id):
                free = tuple(g for g in self.view.free_of(host_id) if g in left)
                if free:
                    room.append((host_id, free))
        return tuple(room)

    def _free_on(self, host_ids: list[str], gpus: int) -> Assignment:
        """Up to ``gpus`` free GPUs of ``host_ids`` (schedulable ones, in order)."""
        room = []
        for host_id in host_ids:
            if gpus <= 0:
                break
            if self._schedulable(host_id):
                free = tuple(self.view.free_of(host_id)[:gpus])
                if free:
                    room.append((host_id, free))
                    gpus -= len(free)
        return tuple(room)

    def _schedulable(self, host_id: str) -> bool:
        return host_id in self.st.free and schedulable(self.st.host(host_id))

    def _serve_own_room(self, ordering: Ordering | None = None) -> None:
        """Requests whose room the walk passed over (the bounds skip a group as a whole)
        get their turn before unallocated work: their victims' GPUs are theirs."""
        for wid in sorted(self._own_room):
            w = self.queue.workload(wid)
            self._consider(w, DEFAULT_POOL if ordering is None else ordering.pool(w, self.st))

    def _consider(self, w: Workload, pool: str) -> None:
        """Place ``w``, or plan room for it by preemption, or record why neither. A reserved
        request gets its held hosts back for its own turn, and holds them again if it
        still cannot start (its room is its own, so the cycle's bounds do not apply)."""
        held = self._held.pop(w.id, None)
        if held is None:
            self._decide(w, pool, bounded=True)
            return
        self._reserved_turns.add(w.id)
        handle, reservation, victims = held
        free = self.view.held_free(handle)
        self.view.unhold(handle, free, victims)
        if not self._decide(w, pool, bounded=False):
            # An earmark planned in between may have taken some of it.
            earmarked = {r.wid for r in victims if r.wid in self.view.earmarked}
            self._hold_again(reservation, free, victims, (), earmarked)

    def _serve_reserved(self) -> None:
        """Reserved requests the walk passed over (the bounds skip a group as a whole)
        get their turn before unallocated work."""
        for wid in [r.workload_id for r in self.reservations if r.workload_id in self._held]:
            if wid in self._reserved_turns:
                continue
            reservation = self._held[wid][1]
            w = next(w for _, w in self.queue.groups[reservation.allocation] if w.id == wid)
            self._consider(w, DEFAULT_POOL)

    def _decide(self, w: Workload, pool: str, *, bounded: bool) -> bool:
        """``_consider``'s work; True when ``w`` was placed or got a preemption plan."""
        gpus = w.gpus
        may_preempt = self._preempts and (is_allocated(w) or not self._fair_tree)
        own = self._own_victims.pop(w.id, None)
        room = self._own_room.pop(w.id, None)
        if own or room:
            # Earmarks asked for before this turn were planned without this room.
            self._plan_due_earmarks()
            bounded = False  # its own work under notice, and what such work left, is
            # room no bound counted
        if own:
            self.view.unclaim(own)
        if room:
            self.view.give(room)
        if self._lane and (own or room) and self._in_the_lane(own or (), room or ()):
            # GPUs given back in the lane: its bounds (room that only shrank) no longer hold
            self._lane_fit_bound = self._lane_bound = math.inf
        if not bounded or gpus < self.place_bound.get(pool, math.inf):
            self._plan_due_earmarks()
            lane = self._lane and self._short(w)
            assignment = self._fit_in_room(room, pool, gpus, lane=lane) if room else None
            if assignment is None:
                assignment = self.view.find_fit(pool, gpus)
            if assignment is None and is_allocated(w) and self._held:
                assignment = self._backfill(w)
            if assignment is not None:
                self._place(w, assignment)
                return True
            self.place_bound[pool] = min(gpus, self.place_bound.get(pool, math.inf))
        if self._lane and pool == DEFAULT_POOL and self._in_lane(w):
            return True
        if not may_preempt:
            return False
        bound_key = self._bound_key(w, pool)
        # The bound assumes victim sets only shrink down the order; a request's own work
        # under notice, or its reserved hosts, add to its set alone.
        if bounded and gpus >= self.preempt_bound.get(bound_key, math.inf):
            return False
        if self._room_upper_bound(w) < gpus:
            self.preempt_bound[bound_key] = min(gpus, self.preempt_bound.get(bound_key, math.inf))
            return False  # no plan, and no earmark plan either, finds this much room
        self._plan_due_earmarks()
        rule = self._victim_rule(w)
        plan = plan_preemption(self.view, pool, gpus, rule)
        if plan is None and self._lane and pool == DEFAULT_POOL and self._short(w):
            # short work past its protection in the lane is a victim there, as elsewhere
            plan = plan_preemption(self.view, SHORT_LANE_POOL, gpus, rule)
        if plan is None and is_allocated(w) and self._held and w.id not in self._reserved_turns:
            plan = self._backfill_plan(w, pool, rule)
        if plan is None:
            self.preempt_bound[bound_key] = min(gpus, self.preempt_bound.get(bound_key, math.inf))
            self._earmark(w, pool)
            return False
        self._apply_plan(w, plan, rule)
        return True

    def _place(self, w: Workload, assignment: Assignment) -> None:
        self.view.take(assignment)
        self.placements.append(Placement(w, assignment))
        if is_allocated(w):
            alloc = w.allocation
            assert alloc is not None
            self.held[alloc] = self.held.get(alloc, 0) + w.gpus
            self._tiers.pop(alloc, None)
            self.served_allocated += 1

    def _apply_plan(self, w: Workload, plan: Plan, rule: RequestRule) -> None:
        if is_allocated(w):
            self.served_allocated += 1
        for victim in plan.new_victims:  # ``reserve`` re-indexes their hosts once for all
            self._notice(victim, rule.reason(victim), preemptor=w.id, touch=False)
        self.view.reserve(plan.victims, plan.free_taken)
        waited = tuple(sorted(r.wid for r in plan.victims))
        if waited:
            self.waiting_on.append((w.id, waited))

    def _in_lane(self, w: Workload) -> bool:
        """After its fit elsewhere failed, start ``w`` in the short lane, or plan its room
        with cheap victims, when it may (True). Unallocated work takes the lane's free GPUs.
        Short allocated work (``Policy.short``), before any allocated victim: the lane's
        free GPUs; else the cheap plan, elsewhere or in the lane, that frees its GPUs first
        (GPUs already under notice may free in seconds or in minutes; on a tie, elsewhere:
        the lane is kept for the next short request)."""
        gpus = w.gpus
        view = self.view
        if not is_allocated(w):
            if gpus >= self._lane_fit_bound:
                return False
            assignment = view.find_fit(SHORT_LANE_POOL, gpus)
            if assignment is None:
                self._lane_fit_bound = float(gpus)
                return False
            self._place(w, assignment)
            return True
        if gpus >= self._lane_bound or not self._short(w):
            return False
        assignment = view.find_fit(SHORT_LANE_POOL, gpus)
        if assignment is not None:
            self._place(w, assignment)
            return True
        self._plan_due_earmarks()
        plan = plan_cheap(view, DEFAULT_POOL, gpus)
        here = plan_cheap(view, SHORT_LANE_POOL, gpus)
        if here is None:
            self._lane_bound = float(gpus)
        elif plan is None or self._frees_in(here) < self._frees_in(plan):
            plan = here
        if plan is None:
            return False
        self._apply_plan(w, plan, self._victim_rule(w))
        return True

    def _in_the_lane(self, victims: Iterable[Running], room: Assignment) -> bool:
        """Whether any of ``victims`` or ``room`` is on a host of the short lane."""
        pool_of = self.st.pool_of
        hosts = [h for h, _ in room] + [h for r in victims for h, _ in r.assignment]
        return any(pool_of[h] == SHORT_LANE_POOL for h in hosts)

    def _frees_in(self, plan: Plan) -> float:
        """Seconds until every victim of ``plan`` has left (a new notice: its grace)."""
        wait = 0.0
        for run in plan.victims:
            at = run.preempt_at
            if at is None:
                at = self.view.noticed.get(run.wid)
            left = self.policy.grace_of(run.allocated) if at is None else at - self.now
            wait = max(wait, left)
        return wait

    def _held_back(self, w: Workload) -> bool:
        """Requeued by a notice for another request not long ago: it may displace only
        unallocated work (``Policy.requeue_hold_s``)."""
        return self.queue.held_back(w.id, self.now, self.policy.requeue_hold_s)

    def _hold_settling(self) -> None:
        """Before unallocated work: hosts whose GPUs came free less than
        ``unallocated_settle_s`` ago keep them for allocated work, and the cycle wakes when
        they have settled. A time ahead of the cycle's clock (a bad report) counts as
        settled: it can hold nothing back for long."""
        settle = self.policy.unallocated_settle_s
        if settle <= 0:
            return
        view = self.view
        since = self.now - settle
        seen: set[str] = set()
        for t, host_id in reversed(self.st.freed):
            if t <= since:
                break
            if t > self.now or host_id in seen:
                continue
            seen.add(host_id)
            free = view.free_of(host_id)
            if free and schedulable(self.st.host(host_id)):
                view.take(((host_id, tuple(free)),))
                self.wakeups.append(t + settle)

    # ----------------------------------------------------------- reservations
    def _reserve(self) -> None:
        """Plan reservations (``allot.core.reservations``) for the best-ordered large
        requests: per allocation its first request of at least one whole host, if the
        allocation is below its entitlement (tier 0) or the request has waited
        ``reservation_after_s``; in queue order, within the policy's bounds. Each holds
        its hosts for the rest of the cycle (see ``_consider`` and ``_backfill``)."""
        policy = self.policy
        largest = self.st.pool_max_gpus.get(DEFAULT_POOL)
        if not largest or policy.max_reservations == 0:
            return
        queue = self.queue
        minimum = max(largest, policy.reservation_min_gpus)
        candidates: list[tuple[tuple[object, ...], Workload]] = []
        for group, items in queue.groups.items():
            if group is None or queue.max_gpus_from(group, 0) < minimum:
                continue
            tier = self._tier(group)
            for _, w in items:
                if w.gpus < minimum or self._held_back(w):
                    continue
                if tier == 0 or self.now - w.submit_time >= policy.reservation_after_s:
                    key = (tier, self.order.get(group, WORST_ORDER), w.submit_time, w.id)
                    candidates.append((key, w))
                    self._reservation_tier[w.id] = tier
                break
        candidates.sort(key=lambda c: c[0])
        budget = policy.reservation_max_share * self.st.healthy_gpus
        for _, w in candidates:
            if len(self.reservations) >= policy.max_reservations:
                break
            if w.gpus > budget:
                continue
            rule = self._reservation_rule(w, ignore_protection=True)
            planned = plan_reservation(self.view, DEFAULT_POOL, w.gpus, rule)
            if planned is None:
                continue
            start_at, options = planned
            victims = tuple({r.wid: r for o in options for r in o.victims}.values())
            free = tuple(sorted((o.host, o.free) for o in options if o.free))
            hosts = tuple(sorted(o.host for o in options))
            reservation = Reservation(w.id, w.allocation, start_at, hosts, w.gpus)
            self.reservations.append(reservation)
            self._held[w.id] = (self.view.earmark(victims, free), reservation, victims)
            budget -= w.gpus

    def _backfill_plan(self, w: Workload, pool: str, rule: RequestRule) -> Plan | None:
        """A preemption plan that may use a reservation's held hosts, for work whose
        protection ends by the reservation's start (the latest reservation first): the
        hosts are given back for one plan, and whatever it does not take is held again."""
        view = self.view
        for handle, reservation, victims in self._holds_outlasting(w):
            free = view.held_free(handle)
            view.unhold(handle, free, victims)
            plan = plan_preemption(view, pool, w.gpus, rule)
            if plan is None:
                self._hold_again(reservation, free, victims, (), set())
                continue
            used = {r.wid for r in plan.victims}
            self._hold_again(reservation, free, victims, plan.free_taken, used)
            return plan
        return None

    def _holds_outlasting(self, w: Workload) -> list[tuple[int, Reservation, tuple[Running, ...]]]:
        """The holds whose reservation starts no earlier than ``w``'s protection would end
        (backfill candidates), the latest first."""
        ends = self.now + w.min_runtime_s
        held = [h for h in self._held.values() if h[1].start_at >= ends]
        return sorted(held, key=lambda h: (-h[1].start_at, h[1].workload_id))

    def _hold_again(
        self,
        reservation: Reservation,
        free: Assignment,
        victims: tuple[Running, ...],
        taken: Assignment,
        used: set[str],
    ) -> None:
        """Hold for ``reservation`` again what it held (``free``, ``victims``) after it was
        given back, except the GPUs ``taken`` and the victims ``used`` meanwhile and any
        GPU no longer free."""
        view = self.view
        gone = {h: set(g) for h, g in taken}
        still: list[tuple[str, tuple[int, ...]]] = []
        for host, gpus in free:
            free_now = set(view.free_of(host))
            kept = tuple(x for x in gpus if x in free_now and x not in gone.get(host, ()))
            if kept:
                still.append((host, kept))
        keep = tuple(r for r in victims if r.wid not in used)
        handle = view.earmark(keep, tuple(still))
        self._held[reservation.workload_id] = (handle, reservation, keep)

    def _backfill(self, w: Workload) -> Assignment | None:
        """Free GPUs a reservation holds, for allocated work on one host whose protection
        ends by the reservation's start (it is preemptible then): best fit over the held
        hosts, the latest reservation first."""
        if self._is_gang(w.gpus, DEFAULT_POOL):
            return None
        for handle, _, _ in self._holds_outlasting(w):
            fits = [(len(g), h, g) for h, g in self.view.held_free(handle) if len(g) >= w.gpus]
            if fits:
                _, host, gpus = min(fits)
                part = ((host, gpus[: w.gpus]),)
                self.view.unhold(handle, part)
                return part
        return None

    # ------------------------------------------------------------- preemption
    def _room_upper_bound(self, w: Workload) -> float:
        """More GPUs than any preemption plan for ``w`` can find (a cheap test that skips
        hopeless plans; it changes no decision): free GPUs on schedulable hosts, plus all
        unallocated work, plus everything held by other allocations above their
        entitlement, plus work already under notice, all as of the cycle's start (room
        only shrinks during a cycle). Fair Tree only; a plugged-in ordering gets infinity."""
        if not self._fair_tree or w.allocation is None:
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
            # This cycle's idle notices are room as well (drains' are on hosts no request
            # may use).
            for wid in (*st.noticed, *self._idle_noticed):
                run = st.running[wid].workload
                key = run.allocation if is_allocated(run) else None
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
        if self._held_back(w) or w.id in self._reserved_turns:
            return  # it may not take allocated work, or it holds a reservation
        self.earmarked_for.add(alloc)
        self._due_earmarks.append((w, pool, self._fair_share_rule(w, ignore_protection=True)))

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

    def _victim_rule(self, w: Workload) -> RequestRule:
        victims = self.policy.victims
        if victims is not None:
            return victims.rule(w, self.now)
        if w.id in self._reserved_turns:
            return self._reservation_rule(w, ignore_protection=False)
        return self._fair_share_rule(w, ignore_protection=False)

    def _reservation_rule(self, w: Workload, *, ignore_protection: bool) -> FairShareRule:
        """A reservation's victims: the hosts are chosen with this rule, and at the
        reservation's time the request preempts with it. For an allocation below its
        entitlement (tier 0), unallocated work and any other allocation's work over its
        entitlement (the reclaim rule, however large the request); otherwise its own rule
        (worse-ranked allocations' work beyond their entitlement)."""
        alloc = w.allocation
        assert alloc is not None
        reclaim = self._reservation_tier.get(w.id, 1) == 0
        return self._fair_share.rule(
            alloc, reclaim, ignore_protection=ignore_protection, for_reservation=True
        )

    def _fair_share_rule(self, w: Workload, *, ignore_protection: bool) -> FairShareRule:
        alloc = w.allocation
        assert alloc is not None
        allocated_victims = not self._held_back(w)
        key = (alloc, self._reclaims(w), ignore_protection, allocated_victims)
        rule = self._rules.get(key)
        if rule is None:
            rule = self._fair_share.rule(
                alloc,
                key[1],
                ignore_protection=ignore_protection,
                allocated_victims=allocated_victims,
            )
            self._rules[key] = rule
        return rule

    def _notice(
        self,
        run: Running,
        reason: PreemptReason,
        preemptor: str | None,
        *,
        touch: bool = True,
        requeue: bool = True,
    ) -> None:
        """``requeue``: False when the victim must not come back even if resumable."""
        w = run.workload
        at = self.now + self.policy.grace_of(is_allocated(w))
        self.view.notice(run, at, touch=touch)
        alloc = w.allocation if is_allocated(w) else None
        self.preemptions.append(
            Preemption(
                workload_id=w.id,
                allocation=alloc,
                gpus=w.gpus,
                reason=reason,
                preempt_at=at,
                requeue=requeue and w.resumable,
                preemptor=preemptor,
                victim_held_gpus=self.st.held.get(alloc, 0) if alloc else 0,
                victim_entitlement_gpus=self.entitlement.get(alloc, 0.0) if alloc else 0.0,
            )
        )


def _coverage(
    room: Assignment, victims: Iterable[Running]
) -> tuple[dict[str, int], dict[str, int]]:
    """Per host, the GPUs a request's room and its victims under notice hold, and those of
    its victims alone."""
    held: dict[str, int] = {}
    under_notice: dict[str, int] = {}
    for r in victims:
        for host_id, gpus in r.assignment:
            under_notice[host_id] = under_notice.get(host_id, 0) + len(gpus)
            held[host_id] = held.get(host_id, 0) + len(gpus)
    for host_id, gpus in room:
        held[host_id] = held.get(host_id, 0) + len(gpus)
    return held, under_notice
