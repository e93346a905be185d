"""Twin parity: the live leader's decisions, decided again from the log (``allot twin``).

Input: the log's records as ``allot.ops.log_reader`` hands them over (each stream in its own
order; the USAGE stream's budget trees, rankings *and* idle flags), the placement service's
policy, the window of cycles to compare and a timing tolerance. Output: a ``Parity``, every
live cycle compared, with the fraction of identical placements and each difference's kind
(``KINDS``). No I/O, no clock.

1. **A live cycle** is the decision records one leader wrote at once: ``WorkloadPlaced`` and
   ``PreemptionNotice`` (WORKLOADS) and ``HostDrained`` (HOSTS) with the same ``(epoch,
   at)``; ``at`` is the cycle's ``now``. A cycle that decided nothing left no record and is
   not compared.
2. **One order for three streams.** The records are merged into one sequence of steps, each
   stream in its own order, by a lower bound of the time each was stored: the latest stamp
   (``at``) of its stream up to it (a record is stored after every earlier record of its
   stream was stamped). Rankings are steps too: placement takes each as it is published.
   Runs' starts are left out, as placement's reader leaves them out (they decide nothing).
3. **The state the leader decided on** (its ``LogFold`` and the ranking it held) is the fold
   of a prefix of the steps. The cycle's *natural cut*: every step before the cycle's first
   record whose bound is at most ``now`` (a record stamped later was not yet written). Its
   *floor*: just after the same leader's previous cycle's last WORKLOADS record (or its
   ``LeaderElected``): the leader decides again only once its decisions are back in its
   fold, so it had read that far.
4. **The replay**: ``run_cycle``, the core's one scheduling entry point (the simulator's
   too), at ``now`` on the cut's snapshot, made by placement's own ``LastRanking.snapshot``
   from the fold and the last ranking read. Its placements (workload, hosts and
   GPUs, in order), notices (workload, reason, deadline, preemptor) and drains are compared
   with the recorded ones. The log's decisions, not the replay's, then go into the fold:
   each cycle is judged on the state the live leader had, and a difference does not carry
   into later cycles.

**Timing tolerance.** A cycle runs when records arrive; a record stored while the leader was
computing (or still queued in its reader: a loaded leader reads the log tens of milliseconds
late) lies before the cycle's decisions in the log and is stamped before ``now``, yet was not
in its snapshot. A cycle that differs at the natural cut is therefore tried on earlier cuts,
dropping steps from its end, as long as every step dropped

* lies after the floor,
* is not one the live decisions show the leader had read (each placed workload's submission
  or requeue, each victim's placement, each notice's requester: ``_Replay.seen_by``),
* has a bound less than ``tolerance_s`` before ``now`` (``DEFAULT_TOLERANCE_S``),

and only where a dropped step changes what a cycle reads. A full match counts as identical
*within the tolerance*; of several, the cut closest to the natural one, so its first dropped
step is the record whose absence explains the decision, and names the kind (a submission, a
run's end, a ranking... in flight) and ``lag_s`` (``now`` minus that step's bound). At most
``MAX_CUTS`` earlier cuts are tried per cycle.

What still differs is classified: ``fenced`` (the log had a newer epoch: every fold ignored
the decisions), ``refused`` (the fold refused some of them, e.g. their GPUs were not free),
``order`` (the same placements in another order), ``notice-deadline`` (the same decisions,
other deadlines: the replay's grace settings are not the stack's), ``unexplained``.

Clocks. Stamps come from the writers' clocks (intake, dispatch, health, ranking, the
leader); the natural cut assumes they agree to well within the tolerance (one machine, or
NTP). A writer whose clock runs ahead shows as differences no cut explains.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

import msgspec

from allot.core.cycle import run_cycle
from allot.core.decisions import CycleResult
from allot.core.errors import ValidationError
from allot.core.model import Assignment, HostState
from allot.core.policy import Policy
from allot.eventlog.last_ranking import LastRanking
from allot.eventlog.logfold import Applied, LogFold
from allot.proto import messages as m

DEFAULT_TOLERANCE_S = 1.0
"""How long before a cycle's ``now`` a record may have been stamped and still be in flight
(docs/decisions/0051: dispatch lets reports linger 250 ms before it appends them, and a
loaded stack's appends take tens of milliseconds more)."""
MAX_CUTS = 1000
"""Earlier cuts tried per cycle at most, the earliest first (each one is a ``run_cycle``):
a loaded stack's leader may be a few hundred records behind the log."""

WORKLOADS_RECORDS: tuple[type[msgspec.Struct], ...] = (
    m.WorkloadSubmitted,
    m.CancelRequested,
    m.LeaderElected,
    m.WorkloadPlaced,
    m.PreemptionNotice,
    m.WorkloadPreempted,
    m.WorkloadRequeued,
    m.WorkloadCompleted,
    m.WorkloadFailed,
    m.WorkloadCancelled,
)
"""What of WORKLOADS placement reads (``DECISION_INPUTS``: all but runs' starts)."""
HOSTS_RECORDS: tuple[type[msgspec.Struct], ...] = (
    m.HostRegistered,
    m.HostDraining,
    m.HostHealthy,
    m.HostDrained,
)
USAGE_RECORDS: tuple[type[msgspec.Struct], ...] = (
    m.BudgetTreeSet,
    m.RankingUpdated,
    m.WorkloadFlaggedIdle,
    m.WorkloadIdleCleared,
)
_STREAM_OF: dict[type, int] = {
    **dict.fromkeys(HOSTS_RECORDS, 0),
    **dict.fromkeys(USAGE_RECORDS, 1),
    **dict.fromkeys(WORKLOADS_RECORDS, 2),
}
"""Record type -> its stream, numbered in the order a reader replays them (ties go first)."""
_WORKLOADS = 2


class Verdict(StrEnum):
    IDENTICAL = "identical"  # the same decisions at the natural cut
    WITHIN_TOLERANCE = "within-tolerance"  # the same decisions at an earlier cut
    DIFFERENT = "different"


FENCED = "fenced"
REFUSED = "refused"
ORDER = "order"
NOTICE_DEADLINE = "notice-deadline"
UNEXPLAINED = "unexplained"
_IN_FLIGHT: dict[type, str] = {
    m.WorkloadSubmitted: "submission-in-flight",
    m.CancelRequested: "cancel-in-flight",
    m.WorkloadCompleted: "run-end-in-flight",
    m.WorkloadFailed: "run-end-in-flight",
    m.WorkloadPreempted: "run-end-in-flight",
    m.WorkloadCancelled: "run-end-in-flight",
    m.RankingUpdated: "ranking-in-flight",
    m.BudgetTreeSet: "budget-change-in-flight",
    m.WorkloadFlaggedIdle: "idle-flag-in-flight",
    m.WorkloadIdleCleared: "idle-flag-in-flight",
    m.WorkloadPlaced: "decision-in-flight",
    m.PreemptionNotice: "decision-in-flight",
    **dict.fromkeys(HOSTS_RECORDS, "host-change-in-flight"),
}
KINDS: dict[str, str] = {
    "submission-in-flight": "a submission stored while the leader was deciding: in the "
    "log before the cycle's decisions, not in its snapshot",
    "run-end-in-flight": "a run's end (completed, failed, preempted, cancelled) stored while "
    "the leader was deciding (dispatch lets reports linger 250 ms)",
    "cancel-in-flight": "a cancel request stored while the leader was deciding",
    "ranking-in-flight": "a ranking published while the leader was deciding: it decided "
    "with the previous one",
    "budget-change-in-flight": "a budget tree stored while the leader was deciding",
    "idle-flag-in-flight": "an idle flag or its clear stored while the leader was deciding "
    "(only with the health service's --idle-preempt)",
    "host-change-in-flight": "a host's registration or health change stored while the "
    "leader was deciding",
    "decision-in-flight": "another leader's decisions stored while this one was deciding",
    FENCED: "decisions of an epoch the log had replaced (a paused old leader): every fold "
    "ignores them",
    REFUSED: "decisions the fold refused (the workload was not pending, its GPUs not free): "
    "the leader decided on a state the log does not give",
    ORDER: "the same placements in another order",
    NOTICE_DEADLINE: "the same decisions, notices with other deadlines: the stack's grace "
    "settings (--grace-s, --unallocated-grace-s) are not the ones given to the replay",
    UNEXPLAINED: "none of the above: the replay decided otherwise on every cut tried",
}
"""Every kind of difference and what it means (``allot twin`` prints these)."""


@dataclass(frozen=True, slots=True)
class Decided:
    """A placement: the workload, its hosts and GPUs."""

    workload_id: str
    assignment: Assignment


@dataclass(frozen=True, slots=True, order=True)
class Noticed:
    """A preemption notice: the victim, why, the deadline, the request it makes room for."""

    workload_id: str
    reason: str
    deadline: float
    preemptor: str | None


@dataclass(frozen=True, slots=True)
class Decisions:
    """One cycle's decisions: placements in order, notices and drained hosts sorted."""

    placements: tuple[Decided, ...] = ()
    notices: tuple[Noticed, ...] = ()
    drains: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CycleParity:
    """One live cycle and its replay at the cut chosen (see the module docstring)."""

    epoch: int
    at: float
    live: Decisions
    replay: Decisions
    verdict: Verdict
    kind: str | None = None
    """None when identical; an in-flight kind within the tolerance; else a difference's."""
    lag_s: float | None = None
    """Within the tolerance: ``at`` minus the first dropped step's bound."""
    dropped: int = 0
    """Steps dropped from the natural cut."""
    interleaved: bool = False
    """Another cycle's records lie among this one's in WORKLOADS."""

    @property
    def identical_placements(self) -> int:
        return len(set(self.live.placements) & set(self.replay.placements))

    @property
    def replay_only(self) -> int:
        return len(set(self.replay.placements) - set(self.live.placements))

    @property
    def identical_notices(self) -> int:
        return len(set(self.live.notices) & set(self.replay.notices))


@dataclass(frozen=True, slots=True)
class Parity:
    """Every live cycle of the window compared (``allot.eventlog.twin_figures`` sums them
    up)."""

    cycles: tuple[CycleParity, ...]
    tolerance_s: float
    since: float
    until: float
    records: int = 0

    @property
    def fraction_identical(self) -> float:
        """Identical placements (at the natural cut or within the tolerance) over every
        placement either side made in the cycles compared; 1.0 when there were none."""
        live = sum(len(c.live.placements) for c in self.cycles)
        extra = sum(c.replay_only for c in self.cycles)
        same = sum(c.identical_placements for c in self.cycles)
        return same / (live + extra) if live + extra else 1.0


def twin_parity(
    records: Iterable[msgspec.Struct],
    policy: Policy,
    *,
    since: float = -math.inf,
    until: float = math.inf,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    short_lane: Iterable[str] = (),
) -> Parity:
    """Compare each live cycle of ``[since, until]`` in ``records`` with ``run_cycle``'s
    decision under ``policy`` (see the module docstring); ``short_lane``: the placement
    service's short-lane hosts."""
    if not (isinstance(tolerance_s, int | float) and 0 <= tolerance_s < math.inf):
        raise ValidationError("tolerance_s", f"must be a finite number >= 0, got {tolerance_s!r}")
    if not since <= until:
        raise ValidationError("since", f"must not be after until ({since:g} > {until:g})")
    steps = _merged(records)
    effects, outcomes = _first_pass(steps)
    judge = _Judge(steps, effects, policy, tolerance_s, tuple(short_lane))
    cycles = _live_cycles(steps, judge.keys, outcomes)
    compared = [
        judge.compare(cycle)
        for cycle in sorted(cycles, key=lambda c: (c.natural, c.at))
        if since <= cycle.at <= until
    ]
    compared.sort(key=lambda c: (c.at, c.epoch))
    return Parity(tuple(compared), float(tolerance_s), since, until, records=len(steps))


# -- the steps ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Step:
    key: float
    """A lower bound of when it was stored: its stream's latest stamp up to it."""
    stream: int
    record: msgspec.Struct


def _merged(records: Iterable[msgspec.Struct]) -> list[_Step]:
    streams: list[list[_Step]] = [[], [], []]
    latest = [-math.inf] * 3
    for record in records:
        stream = _STREAM_OF.get(type(record))
        if stream is None:
            continue  # runs' starts, usage records: nothing placement decides on
        at = getattr(record, "at")  # noqa: B009 - every record of the three tuples has one
        latest[stream] = max(latest[stream], at)
        streams[stream].append(_Step(latest[stream], stream, record))
    # Stable: on equal bounds HOSTS before USAGE before WORKLOADS, as readers replay them.
    return list(heapq.merge(*streams, key=lambda s: s.key))


def _first_pass(steps: Sequence[_Step]) -> tuple[list[bool], dict[int, Applied]]:
    """Per step, whether it changes what a cycle reads (the fold, or the ranking's order);
    and what the fold made of each decision record (fenced, refused)."""
    fold = LogFold()
    order: Mapping[str, int] = {}
    effects = []
    outcomes: dict[int, Applied] = {}
    for k, step in enumerate(steps):
        record = step.record
        if isinstance(record, m.RankingUpdated):
            new = LastRanking.of(record, 0).order
            effects.append(new != order)
            order = new
            continue
        applied = fold.apply(record)
        # A new epoch changes the fold but nothing a cycle reads (fencing acts on the
        # decision records after it, which a cut drops too).
        effects.append(applied.changed and not isinstance(record, m.LeaderElected))
        if isinstance(record, m.WorkloadPlaced | m.PreemptionNotice | m.HostDrained):
            outcomes[k] = applied
    return effects, outcomes


class _Replay:
    """The fold of ``steps[:pos]``, the ranking's order there, and where each workload last
    became pending (its submission, or the end that requeued it) and last started."""

    def __init__(self, steps: Sequence[_Step], short_lane: tuple[str, ...]) -> None:
        self.steps = steps
        self.fold = LogFold(short_lane)
        self.ranking = LastRanking()
        self.pos = 0
        self.queued_at: dict[str, int] = {}
        self.placed_at: dict[str, int] = {}

    def advance(self, to: int) -> None:
        while self.pos < to:
            record = self.steps[self.pos].record
            if isinstance(record, m.RankingUpdated):
                self.ranking = LastRanking.of(record, self.ranking.version + 1)
            else:
                applied = self.fold.apply(record)
                if applied.requeued or (
                    applied.changed and isinstance(record, m.WorkloadSubmitted)
                ):
                    self.queued_at[getattr(record, "workload_id")] = self.pos  # noqa: B009
                elif applied.changed and isinstance(record, m.WorkloadPlaced):
                    self.placed_at[record.workload_id] = self.pos
            self.pos += 1

    def decide(self, policy: Policy, now: float) -> Decisions:
        return _replayed(run_cycle(self.ranking.snapshot(self.fold), policy, now))

    def seen_by(self, live: Decisions) -> int:
        """The shortest cut that holds what ``live`` shows its leader had read: each placed
        workload pending, each victim running, each notice's requester pending."""
        needed = [self.queued_at.get(p.workload_id, -1) for p in live.placements]
        for n in live.notices:
            needed.append(self.placed_at.get(n.workload_id, -1))
            if n.preemptor is not None:
                needed.append(self.queued_at.get(n.preemptor, -1))
        return max(needed, default=-1) + 1


# -- the live cycles ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Live:
    epoch: int
    at: float
    positions: list[int] = field(default_factory=list)
    records: list[msgspec.Struct] = field(default_factory=list)
    natural: int = 0
    floor: int = 0
    fenced: bool = False
    refused: bool = False
    interleaved: bool = False

    @property
    def decisions(self) -> Decisions:
        placements, notices, drains = [], [], []
        for r in self.records:
            if isinstance(r, m.WorkloadPlaced):
                hosts = tuple((hg.host, tuple(hg.gpus)) for hg in r.assignment)
                placements.append(Decided(r.workload_id, hosts))
            elif isinstance(r, m.PreemptionNotice):
                notices.append(Noticed(r.workload_id, r.reason, r.grace_deadline, r.preemptor))
            elif isinstance(r, m.HostDrained):
                drains.append(r.host)
        return Decisions(tuple(placements), tuple(sorted(notices)), tuple(sorted(drains)))


def _live_cycles(
    steps: Sequence[_Step], keys: Sequence[float], outcomes: Mapping[int, Applied]
) -> list[_Live]:
    cycles: dict[tuple[int, float], _Live] = {}
    elected: dict[int, int] = {}
    for k, step in enumerate(steps):
        r = step.record
        if isinstance(r, m.LeaderElected):
            elected.setdefault(r.epoch, k)
        if not isinstance(r, m.WorkloadPlaced | m.PreemptionNotice | m.HostDrained):
            continue
        cycle = cycles.setdefault((r.epoch, r.at), _Live(r.epoch, r.at))
        cycle.positions.append(k)
        cycle.records.append(r)
        applied = outcomes[k]
        if not applied.changed and not isinstance(r, m.HostDrained):
            cycle.fenced |= applied.why == "stale epoch"
            cycle.refused |= applied.why != "stale epoch"
    by_epoch: dict[int, list[_Live]] = {}
    for cycle in cycles.values():
        cycle.natural = min(cycle.positions[0], bisect.bisect_right(keys, cycle.at))
        by_epoch.setdefault(cycle.epoch, []).append(cycle)
    for epoch, own in by_epoch.items():
        own.sort(key=lambda c: c.at)
        floor = elected[epoch] + 1 if epoch in elected else 0
        for cycle in own:
            cycle.floor = min(floor, cycle.natural)
            in_workloads = [k for k in cycle.positions if steps[k].stream == _WORKLOADS]
            if in_workloads:
                floor = max(floor, in_workloads[-1] + 1)
    _mark_interleaved(steps, list(cycles.values()))
    return list(cycles.values())


def _mark_interleaved(steps: Sequence[_Step], cycles: Sequence[_Live]) -> None:
    """A cycle whose WORKLOADS records have another cycle's among them."""
    owner: dict[int, _Live] = {}
    for cycle in cycles:
        for k in cycle.positions:
            if steps[k].stream == _WORKLOADS:
                owner[k] = cycle
    for cycle in cycles:
        own = [k for k in cycle.positions if steps[k].stream == _WORKLOADS]
        if not own:
            continue
        for k in range(own[0], own[-1]):
            other = owner.get(k)
            if other is not None and other is not cycle:
                cycle.interleaved = other.interleaved = True
                break


# -- comparing one cycle -----------------------------------------------------------------------


def _replayed(result: CycleResult) -> Decisions:
    return Decisions(
        tuple(Decided(p.workload.id, p.assignment) for p in result.placements),
        tuple(
            sorted(
                Noticed(p.workload_id, p.reason.value, p.preempt_at, p.preemptor)
                for p in result.preemptions
            )
        ),
        tuple(sorted(t.host for t in result.transitions if t.state is HostState.DRAINED)),
    )


def _score(live: Decisions, replay: Decisions) -> tuple[bool, int, int, int]:
    """(all the same, then minus the decisions on one side only: placements, notices,
    notices but for their deadlines): a larger one is closer."""
    return (
        live == replay,
        -len(set(live.placements) ^ set(replay.placements)),
        -len(set(live.notices) ^ set(replay.notices)),
        -len(set(_undated(live.notices)) ^ set(_undated(replay.notices))),
    )


class _Judge:
    """Compares the live cycles in the order of their natural cuts, with two folds that
    only move forward: one to each cycle's natural cut, one through its floor and the
    earlier cuts (an older state is folded again from the start: a cycle of another leader
    that decided on an older state)."""

    def __init__(
        self,
        steps: Sequence[_Step],
        effects: Sequence[bool],
        policy: Policy,
        tolerance_s: float,
        short_lane: tuple[str, ...],
    ) -> None:
        self.steps = steps
        self.keys = [s.key for s in steps]
        self.effects = effects
        self.policy = policy
        self.tolerance_s = tolerance_s
        self.short_lane = short_lane
        self.replays = [_Replay(steps, short_lane), _Replay(steps, short_lane)]

    def compare(self, cycle: _Live) -> CycleParity:
        base, behind = self._at(0, cycle.natural), self._at(1, cycle.floor)
        live = cycle.decisions
        natural = base.decide(self.policy, cycle.at)
        judged = CycleParity(
            epoch=cycle.epoch,
            at=cycle.at,
            live=live,
            replay=natural,
            verdict=Verdict.IDENTICAL,
            interleaved=cycle.interleaved,
        )
        if live == natural:
            return judged
        # Earlier cuts: after the floor, holding what the live decisions show was read,
        # dropping only steps bounded within the tolerance before now, and only where a
        # dropped step changes something.
        earliest = max(
            cycle.floor,
            base.seen_by(live),
            bisect.bisect_right(self.keys, cycle.at - self.tolerance_s),
        )
        cuts = [k for k in range(earliest, cycle.natural) if self.effects[k]][:MAX_CUTS]
        tried = [(_score(live, natural), cycle.natural, natural)]
        for cut in cuts:  # ascending: the replay behind moves forward through them
            behind.advance(cut)
            decided = behind.decide(self.policy, cycle.at)
            tried.append((_score(live, decided), cut, decided))
        # The closest match; on a tie, the cut closest to the natural one.
        _, cut, best = max(tried, key=lambda t: (t[0], t[1]))
        dropped = cycle.natural - cut
        lag_s = cycle.at - self.keys[cut] if dropped else None
        if best == live:
            kind = _IN_FLIGHT[type(self.steps[cut].record)]
            verdict = Verdict.WITHIN_TOLERANCE
        else:
            kind, verdict = _difference(cycle, live, best), Verdict.DIFFERENT
        return replace(
            judged, replay=best, verdict=verdict, kind=kind, lag_s=lag_s, dropped=dropped
        )

    def _at(self, i: int, to: int) -> _Replay:
        """``replays[i]`` moved forward to ``to``; a new one if it is past it."""
        if self.replays[i].pos > to:
            self.replays[i] = _Replay(self.steps, self.short_lane)
        self.replays[i].advance(to)
        return self.replays[i]


def _difference(cycle: _Live, live: Decisions, replay: Decisions) -> str:
    if cycle.fenced:
        return FENCED
    if cycle.refused:
        return REFUSED
    same_drains = live.drains == replay.drains
    reordered = sorted(live.placements, key=_key) == sorted(replay.placements, key=_key)
    if reordered and live.notices == replay.notices and same_drains:
        return ORDER
    redated = _undated(live.notices) == _undated(replay.notices)
    if live.placements == replay.placements and same_drains and redated:
        return NOTICE_DEADLINE
    return UNEXPLAINED


def _key(d: Decided) -> tuple[str, Assignment]:
    return (d.workload_id, d.assignment)


def _undated(notices: Iterable[Noticed]) -> list[tuple[str, str, str | None]]:
    return sorted((n.workload_id, n.reason, n.preemptor) for n in notices)
