"""Why a workload waits, why one was preempted, and what its queue position is made of.

``explain_pending`` gives every workload still pending after a cycle exactly one
``PendingReason`` with the numbers behind it. It does not replay the cycle: it asks, of the
snapshot the cycle read, a fixed sequence of questions and stops at the first "yes"
(``docs/reasons.md`` has the table):

0. ``starts-next-cycle`` (``dry_run`` only): ``result`` is a dry run of the cycle about to
   happen (the placement service answering ``allot queue``), and it places the workload.
1. ``waiting-for-notice``: the cycle reserved room for it on GPUs under notice.
2. ``too-large`` / ``hosts-draining``: its shape (one host, or g // G whole hosts plus one)
   fits no set of this pool's hosts even empty; ``hosts-draining`` when it would with the
   draining, drained or cordoned hosts back.
3. ``unallocated-idle-only`` (Fair Tree): unallocated work runs only on idle GPUs.
4. ``better-ranked-first``: it fit the free GPUs at the start of the cycle, or a preemption
   plan existed for it then: work ahead of it in the queue took that room this cycle.
5. ``protected-until``: a plan exists only if protection is ignored: it waits for the
   protected work it may take, until its protection ends.
6. ``over-entitlement``: its allocation is at or over its entitlement (or the request is
   mostly beyond it), so it may take only worse-ranked over-entitlement work: none exists.
7. ``no-host-large-enough``: none of the above: not enough free GPUs in its shape, and
   nothing it may preempt (or preemption is off).

Two answers come before these (after ``waiting-for-notice``): ``reserved-until`` when the
cycle holds a reservation for it (``allot.core.reservations``: its hosts and time), and
``after-preemption`` when it was requeued by a notice for another request less than
``Policy.requeue_hold_s`` ago and has no plan without allocated victims (meanwhile it may
not preempt allocated work: one request, one round of notices).

The questions use the core's own placement and preemption planner on a fresh read-only
``ClusterView`` of the snapshot, so a reason never claims room the planner would not find.
Held GPUs are counted after the cycle's placements (what the next cycle will see).

``estimated_start(why, now)`` turns a reason into an ESTIMATE of the start: the notice
deadline, the protection end, ``now`` for ``starts-next-cycle``, else None (running work
declares no time limit, so nothing else bounds it).

Cost. Per pool, the free GPUs, the largest free block and the host sizes are read once;
the shape and free-fit questions are memoised per (pool, GPUs); past the reservation check
the whole answer is memoised per (allocation, GPUs) (one ``Why``, read-only, serves every
workload with that key); plans are memoised per victim rule and size, and a size between
one a plan was found for and one it was not is decided by the cycle's monotone bound
without planning. A queue of 10,000 costs about one pass over it (docs/decisions/0022).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from allot.core.cycle import Snapshot, hold_until, victims_held_for
from allot.core.decisions import CycleResult, Preemption, PreemptReason
from allot.core.duration_text import format_duration
from allot.core.model import Workload
from allot.core.placement import ClusterView
from allot.core.policy import Policy
from allot.core.preemption import Plan, VictimRule, plan_preemption
from allot.core.queue_view import TIER_NAMES, UNALLOCATED, QueueEntry, queue_order
from allot.core.running import Running, is_allocated
from allot.core.state import DEFAULT_POOL, ClusterState, schedulable
from allot.core.victims import FairShareVictims, reclaims

Number = float | int | str
_NEVER = 1 << 62  # no failed plan size yet
HOLDERS_NAMED = 5  # ``room-held`` names this many requests, then counts the rest


class PendingReason(StrEnum):
    STARTS_NEXT_CYCLE = "starts-next-cycle"
    WAITING_FOR_NOTICE = "waiting-for-notice"
    TOO_LARGE = "too-large"
    HOSTS_DRAINING = "hosts-draining"
    UNALLOCATED_IDLE_ONLY = "unallocated-idle-only"
    BETTER_RANKED_FIRST = "better-ranked-first"
    PROTECTED_UNTIL = "protected-until"
    OVER_ENTITLEMENT = "over-entitlement"
    NO_HOST_LARGE_ENOUGH = "no-host-large-enough"
    RESERVED_UNTIL = "reserved-until"
    AFTER_PREEMPTION = "after-preemption"
    ROOM_HELD = "room-held"


@dataclass(frozen=True, slots=True)
class Why:
    """One pending workload's reason: the code, the numbers behind it, one human line."""

    code: PendingReason
    numbers: Mapping[str, Number]
    text: str


