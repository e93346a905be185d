"""Where a workload fits: all-or-nothing, best fit, deterministic.

Rules (rule 7 of the design):

1. Only HEALTHY hosts take new work (never draining, drained or cordoned ones).
2. A workload of g GPUs with g <= the largest host of its pool lands on ONE host: the host
   with the fewest free GPUs that still has >= g (best fit keeps whole hosts free for gangs);
   ties go to the host id that sorts first. It takes that host's lowest free GPU indices.
3. A larger workload is a gang: with G the largest host size of the pool, it takes
   g // G whole free hosts of size G (ids in sorted order) plus, when g % G > 0, the
   remainder on one further host, chosen by rule 2. All or nothing: if any part does not
   fit, nothing is placed.

``ClusterView`` is one cycle's copy-on-write view of a ``ClusterState``: GPUs taken, notices
issued and GPUs reserved during the cycle live here, never in the state.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator

from allot.core.heap_order import OrderedIds, ascending
from allot.core.model import Assignment
from allot.core.running import Running
from allot.core.state import ClusterState, gpus_on, schedulable


class ClusterView:
    def __init__(self, state: ClusterState, now: float) -> None:
        self.st = state
        self.now = now
        self._free: dict[str, list[int]] = {}
        self._buckets: dict[str, list[OrderedIds]] = {}
        self.noticed: dict[str, float] = {}  # workload id -> preempt_at, issued this cycle
        self.claimed: set[str] = set()  # workloads under notice whose GPUs a requester awaits
        self.earmarked: set[str] = set()  # protected workloads a blocked request will reclaim
        self._earmarks: list[Assignment] = []  # free GPUs held back for those requests
        # Held, minus this cycle's victims: it only falls (``TakeableAllocations`` relies on it).
        self.victim_held: dict[str, int] = dict(state.held)
        self._candidates: dict[tuple[str, bool], list[str]] = {}
        self._movable_of: dict[tuple[str, bool], set[str]] = {}
        self._movable_among: dict[tuple[tuple[str, ...], str, bool], list[str]] = {}
        # "Cheap room" per host: free GPUs + GPUs under notice nobody claimed yet + GPUs of
        # unallocated work (preemptible by any allocated request). Built on first use.
        self._room: dict[str, int] | None = None
        self._noticed_room: dict[str, int] | None = None  # unclaimed GPUs under notice
        self._room_buckets: dict[str, list[OrderedIds]] = {}
        # Per pool, hosts of its largest size whose occupants could all move, as a heap by
        # ``clear_cost`` (stale entries are skipped: ``_clear_key`` holds the current one).
        # Built on first use, then kept current wherever cheap room is.
        self._clear: dict[str, list[tuple[tuple[float, ...], int]]] | None = None
        self._clear_key: dict[str, tuple[float, ...]] = {}
        self._clear_stale: set[str] = set()  # hosts touched since the last read
        self._clear_all = False  # every clearable host costed, not only the cheap ones
        self._memo: dict[str, dict[object, object]] = {}  # see ``memo``
        self._touched_early: set[str] = set()  # hosts changed before cheap room was built

    # ------------------------------------------------------------------ reads
    def free_of(self, host_id: str) -> list[int]:
        free = self._free.get(host_id)
        return self.st.free[host_id] if free is None else free

    def buckets(self, pool: str) -> list[OrderedIds] | None:
        mine = self._buckets.get(pool)
        if mine is None:
            theirs = self.st.by_free.get(pool)
            if theirs is None:
                return None
            mine = [OrderedIds(b) for b in theirs]
            self._buckets[pool] = mine
        return mine

    def terminating(self, run: Running) -> bool:
        return run.preempt_at is not None or run.wid in self.noticed

    def find_fit(self, pool: str, gpus: int) -> Assignment | None:
        buckets = self.buckets(pool)
        if buckets is None:
            return None
        largest = self.st.pool_max_gpus[pool]
        if gpus <= largest:
            host = self.best_fit(buckets, gpus, exclude=())
            return None if host is None else ((host, tuple(self.free_of(host)[:gpus])),)
        whole_count, rest = divmod(gpus, largest)
        whole = buckets[largest]
        if len(whole) < whole_count:
            return None
        chosen = whole.smallest(whole_count)
        parts = [(self.st.host_at[i], tuple(self.free_of(self.st.host_at[i]))) for i in chosen]
        if rest:
            host = self.best_fit(buckets, rest, exclude=set(chosen))
            if host is None:
                return None
            parts.append((host, tuple(self.free_of(host)[:rest])))
        return tuple(sorted(parts))

    def best_fit(self, buckets: list[OrderedIds], gpus: int, exclude: Iterable[int]) -> str | None:
        excluded = set(exclude)
        for free_count in range(gpus, len(buckets)):
            bucket = buckets[free_count]
            if not bucket:
                continue
            idx = bucket.first(excluded)
            if idx is not None:
                return self.st.host_at[idx]
        return None

    def candidate_hosts(self, pool: str, respect_protection: bool) -> list[str]:
        """Schedulable hosts of ``pool`` where someone might make room: an occupant under
        notice, or one past its protection (any one when protection is ignored)."""
        key = (pool, respect_protection)
        cached = self._candidates.get(key)
        if cached is None:
            hosts: set[str] = set()
            for run in self.st.running.values():
                if not respect_protection or self._movable(run):
                    hosts.update(h for h, _ in run.assignment)
            pool_of = self.st.pool_of
            cached = sorted(h for h in hosts if pool_of[h] == pool and schedulable(self.st.host(h)))
            self._candidates[key] = cached
        return cached

    def movable_hosts_of(self, allocation: str, *, respect: bool = True) -> set[str]:
        """Schedulable hosts where some allocated work of ``allocation`` is past its
        protection (any of its work when not ``respect``); per allocation on first use, a
        cycle's own decisions add none."""
        key = (allocation, respect)
        cached = self._movable_of.get(key)
        if cached is None:
            cached = set()
            now = self.now
            running = self.st.running
            for wid in self.st.running_of.get(allocation, ()):
                run = running[wid]
                if not respect or run.protected_until <= now:
                    cached.update(h for h, _ in run.assignment)
            cached = {h for h in cached if schedulable(self.st.host(h))}
            self._movable_of[key] = cached
        return cached

    def movable_hosts_among(
        self, allocations: tuple[str, ...], pool: str, *, respect: bool = True
    ) -> list[str]:
        """The hosts of ``pool`` in ``movable_hosts_of`` of any of ``allocations``, kept
        per set asked for (requests of one cycle ask for the same few); do not change the
        list returned."""
        key = (allocations, pool, respect)
        cached = self._movable_among.get(key)
        if cached is None:
            hosts: set[str] = set()
            for alloc in allocations:
                hosts.update(self.movable_hosts_of(alloc, respect=respect))
            pool_of = self.st.pool_of
            cached = self._movable_among[key] = [h for h in hosts if pool_of[h] == pool]
        return cached

    def has_movable(self, host_id: str) -> bool:
        """Whether some occupant of ``host_id`` is under notice or past its protection (a
        ``candidate_hosts(..., True)`` host, asked of one host)."""
        return any(self._movable(run) for run in self.st.on_host[host_id].values())

    def _movable(self, run: Running) -> bool:
        """Under notice, or past its protection (as of the cycle's start)."""
        return run.preempt_at is not None or run.protected_until <= self.now

    def noticed_room(self) -> dict[str, int]:
        """Per host, GPUs under notice that no request has claimed yet (built on first use,
        then kept current by ``notice``, ``reserve`` and ``earmark``)."""
        if self._noticed_room is None:
            self._noticed_room = {}
            for wid in self.st.noticed:
                self._count_noticed(self.st.running[wid], +1)
            for wid in self.noticed:
                self._count_noticed(self.st.running[wid], +1)
        return self._noticed_room

    def _count_noticed(self, run: Running, sign: int) -> None:
        room = self._noticed_room
        if room is None or run.wid in self.claimed or run.wid in self.earmarked:
            return
        for host_id, gpus in run.assignment:
            left = room.get(host_id, 0) + sign * len(gpus)
            if left:
                room[host_id] = left
            else:
                del room[host_id]  # keep only hosts with room: callers scan this dict

    def cheap_room(self, host_id: str) -> int:
        self._build_room()
        assert self._room is not None
        return self._room.get(host_id, 0)

    def room_buckets(self, pool: str) -> list[OrderedIds]:
        """Schedulable hosts of ``pool`` by cheap room (see ``cheap_room``)."""
        self._build_room()
        return self._room_buckets.get(pool, [])

    def _build_room(self) -> None:
        if self._room is not None:
            return
        self._room = {}
        # Only hosts with free GPUs or a cheap occupant can have room; the rest would sit
        # in bucket 0, which no request reads (hosts touched later are indexed then).
        hosts = {
            self.st.host_at[i]
            for buckets in self.st.by_free.values()
            for bucket in buckets[1:]
            for i in bucket
        }
        hosts.update(self._free)
        # Hosts with cheap occupants: unallocated work and work under notice, as the state
        # counts them between cycles, and notices of this cycle.
        hosts.update(self.st.cheap_gpus)
        running = self.st.running
        for wid in self.noticed:
            hosts.update(h for h, _ in running[wid].assignment)
        # A host this cycle has not changed has room = free GPUs + the state's cheap GPUs
        # (nothing of it is claimed or earmarked yet); the others count their occupants.
        # Sets and dicts keyed by host: the order of insertion does not matter.
        early = self._touched_early
        cheap = self.st.cheap_gpus
        free = self.st.free
        pool_of = self.st.pool_of
        index_of = self.st.host_index
        room = self._room
        for host_id in hosts:
            host = self.st.host(host_id)
            if not schedulable(host):
                continue
            if host_id in early:
                self._set_room(host_id)
                continue
            value = len(free[host_id]) + cheap.get(host_id, 0)
            room[host_id] = value
            self._pool_room(pool_of[host_id], host.gpus)[value].add(index_of[host_id])

    def _pool_room(self, pool: str, size: int) -> list[OrderedIds]:
        """The pool's cheap-room buckets, long enough for a host of ``size`` GPUs."""
        buckets = self._room_buckets.setdefault(pool, [])
        while len(buckets) <= size:
            buckets.append(OrderedIds())
        return buckets

    def _cheap(self, run: Running) -> bool:
        if run.wid in self.earmarked:
            return False
        if self.terminating(run):
            return run.wid not in self.claimed
        return not run.allocated

    def _set_room(self, host_id: str) -> None:
        room = self._room
        if room is None or not schedulable(self.st.host(host_id)):
            return
        value = len(self.free_of(host_id))
        for run in self.st.on_host[host_id].values():
            if self._cheap(run):
                value += gpus_on(run, host_id)
        buckets = self._pool_room(self.st.pool_of[host_id], self.st.host(host_id).gpus)
        idx = self.st.host_index[host_id]
        old = room.get(host_id)
        if old == value:
            return
        if old is not None:
            buckets[old].discard(idx)
        room[host_id] = value
        buckets[value].add(idx)

    def memo(self, host_id: str) -> dict[object, object]:
        """Scratch space for what a planner computed from ``host_id``'s state in this view
        alone (its free GPUs, its occupants, their notices, claims and earmarks): emptied
        whenever a decision touches the host, so a value read from it is still true."""
        memo = self._memo.get(host_id)
        if memo is None:
            memo = self._memo[host_id] = {}
        return memo

    def touched(self, host_ids: Iterable[str]) -> None:
        """Recompute cheap room and clearing costs where a decision changed something, and
        forget what planners kept about those hosts."""
        memo = self._memo
        room_built = self._room is not None
        clear_built = self._clear is not None
        for host_id in host_ids:
            memo.pop(host_id, None)
            if room_built:
                self._set_room(host_id)
            else:
                self._touched_early.add(host_id)  # counted in full when room is built
            if clear_built:
                self._clear_stale.add(host_id)  # re-costed on the next read

    # ------------------------------------------------------ clearing whole hosts
    def clear_cost(self, host_id: str) -> tuple[float, ...] | None:
        """What preempting everything on ``host_id`` costs, as the preemption planner ranks
        hosts: ``(worst victim class, GPUs of new victims, work lost, host order)`` with
        classes 0 = under notice, 1 = unallocated, 2 = allocated (lost work is GPUs x time
        since start, summed exactly so that the order of the occupants does not matter).
        None when an occupant cannot move (allocated work still protected, earmarked work,
        work under notice that a request already awaits) or some GPUs were taken this
        cycle. Whether a given request may take the allocated occupants is its rule's to
        say."""
        worst = 0
        gpus = 0
        lost: list[float] = []
        now = self.now
        room = len(self.free_of(host_id))  # GPUs taken this cycle cannot be cleared
        for wid, run in self.st.on_host[host_id].items():
            if wid in self.earmarked:
                return None
            room += gpus_on(run, host_id)
            if self.terminating(run):
                if wid in self.claimed:
                    return None
                continue
            if run.allocated:
                if run.protected_until > now:
                    return None
                worst = 2
            elif worst == 0:
                worst = 1
            gpus += run.gpus
            lost.append(run.gpus * (now - run.start_time))
        if room < self.st.host(host_id).gpus:
            return None
        return (worst, gpus, math.fsum(lost), self.st.host_index[host_id])

    def clear_order(
        self, pool: str, *, cheap_only: bool = False
    ) -> Iterator[tuple[tuple[float, ...], str]]:
        """``(clear_cost, host)`` for the schedulable hosts of ``pool``'s largest size that
        could be cleared, cheapest first (free hosts first of all). Lazy: a planner that
        needs k hosts reads about k entries, not the pool. ``cheap_only``: the reader stops
        at the first host with allocated work (class 2), so only the hosts of cheap room
        ``largest`` need costing until a reader wants the rest. Do not change the view
        while reading it."""
        if self._clear is None:
            self._build_clear(cheap_only)
        elif not cheap_only and not self._clear_all:
            self._clear_all = True  # cost every host not costed yet
            for host_id in self.st.host_ids:
                if host_id not in self._clear_key:
                    self._set_clear(host_id)
        assert self._clear is not None
        if self._clear_stale:
            for host_id in self._clear_stale:
                self._set_clear(host_id)
            self._clear_stale.clear()
        heap = self._clear.get(pool)
        if not heap:
            return
        keys = self._clear_key
        ids = self.st.host_at
        while heap and keys.get(ids[heap[0][1]]) != heap[0][0]:
            heapq.heappop(heap)  # hosts taken by earlier plans sit on top: drop them
        seen: set[int] = set()
        for key, idx in ascending(heap):
            host_id = ids[idx]
            if idx not in seen and keys.get(host_id) == key:
                seen.add(idx)
                yield key, host_id

    def _build_clear(self, cheap_only: bool) -> None:
        self._clear = {}
        self._clear_all = not cheap_only
        if cheap_only:  # the hosts whose room is all cheap: those of room = their size
            self._build_room()
            hosts = [
                self.st.host_at[i]
                for pool, buckets in self._room_buckets.items()
                if len(buckets) > (size := self.st.pool_max_gpus.get(pool, 0))
                for i in buckets[size]
            ]
        else:
            hosts = self.st.host_ids
        largest = self.st.pool_max_gpus
        for host_id in hosts:
            host = self.st.host(host_id)
            pool = self.st.pool_of[host_id]
            if host.gpus != largest.get(pool) or not schedulable(host):
                continue
            key = self._clear_cost_kept(host_id)
            if key is not None:
                self._clear_key[host_id] = key
                self._clear.setdefault(pool, []).append((key, self.st.host_index[host_id]))
        for heap in self._clear.values():
            heapq.heapify(heap)

    def _clear_cost_kept(self, host_id: str) -> tuple[float, ...] | None:
        """``clear_cost``, or None for a host with allocated work while only cheap hosts
        are kept."""
        key = self.clear_cost(host_id)
        if key is not None and key[0] == 2 and not self._clear_all:
            return None
        return key

    def _set_clear(self, host_id: str) -> None:
        heaps = self._clear
        if heaps is None:
            return
        host = self.st.host(host_id)
        pool = self.st.pool_of[host_id]
        if host.gpus != self.st.pool_max_gpus.get(pool):
            return
        key = self._clear_cost_kept(host_id) if schedulable(host) else None
        if key == self._clear_key.get(host_id):
            return
        if key is None:
            del self._clear_key[host_id]
            return
        self._clear_key[host_id] = key
        heapq.heappush(heaps.setdefault(pool, []), (key, self.st.host_index[host_id]))

    # ----------------------------------------------------------------- writes
    def take(self, assignment: Assignment) -> None:
        """Remove GPUs from the free pool for the rest of the cycle (placed or reserved)."""
        for host_id, gpus in assignment:
            free = self.free_of(host_id)
            taken = set(gpus)
            left = [g for g in free if g not in taken]
            self._free[host_id] = left
            host = self.st.host(host_id)
            if not schedulable(host):
                continue
            buckets = self.buckets(self.st.pool_of[host_id])
            assert buckets is not None
            idx = self.st.host_index[host_id]
            buckets[len(free)].discard(idx)
            buckets[len(left)].add(idx)
        self.touched(h for h, _ in assignment)

    def reserve(self, victims: Iterable[Running], free: Assignment) -> None:
        """A request waits for these victims' GPUs and the free GPUs beside them: nobody
        else may use either for the rest of the cycle."""
        victims = list(victims)
        for run in victims:
            if self.terminating(run):
                self._count_noticed(run, -1)
        self.claimed.update(r.wid for r in victims)
        self.take(free)
        self.touched({h for r in victims for h, _ in r.assignment})

    def unclaim(self, victims: Iterable[Running]) -> None:
        """Undo ``reserve`` of these victims (not of free GPUs): others may plan with them."""
        victims = [r for r in victims if r.wid in self.claimed]
        self.claimed.difference_update(r.wid for r in victims)
        for run in victims:
            if self.terminating(run):
                self._count_noticed(run, +1)
        self.touched({h for r in victims for h, _ in r.assignment})

    def earmark(self, victims: Iterable[Running], free: Assignment) -> int:
        """Hold back ``free`` from allocated work until ``release_earmarks``; the victims
        stay put (they are protected) but no other request may plan with them. Returns a
        handle for ``unhold``."""
        victims = list(victims)
        for run in victims:
            if self.terminating(run):
                self._count_noticed(run, -1)
        self.earmarked.update(r.wid for r in victims)
        self.take(free)
        self._earmarks.append(free)
        self.touched({h for r in victims for h, _ in r.assignment})
        return len(self._earmarks) - 1

    def held_free(self, handle: int) -> Assignment:
        """The free GPUs earmark ``handle`` still holds back."""
        return self._earmarks[handle]

    def unhold(self, handle: int, part: Assignment, victims: Iterable[Running] = ()) -> None:
        """Give back ``part`` of earmark ``handle``'s free GPUs, and ``victims`` to the
        planners (a reservation's own request, or backfill that ends in time)."""
        gone = {h: set(g) for h, g in part}
        left = tuple(
            (h, kept)
            for h, g in self._earmarks[handle]
            if (kept := tuple(x for x in g if x not in gone.get(h, ())))
        )
        self._earmarks[handle] = left
        self.give(part)
        victims = [r for r in victims if r.wid in self.earmarked]
        self.earmarked.difference_update(r.wid for r in victims)
        for run in victims:
            if self.terminating(run):
                self._count_noticed(run, +1)
        self.touched({h for r in victims for h, _ in r.assignment})

    def release_earmarks(self) -> None:
        for free in self._earmarks:
            self.give(free)
        self._earmarks.clear()

    def give(self, assignment: Assignment) -> None:
        """Return GPUs taken earlier this cycle (an earmark released)."""
        for host_id, gpus in assignment:
            free = self.free_of(host_id)
            back = sorted([*free, *gpus])
            self._free[host_id] = back
            buckets = self.buckets(self.st.pool_of[host_id])
            assert buckets is not None
            idx = self.st.host_index[host_id]
            buckets[len(free)].discard(idx)
            buckets[len(back)].add(idx)
        self.touched(h for h, _ in assignment)

    def notice(self, run: Running, preempt_at: float, *, touch: bool = True) -> None:
        """``touch=False``: the caller touches the run's hosts itself before any read (a
        plan's notices, then ``reserve`` of all its victims)."""
        self.noticed[run.wid] = preempt_at
        self._count_noticed(run, +1)
        if touch:
            self.touched(h for h, _ in run.assignment)
        alloc = run.allocation
        if run.allocated and alloc is not None:
            self.victim_held[alloc] = self.victim_held.get(alloc, 0) - run.gpus
