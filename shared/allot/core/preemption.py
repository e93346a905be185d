"""The preemption planner: the fewest, cheapest victims that make a request fit.

Input: a cycle's ``ClusterView``, the request's pool and GPU count, and a ``VictimRule``
(who may be preempted, and in what preference). Output: a ``Plan`` or ``None``.

Rules (rule 8 of the design):

1. Never a protected workload (unless the rule ignores protection); the rule decides the
   rest.
2. A gang victim is freed whole: preempting it ends it on every host it spans.
3. Work already under notice and not yet claimed costs nothing: it is used first, so a
   request waiting out a grace period never causes a second round of preemptions.
4. Single-host requests (g <= largest host G): for each candidate host, take victims in
   the rule's preference order until free + freed >= g, then drop (least preferred first)
   every victim the fit does not need. Among hosts, pick the smallest cost
   ``(worst victim class, GPUs of new victims, work lost, host order)``: the victims free
   what the request needs on one host, not GPUs scattered over many.
5. Gangs (g > G): g // G hosts of size G are cleared whole (the cheapest ones by the same
   cost, free hosts costing nothing), and the remainder is planned as in 4 on another host.

When only cheap victims are needed (unallocated work, unclaimed notices), the hosts come
from an index by cheap room, and rule 4 compares the first ``CHEAP_CANDIDATES`` that fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final, Protocol, cast

from allot.core.heap_order import OrderedIds
from allot.core.model import Assignment
from allot.core.placement import ClusterView
from allot.core.running import Running
from allot.core.state import gpus_on, schedulable

_NOTICED_KEY: tuple[object, ...] = (0, -1.0, 0.0)  # before any other class-0 option


class VictimRule(Protocol):
    """Who a request may preempt. A rule whose ``costs_by_kind`` is true ranks unallocated
    work class 1 (0 when it ignores protection), allocated work class 2 and nothing higher:
    the planners read hosts in ``ClusterView.clear_order`` for it, and ``_best_host`` bounds
    a host's cost by the allocated GPUs its cheap room leaves it to take."""

    def key(self, run: Running, victim_held: Mapping[str, int]) -> tuple[object, ...] | None:
        """Preference key (smaller is preempted first; first item is the victim class),
        or None when ``run`` may not be preempted for this request."""

    def keeps_eligible(self, run: Running, victim_held: Mapping[str, int]) -> bool:
        """Whether ``run`` is still a fair victim given the victims already chosen."""

    def may_take_allocated(self, victim_held: Mapping[str, int]) -> bool:
        """Whether any allocated work at all could be a victim (a cheap early exit)."""


class Plan:
    """Where a request goes and whom it displaces. Plain classes here, not dataclasses: a
    written-out ``__init__`` is compiled with the core, a dataclass's is not (decision
    0070); ``Final`` fields stand for ``frozen``."""

    __slots__ = ("free_taken", "hosts", "new_victims", "victims")

    def __init__(
        self,
        hosts: tuple[str, ...],
        victims: tuple[Running, ...],
        new_victims: tuple[Running, ...],
        free_taken: Assignment,
    ) -> None:
        self.hosts: Final = hosts
        self.victims: Final = victims  # every workload whose GPUs the request will use
        self.new_victims: Final = new_victims  # the ones that need a notice now
        self.free_taken: Final = free_taken  # free GPUs on the planned hosts, reserved for it


class _HostPlan:
    """One host's option: its cost, the victims it needs and its free GPUs."""

    __slots__ = ("cost", "free", "host", "victims")

    def __init__(
        self, host: str, cost: tuple[float, ...], victims: list[Running], free: tuple[int, ...]
    ) -> None:
        self.host = host
        self.cost = cost
        self.victims = victims
        self.free = free