@dataclass(frozen=True, slots=True)
class PrioRow:
    """``allot prio``: one pending workload's sort key broken into its inputs (``sprio -l``).

    ``sort_key`` lists the inputs in precedence order (smaller first): Fair Tree
    ``(class, tier, order_key, -priority, submit_time, id)`` with class 0 allocated and 1
    unallocated; a plugged-in ordering its ``key`` (FIFO ``(submit_time, id)``).
    Allocations with equal order keys are interleaved by the submit time of their heads,
    exactly as the cycle merges them; ``position`` is authoritative."""

    position: int
    workload_id: str
    allocation: str | None
    user: str
    gpus: int
    tier: int  # 0 under entitlement, 1 at or over, 2 unallocated
    tier_name: str
    held: int  # GPUs the allocation holds now (0 for unallocated work)
    entitlement: float  # effective share x GPUs on healthy hosts
    order_key: int | None  # Fair Tree order of the allocation (smaller first)
    rank: int | None
    fairshare: float | None
    priority: int
    age_s: float
    sort_key: tuple[object, ...]


# ----------------------------------------------------------------------------- pending


def explain_pending(
    snapshot: Snapshot,
    policy: Policy,
    now: float,
    result: CycleResult,
    *,
    dry_run: bool = False,
    entries: Sequence[QueueEntry] | None = None,
) -> dict[str, Why]:
    """Workload id -> why it is still pending after ``result``, for every workload of
    ``snapshot.queue`` that ``result`` did not place, in queue order. Reads only.

    ``dry_run``: ``result`` is ``run_cycle`` of this very snapshot, not yet acted on (the
    placement service explaining its queue between cycles): the workloads it places are
    still pending, and get ``starts-next-cycle``. ``entries``: ``queue_order(snapshot,
    policy)`` when the caller has it already (it is not computed twice)."""
    return _Explainer(snapshot, policy, now, result).run(dry_run, entries)


def estimated_start(why: Why, now: float) -> float | None:
    """An ESTIMATE of when the workload starts, from its reason: the notice deadline
    (``waiting-for-notice``), the protection end (``protected-until``, ``reserved-until``),
    ``now``
    (``starts-next-cycle``); None for the other codes, which nothing bounds (running work
    declares no time limit). Work ahead of it may still take the room first."""
    if why.code is PendingReason.STARTS_NEXT_CYCLE:
        return now
    key = {
        PendingReason.WAITING_FOR_NOTICE: "deadline",
        PendingReason.PROTECTED_UNTIL: "until",
        PendingReason.RESERVED_UNTIL: "until",
    }
    name = key.get(why.code)
    if name is None:
        return None
    value = why.numbers.get(name)
    return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True, slots=True)
class _Pool:
    """A pool's hosts as the cycle found them (read once per explanation)."""

    healthy: list[int]  # GPUs of each schedulable host
    down: list[int]  # GPUs of each draining, drained or cordoned host
    free: int  # free GPUs on schedulable hosts
    block: int  # the largest free block on one schedulable host


