"""Prometheus metrics: the same numbers as ``allot share``/``allot queue``, for Grafana.

CALL (the dashboard service's ``/metrics``)::

    from allot.services.dashboard.metrics import (
        CONTENT_TYPE, MetricsInputs, QueueWaitHistogram, render_metrics,
    )

    waits = QueueWaitHistogram()      # ONCE, next to the timeline; kept for the process's life

    body = render_metrics(            # every scrape
        MetricsInputs(
            timeline=timeline,        # allot.eventlog.timeline.LogTimeline (anything TimelineView)
            now=time.time(),          # seconds since the epoch; only for the *_age_seconds
            queue=queue_snapshot,     # m.QueueSnapshot | None   (placement: pending reasons)
            ranking=ranking,          # m.RankingUpdated | None  (ranking: window usage, factor)
            allocations=allocations,  # m.AllocationsSnapshot | None (placement: held, budget)
            placement_stats=stats,    # m.PlacementStats | None  (cycle-duration histogram)
            queue_waits=waits,        # the long-lived histogram above
        )
    )
    # respond 200, Content-Type: CONTENT_TYPE, body

Why the histogram is kept by the caller: the timeline drops placements older than its
horizon (8 days), and a Prometheus histogram must never go down (a drop reads as a counter
reset: ``rate()`` would spike by the whole history). ``render_metrics`` adds the placements
made since the previous scrape (``timeline.queue_waits_since``) to ``queue_waits`` and
renders its totals; that is its only side effect. Without ``queue_waits`` a fresh histogram
of the waits still in the timeline is rendered: right for a one-off render, wrong for a
server scraped for longer than the horizon.

``MetricsInputs(...)`` raises ``allot.core.errors.ValidationError`` (naming the field) when
``now`` is not a finite time or ``placement_stats`` is not a cumulative histogram;
``render_metrics`` raises it when a queue wait from the timeline is negative or not finite.
Any input but the timeline may be None (placement leader or ranking unreachable): the
metrics that need it are left out, the rest are exported. No I/O, no clock, no global
registry: each call builds a fresh ``CollectorRegistry`` and renders the Prometheus text
format (version 0.0.4).

NAMES say which clock they read. ``held`` is NOW (GPUs a running workload holds at this
instant); ``window`` is HISTORY (GPU-seconds charged over the ranking's usage window,
``allot_usage_window_seconds`` long, which is what Fair Tree ranks on). Base units only:
seconds, GPUs, GPU-seconds, ratios 0..1. Labels are only ``allocation``, ``reason``,
``state`` (and the histograms' ``le``): never a workload or a user, so the series count is
bounded by the budget tree, not by the workload count. ``docs/metrics.md`` lists every
metric with its source; a test keeps the two equal.

Sources and formulas:

* per allocation, NOW: ``held_gpus``, ``entitlement_gpus`` and ``budget_ratio`` (effective
  share) from the placement leader's ``AllocationsSnapshot``; without one, from the fold
  exactly as placement computes them (``ClusterState.held``; effective share of the budget
  tree; entitlement = effective share x GPUs on healthy hosts).
* per allocation, WINDOW: ``window_usage_gpu_seconds`` (RankRow.raw_usage),
  ``fairshare_ratio`` (the Fair Tree factor, 1 = best) and ``fairtree_rank`` (highest = best)
  from the leaves of ``RankingUpdated``.
* ``allot_allocation_sort_key`` = tier + (1 - fair-share factor), smaller served first;
  tier 0 when held < entitlement, else 1. Taken from the queue snapshot's rows when the
  allocation has allocated work pending (the value the queue used, whatever the policy;
  rows of work the fold no longer has pending are stale and ignored); otherwise computed
  as above with the tiered policy (factor 0 when unranked, as placement does): what its
  next workload would get.
* pending: every workload pending in the fold, counted by allocation (``(none)`` when it
  has none) and by the reason code of its row in the queue snapshot; ``unknown`` when the
  snapshot has no row for it (submitted after the snapshot, beyond its first
  ``MAX_QUEUE_ROWS`` rows, or no snapshot). Absent series mean zero.
* counters from the timeline: preemption notices by reason (every reason present from the
  start, so ``rate()`` sees the first one), GPU-seconds run by attempts that ended
  preempted.
* hosts and GPUs by ``HostState`` (all four states always present), GPUs held by running
  allocated vs unallocated work (a workload under notice still holds its GPUs).
* ``allot_queue_wait_seconds``: histogram of each placement's wait since submission or
  requeue (``timeline.queue_waits_since``, accumulated in ``QueueWaitHistogram``), buckets
  1 s .. 7 days.
* ``allot_scheduling_cycle_duration_seconds``: the leader's own histogram, passed through.
  It restarts at zero when leadership moves: Prometheus reads that as a counter reset.
  Two counters beside it say where the cycles' time went:
  ``allot_scheduling_cycle_decide_seconds_total`` and
  ``allot_scheduling_cycle_append_wait_seconds_total`` (``PlacementStats.decide_s`` and
  ``append_wait_s``).
* idle allocated work, from the ``IdleBook`` of the idle records (USAGE;
  ``allot.eventlog.idle_book``): ``allot_idle_gpu_seconds_total`` per allocation (GPU time
  its work held while flagged idle: closed stretches, and open ones up to ``now``;
  accumulated by ``IdleCounter``, kept by the caller, so a stretch that closes a little
  before the last scrape's ``now`` does not make the counter go down), and NOW
  ``allot_idle_workloads`` and ``allot_idle_gpus``, the runs flagged idle and their GPUs.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Final, Protocol, get_args

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from allot.core.errors import ValidationError
from allot.core.model import HostState
from allot.core.queue_view import OVER, UNDER
from allot.eventlog.logfold import LogFold
from allot.proto import messages as m

CONTENT_TYPE: Final = CONTENT_TYPE_PLAIN_0_0_4
"""The ``Content-Type`` of ``render_metrics``'s body."""