def plan_preemption(view: ClusterView, pool: str, gpus: int, rule: VictimRule) -> Plan | None:
    largest = view.st.pool_max_gpus.get(pool)
    if largest is None:
        return None
    if getattr(rule, "unallocated_first", False):
        plan = _plan_cheap(view, pool, gpus, largest)
        if plan is not None:
            return plan
        if not rule.may_take_allocated(view.victim_held):
            return None
    return _plan_full(view, pool, gpus, largest, rule)


class _CheapRule:
    """Victims that cost no allocation anything: unallocated work (and, as always, work
    already under notice that nobody claimed)."""

    __slots__ = ("now",)
    costs_by_kind = True  # class 1 for unallocated work (see ``_clearable_in_order``)

    def __init__(self, now: float) -> None:
        self.now: Final = now

    # Equal by ``now``, as the dataclass it was: ``_cheap_option``'s per-host memo keys on
    # the rule, and every cheap plan of a cycle makes its own.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _CheapRule):
            return NotImplemented
        return self.now == other.now

    def __hash__(self) -> int:
        return hash((self.now,))

    def key(self, run: Running, victim_held: Mapping[str, int]) -> tuple[object, ...] | None:
        if run.allocated:
            return None
        return (1, 0.0, run.gpus * (self.now - run.start_time), run.wid)

    def keeps_eligible(self, run: Running, victim_held: Mapping[str, int]) -> bool:
        return True

    def may_take_allocated(self, victim_held: Mapping[str, int]) -> bool:
        return False


def plan_cheap(view: ClusterView, pool: str, gpus: int) -> Plan | None:
    """A plan of cheap victims alone (free GPUs, unallocated work, work under notice that
    nobody claimed), the first step of ``plan_preemption`` for a Fair Tree request; None
    when there is none. Any allocated request may take cheap victims."""
    largest = view.st.pool_max_gpus.get(pool)
    return None if largest is None else _plan_cheap(view, pool, gpus, largest)


def _plan_cheap(view: ClusterView, pool: str, gpus: int, largest: int) -> Plan | None:
    """Rules 3-5 restricted to cheap victims, found through the cheap-room index in
    O(host size): GPUs already under notice first (no new notice at all), then the host
    whose cheap room is the smallest that fits frees what the request needs and no more
    (best fit, as placement does for free GPUs)."""
    rule = _CheapRule(view.now)
    buckets = view.room_buckets(pool)
    held = view.victim_held  # cheap victims are unallocated: nothing charges it
    whole_count, rest = divmod(gpus, largest) if gpus > largest else (0, gpus)
    chosen: list[_HostPlan] = []
    if whole_count:
        if len(buckets) <= largest or len(buckets[largest]) < whole_count:
            return None  # too few hosts with cheap room for all their GPUs
        # The hosts of cheap room ``largest`` are those the clearing order ranks below
        # class 2 (no allocated occupant): free hosts first, then the fewest victims.
        for key, host in view.clear_order(pool, cheap_only=True):
            if key[0] == 2 or len(chosen) == whole_count:
                break
            option = _clear_host(view, host, largest, rule, held)
            assert option is not None and option.cost == key, (host, key)
            chosen.append(option)
        if len(chosen) < whole_count:
            return None
    if rest:
        exclude = {view.st.host_index[o.host] for o in chosen}
        extra = _noticed_host(view, pool, rest, exclude) or _cheap_host(
            view, buckets, rest, rule, held, exclude=exclude
        )
        if extra is None:
            return None
        chosen.append(extra)
    return _plan(chosen, view)


CHEAP_CANDIDATES = 4
"""Hosts a cheap plan compares for one request (rule 4's cost) when none of them frees
exactly what it needs, taken from the smallest cheap room that fits upward. Bounded, as
each costs a host plan (docs/decisions/0020)."""