class _Explainer:
    def __init__(self, snapshot: Snapshot, policy: Policy, now: float, result: CycleResult):
        self.snap = snapshot
        self.st: ClusterState = snapshot.cluster
        self.policy = policy
        self.now = now
        self.result = result
        self.view = ClusterView(self.st, now)  # start of the cycle; read-only use
        self.fair_tree = policy.fair_tree
        self.tiered = policy.fair_tree and policy.entitlement_tier
        capacity = self.st.healthy_gpus
        self.entitlement = {a: s * capacity for a, s in snapshot.shares.items()}
        self.fair_share = FairShareVictims(
            snapshot.order,
            self.entitlement,
            policy.entitlement_tier,
            now,
            keep_gangs=policy.keep_gangs_at_entitlement,
            keep_large_gangs=policy.keep_large_gangs,
        )
        self.held = dict(self.st.held)
        placed_gpus: dict[str, int] = {}
        for p in result.placements:
            for host_id, gpus in p.assignment:
                pool = self.st.pool_of[host_id]
                placed_gpus[pool] = placed_gpus.get(pool, 0) + len(gpus)
            if is_allocated(p.workload) and p.workload.allocation is not None:
                a = p.workload.allocation
                self.held[a] = self.held.get(a, 0) + p.workload.gpus
        self.placed_gpus = placed_gpus
        self.placed = {p.workload.id: p for p in result.placements}
        self.waiting = dict(result.waiting_on)
        self.notice_at = {p.workload_id: p.preempt_at for p in result.preemptions}
        self.reserved = {r.workload_id: r for r in result.reservations}
        self._plans: dict[tuple[object, ...], Plan | None] = {}
        # Requests whose notices made room (``allot.core.cycle._hold_own_victims``): the
        # free GPUs their victims left or their plans took, and their victims still under
        # notice, are no other request's; request id -> when the hold lapses at the latest.
        self.holders: dict[str, float] = {r.workload_id: r.until for r in result.rooms}
        self.own_victims: list[Running] = []
        for for_id, runs in victims_held_for(self.st, snapshot.queue).items():
            self.own_victims += runs
            until = hold_until(runs, None, now, policy.grace_s)
            self.holders[for_id] = max(until, self.holders.get(for_id, until))
        self._held_view: ClusterView | None = None
        self._held_answers: dict[tuple[object, ...], bool] = {}
        self._pools: dict[str, _Pool] = {}
        self._fits: dict[tuple[str, int], bool] = {}  # shape fits the empty healthy hosts
        self._free_fits: dict[tuple[str, int], bool] = {}  # fits the free GPUs
        self._answers: dict[tuple[object, ...], Why] = {}
        # Per victim rule: the largest size a plan was found for, the smallest it was not.
        self._plan_bounds: dict[tuple[object, ...], tuple[int, int]] = {}
        # Allocation -> GPUs of its gangs the keep rules shield from reclaims (lazily).
        self._kept: dict[str, int] | None = None

    def run(self, include_placed: bool, entries: Sequence[QueueEntry] | None) -> dict[str, Why]:
        out: dict[str, Why] = {}
        if entries is None:
            entries = queue_order(self.snap, self.policy)
        for entry in entries:
            w = entry.workload
            placement = self.placed.get(w.id)
            if placement is None:
                out[w.id] = self.explain(w)
            elif include_placed:
                hosts = [h for h, _ in placement.assignment]
                out[w.id] = _why(
                    PendingReason.STARTS_NEXT_CYCLE,
                    requested=w.gpus,
                    hosts=",".join(hosts),
                    host_count=len(hosts),
                    starting_workloads=len(self.placed),
                )
        return out

    def explain(self, w: Workload) -> Why:
        if w.id in self.waiting:
            return self._waiting(w, self.waiting[w.id])
        reservation = self.reserved.get(w.id)
        if reservation is not None:
            return _why(
                PendingReason.RESERVED_UNTIL,
                requested=w.gpus,
                until=reservation.start_at,
                in_s=max(0.0, reservation.start_at - self.now),
                hosts=",".join(reservation.hosts),
                host_count=len(reservation.hosts),
            )
        preempted_for = self.snap.queue.preempted_for.get(w.id)
        if preempted_for is not None and self._held_back(w) and self.fair_tree and is_allocated(w):
            pool = self._pool(w)
            if not (self._fits_free(pool, w.gpus) or self._plan_exists(w, pool)):
                preemptor, deadline = preempted_for
                until = deadline + self.policy.requeue_hold_s
                return _why(
                    PendingReason.AFTER_PREEMPTION,
                    requested=w.gpus,
                    preemptor=preemptor,
                    until=until,
                    in_s=until - self.now,
                )
        # Past the reservation, the answer depends on the request's size and allocation
        # (and a plugged-in victim rule, and whether it is held back after a preemption)
        # only, never on its id: one Why serves every workload with the same key (10,000
        # pending hold a few hundred keys).
        if w.id in self.holders:
            return self._explain(w, holder=True)  # its own room is no reason to wait
        key = (w.allocation, is_allocated(w), w.gpus, self._plugged_rule(w), self._held_back(w))
        why = self._answers.get(key)
        if why is None:
            why = self._answers[key] = self._explain(w)
        return why

    def _explain(self, w: Workload, *, holder: bool = False) -> Why:
        g = w.gpus
        pool = self._pool(w)
        shape = self._shape(w, pool)
        if shape is not None:
            return shape
        free, block = self._free(pool)
        if self.fair_tree and not is_allocated(w):
            return _why(
                PendingReason.UNALLOCATED_IDLE_ONLY,
                requested=g,
                free_gpus=free,
                largest_free_block=block,
                placed_gpus=self.placed_gpus.get(pool, 0),
            )
        may_preempt = self.policy.preempts and (is_allocated(w) or not self.fair_tree)
        if self._fits_free(pool, g) or (may_preempt and self._plan_exists(w, pool)):
            if self.holders and not holder and not self._room_outside_holds(w, pool, may_preempt):
                return self._room_held(w)
            return _why(
                PendingReason.BETTER_RANKED_FIRST,
                requested=g,
                free_gpus=free,
                largest_free_block=block,
                placed_gpus=self.placed_gpus.get(pool, 0),
                placed_workloads=len(self.result.placements),
                waiting_requesters=len(self.waiting),
            )
        alloc = w.allocation if is_allocated(w) else None
        held = self.held.get(alloc, 0) if alloc else 0
        entitlement = self.entitlement.get(alloc, 0.0) if alloc else 0.0
        if may_preempt and self.fair_tree:
            plan = self._plan(w, pool, ignore_protection=True)
            until = self._protection_end(plan) if plan is not None else None
            if plan is not None and until is not None:
                protected = [r for r in plan.victims if r.protected(self.now)]
                return _why(
                    PendingReason.PROTECTED_UNTIL,
                    requested=g,
                    until=until,
                    in_s=until - self.now,
                    protected_gpus=sum(r.workload.gpus for r in protected),
                    hosts=",".join(plan.hosts),
                    held=held,
                    entitlement=entitlement,
                )
        # A request that does not reclaim competes by Fair Tree rank only (cycle step 4).
        if alloc is not None and self.tiered and not self._reclaims(alloc, g):
            return _why(
                PendingReason.OVER_ENTITLEMENT,
                allocation=alloc,
                requested=g,
                held=held,
                entitlement=entitlement,
                owed=max(0.0, entitlement - held),
            )
        numbers: dict[str, Number] = {
            "requested": g,
            "free_gpus": free,
            "largest_free_block": block,
            "largest_host": self.st.pool_max_gpus.get(pool, 0),
            "preemption": "on" if may_preempt else "off",
        }
        if may_preempt and alloc is not None and self._reclaims(alloc, g):
            kept = self._kept_gang_gpus(alloc)
            if kept:
                numbers["kept_gang_gpus"] = kept
        return _why(PendingReason.NO_HOST_LARGE_ENOUGH, **numbers)

    # ------------------------------------------------------------------ codes
    def _waiting(self, w: Workload, victims: tuple[str, ...]) -> Why:
        deadlines: list[float] = []
        victim_gpus = 0
        for wid in victims:
            run = self.st.running.get(wid)
            at = self.notice_at.get(wid, run.preempt_at if run is not None else None)
            if at is not None:
                deadlines.append(at)
            if run is not None:
                victim_gpus += run.workload.gpus
        deadline = max(deadlines, default=self.now)
        return _why(
            PendingReason.WAITING_FOR_NOTICE,
            requested=w.gpus,
            victims=",".join(victims),
            victim_count=len(victims),
            victim_gpus=victim_gpus,
            deadline=deadline,
            in_s=max(0.0, deadline - self.now),
        )

    def _room_held(self, w: Workload) -> Why:
        holders = sorted(self.holders)
        until = max(self.holders.values())
        room = sum(len(g) for r in self.result.rooms for _, g in r.gpus)
        room += sum(r.workload.gpus for r in self.own_victims)
        return _why(
            PendingReason.ROOM_HELD,
            requested=w.gpus,
            holders=",".join(holders[:HOLDERS_NAMED]),
            holder_count=len(holders),
            room_gpus=room,
            until=until,
            in_s=max(0.0, until - self.now),
        )

    def _room_outside_holds(self, w: Workload, pool: str, may_preempt: bool) -> bool:
        """Whether ``w`` fits, or a plan exists for it, with the holds the cycle made before
        its walk taken out of the view (memoised per victim rule and size)."""
        key = (self._rule_key(w, pool, False), w.gpus) if may_preempt else (pool, w.gpus)
        answer = self._held_answers.get(key)
        if answer is None:
            view = self._held_view
            if view is None:
                view = self._held_view = ClusterView(self.st, self.now)
                if self.own_victims:
                    view.reserve(self.own_victims, ())
                for r in self.result.rooms:
                    view.take(r.gpus)
            answer = view.find_fit(pool, w.gpus) is not None or (
                may_preempt
                and plan_preemption(view, pool, w.gpus, self._rule(w, False)) is not None
            )
            self._held_answers[key] = answer
        return answer

    def _shape(self, w: Workload, pool: str) -> Why | None:
        """``too-large`` or ``hosts-draining`` when no set of the pool's healthy hosts, even
        empty, has the request's shape."""
        info = self._pool_info(pool)
        key = (pool, w.gpus)
        fits = self._fits.get(key)
        if fits is None:
            fits = self._fits[key] = fits_empty(info.healthy, w.gpus)
        if fits:
            return None
        if fits_empty(info.healthy + info.down, w.gpus):
            return _why(
                PendingReason.HOSTS_DRAINING,
                requested=w.gpus,
                healthy_gpus=sum(info.healthy),
                unavailable_hosts=len(info.down),
                unavailable_gpus=sum(info.down),
            )
        sizes = info.healthy + info.down
        largest = max(sizes, default=0)
        return _why(
            PendingReason.TOO_LARGE,
            requested=w.gpus,
            largest_host=largest,
            hosts_of_largest=sizes.count(largest),
            cluster_gpus=sum(sizes),
        )

    # ---------------------------------------------------------------- helpers
    def _pool(self, w: Workload) -> str:
        """The pool the cycle places ``w`` in."""
        ordering = self.policy.ordering
        return DEFAULT_POOL if ordering is None else ordering.pool(w, self.st)

    def _free(self, pool: str) -> tuple[int, int]:
        """Free GPUs and the largest free block on the pool's schedulable hosts."""
        info = self._pool_info(pool)
        return info.free, info.block

    def _fits_free(self, pool: str, gpus: int) -> bool:
        """Whether the request fit the free GPUs at the start of the cycle (memoised: the
        view is only read, so the answer depends on the pool and the size alone)."""
        key = (pool, gpus)
        fits = self._free_fits.get(key)
        if fits is None:
            fits = self._free_fits[key] = self.view.find_fit(pool, gpus) is not None
        return fits

    def _pool_info(self, pool: str) -> _Pool:
        info = self._pools.get(pool)
        if info is None:
            healthy: list[int] = []
            down: list[int] = []
            free = block = 0
            for h in self.st.hosts:
                if self.st.pool_of[h.id] != pool:
                    continue
                if schedulable(h):
                    healthy.append(h.gpus)
                    n = len(self.st.free[h.id])
                    free += n
                    block = max(block, n)
                else:
                    down.append(h.gpus)
            info = self._pools[pool] = _Pool(healthy, down, free, block)
        return info

    def _kept_gang_gpus(self, requester: str) -> int:
        """GPUs of other allocations' gangs past their protection that a reclaim could take
        but for the policy's keep rules (``keep_large_gangs``, ``keep_gangs_at_entitlement``:
        taking one would leave its team below its share). One pass over the running work,
        the first time a reclaiming request asks."""
        if self._kept is None:
            self._kept = {}
            if self.policy.keep_large_gangs or self.policy.keep_gangs_at_entitlement:
                keep = self.fair_share.rule("", True)
                take = FairShareVictims(
                    self.snap.order, self.entitlement, self.policy.entitlement_tier, self.now
                )
                rule = take.rule("", True)
                # The GPUs each allocation keeps after this cycle: its placements counted
                # (``self.held``), the work it noticed gone.
                held = dict(self.held)
                for p in self.result.preemptions:
                    if p.allocation:  # set only for allocated victims
                        held[p.allocation] = held.get(p.allocation, 0) - p.gpus
                for run in self.st.running.values():
                    a = run.workload.allocation
                    if a is None or len(run.assignment) < 2 or run.preempt_at is not None:
                        continue
                    if run.workload.id in self.notice_at:  # noticed this cycle
                        continue
                    if keep.key(run, held) is None and rule.key(run, held) is not None:
                        self._kept[a] = self._kept.get(a, 0) + run.workload.gpus
        return sum(gpus for a, gpus in self._kept.items() if a != requester)

    def _reclaims(self, alloc: str, gpus: int) -> bool:
        """The cycle's rule (``allot.core.victims.reclaims``) with the held GPUs after this
        cycle's placements; never with the tier off."""
        if not self.tiered:
            return False
        return reclaims(self.held.get(alloc, 0), self.entitlement.get(alloc, 0.0), gpus)

    def _held_back(self, w: Workload) -> bool:
        return self.snap.queue.held_back(w.id, self.now, self.policy.requeue_hold_s)

    def _plugged_rule(self, w: Workload) -> VictimRule | None:
        """The plugged-in victim rule of ``w`` (hashable: it keys the memos); None under
        Fair Tree, whose rule follows from the allocation and the size."""
        victims = self.policy.victims
        return None if victims is None else victims.rule(w, self.now)

    def _rule(self, w: Workload, ignore_protection: bool) -> VictimRule:
        plugged = self._plugged_rule(w)
        if plugged is not None:
            return plugged
        alloc = w.allocation
        assert alloc is not None
        reclaiming = self._reclaims(alloc, w.gpus)
        return self.fair_share.rule(
            alloc,
            reclaiming,
            ignore_protection=ignore_protection,
            allocated_victims=not self._held_back(w),
        )

    def _rule_key(self, w: Workload, pool: str, ignore_protection: bool) -> tuple[object, ...]:
        """What the victim rule depends on (besides the view, which is read-only)."""
        plugged = self._plugged_rule(w)
        if plugged is not None:
            return (pool, plugged)
        a = w.allocation
        restricted = self._held_back(w)
        return (pool, a, self._reclaims(a or "", w.gpus), ignore_protection, restricted)

    def _plan(self, w: Workload, pool: str, *, ignore_protection: bool) -> Plan | None:
        """A preemption plan on the snapshot as the cycle found it (memoised: the answer
        depends only on the rule's inputs and the request's size)."""
        key = (self._rule_key(w, pool, ignore_protection), w.gpus)
        if key not in self._plans:
            rule = self._rule(w, ignore_protection)
            plan = self._plans[key] = plan_preemption(self.view, pool, w.gpus, rule)
            ok, failed = self._plan_bounds.get(key[0], (0, _NEVER))
            if plan is None:
                self._plan_bounds[key[0]] = (ok, min(failed, w.gpus))
            else:
                self._plan_bounds[key[0]] = (max(ok, w.gpus), failed)
        return self._plans[key]

    def _plan_exists(self, w: Workload, pool: str) -> bool:
        """Whether a plan (protection respected) exists, without building one when the
        sizes already planned for the same rule decide it: on one view a rule's victims do
        not depend on the request, so a plan for g GPUs means one for fewer, and none for g
        means none for more (the cycle's own monotone bound, ``allot.core.cycle``)."""
        ok, failed = self._plan_bounds.get(self._rule_key(w, pool, False), (0, _NEVER))
        if w.gpus <= ok:
            return True
        if w.gpus >= failed:
            return False
        return self._plan(w, pool, ignore_protection=False) is not None

    def _protection_end(self, plan: Plan) -> float | None:
        """When the plan's protected victims are all past their protection (the room then
        exists); the cluster's next protection end if none is protected; None if neither."""
        ends = [r.protected_until for r in plan.victims if r.protected(self.now)]
        if ends:
            return max(ends)
        return self.st.next_protection_end(self.now)