NO_ALLOCATION: Final = "(none)"
"""``allocation`` label of pending work charged to no allocation (not a valid name)."""

UNKNOWN_REASON: Final = "unknown"
"""``reason`` label of pending work the queue snapshot has no reason for."""

QUEUE_WAIT_BUCKETS_S: Final = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
    28800.0,
    86400.0,
    172800.0,
    604800.0,
)
"""Upper bounds: 1 s to 7 days, about x2-x3 apart (waits span seconds to days)."""

PREEMPT_REASONS: Final[tuple[str, ...]] = get_args(m.PreemptReason)


class TimelineView(Protocol):
    """What the metrics read of ``allot.eventlog.timeline.LogTimeline``."""

    @property
    def fold(self) -> LogFold: ...

    def preemptions_by_reason(self) -> dict[str, int]: ...

    def preempted_gpu_seconds(self) -> float: ...

    def lost_gpu_seconds_total(self) -> dict[str, float]: ...

    @property
    def placements(self) -> int: ...

    def queue_waits_since(self, seen: int) -> list[float]: ...


class QueueWaitHistogram:
    """Queue waits bucketed by ``QUEUE_WAIT_BUCKETS_S``, cumulative for the life of the
    process (see the module docstring: the timeline forgets, this must not)."""

    def __init__(self) -> None:
        self.counts = [0] * (len(QUEUE_WAIT_BUCKETS_S) + 1)  # per bucket, +Inf last; not cumulative
        self.sum_s = 0.0
        self.seen = 0  # the timeline's ``placements`` when last read

    def update(self, timeline: TimelineView) -> None:
        """Add the waits of the placements the timeline applied since the last update."""
        if timeline.placements < self.seen:  # another timeline (a restart): read it all
            self.seen = 0
        new = timeline.queue_waits_since(self.seen)
        for i, wait in enumerate(new):
            if not math.isfinite(wait) or wait < 0:
                raise ValidationError(
                    f"timeline.queue_waits_since({self.seen})[{i}]", f"must be >= 0, got {wait!r}"
                )
        for wait in new:
            # ``le`` is inclusive: a wait equal to a bound belongs to that bound's bucket.
            self.counts[bisect_left(QUEUE_WAIT_BUCKETS_S, wait)] += 1
            self.sum_s += wait
        self.seen = timeline.placements

    def cumulative(self) -> list[int]:
        """Observations <= each bound, +Inf (= all observations) last."""
        return list(accumulate(self.counts))