def _cheap_host(
    view: ClusterView,
    buckets: list[OrderedIds],
    gpus: int,
    rule: _CheapRule,
    held: dict[str, int],
    *,
    exclude: set[int],
) -> _HostPlan | None:
    """The first host, by cheap room then index, whose plan frees exactly ``gpus``; when
    none of the first ``CHEAP_CANDIDATES`` does, the cheapest of them. Room alone does not
    say what a host frees: a host with one 8-GPU victim and one with two 4-GPU victims
    both have room 8, and a 4-GPU request needs a notice for 4 GPUs on the second, 8 on
    the first (a 12-GPU gang's remainder taking the first, the lowest index, preempted 4
    GPUs for nothing: docs/decisions/0020). Cheap victims charge no allocation, so
    planning a host changes nothing until one is chosen."""
    best: _HostPlan | None = None
    seen = 0
    for room in range(gpus, len(buckets)):
        for idx in buckets[room].smallest(CHEAP_CANDIDATES - seen, exclude):
            host = view.st.host_at[idx]
            option, exact = _cheap_option(view, host, gpus, rule, held)
            if option is None:
                continue
            if exact:
                return option  # nothing to spare: no other host frees less
            if best is None or option.cost < best.cost:
                best = option
            seen += 1
            if seen >= CHEAP_CANDIDATES:
                return best
    return best


def _cheap_option(
    view: ClusterView, host: str, gpus: int, rule: _CheapRule, held: dict[str, int]
) -> tuple[_HostPlan | None, bool]:
    """``host``'s cheap plan for ``gpus`` and whether it frees exactly that many, kept in
    the view's memo of the host: it depends on the host's state alone (cheap victims
    charge no allocation), and the hosts a request compares but does not take are the
    next request's candidates again."""
    memo = view.memo(host)
    key = (rule, gpus)
    kept = memo.get(key)
    if kept is None:
        option = _best_host(view, [host], gpus, rule, held, exclude=set())
        exact = option is not None and (
            len(option.free) + sum(gpus_on(r, host) for r in option.victims) == gpus
        )
        kept = memo[key] = (option, exact)
    return cast(tuple[_HostPlan | None, bool], kept)


class _NoNewVictims:
    """Only GPUs already under notice (and free ones) may be used."""

    def key(self, run: Running, victim_held: Mapping[str, int]) -> tuple[object, ...] | None:
        return None

    def keeps_eligible(self, run: Running, victim_held: Mapping[str, int]) -> bool:
        return True

    def may_take_allocated(self, victim_held: Mapping[str, int]) -> bool:
        return False


def _noticed_host(view: ClusterView, pool: str, gpus: int, exclude: set[int]) -> _HostPlan | None:
    """Rule 3: the host where free GPUs plus unclaimed GPUs under notice fit ``gpus`` most
    tightly; None when no such host exists."""
    best: tuple[int, int, str] | None = None
    for host, noticed in view.noticed_room().items():
        if noticed <= 0:
            continue
        idx = view.st.host_index[host]
        if idx in exclude or view.st.pool_of[host] != pool or not schedulable(view.st.host(host)):
            continue
        room = noticed + len(view.free_of(host))
        if room >= gpus and (best is None or (room, idx) < best[:2]):
            best = (room, idx, host)
    if best is None:
        return None
    return _best_host(view, [best[2]], gpus, _NoNewVictims(), {}, exclude=set())


