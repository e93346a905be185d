"""The simulator's baselines: the policies Allot is compared with, plugged into the core's
``run_cycle`` (an ``Ordering``, and ``Victims`` for the legacy system; see
``allot.core.policy``). They share its placement, gang rules, grace periods and drains and
differ only in queue order, pools and who may preempt whom:

- ``priority`` (``LegacyPriority``): the legacy system of the seeds. Workloads carry a
  class (trace column ``legacy_class``: HIGH 2, NORMAL 1, LOW 0, put in
  ``Workload.priority``) and may opt out of preemption (``legacy_protected``); a team may
  hold at most ``protected_gpu_cap`` opted-out GPUs at once (the rest run unshielded).
  Queue: class, then submit time. A request preempts unshielded work of a strictly lower
  class, protected or not (the legacy system had no minimum-runtime contract). A drain
  cannot remove shielded work: operators had to negotiate it (the seeds' on-call toil).
- ``fifo``: the core's ``FIFO``: one queue by submit time, greedy backfill, no preemption.
- ``partitioned`` (``Partitioned``): each team owns a fixed set of hosts (the cluster file's
  ``partitions``: a pool per team); FIFO with backfill inside each; no preemption. Work of a
  team with no hosts, and unallocated work, uses the hosts no team owns (pool ``""``).

``named_policy`` builds every policy of ``allot simulate --policy``; ``baseline_of`` gives
the engine what a policy needs besides ``run_cycle`` (``Baseline``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace

from allot.core.budgets import BudgetTree
from allot.core.decisions import Placement, PreemptReason
from allot.core.errors import ValidationError
from allot.core.model import DEFAULT_UNALLOCATED_GRACE_S, Workload
from allot.core.policy import DEFAULT_UNALLOCATED_SETTLE_S, Fifo, Policy, Reach, make_policy
from allot.core.running import Running
from allot.core.state import DEFAULT_POOL, ClusterState, PendingQueue
from allot.sim.cluster import ClusterSpec
from allot.sim.trace import TraceJob

LEGACY_CLASSES = {"HIGH": 2, "NORMAL": 1, "LOW": 0}

POLICY_NAMES = (
    "fairshare",
    "fairshare-window",
    "fairshare-no-reservations",
    "fairshare-keep-gangs",
    "fairshare-reclaim-gangs",
    "priority",
    "fifo",
    "partitioned",
    "fifo-strict",
    "partitioned-strict",
)


def named_policy(
    name: str,
    tree: BudgetTree,
    capacity_gpus: int,
    grace_s: int,
    *,
    unallocated_grace_s: int = DEFAULT_UNALLOCATED_GRACE_S,
    unallocated_settle_s: float = DEFAULT_UNALLOCATED_SETTLE_S,
) -> Policy:
    """The named policies of ``allot simulate --policy``: the placement service's
    (``allot.core.policy.make_policy``, which alone read the unallocated knobs) and the
    baselines."""
    if name not in POLICY_NAMES:
        raise ValueError(f"policy: unknown policy {name!r}")
    if name == "priority":
        # The seeds' legacy system capped each team's concurrently protected GPUs; we cap
        # it at the team's share of the cluster, the most generous reading.
        caps = {
            leaf: round(share * capacity_gpus) for leaf, share in tree.effective_shares().items()
        }
        legacy = LegacyPriority(caps)
        return Policy(grace_s=grace_s, ordering=legacy, victims=legacy)
    if name == "partitioned":
        return Policy(preemption=False, grace_s=grace_s, ordering=PARTITIONED)
    if name == "fifo-strict":
        return Policy(preemption=False, grace_s=grace_s, ordering=STRICT_FIFO)
    if name == "partitioned-strict":
        return Policy(preemption=False, grace_s=grace_s, ordering=STRICT_PARTITIONED)
    return make_policy(name, grace_s, unallocated_grace_s, unallocated_settle_s)


class Baseline:
    """What a simulation does for its policy besides ``run_cycle``. This default (Allot's
    policies, FIFO) does nothing."""

    def start(self, policy: Policy) -> tuple[Baseline, Policy]:
        """This baseline for one simulation, and the policy its cycles run with (a
        baseline with state starts afresh)."""
        return self, policy

    def pools(self, cluster: ClusterSpec) -> dict[str, str] | None:
        """Host id -> pool for ``ClusterState``; None: one pool."""
        return None

    def submitted(self, job: TraceJob) -> Workload:
        """The workload a trace row submits under this baseline."""
        return job.workload

    def started(self, placements: Sequence[Placement], state: ClusterState) -> None:
        """A cycle's placements have started (``state`` holds them)."""

    def ended(self, workload_id: str) -> None:
        """A running workload has ended (completed or preempted)."""


NO_BASELINE = Baseline()


def baseline_of(policy: Policy) -> Baseline:
    ordering = policy.ordering
    return ordering if isinstance(ordering, Baseline) else NO_BASELINE


class Partitioned(Fifo, Baseline):
    """FIFO inside each team's own pool of hosts."""

    def pool(self, w: Workload, st: ClusterState) -> str:
        alloc = w.allocation
        if alloc is not None and alloc in st.by_free:
            return alloc
        return DEFAULT_POOL

    def pools(self, cluster: ClusterSpec) -> dict[str, str] | None:
        return {h: team for team, hosts in cluster.partitions.items() for h in hosts}


PARTITIONED = Partitioned()