class IdleView(Protocol):
    """What the metrics read of ``allot.eventlog.idle_book.IdleBook``."""

    def total_gpu_seconds(self, now: float) -> dict[str, float]: ...

    def open_stretches(self, allocation: str | None = None) -> Sequence[Any]: ...


class IdleCounter:
    """Idle GPU-seconds per allocation, never lower than a value already exported (see the
    module docstring); kept for the life of the process, as ``QueueWaitHistogram``."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def update(self, totals: dict[str, float]) -> dict[str, float]:
        for allocation, value in totals.items():
            self.totals[allocation] = max(self.totals.get(allocation, 0.0), value)
        return dict(self.totals)


@dataclass(frozen=True, slots=True)
class MetricsInputs:
    """Everything one scrape reads (see the module docstring for who supplies what)."""

    timeline: TimelineView
    now: float
    queue: m.QueueSnapshot | None = None
    ranking: m.RankingUpdated | None = None
    allocations: m.AllocationsSnapshot | None = None
    placement_stats: m.PlacementStats | None = None
    queue_waits: QueueWaitHistogram = field(default_factory=QueueWaitHistogram)
    idle: IdleView | None = None
    idle_counter: IdleCounter = field(default_factory=IdleCounter)

    def __post_init__(self) -> None:
        if isinstance(self.now, bool) or not isinstance(self.now, int | float):
            raise ValidationError("now", f"must be a number of seconds, got {self.now!r}")
        if not math.isfinite(self.now) or self.now < 0:
            raise ValidationError("now", f"must be a finite time >= 0, got {self.now!r}")
        if self.placement_stats is not None:
            _check_histogram(self.placement_stats)


def render_metrics(inputs: MetricsInputs) -> bytes:
    """The Prometheus text exposition (``CONTENT_TYPE``) of ``inputs``."""
    inputs.queue_waits.update(inputs.timeline)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(inputs))
    return generate_latest(registry)


# ---------------------------------------------------------------------------- collector
@dataclass(frozen=True, slots=True, eq=False)
class _Collector:
    """One scrape's collector (hashed by identity: the registry keys on it)."""

    inputs: MetricsInputs

    def collect(self) -> Iterator[Metric]:
        now_rows = _now_rows(self.inputs)
        yield from _allocation_now(now_rows)
        yield from _allocation_window(self.inputs)
        yield _sort_key(self.inputs, now_rows)
        yield from _pending(self.inputs)
        yield from _preemptions(self.inputs.timeline)
        yield from _cluster(self.inputs.timeline.fold)
        yield _queue_waits(self.inputs.queue_waits)
        if self.inputs.placement_stats is not None:
            yield _cycle_durations(self.inputs.placement_stats)
            yield from _cycle_parts(self.inputs.placement_stats)
        yield from _ages(self.inputs)
        if self.inputs.idle is not None:
            yield from _idle(self.inputs.idle, self.inputs.idle_counter, self.inputs.now)


@dataclass(frozen=True, slots=True)
class _AllocationNow:
    held_gpus: int
    entitlement_gpus: float
    budget: float


def _now_rows(inputs: MetricsInputs) -> dict[str, _AllocationNow]:
    """Held, entitlement and budget per allocation: the leader's answer, else the fold."""
    if inputs.allocations is not None:
        return {
            r.allocation: _AllocationNow(r.held_gpus, r.entitlement_gpus, r.effective_share)
            for r in inputs.allocations.rows
        }
    fold = inputs.timeline.fold
    shares = fold.shares()
    held = fold.state.held
    capacity = fold.state.healthy_gpus
    names = set(shares) | {a for a, g in held.items() if g}
    return {
        a: _AllocationNow(held.get(a, 0), shares.get(a, 0.0) * capacity, shares.get(a, 0.0))
        for a in sorted(names)
    }