def _plan_full(
    view: ClusterView, pool: str, gpus: int, largest: int, rule: VictimRule
) -> Plan | None:
    respect = not _ignores_protection(rule)
    held = dict(view.victim_held)
    take_from = getattr(rule, "may_take_from", None)
    if gpus <= largest:
        if take_from is not None and getattr(rule, "unallocated_first", False):
            hosts = _hosts_with_victims(view, pool, take_from, held, respect=respect)
        else:
            hosts = view.candidate_hosts(pool, respect)
        best = _best_host(view, hosts, gpus, rule, held, exclude=set())
        return None if best is None else _plan([best], view)
    whole_count, rest = divmod(gpus, largest)
    chosen: list[_HostPlan] = []
    taken: set[str] = set()
    if respect and getattr(rule, "costs_by_kind", False):
        options: Iterable[_HostPlan] = _clearable_in_order(view, pool, largest, rule, held)
    else:
        if take_from is None:
            hosts = view.candidate_hosts(pool, respect)
        else:
            hosts = _clearable_candidates(view, pool, largest, take_from, held, respect=respect)
        options = _clearable_scanned(view, pool, largest, rule, held, hosts=hosts)
    for option in options:
        if len(chosen) == whole_count:
            break
        if not all(r.wid in taken or _still_fair(view, r, rule, held) for r in option.victims):
            continue
        chosen.append(option)
        for r in option.victims:
            if r.wid not in taken:
                taken.add(r.wid)
                _charge(view, r, held)
    if len(chosen) < whole_count:
        return None
    if rest:
        exclude = {o.host for o in chosen}
        near = hosts_with_free(view, pool, view.candidate_hosts(pool, respect))
        extra = _best_host(view, near, rest, rule, held, exclude=exclude)
        if extra is None:
            return None
        chosen.append(extra)
    return _plan(chosen, view)


def _hosts_with_victims(
    view: ClusterView,
    pool: str,
    take_from: Callable[[str, Mapping[str, int]], bool],
    held: Mapping[str, int],
    *,
    respect: bool = True,
) -> list[str]:
    """The hosts of ``pool`` where an allocation the rule may take from runs work past
    its protection (any of its work, for a rule that ignores protection). After a failed
    cheap plan no host fits on free GPUs, notices and unallocated work alone, so no other
    host can serve; the best host is the cheapest by a cost that ends in the host's
    order, so the order of this list does not matter."""
    allowed = tuple(a for a in view.st.running_of if a is not None and take_from(a, held))
    return view.movable_hosts_among(allowed, pool, respect=respect)


def _clearable_in_order(
    view: ClusterView, pool: str, largest: int, rule: VictimRule, held: Mapping[str, int]
) -> Iterator[_HostPlan]:
    """The hosts this rule may clear, cheapest first: the view's clearing order of hosts
    with no allocated occupant (a rule with ``costs_by_kind`` ranks a host as
    ``ClusterView.clear_cost`` does; it only rules some hosts out), then the hosts with
    allocated work (class 2). A rule that names the allocations it may take from
    (``may_take_from``) can clear a class-2 host only where such an allocation runs work
    past its protection, so only those hosts are costed; the others read the view's whole
    order. Each host is costed as the cycle stood before this plan."""
    costed = dict(held)
    take_from = getattr(rule, "may_take_from", None)
    for key, host in view.clear_order(pool, cheap_only=take_from is not None):
        if take_from is not None and key[0] == 2:
            break  # the order holds class 2 too once another reader asked for it whole
        if not view.st.on_host[host]:
            yield _HostPlan(host, key, [], tuple(view.free_of(host)))
        elif view.has_movable(host):
            option = _clear_host(view, host, largest, rule, costed)
            if option is not None:
                assert option.cost == key, (host, key)
                yield option
    if take_from is None:
        return
    keyed: list[tuple[tuple[float, ...], str]] = []
    for host in _hosts_with_victims(view, pool, take_from, costed):
        if view.st.host(host).gpus == largest:
            cost = view.clear_cost(host)
            if cost is not None and cost[0] == 2:  # classes 0 and 1 came from the order
                keyed.append((cost, host))
    keyed.sort()
    for cost, host in keyed:
        option = _clear_host(view, host, largest, rule, costed)
        if option is not None:
            assert option.cost == cost, (host, cost)
            yield option