class StrictFifo(Fifo):
    """Head-of-line FIFO, as published simulators run it: the queue in submit order stops at
    the first workload that does not start; nothing behind it is backfilled. ``Fifo``
    passes over such work instead (greedy backfill)."""

    def walk(self, queue: PendingQueue, st: ClusterState, reach: Reach) -> Iterator[Workload]:
        blocked: set[str] = set()
        for _, w in queue.fifo:
            pool = self.pool(w, st)
            if pool in blocked:
                continue
            yield w
            # Not placed (preemption is off): its pool's bound fell to its size or below.
            if reach(pool) <= w.gpus:
                blocked.add(pool)
                if len(blocked) >= len(st.by_free):
                    return


class StrictPartitioned(StrictFifo, Partitioned):
    """Head-of-line FIFO inside each team's own pool: a team's blocked head holds only its
    own queue, as per-VC FIFO does in published Philly simulators."""


STRICT_FIFO = StrictFifo()
STRICT_PARTITIONED = StrictPartitioned()


@dataclass(frozen=True, slots=True)
class LegacyRule:
    """Legacy priority: preempt unshielded work of a strictly lower class, lowest first."""

    requester_class: int
    now: float
    shielded: Set[str] = field(compare=False)
    ignores_protection: bool = True  # the legacy system had no minimum-runtime contract

    def key(self, run: Running, victim_held: Mapping[str, int]) -> tuple[object, ...] | None:
        w = run.workload
        if w.id in self.shielded or w.priority >= self.requester_class:
            return None
        return (1 + w.priority, 0.0, w.gpus * (self.now - run.start_time), w.id)

    def keeps_eligible(self, run: Running, victim_held: Mapping[str, int]) -> bool:
        return True

    def may_take_allocated(self, victim_held: Mapping[str, int]) -> bool:
        return True

    def reason(self, victim: Running) -> PreemptReason:
        return PreemptReason.HIGHER_CLASS


@dataclass(frozen=True, slots=True, eq=False)
class LegacyPriority(Baseline):
    """The legacy priority system: its ordering, victim rule and shields. ``shielded``:
    running work opted out within its team's cap; ``opted_out``: workloads that asked."""

    protected_gpu_cap: Mapping[str, int] = field(default_factory=dict)
    shielded: set[str] = field(default_factory=set)
    opted_out: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        for team, cap in self.protected_gpu_cap.items():
            if cap < 0:
                raise ValidationError(f"protected_gpu_cap.{team}", f"must be >= 0, got {cap}")

    # -- the ordering
    def key(self, w: Workload) -> tuple[object, ...]:
        return (-w.priority, w.submit_time, w.id)

    def pool(self, w: Workload, st: ClusterState) -> str:
        return DEFAULT_POOL

    def walk(self, queue: PendingQueue, st: ClusterState, reach: Reach) -> Iterator[Workload]:
        """The allocations' queues (and the unallocated one, by submit time) merged by the
        class of their heads; work out of reach at a head is passed over at once."""
        groups = queue.groups
        heads: list[tuple[tuple[object, ...], int, str | None]] = []
        cursor: dict[str | None, int] = {}
        for seq, group in enumerate(sorted(groups, key=lambda g: (g is None, g or ""))):
            cursor[group] = 0
            heads.append((self.key(groups[group][0][1]), seq, group))
        heapq.heapify(heads)
        while heads:
            _, seq, group = heapq.heappop(heads)
            items = groups[group]
            pos = cursor[group]
            bound = reach(DEFAULT_POOL)
            if queue.min_gpus_from(group, pos) >= bound:
                continue  # nothing left in this group can happen this cycle
            start = pos
            while items[pos][1].gpus >= bound:
                pos += 1
            if pos != start:
                cursor[group] = pos  # the head moved: re-sort the group by its new head
                heapq.heappush(heads, (self.key(items[pos][1]), seq, group))
                continue
            cursor[group] = pos + 1
            if pos + 1 < len(items):
                heapq.heappush(heads, (self.key(items[pos + 1][1]), seq, group))
            yield items[pos][1]

    # -- the victims
    def rule(self, w: Workload, now: float) -> LegacyRule:
        return LegacyRule(w.priority, now, self.shielded)

    def drain_at(self, run: Running, now: float) -> float | None:
        return None if run.workload.id in self.shielded else now

    # -- the engine's hooks
    def start(self, policy: Policy) -> tuple[Baseline, Policy]:
        fresh = LegacyPriority(self.protected_gpu_cap)
        return fresh, replace(policy, ordering=fresh, victims=fresh)

    def submitted(self, job: TraceJob) -> Workload:
        if job.legacy_protected:
            self.opted_out.add(job.workload.id)
        return replace(job.workload, priority=LEGACY_CLASSES.get(job.legacy_class.upper(), 1))

    def started(self, placements: Sequence[Placement], state: ClusterState) -> None:
        """Shield the placements that opted out, in placement order, while their team
        stays within its cap (a team missing from the caps has none; no team, no shield)."""
        used: dict[str, int] = {}
        for wid in self.shielded:
            w = state.running[wid].workload
            if w.allocation is not None:
                used[w.allocation] = used.get(w.allocation, 0) + w.gpus
        for p in placements:
            w = p.workload
            if w.id not in self.opted_out or w.allocation is None:
                continue
            cap = self.protected_gpu_cap.get(w.allocation)
            team_used = used.get(w.allocation, 0)
            if cap is not None and team_used + w.gpus > cap:
                continue
            used[w.allocation] = team_used + w.gpus
            self.shielded.add(w.id)

    def ended(self, workload_id: str) -> None:
        self.shielded.discard(workload_id)