def _allocation_now(rows: dict[str, _AllocationNow]) -> Iterator[Metric]:
    held = _gauge(
        "allot_allocation_held_gpus",
        "NOW: GPUs held by the allocation's running allocated work at this instant.",
        ["allocation"],
    )
    entitled = _gauge(
        "allot_allocation_entitlement_gpus",
        "NOW: effective share x GPUs on healthy hosts.",
        ["allocation"],
    )
    budget = _gauge(
        "allot_allocation_budget_ratio",
        "NOW: the allocation's effective share of the cluster (0..1; leaves sum to 1).",
        ["allocation"],
    )
    for name, row in rows.items():
        held.add_metric([name], row.held_gpus)
        entitled.add_metric([name], row.entitlement_gpus)
        budget.add_metric([name], row.budget)
    yield from (held, entitled, budget)


def _allocation_window(inputs: MetricsInputs) -> Iterator[Metric]:
    if inputs.ranking is None:
        return
    usage = _gauge(
        "allot_allocation_window_usage_gpu_seconds",
        "WINDOW (history): GPU-seconds charged to the allocation over the last "
        "allot_usage_window_seconds (what Fair Tree ranks on); not what it holds now.",
        ["allocation"],
    )
    factor = _gauge(
        "allot_allocation_fairshare_ratio",
        "WINDOW: Fair Tree fair-share factor from window usage (0..1, 1 = best).",
        ["allocation"],
    )
    rank = _gauge(
        "allot_allocation_fairtree_rank",
        "WINDOW: Fair Tree rank among allocations (highest = best; 1 = worst, as Slurm).",
        ["allocation"],
    )
    for row in sorted((r for r in inputs.ranking.nodes if r.leaf), key=lambda r: r.name):
        usage.add_metric([row.name], row.raw_usage)
        if row.fairshare is not None:
            factor.add_metric([row.name], row.fairshare)
        if row.rank is not None:
            rank.add_metric([row.name], row.rank)
    window = _gauge(
        "allot_usage_window_seconds",
        "Length of the usage window the window_* metrics cover.",
        value=inputs.ranking.window_s,
    )
    yield from (usage, factor, rank, window)


def _sort_key(inputs: MetricsInputs, now_rows: dict[str, _AllocationNow]) -> Metric:
    metric = _gauge(
        "allot_allocation_sort_key",
        "Queue sort metric of the allocation's pending work: tier (0 under entitlement, "
        "1 at or over) + 1 - fair-share factor; smaller is served first.",
        ["allocation"],
    )
    keys: dict[str, float] = {}
    if inputs.ranking is not None:
        factors = {r.name: r.fairshare or 0.0 for r in inputs.ranking.nodes if r.leaf}
    else:
        factors = {}
    for name, row in now_rows.items():
        tier = UNDER if row.held_gpus < row.entitlement_gpus else OVER
        keys[name] = tier + (1.0 - factors.get(name, 0.0))
    if inputs.queue is not None:
        pending = inputs.timeline.fold.queue
        queued: dict[str, float] = {}
        for q in inputs.queue.rows:
            # A row of work no longer pending is stale: it does not speak for the queue.
            if q.allocation is not None and q.tier != "unallocated" and q.workload_id in pending:
                queued.setdefault(q.allocation, q.sort_metric)
        keys.update(queued)
    for name in sorted(keys):
        metric.add_metric([name], keys[name])
    return metric


def _pending(inputs: MetricsInputs) -> Iterator[Metric]:
    reason_of: dict[str, str] = {}
    if inputs.queue is not None:
        reason_of = {r.workload_id: r.reason or UNKNOWN_REASON for r in inputs.queue.rows}
    workloads: dict[tuple[str, str], int] = {}
    gpus: dict[tuple[str, str], int] = {}
    for w in inputs.timeline.fold.queue:
        key = (w.allocation or NO_ALLOCATION, reason_of.get(w.id, UNKNOWN_REASON))
        workloads[key] = workloads.get(key, 0) + 1
        gpus[key] = gpus.get(key, 0) + w.gpus
    count = _gauge(
        "allot_pending_workloads",
        "Workloads pending now, by allocation and pending-reason code (docs/reasons.md).",
        ["allocation", "reason"],
    )
    asked = _gauge(
        "allot_pending_gpus",
        "GPUs asked for by workloads pending now, by allocation and pending-reason code.",
        ["allocation", "reason"],
    )
    for key in sorted(workloads):
        count.add_metric(list(key), workloads[key])
        asked.add_metric(list(key), gpus[key])
    yield from (count, asked)