def _clearable_candidates(
    view: ClusterView,
    pool: str,
    largest: int,
    take_from: Callable[[str, Mapping[str, int]], bool],
    held: Mapping[str, int],
    *,
    respect: bool,
) -> list[str]:
    """The ``candidate_hosts`` that a rule naming the allocations it may take from could
    clear whole: every occupant movable, so either all of them cheap (cheap room = the
    host's size) or some allocated work of such an allocation among them. The scan costs
    these instead of every candidate; it sorts what it costs, so the order is free."""
    buckets = view.room_buckets(pool)
    cheap = buckets[largest] if len(buckets) > largest else ()
    hosts = {view.st.host_at[i] for i in cheap}
    hosts.update(_hosts_with_victims(view, pool, take_from, held, respect=respect))
    on_host = view.st.on_host
    # ``candidate_hosts``' own test: any occupant, or (respecting protection) one that may move
    if respect:
        return [h for h in hosts if on_host[h] and view.has_movable(h)]
    return [h for h in hosts if on_host[h]]


def _clearable_scanned(
    view: ClusterView,
    pool: str,
    largest: int,
    rule: VictimRule,
    held: Mapping[str, int],
    *,
    hosts: list[str],
) -> list[_HostPlan]:
    """The same for any other rule: every candidate host costed, then sorted."""
    options: list[_HostPlan] = []
    buckets = view.buckets(pool) or []
    fully_free: Iterable[int] = buckets[largest] if len(buckets) > largest else ()
    seen: set[str] = set()
    for idx in sorted(fully_free):
        host = view.st.host_at[idx]
        seen.add(host)
        options.append(_HostPlan(host, (0, 0, 0.0, idx), [], tuple(view.free_of(host))))
    for host in hosts:
        if host in seen or view.st.host(host).gpus != largest:
            continue
        option = _clear_host(view, host, largest, rule, held)
        if option is not None:
            options.append(option)
    options.sort(key=lambda o: o.cost)
    return options


def hosts_with_free(view: ClusterView, pool: str, candidates: list[str]) -> list[str]:
    """Candidate hosts plus every schedulable host of the pool with some free GPU."""
    buckets = view.buckets(pool) or []
    free_hosts = {view.st.host_at[i] for b in buckets[1:] for i in b}
    return sorted(free_hosts.union(candidates))


def _ignores_protection(rule: VictimRule) -> bool:
    return bool(getattr(rule, "ignores_protection", False))


def _still_fair(view: ClusterView, run: Running, rule: VictimRule, held: dict[str, int]) -> bool:
    return view.terminating(run) or rule.keeps_eligible(run, held)


def _charge(view: ClusterView, run: Running, held: dict[str, int]) -> None:
    """Count a chosen new victim against its allocation's held GPUs for later choices."""
    alloc = run.allocation
    if not view.terminating(run) and run.allocated and alloc is not None:
        held[alloc] = held.get(alloc, 0) - run.gpus


def _options_on(
    view: ClusterView, host: str, rule: VictimRule, held: Mapping[str, int]
) -> tuple[list[tuple[tuple[object, ...], Running]], bool]:
    """Movable occupants of ``host`` with their preference keys, and whether every
    occupant is movable (needed to clear a host whole). Sorted by key, then workload id
    (as a stable sort of the occupants by id would leave equal keys)."""
    options: list[tuple[tuple[object, ...], Running]] = []
    all_movable = True
    earmarked = view.earmarked
    claimed = view.claimed
    noticed = view.noticed
    for wid, run in view.st.on_host[host].items():
        if wid in earmarked:
            all_movable = False
            continue
        if run.preempt_at is not None or wid in noticed:  # ``view.terminating(run)``
            if wid in claimed:
                all_movable = False
                continue
            options.append(((*_NOTICED_KEY, wid), run))
            continue
        key = rule.key(run, held)
        if key is None:
            all_movable = False
            continue
        options.append((key, run))
    options.sort(key=_option_order)
    return options, all_movable


def _option_order(option: tuple[tuple[object, ...], Running]) -> tuple[object, ...]:
    return (option[0], option[1].wid)