def fits_empty(sizes: list[int], gpus: int) -> bool:
    """Whether hosts of these sizes, all empty, hold a request of ``gpus`` in the placement
    shape: one host when gpus <= the largest G, else gpus // G hosts of size G plus one more
    host for the remainder."""
    if not sizes:
        return False
    largest = max(sizes)
    if gpus <= largest:
        return True
    whole, rest = divmod(gpus, largest)
    n_largest = sizes.count(largest)
    if n_largest < whole:
        return False
    return rest == 0 or n_largest > whole or any(rest <= s < largest for s in sizes)


# ------------------------------------------------------------------------------- text


def _why(code: PendingReason, **numbers: Number) -> Why:
    # Read-only: one Why may explain many workloads (see ``_Explainer.explain``).
    frozen = MappingProxyType(numbers)
    return Why(code, frozen, _TEXT[code](frozen))


def _num(x: Number) -> str:
    if isinstance(x, float):
        return f"{x:.1f}"
    return str(x)


def _better_ranked_text(n: Mapping[str, Number]) -> str:
    if not n["placed_workloads"] and not n["waiting_requesters"]:
        # Nothing started and nothing reserved: the room went to an earmark (a reclaiming
        # request ahead of it, blocked by protected work, holds those hosts) or was just
        # reclaimed for another request of the allocation that lost it.
        return (
            f"needs {n['requested']} GPUs: the room it could use is held back for work "
            "ahead of it (earmarked behind protected work, or just reclaimed for another "
            "request)"
        )
    return (
        f"work ahead of it took the room this cycle: {n['placed_workloads']} started on "
        f"{n['placed_gpus']} of {n['free_gpus']} free GPUs, {n['waiting_requesters']} "
        f"wait on notices; needs {n['requested']}"
    )