def _preemptions(timeline: TimelineView) -> Iterator[Metric]:
    by_reason = dict.fromkeys(PREEMPT_REASONS, 0) | timeline.preemptions_by_reason()
    notices = CounterMetricFamily(
        "allot_preemptions",
        "Preemption notices issued, by preemption-reason code.",
        labels=["reason"],
    )
    for reason in sorted(by_reason):
        notices.add_metric([reason], by_reason[reason])
    yield notices
    yield CounterMetricFamily(
        "allot_preempted_gpu_seconds",
        "GPU-seconds run by attempts that ended preempted (an upper bound of work lost).",
        value=timeline.preempted_gpu_seconds(),
    )
    lost = CounterMetricFamily(
        "allot_preemption_lost_gpu_seconds",
        "GPU-seconds of allocated work lost to preemption (since each attempt's last "
        "confirmed checkpoint, the whole attempt without one), by allocation.",
        labels=["allocation"],
    )
    for allocation, value in timeline.lost_gpu_seconds_total().items():
        lost.add_metric([allocation], value)
    yield lost


def _idle(idle: IdleView, counter: IdleCounter, now: float) -> Iterator[Metric]:
    totals = counter.update(idle.total_gpu_seconds(now))
    held = CounterMetricFamily(
        "allot_idle_gpu_seconds",
        "GPU-seconds allocated work held while flagged idle (every GPU below the threshold), "
        "by allocation.",
        labels=["allocation"],
    )
    for allocation in sorted(totals):
        held.add_metric([allocation], totals[allocation])
    yield held
    count: dict[str, int] = {}
    gpus: dict[str, int] = {}
    for stretch in idle.open_stretches():
        count[stretch.allocation] = count.get(stretch.allocation, 0) + 1
        gpus[stretch.allocation] = gpus.get(stretch.allocation, 0) + stretch.gpus
    runs = _gauge("allot_idle_workloads", "NOW: runs flagged idle, by allocation.", ["allocation"])
    held_now = _gauge(
        "allot_idle_gpus", "NOW: GPUs held by runs flagged idle, by allocation.", ["allocation"]
    )
    for allocation in sorted(count):
        runs.add_metric([allocation], count[allocation])
        held_now.add_metric([allocation], gpus[allocation])
    yield from (runs, held_now)


def _cluster(fold: LogFold) -> Iterator[Metric]:
    hosts = dict.fromkeys(HostState, 0)
    gpus = dict.fromkeys(HostState, 0)
    for h in fold.state.hosts:
        hosts[h.state] += 1
        gpus[h.state] += h.gpus
    by_hosts = _gauge("allot_hosts", "Registered hosts by state.", ["state"])
    by_gpus = _gauge("allot_host_gpus", "GPUs on registered hosts, by host state.", ["state"])
    for state in HostState:
        by_hosts.add_metric([state.value], hosts[state])
        by_gpus.add_metric([state.value], gpus[state])
    allocated = unallocated = 0
    for run in fold.state.running.values():
        if run.workload.allocated:
            allocated += run.workload.gpus
        else:
            unallocated += run.workload.gpus
    yield from (by_hosts, by_gpus)
    yield _gauge(
        "allot_running_allocated_gpus",
        "NOW: GPUs held by running allocated work (charged, protected for its minimum runtime).",
        value=allocated,
    )
    yield _gauge(
        "allot_running_unallocated_gpus",
        "NOW: GPUs held by running unallocated work (idle capacity, preempted first).",
        value=unallocated,
    )


def _queue_waits(waits: QueueWaitHistogram) -> Metric:
    return _histogram(
        "allot_queue_wait_seconds",
        "Seconds each placement waited since its submission or requeue.",
        QUEUE_WAIT_BUCKETS_S,
        waits.cumulative(),
        waits.sum_s,
    )