def _cost(
    view: ClusterView, host: str, victims: list[Running], klass: Mapping[str, object]
) -> tuple[float, ...]:
    """``(worst victim class, GPUs of new victims, work lost, host order)``; the class is
    the first item of the rule's preference key (0 for work already under notice). The
    exact sum makes the cost of a host independent of its occupants' order, so
    ``ClusterView.clear_cost`` gives the same figure."""
    new = [r for r in victims if not view.terminating(r) and klass.get(r.wid, 0) != 0]
    worst = 0
    for r in new:
        c = klass.get(r.wid, 0)
        worst = max(worst, c if isinstance(c, int) else 0)
    lost = math.fsum(r.gpus * (view.now - r.start_time) for r in new)
    return (worst, sum(r.gpus for r in new), lost, view.st.host_index[host])


def _best_host(
    view: ClusterView,
    hosts: list[str],
    gpus: int,
    rule: VictimRule,
    held: dict[str, int],
    *,
    exclude: set[str],
) -> _HostPlan | None:
    best: _HostPlan | None = None
    # A host whose cheap room (free GPUs, unclaimed notices, unallocated work) falls short
    # of the request by n must give it allocated work: its cost is at least (2, n) (a rule
    # with ``costs_by_kind`` ranks allocated victims class 2, and a victim's GPUs count
    # whole). Hosts taken by that bound, smallest first, stop once it exceeds the best
    # cost found: the cost ends in the host's order, so the order read does not matter.
    short_by: dict[str, int] = {}
    if getattr(rule, "costs_by_kind", False) and len(hosts) > 1:
        short_by = {h: gpus - view.cheap_room(h) for h in hosts if schedulable(view.st.host(h))}
        hosts = sorted(hosts, key=lambda h: short_by.get(h, 0))
    for host in hosts:
        short = short_by.get(host, 0)
        if best is not None and short > 0 and (2, short) > best.cost[:2]:
            break
        if host in exclude or view.st.host(host).gpus < gpus:
            continue
        free = view.free_of(host)
        options, _ = _options_on(view, host, rule, held)
        if len(free) + sum(gpus_on(r, host) for _, r in options) < gpus:
            continue
        local: dict[str, int] | None = None  # held minus this host's picks, copied on write
        got = len(free)
        picked: list[Running] = []
        for _, run in options:
            if got >= gpus:
                break
            if not _still_fair(view, run, rule, held if local is None else local):
                continue
            picked.append(run)
            if run.allocated and not view.terminating(run):
                if local is None:
                    local = dict(held)
                _charge(view, run, local)
            got += gpus_on(run, host)
        if got < gpus:
            continue
        for run in reversed(list(picked)):  # drop what the fit does not need
            n = gpus_on(run, host)
            if got - n >= gpus:
                picked.remove(run)
                got -= n
        klass = {r.wid: k[0] for k, r in options}
        option = _HostPlan(host, _cost(view, host, picked, klass), picked, tuple(free))
        if best is None or option.cost < best.cost:
            best = option
    if best is not None:
        for run in best.victims:
            _charge(view, run, held)
    return best


def _clear_host(
    view: ClusterView, host: str, size: int, rule: VictimRule, held: Mapping[str, int]
) -> _HostPlan | None:
    options, all_movable = _options_on(view, host, rule, held)
    if not all_movable:
        return None
    victims = [r for _, r in options]
    free = view.free_of(host)
    if len(free) + sum(gpus_on(r, host) for r in victims) < size:
        return None
    klass = {r.wid: k[0] for k, r in options}
    return _HostPlan(host, _cost(view, host, victims, klass), victims, tuple(free))


def _plan(parts: list[_HostPlan], view: ClusterView) -> Plan:
    victims: dict[str, Running] = {}
    for part in parts:
        for run in part.victims:
            victims[run.wid] = run
    ordered = tuple(victims[k] for k in sorted(victims))
    return Plan(
        hosts=tuple(p.host for p in parts),
        victims=ordered,
        new_victims=tuple(r for r in ordered if not view.terminating(r)),
        free_taken=tuple(sorted((p.host, p.free) for p in parts if p.free)),
    )