_TEXT: dict[PendingReason, Callable[[Mapping[str, Number]], str]] = {
    PendingReason.STARTS_NEXT_CYCLE: lambda n: (
        f"starts at the next cycle on {n['hosts']} ({n['requested']} GPUs free there now)"
    ),
    PendingReason.WAITING_FOR_NOTICE: lambda n: (
        f"room reserved: {n['victim_count']} run(s) holding {n['victim_gpus']} GPUs "
        f"({n['victims']}) are under preemption notice, gone in {format_duration(float(n['in_s']))}"
    ),
    PendingReason.TOO_LARGE: lambda n: (
        f"needs {n['requested']} GPUs: more than the cluster can hold in one placement "
        f"({n['hosts_of_largest']} host(s) of {n['largest_host']} GPUs, "
        f"{n['cluster_gpus']} GPUs in all)"
    ),
    PendingReason.HOSTS_DRAINING: lambda n: (
        f"needs {n['requested']} GPUs: only {n['healthy_gpus']} on healthy hosts; "
        f"{n['unavailable_hosts']} host(s) with {n['unavailable_gpus']} GPUs are draining "
        "or out of service"
    ),
    PendingReason.UNALLOCATED_IDLE_ONLY: lambda n: (
        f"unallocated: runs only on idle GPUs; needs {n['requested']}, "
        f"{n['free_gpus']} free (largest block {n['largest_free_block']}), "
        f"{n['placed_gpus']} just given to other work"
    ),
    PendingReason.BETTER_RANKED_FIRST: _better_ranked_text,
    PendingReason.PROTECTED_UNTIL: lambda n: (
        f"room only behind protected work ({n['protected_gpus']} GPUs on {n['hosts']}) "
        f"until its protection ends in {format_duration(float(n['in_s']))}; "
        f"allocation holds {n['held']} of {_num(n['entitlement'])} entitled"
    ),
    PendingReason.OVER_ENTITLEMENT: lambda n: (
        f"{n['allocation']} holds {n['held']} of {_num(n['entitlement'])} entitled GPUs "
        f"(owed {_num(n['owed'])}, asks {n['requested']}): it may take only unprotected "
        "work of allocations ranked below it and over their entitlement, and none runs "
        "any (work of allocations ranked as well or better is never its victim)"
    ),
    PendingReason.RESERVED_UNTIL: lambda n: (
        f"needs {n['requested']} GPUs: {n['host_count']} host(s) ({n['hosts']}) are held "
        f"for it and it starts there when their protection ends, in "
        f"{format_duration(float(n['in_s']))}; only work that ends by then may use them"
    ),
    PendingReason.AFTER_PREEMPTION: lambda n: (
        f"it was preempted for {n['preemptor']}: for {format_duration(float(n['in_s']))} "
        f"more it may take free GPUs and unallocated work only, not preempt allocated work "
        f"(one request, one round of notices); needs {n['requested']}"
    ),
    PendingReason.ROOM_HELD: lambda n: (
        f"needs {n['requested']} GPUs: the room it could use ({n['room_gpus']} GPUs, free or "
        f"under notice) is held for {n['holders']}"
        + (
            f" and {int(n['holder_count']) - HOLDERS_NAMED} more"
            if int(n["holder_count"]) > HOLDERS_NAMED
            else ""
        )
        + ", whose notices made it (one request, one round of notices), until their turn "
        f"or at most {format_duration(float(n['in_s']))}"
    ),
    PendingReason.NO_HOST_LARGE_ENOUGH: lambda n: (
        f"needs {n['requested']} GPUs, {n['free_gpus']} free (largest block "
        f"{n['largest_free_block']} on hosts of {n['largest_host']}), and no work it may "
        f"preempt (preemption {n['preemption']})"
        + (
            f"; {n['kept_gang_gpus']} GPUs run in gangs a reclaim may not take (taking one "
            "would leave its team below its share)"
            if "kept_gang_gpus" in n
            else ""
        )
    ),
}