def _cycle_durations(stats: m.PlacementStats) -> Metric:
    counts = list(stats.counts) if stats.counts else [stats.count]
    return _histogram(
        "allot_scheduling_cycle_duration_seconds",
        "Duration of the placement leader's scheduling cycles (since it became leader).",
        stats.buckets_s,
        counts,
        stats.sum_s,
    )


def _cycle_parts(stats: m.PlacementStats) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "allot_scheduling_cycle_decide_seconds",
        "Seconds the placement leader's cycles spent deciding (since it became leader).",
        value=stats.decide_s,
    )
    yield CounterMetricFamily(
        "allot_scheduling_cycle_append_wait_seconds",
        "Seconds the placement leader's cycles waited for the log to acknowledge their "
        "appends (since it became leader).",
        value=stats.append_wait_s,
    )


def _ages(inputs: MetricsInputs) -> Iterator[Metric]:
    if inputs.ranking is not None:
        yield _gauge(
            "allot_ranking_age_seconds",
            "Seconds since the ranking the window_* metrics come from was computed.",
            value=max(0.0, inputs.now - inputs.ranking.at),
        )
    placement = [
        s.at for s in (inputs.queue, inputs.allocations, inputs.placement_stats) if s is not None
    ]
    if placement:
        yield _gauge(
            "allot_placement_snapshot_age_seconds",
            "Seconds since the oldest placement-leader answer used (queue, allocations, stats).",
            value=max(0.0, inputs.now - min(placement)),
        )


# ---------------------------------------------------------------------------- helpers
def _gauge(
    name: str, doc: str, labels: Iterable[str] | None = None, value: float | None = None
) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value, labels=None if labels is None else [*labels])


def _histogram(
    name: str, doc: str, bounds: Sequence[float], cumulative: Sequence[int], total: float
) -> HistogramMetricFamily:
    """``cumulative[i]`` observations <= ``bounds[i]``; the last entry is the +Inf bucket.
    ``le`` is written as Python's float repr ("60.0"), as prometheus_client's own
    histograms write it, so a bucket's series never changes name between scrapes."""
    buckets = [(repr(float(b)), float(c)) for b, c in zip(bounds, cumulative, strict=False)]
    buckets.append(("+Inf", float(cumulative[-1])))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


def _check_histogram(stats: m.PlacementStats) -> None:
    """A Prometheus histogram: increasing bounds, cumulative counts, +Inf last = count."""
    field = "placement_stats"
    bounds, counts = stats.buckets_s, stats.counts
    if not counts:
        if bounds:
            raise ValidationError(f"{field}.counts", f"empty but buckets_s has {len(bounds)}")
        return
    if len(counts) != len(bounds) + 1:
        raise ValidationError(
            f"{field}.counts",
            f"needs one count per bucket plus +Inf ({len(bounds) + 1}), got {len(counts)}",
        )
    _check_increasing(f"{field}.buckets_s", bounds, strict=True)
    _check_increasing(f"{field}.counts", counts, strict=False)
    if counts[-1] != stats.count:
        raise ValidationError(
            f"{field}.counts", f"+Inf bucket {counts[-1]} differs from count {stats.count}"
        )
    # Both are parts of every cycle's duration, so together they cannot exceed the sum
    # (up to the rounding of three float sums over the same cycles).
    parts = stats.decide_s + stats.append_wait_s
    if parts > stats.sum_s * (1 + 1e-9) + 1e-9:
        raise ValidationError(
            f"{field}.append_wait_s",
            f"decide_s + append_wait_s = {parts!r} exceeds the cycles' sum_s {stats.sum_s!r}",
        )


def _check_increasing(field: str, values: Sequence[float], *, strict: bool) -> None:
    for i in range(1, len(values)):
        a, b = values[i - 1], values[i]
        if b < a or (strict and b == a):
            word = "increasing" if strict else "cumulative (non-decreasing)"
            raise ValidationError(f"{field}[{i}]", f"must be {word}: {b!r} after {a!r}")
    if any(not math.isfinite(v) for v in values):
        raise ValidationError(field, "must be finite (+Inf is implied)")
