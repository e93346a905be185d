"""The cluster as a fold of events: which workload holds which GPUs, and what waits.

``ClusterState`` and ``PendingQueue`` are plain in-memory structures (deterministic, no I/O,
no clock). The simulator and the placement service both keep one, apply the same events to
it (started, noticed, finished, host state changed), and hand it to ``run_cycle``, which
reads it without changing it. They are mutable only so that a cycle does not have to rebuild
indexes over every host and workload: the simulator runs hundreds of thousands of cycles.

Indexes kept:
- free GPU indices per host (GPUs under a preemption notice are *not* free until the victim
  has ended);
- for schedulable (HEALTHY) hosts, per pool, the set of hosts by free-GPU count: best-fit
  placement reads it in O(host size); it holds hosts' order keys (``host_index``: integers
  in the order of the host ids, with gaps, so a host that joins takes a key between its
  neighbours' and nothing else moves);
- GPUs held per allocation by allocated (charged) work, including work under notice;
- a heap of protection ends, so the next moment protection lapses is found in O(log n).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from itertools import accumulate
from typing import Final

from allot.core.errors import ValidationError
from allot.core.model import Assignment, Host, HostState, Workload
from allot.core.running import Running, is_allocated

DEFAULT_POOL = ""
SHORT_LANE_POOL = "short-lane"
"""The pool of the short lane's hosts (``ClusterState(short_lane=...)``): Fair Tree starts
only unallocated and short allocated work there (``Policy.short_lane_max_gpus``)."""
FREED_KEPT_S = 3600.0
"""How long ``ClusterState.freed`` remembers a host's GPUs coming free (the longest
``Policy.unallocated_settle_s``)."""
HOST_KEY_SPACING = (1 << 32) + 1
"""The gap between neighbouring hosts' order keys when keys are (re)assigned. A host that
joins between two others takes the midpoint of their keys, so keys run out (all hosts are
renumbered and the free index rebuilt, O(hosts)) only after 32 joins between the same two
neighbours; a host joining costs a bisection and a list insert, not a reindex of every host.
Odd, so the keys' low bits (all a set or dict of ints hashes on at first) vary as the
positions do: with 2^32 every key hashed to the same slot."""
_NEAR_HEAD = 64
"""Up to this position, suffix min/max come from the size counts, not a suffix array."""


_HEALTHY: Final = HostState.HEALTHY  # read once: an enum member's lookup costs a call


def schedulable(host: Host) -> bool:
    """``Host.schedulable`` (healthy), computed here as ``running.is_allocated`` is."""
    return host.state is _HEALTHY


def gpus_on(run: Running, host_id: str) -> int:
    """GPUs ``run`` holds on ``host_id``, one of its hosts (it is in ``on_host[host_id]``):
    a run on one host holds all its workload's there (``ClusterState.start`` checks that the
    assignment adds up to them), read without walking the assignment."""
    assignment = run.assignment
    if len(assignment) == 1:
        return run.gpus
    for h, gpus in assignment:
        if h == host_id:
            return len(gpus)
    return 0


class ClusterState:
    """Hosts and running work. Apply events through the methods; read freely."""

    def __init__(
        self,
        hosts: Iterable[Host],
        pools: Mapping[str, str] | None = None,
        *,
        short_lane: Iterable[str] = (),
    ) -> None:
        """``pools`` maps host id -> pool name (the simulator's partitioned baseline);
        default: one pool. ``short_lane``: ids of hosts, present or joining later, that
        form the pool ``SHORT_LANE_POOL`` (Fair Tree's short lane)."""
        ordered = sorted(hosts, key=lambda h: h.id)
        self._hosts: dict[str, Host] = {}
        for host in ordered:
            if host.id in self._hosts:
                raise ValidationError("hosts", f"duplicate host id {host.id!r}")
            self._hosts[host.id] = host
        self.host_ids: list[str] = [h.id for h in ordered]
        self.host_index: dict[str, int] = {}
        """Host id -> its order key: smaller for an earlier id (ties in the planners break
        by it); the indexes hold keys, ``host_at`` maps a key back to its host."""
        self.host_at: dict[int, str] = {}
        self._number_hosts()
        self.short_lane = frozenset(short_lane)
        if pools and self.short_lane:
            raise ValidationError("short_lane", "a short lane needs one pool, not partitions")
        self.pool_of: dict[str, str] = {h.id: self._pool_at_join(h.id) for h in ordered}
        if pools:
            for host_id, pool in pools.items():
                if host_id not in self._hosts:
                    raise ValidationError("pools", f"unknown host {host_id!r}")
                self.pool_of[host_id] = pool
        self.free: dict[str, list[int]] = {h.id: list(range(h.gpus)) for h in ordered}
        self.by_free: dict[str, list[set[int]]] = {}
        self.pool_max_gpus: dict[str, int] = {}
        self._pool_sizes: dict[str, dict[int, int]] = {}
        """Per pool, schedulable hosts by GPU count (``pool_max_gpus`` is the largest)."""
        self.running: dict[str, Running] = {}
        self.running_gpus = 0
        """GPUs held by running work (the sum over ``running``, kept as it changes)."""
        self.on_host: dict[str, dict[str, Running]] = {h.id: {} for h in ordered}
        self.held: dict[str, int] = {}
        self.running_of: dict[str | None, set[str]] = {}
        """Allocation -> its allocated running workloads, None -> unallocated ones (planners
        read one allocation's, or the unallocated work)."""
        self.cheap_gpus: dict[str, int] = {}
        """Per host, GPUs of unallocated work and of work under notice (hosts with none
        are left out): a cycle's cheap room starts as free GPUs plus these."""
        self.healthy_gpus = 0
        self.draining: set[str] = set()
        self.noticed: set[str] = set()  # running workloads under a preemption notice
        self.noticed_for: dict[str, str] = {}
        """Noticed workload -> the request its notice made room for (``Preemption.preemptor``):
        the request keeps those GPUs from one cycle to the next (``allot.core.cycle``)."""
        self._protect_heap: list[tuple[float, str]] = []
        self.freed: deque[tuple[float, str]] = deque()
        """(time, host) whenever work left a host, in the order reported; entries older
        than ``FREED_KEPT_S`` are dropped as the clock moves (``prune_protection``)."""
        for host in ordered:
            self._index_host(host.id, add=True)

    # ----------------------------------------------------------------- reads
    @property
    def hosts(self) -> tuple[Host, ...]:
        return tuple(self._hosts[h] for h in self.host_ids)

    @property
    def lane_holds_every_host(self) -> bool:
        """Whether every host known is in the short lane: then allocated work that is not
        short can start nowhere (the lane names hosts before they join, so this can change
        as hosts do)."""
        ids = self.host_ids
        return 0 < len(ids) <= len(self.short_lane) and self.short_lane.issuperset(ids)

    def host(self, host_id: str) -> Host:
        try:
            return self._hosts[host_id]
        except KeyError:
            raise ValidationError("host", f"unknown host {host_id!r}") from None

    def __contains__(self, host_id: object) -> bool:
        return host_id in self._hosts

    def next_protection_end(self, now: float) -> float | None:
        """Earliest protection end strictly after ``now`` among running allocated work.
        Reads only (a cycle must not change the state); ``prune_protection`` drops the
        entries that lapsed when the caller's clock has moved past them."""
        # Walk the heap as a tree: a node's subtree holds only times >= its own, so below a
        # live entry after ``now`` nothing can be earlier; only lapsed or stale entries
        # (few, once the caller prunes) are descended through.
        best: float | None = None
        running = self.running
        heap = self._protect_heap
        stack = [0] if heap else []
        while stack:
            i = stack.pop()
            t, wid = heap[i]
            if best is not None and t >= best:
                continue
            if t > now:
                r = running.get(wid)
                if r is not None and r.protected_until == t:
                    best = t
                    continue
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    stack.append(child)
        return best

    def prune_protection(self, now: float) -> None:
        freed = self.freed
        while freed and freed[0][0] < now - FREED_KEPT_S:
            freed.popleft()
        heap = self._protect_heap
        while heap:
            t, wid = heap[0]
            r = self.running.get(wid)
            if r is None or r.protected_until != t or t <= now:
                heapq.heappop(heap)
                continue
            break

    # ---------------------------------------------------------------- events
    def add_host(self, host: Host) -> None:
        """A host joins (the live system registers hosts as agents appear)."""
        if host.id in self._hosts:
            raise ValidationError("host", f"duplicate host id {host.id!r}")
        self._hosts[host.id] = host
        pos = bisect_left(self.host_ids, host.id)
        self.host_ids.insert(pos, host.id)
        self.pool_of.setdefault(host.id, self._pool_at_join(host.id))
        self.free[host.id] = list(range(host.gpus))
        self.on_host[host.id] = {}
        key = self._key_between(pos)
        if key is None:
            # No integer left between its neighbours' keys: renumber every host, and
            # rebuild the index that holds keys.
            self._number_hosts()
            self._rebuild_free_index()
            return
        self.host_index[host.id] = key
        self.host_at[key] = host.id
        self._index_host(host.id, add=True)

    def set_host_state(self, host_id: str, state: HostState) -> None:
        host = self.host(host_id)
        if host.state is state:
            return
        self._index_host(host_id, add=False)
        self._hosts[host_id] = Host(host.id, host.gpus, state)
        self._index_host(host_id, add=True)

    def start(self, workload: Workload, assignment: Assignment, now: float) -> Running:
        if workload.id in self.running:
            raise ValidationError("workload", f"{workload.id!r} is already running")
        total = 0
        if len({host_id for host_id, _ in assignment}) != len(assignment):
            # One entry per host: the per-host indexes (``on_host``, ``gpus_on``) hold a
            # run once on each of its hosts.
            raise ValidationError("assignment", "names a host more than once")
        for host_id, gpus in assignment:
            free = self.free[self.host(host_id).id]
            missing = set(gpus) - set(free)
            if missing:
                raise ValidationError(
                    "assignment", f"GPUs {sorted(missing)} of {host_id} are not free"
                )
            total += len(gpus)
        if total != workload.gpus:
            raise ValidationError(
                "assignment", f"assigns {total} GPUs to a {workload.gpus}-GPU workload"
            )
        run = Running(workload, now, assignment)
        for host_id, gpus in assignment:
            self._take(host_id, gpus)
            self.on_host[host_id][workload.id] = run
        self.running[workload.id] = run
        self.running_gpus += workload.gpus
        key = workload.allocation if is_allocated(workload) else None
        self.running_of.setdefault(key, set()).add(workload.id)
        if not is_allocated(workload):
            self._count_cheap(assignment, +1)
        if is_allocated(workload):
            alloc = workload.allocation
            assert alloc is not None
            self.held[alloc] = self.held.get(alloc, 0) + workload.gpus
            heapq.heappush(self._protect_heap, (run.protected_until, workload.id))
        return run

    def notice(self, workload_id: str, preempt_at: float, for_id: str | None = None) -> Running:
        """A preemption notice: the GPUs stay held until the workload has ended. ``for_id``:
        the request it makes room for (none for a drain or a cancel)."""
        run = self._running(workload_id)
        if run.preempt_at is None and is_allocated(run.workload):
            self._count_cheap(run.assignment, +1)  # unallocated work was counted at start
        noticed = Running(run.workload, run.start_time, run.assignment, preempt_at)
        self.running[workload_id] = noticed
        for host_id, _ in run.assignment:
            self.on_host[host_id][workload_id] = noticed
        self.noticed.add(workload_id)
        if for_id is not None:
            self.noticed_for[workload_id] = for_id
        return noticed

    def finish(self, workload_id: str, now: float | None = None) -> Running:
        """The workload ended (completed, failed, or left after its notice), at ``now``
        when the caller knows it (``freed``)."""
        run = self._running(workload_id)
        if now is not None:
            self.freed.extend((now, h) for h, _ in run.assignment)
        del self.running[workload_id]
        self.running_gpus -= run.workload.gpus
        if run.preempt_at is not None or not is_allocated(run.workload):
            self._count_cheap(run.assignment, -1)
        self.noticed.discard(workload_id)
        self.noticed_for.pop(workload_id, None)
        for host_id, gpus in run.assignment:
            self._give(host_id, gpus)
            del self.on_host[host_id][workload_id]
        key = run.workload.allocation if is_allocated(run.workload) else None
        of = self.running_of[key]
        of.discard(workload_id)
        if not of:
            del self.running_of[key]
        if is_allocated(run.workload):
            alloc = run.workload.allocation
            assert alloc is not None
            self.held[alloc] -= run.workload.gpus
        return run

    # -------------------------------------------------------------- internals
    def _running(self, workload_id: str) -> Running:
        try:
            return self.running[workload_id]
        except KeyError:
            raise ValidationError("workload", f"{workload_id!r} is not running") from None

    def _count_cheap(self, assignment: Assignment, sign: int) -> None:
        cheap = self.cheap_gpus
        for host_id, gpus in assignment:
            left = cheap.get(host_id, 0) + sign * len(gpus)
            if left:
                cheap[host_id] = left
            else:
                del cheap[host_id]

    def _pool_at_join(self, host_id: str) -> str:
        return SHORT_LANE_POOL if host_id in self.short_lane else DEFAULT_POOL

    def _number_hosts(self) -> None:
        self.host_index = {h: i * HOST_KEY_SPACING for i, h in enumerate(self.host_ids)}
        self.host_at = {k: h for h, k in self.host_index.items()}

    def _key_between(self, pos: int) -> int | None:
        """An order key for the host at ``pos`` of ``host_ids`` between its neighbours'
        keys; None when they are adjacent integers."""
        ids = self.host_ids
        below = self.host_index[ids[pos - 1]] if pos > 0 else None
        above = self.host_index[ids[pos + 1]] if pos + 1 < len(ids) else None
        if below is None:
            return 0 if above is None else above - HOST_KEY_SPACING
        if above is None:
            return below + HOST_KEY_SPACING
        return (below + above) // 2 if above - below > 1 else None

    def _index_host(self, host_id: str, *, add: bool) -> None:
        host = self._hosts[host_id]
        if host.state is HostState.DRAINING:
            (self.draining.add if add else self.draining.discard)(host_id)
        if not schedulable(host):
            return
        self.healthy_gpus += host.gpus if add else -host.gpus
        pool = self.pool_of[host_id]
        buckets = self.by_free.setdefault(pool, [])
        while len(buckets) <= host.gpus:
            buckets.append(set())
        idx = self.host_index[host_id]
        bucket = buckets[len(self.free[host_id])]
        (bucket.add if add else bucket.discard)(idx)
        # The gang unit is the largest *schedulable* host of the pool.
        sizes = self._pool_sizes.setdefault(pool, {})
        left = sizes.get(host.gpus, 0) + (1 if add else -1)
        if left:
            sizes[host.gpus] = left
        else:
            del sizes[host.gpus]
        if sizes:
            self.pool_max_gpus[pool] = max(sizes)
        else:
            self.pool_max_gpus.pop(pool, None)
            del self.by_free[pool]
            del self._pool_sizes[pool]

    def _rebuild_free_index(self) -> None:
        self.by_free = {}
        self.pool_max_gpus = {}
        self._pool_sizes = {}
        self.healthy_gpus = 0
        self.draining = set()
        for host_id in self.host_ids:
            self._index_host(host_id, add=True)

    def _move_bucket(self, host_id: str, before: int, after: int) -> None:
        host = self._hosts[host_id]
        if not schedulable(host):
            return
        buckets = self.by_free[self.pool_of[host_id]]
        idx = self.host_index[host_id]
        buckets[before].discard(idx)
        buckets[after].add(idx)

    def _take(self, host_id: str, gpus: tuple[int, ...]) -> None:
        free = self.free[host_id]
        before = len(free)
        taken = set(gpus)
        self.free[host_id] = [g for g in free if g not in taken]
        self._move_bucket(host_id, before, len(self.free[host_id]))

    def _give(self, host_id: str, gpus: tuple[int, ...]) -> None:
        free = self.free[host_id]
        before = len(free)
        self.free[host_id] = sorted([*free, *gpus])
        self._move_bucket(host_id, before, len(self.free[host_id]))


def _within_key(w: Workload) -> tuple[int, float, str]:
    """Order inside one allocation: user priority (higher first), then submit time, then id.
    Unallocated work is FIFO: user priority orders only within an allocation."""
    return (-w.priority if is_allocated(w) else 0, w.submit_time, w.id)


class PendingQueue:
    """Queued workloads, grouped by the allocation that pays for them.

    Group ``None`` holds unallocated work (no allocation, or min_runtime 0). Each group is
    kept sorted by user priority, then submit time, then id, so a cycle reads groups from
    the head and never sorts the whole queue. ``fifo`` holds every workload by submit time
    then id, for the FIFO ordering (``allot.core.policy.Fifo``).
    """

    def __init__(self, workloads: Iterable[Workload] = ()) -> None:
        self.groups: dict[str | None, list[tuple[tuple[int, float, str], Workload]]] = {}
        self._group_of: dict[str, str | None] = {}
        self._key_of: dict[str, tuple[int, float, str]] = {}
        self._suffix_min: dict[str | None, list[int]] = {}
        self._suffix_max: dict[str | None, list[int]] = {}
        # GPU sizes per group (size -> count): the whole-group min and max in
        # O(distinct sizes), without rebuilding a suffix array after every arrival.
        self._sizes: dict[str | None, dict[int, int]] = {}
        self.fifo: list[tuple[tuple[float, str], Workload]] = []
        self._fifo_suffix_min: list[int] | None = None
        self.preempted_for: dict[str, tuple[str, float]] = {}
        """Requeued workload -> (the request whose notice preempted it, that notice's
        deadline), until it runs again: for a while such work may displace only
        unallocated work (one request, one round of notices; ``allot.core.cycle``)."""
        self.room_for: dict[str, list[tuple[float, str, tuple[int, ...]]]] = {}
        """Pending request -> the GPUs its notices' victims left, each with that victim's
        notice deadline (``keep_room``), until it leaves the queue: for a while no other
        work may take them before its turn (``allot.core.cycle``)."""
        for w in workloads:
            self.add(w)

    def __len__(self) -> int:
        return len(self._group_of)

    def __contains__(self, workload_id: object) -> bool:
        return workload_id in self._group_of

    def __iter__(self) -> Iterator[Workload]:
        for key in sorted(self.groups, key=lambda g: (g is None, g or "")):
            for _, w in self.groups[key]:
                yield w

    @staticmethod
    def group_of(w: Workload) -> str | None:
        return w.allocation if is_allocated(w) else None

    def add(self, w: Workload, preempted_for: tuple[str, float] | None = None) -> None:
        """Queue ``w``; ``preempted_for``: it is requeued after a notice for that request,
        with that deadline."""
        if w.id in self._group_of:
            raise ValidationError("workload", f"{w.id!r} is already pending")
        if preempted_for is not None:
            self.preempted_for[w.id] = preempted_for
        group = self.group_of(w)
        self._group_of[w.id] = group
        key = _within_key(w)
        self._key_of[w.id] = key
        insort(self.groups.setdefault(group, []), (key, w))
        sizes = self._sizes.setdefault(group, {})
        sizes[w.gpus] = sizes.get(w.gpus, 0) + 1
        self._suffix_min.pop(group, None)
        self._suffix_max.pop(group, None)
        insort(self.fifo, ((w.submit_time, w.id), w))
        self._fifo_suffix_min = None

    def suffix_min_gpus(self, group: str | None) -> list[int]:
        """``[i]`` = the fewest GPUs any workload at position >= i of the group asks for:
        a cycle drops a whole group once that is too many to fit or to preempt for."""
        cached = self._suffix_min.get(group)
        if cached is None:
            gpus = [w.gpus for _, w in reversed(self.groups[group])]
            cached = list(accumulate(gpus, min))
            cached.reverse()
            self._suffix_min[group] = cached
        return cached

    def size_counts(self, group: str | None) -> Mapping[int, int]:
        """How many of the group's workloads ask for each GPU count (do not change it)."""
        return self._sizes[group]

    def min_gpus_from(self, group: str | None, pos: int) -> int:
        """The fewest GPUs any workload at position >= ``pos`` of the group asks for."""
        if pos <= _NEAR_HEAD and group not in self._suffix_min:
            return min(self._sizes_from(group, pos))
        return self.suffix_min_gpus(group)[pos]

    def max_gpus_from(self, group: str | None, pos: int) -> int:
        """The most GPUs any workload at position >= ``pos`` of the group asks for."""
        if pos <= _NEAR_HEAD and group not in self._suffix_max:
            return max(self._sizes_from(group, pos))
        return self.suffix_max_gpus(group)[pos]

    def _sizes_from(self, group: str | None, pos: int) -> dict[int, int] | set[int]:
        """GPU sizes at positions >= ``pos``, near the head: the group's size counts minus
        the first ``pos`` items (no O(group) suffix array after every arrival)."""
        sizes = self._sizes[group]
        if pos == 0:
            return sizes
        left = dict(sizes)
        for _, w in self.groups[group][:pos]:
            left[w.gpus] -= 1
            if not left[w.gpus]:
                del left[w.gpus]
        return left

    def suffix_max_gpus(self, group: str | None) -> list[int]:
        """``[i]`` = the most GPUs any workload at position >= i of the group asks for."""
        cached = self._suffix_max.get(group)
        if cached is None:
            gpus = [w.gpus for _, w in reversed(self.groups[group])]
            cached = list(accumulate(gpus, max))
            cached.reverse()
            self._suffix_max[group] = cached
        return cached

    def fifo_suffix_min_gpus(self) -> list[int]:
        """``suffix_min_gpus`` over ``fifo``."""
        if self._fifo_suffix_min is None:
            gpus = [w.gpus for _, w in reversed(self.fifo)]
            self._fifo_suffix_min = list(accumulate(gpus, min))
            self._fifo_suffix_min.reverse()
        return self._fifo_suffix_min

    def workload(self, workload_id: str) -> Workload:
        """The pending workload ``workload_id``."""
        items = self.groups[self._group_of[workload_id]]
        return items[_position(items, self._key_of[workload_id])][1]

    def keep_room(self, for_id: str, assignment: Assignment, deadline: float) -> None:
        """A victim of ``for_id``'s notice (due to leave by ``deadline``) left
        ``assignment``; kept while ``for_id`` waits."""
        if for_id in self._group_of:
            self.room_for.setdefault(for_id, []).extend((deadline, h, g) for h, g in assignment)

    def held_back(self, workload_id: str, now: float, hold_s: float) -> bool:
        """Whether ``workload_id`` was requeued by a notice for another request less than
        ``hold_s`` before ``now`` (it may displace only unallocated work meanwhile)."""
        entry = self.preempted_for.get(workload_id)
        return entry is not None and now < entry[1] + hold_s

    def remove(self, workload_id: str) -> Workload:
        try:
            group = self._group_of.pop(workload_id)
        except KeyError:
            raise ValidationError("workload", f"{workload_id!r} is not pending") from None
        key = self._key_of.pop(workload_id)
        self.preempted_for.pop(workload_id, None)
        self.room_for.pop(workload_id, None)
        items = self.groups[group]
        sizes = self._sizes[group]
        w = items.pop(_position(items, key))[1]
        sizes[w.gpus] -= 1
        if not sizes[w.gpus]:
            del sizes[w.gpus]
        self._suffix_min.pop(group, None)
        self._suffix_max.pop(group, None)
        if not items:
            del self.groups[group]
            del self._sizes[group]
        j = bisect_left(self.fifo, (w.submit_time, w.id), key=lambda item: item[0])
        del self.fifo[j]
        self._fifo_suffix_min = None
        return w


def _position(
    items: list[tuple[tuple[int, float, str], Workload]], key: tuple[int, float, str]
) -> int:
    """Where ``key`` is in a group's sorted items: keys are unique (they end with the id),
    so the first key >= ours is ours."""
    return bisect_left(items, key, key=lambda item: item[0])