# ------------------------------------------------------------------------- preemption

PREEMPT_TEXT: dict[PreemptReason, str] = {
    PreemptReason.RECLAIMED_FOR_ENTITLEMENT: "reclaimed for an allocation below its entitlement",
    PreemptReason.BETTER_RANKED: "taken by a better-ranked allocation",
    PreemptReason.HOST_DRAIN: "its host is draining and its protection has ended",
    PreemptReason.DISPLACED_UNALLOCATED: "unallocated work displaced by allocated work",
    PreemptReason.HIGHER_CLASS: "taken by a higher priority class (legacy policy)",
    PreemptReason.RESERVATION: "its host was reserved for a large request, which starts now",
    PreemptReason.IDLE: "its GPUs were flagged idle and its protection has ended",
}
"""One line per preemption reason (``docs/reasons.md``): the CLI, the dashboard."""


def explain_preemption(p: Preemption, now: float | None = None) -> str:
    """One line: who, why, for whom, the victim allocation's numbers, and the deadline
    (relative to ``now`` when given)."""
    owner = p.allocation or "unallocated"
    parts = [
        f"{p.workload_id} ({p.gpus} GPUs, {owner}): {p.reason.value}: {PREEMPT_TEXT[p.reason]}"
    ]
    if p.preemptor is not None:
        parts.append(f"for {p.preemptor}")
    if p.allocation is not None:
        parts.append(
            f"{p.allocation} held {p.victim_held_gpus} of {p.victim_entitlement_gpus:.1f} "
            "entitled GPUs"
        )
    when = (
        f"in {format_duration(max(0.0, p.preempt_at - now))}"
        if now is not None
        else f"at t={p.preempt_at:.0f}"
    )
    parts.append(f"leaves {when}, " + ("requeued" if p.requeue else "not requeued"))
    return "; ".join(parts)


# ------------------------------------------------------------------------------- prio


def priority_breakdown(
    snapshot: Snapshot,
    policy: Policy,
    now: float,
    fairshare: Mapping[str, float] | None = None,
    rank: Mapping[str, int] | None = None,
) -> list[PrioRow]:
    """``allot prio``: every pending workload in ``queue_order``, with the inputs of its
    position (tier and why, Fair Tree order and factor, user priority, age)."""
    st = snapshot.cluster
    capacity = st.healthy_gpus
    rows: list[PrioRow] = []
    for e in queue_order(snapshot, policy):
        w = e.workload
        alloc = w.allocation if is_allocated(w) else None
        tier = UNALLOCATED if alloc is None else e.tier
        if policy.ordering is not None:
            key = policy.ordering.key(w)
        elif alloc is None:
            key = (1, 0, 0, 0, w.submit_time, w.id)
        else:
            key = (0, tier, e.order_key, -w.priority, w.submit_time, w.id)
        rows.append(
            PrioRow(
                position=e.position,
                workload_id=w.id,
                allocation=w.allocation,
                user=w.user,
                gpus=w.gpus,
                tier=tier,
                tier_name=TIER_NAMES[tier],
                held=st.held.get(alloc, 0) if alloc else 0,
                entitlement=snapshot.shares.get(alloc, 0.0) * capacity if alloc else 0.0,
                order_key=e.order_key if alloc is not None else None,
                rank=(rank or {}).get(alloc) if alloc else None,
                fairshare=(fairshare or {}).get(alloc) if alloc else None,
                priority=w.priority,
                age_s=now - w.submit_time,
                sort_key=key,
            )
        )
    return rows
