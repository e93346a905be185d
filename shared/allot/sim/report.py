"""Turn a ``SimRecord`` into report.json (and report.html): the run's figures, computed once.

Input: the engine's ``SimRecord`` and a bucket width ``bucket_s`` (default one hour).
Output: a plain dict (keys below); ``write_report`` writes it as
``json.dumps(report, sort_keys=True, indent=2)`` plus the HTML page from
``allot.sim.html.render_html``. Every float is rounded to ``DECIMALS`` (6) places and -0.0
becomes 0.0, so the same record always gives the same bytes.

Periods. ``t0 = first_submit``; the *span* is ``[t0, end_time]``; the *observed period* is
``[t0, min(last_submit, end_time)]``: the drain-out after the last arrival has little
demand, so owed/delivered is computed on the observed period only. Buckets are
``[t0 + i*bucket_s, t0 + (i+1)*bucket_s)``; the last bucket of each period is partial and
every quantity in it is pro rata (a segment covering 20 minutes of an hour adds 20 minutes
of GPU-seconds). Accumulation is O(1) per interval (partial amounts at both ends plus a
difference array for the whole buckets between), then O(buckets) per series.

Keys:

* ``policy``, ``seed`` (the simulation's own); ``scenario`` when the caller knows where the
  trace came from (``allot scenario``'s name and seed); ``span_s = end_time - first_submit``,
  split into ``submissions_s = last_submit - first_submit`` (arrivals) and
  ``drain_s = end_time - last_submit`` (the queue draining after the last arrival, mostly
  unallocated filler); ``workloads`` (jobs in the record), ``completed`` (state
  ``completed``), ``preemptions`` (notices), ``requeues``.
* ``occupancy`` = busy GPU-seconds (every segment, allocated or not) / healthy GPU-seconds,
  over the span; ``occupancy_observed`` the same over the observed period. Healthy
  capacity is the step function ``record.capacity`` (the first value also holds before its
  time). null when there is no capacity.
* ``unallocated_fraction`` = unallocated busy GPU-seconds / busy GPU-seconds over the span;
  ``unallocated_fraction_observed`` the same over the observed period
  (the seeds' "share of delivered GPU time that was unallocated").
* ``owed_delivered``: for each observed bucket ``h`` and allocation ``a``::

      demand[a,h]    = GPU-s of a's ALLOCATED work running or waiting in h
                       (segments and waits with allocated=True)
      owed[a,h]      = min(effective_share[a] * healthy_GPU_s[h], demand[a,h])
      delivered[a,h] = min(allocated GPU-s a ran in h, owed[a,h])
      ratio[a]       = sum_h delivered / sum_h owed     (null when sum_h owed == 0)

  Unallocated running is never delivered (it is free time, not owed time). ``overall`` is
  total delivered / total owed; ``by_program`` sums its allocations' per-hour owed and
  delivered (``record.programs``; an allocation without a program is its own program).
  ``teams`` counts allocations with a ratio; ``teams_at_or_above_095`` those whose ratio,
  as rounded in the report, is >= 0.95. Values are in GPU-hours. Allocations listed are
  those of ``record.effective_shares`` plus any that ran or waited allocated work.
* ``wait_s``: a job's wait is ``first_start - submit_time``; a job that never started
  counts ``end_time - submit_time`` (a lower bound) and is counted in ``never_started``.
  Each stats block is ``{n, never_started, mean, p50, p90, p99}`` (null when n == 0) for
  ``all``, ``allocated`` and ``unallocated`` (the contract's meaning, from the job's
  segments and waits: unallocated work waits by design, for free GPUs), ``by_kind``,
  ``by_size`` (GPUs ``1``, ``2-8``, ``9-63``, ``64+``) and
  ``by_allocation`` (the job's allocation as named in the trace, ``(none)`` without one).
  Percentiles are nearest-rank: sort the n waits ascending, ``p_q = x[ceil(q/100*n)]``
  (1-based; ``p_0`` is the minimum). ``cdf_by_kind[kind]`` lists p_0 .. p_100 (101 values)
  for the HTML CDF chart.
* ``jct_s``: job completion times, ``end - submit`` of the jobs that ended (a stats block;
  ``never_started`` counts those that had not ended when the run did).
* ``timeseries``: ``bucket_s``, ``start_s``, ``buckets`` (span), ``observed_buckets``;
  per span bucket ``capacity_gpu_h``, ``busy_gpu_h``, ``occupancy`` (null without
  capacity), ``unallocated_share`` (null when nothing ran), ``preemptions`` (notices in the
  bucket); per observed bucket and allocation ``owed_gpu_h`` and ``delivered_gpu_h``.
* ``final_fairshare``: ``record.final_fairshare`` (the Fair Tree factor per allocation at
  the end of the run).
* ``preemption_rate``: notices per 1,000 GPU-hours run over the span (``per_1000_gpu_h``)
  and those that hit allocated work (``allocated_per_1000_gpu_h``).
* ``unallocated_goodput``: unallocated GPU-hours (``gpu_h``), of which in attempts longer
  than ``startup_allowance_s`` (``goodput_gpu_h``, ``goodput_fraction``), ``attempts`` and
  ``short_attempts``; per unallocated workload that ran, notices per minute of its life
  (first start to last end, at least one minute): ``preemptions_per_minute_mean``/``max``.
* ``reservations``: ``workloads`` that held a reservation at some point, and
  ``idle_gpu_h``, the GPU-hours reserved hosts held free with nothing running on them
  (what the reservations cost; unallocated work may use held GPUs).
* ``short_lane``, only when the run had one: its hosts (Fair Tree's short lane).
* ``checkpointing`` and ``lost_to_preemption``, only when the record models checkpointing
  (``allot simulate``; ``allot.sim.checkpoints``). ``checkpointing``: the settings per
  kind (``*``: every kind not named), each ``{every_s, on_notice, save_s, restore_s}``.
  ``lost_to_preemption``: GPU-hours lost (``gpu_h``: work since the last checkpoint, the
  notice save, restores, and the whole attempt of non-resumable work), split into
  ``allocated_gpu_h`` and ``unallocated_gpu_h`` (the contract's meaning), of which
  ``restore_gpu_h`` restoring; ``of_busy`` = lost / busy GPU-hours over the span;
  ``by_allocation``: per allocation, its allocated work's ``gpu_h`` lost and ``of_run``
  (lost / its allocated GPU-hours run; null when none ran), for every allocation of the
  report; ``by_kind``: GPU-hours lost per kind; ``preempted_attempts``, of which
  ``saved_on_notice`` and ``notice_too_short`` (the save did not fit in that notice's
  grace); ``periodic_save_gpu_h``: GPU-hours spent in completed periodic saves, paid
  whether or not the work is preempted (overhead, not lost).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from allot.core.errors import ValidationError
from allot.sim.html import render_html
from allot.sim.record import SimRecord, allocated_workloads

DECIMALS = 6
HOUR = 3600.0
SIZE_BUCKETS = ("1", "2-8", "9-63", "64+")
CDF_POINTS = 101  # p_0 .. p_100

Json = dict[str, Any]  # a JSON document: values are JSON types, checked by json.dumps


def build_report(
    record: SimRecord, bucket_s: int = 3600, scenario: Mapping[str, object] | None = None
) -> Json:
    """The report dict for ``record`` (see the module docstring for every key)."""
    if isinstance(bucket_s, bool) or not isinstance(bucket_s, int) or bucket_s <= 0:
        raise ValidationError("bucket_s", f"must be a positive integer, got {bucket_s!r}")
    t0 = record.first_submit
    t_end = record.end_time
    if t_end < t0:
        raise ValidationError("end_time", f"is before first_submit ({t_end} < {t0})")
    t_obs = max(t0, min(record.last_submit, t_end))
    span = _Grid(t0, t_end, bucket_s)
    observed = _Grid(t0, t_obs, bucket_s)

    capacity = span.series()
    capacity_obs = observed.series()
    busy = span.series()
    unallocated = span.series()
    busy_obs = 0.0  # busy GPU-seconds in the observed period (a scalar is enough)
    unalloc_obs = 0.0  # of which unallocated
    running: dict[str, _Series] = {}  # allocated running per allocation, observed period
    waiting: dict[str, _Series] = {}  # allocated waiting per allocation, observed period

    for start, end, gpus in _capacity_pieces(record, t0, t_end):
        span.add(start, end, gpus, (capacity,))
        observed.add(start, end, gpus, (capacity_obs,))
    busy_only = (busy,)
    busy_and_unallocated = (busy, unallocated)
    for seg in record.segments:
        start, end, gpus = seg.start, seg.end, seg.gpus
        in_observed = gpus * max(0.0, min(end, t_obs) - max(start, t0))
        busy_obs += in_observed
        if not seg.allocated:
            unalloc_obs += in_observed
            span.add(start, end, gpus, busy_and_unallocated)
            continue
        span.add(start, end, gpus, busy_only)
        if seg.allocation is not None and start < t_obs:
            series = running.get(seg.allocation)
            if series is None:
                series = running[seg.allocation] = observed.series()
            observed.add(start, end, gpus, (series,))
    for wait in record.waits:
        if wait.allocated and wait.allocation is not None and wait.start < t_obs:
            series = waiting.get(wait.allocation)
            if series is None:
                series = waiting[wait.allocation] = observed.series()
            observed.add(wait.start, wait.end, wait.gpus, (series,))

    cap_s = capacity.values()
    busy_s = busy.values()
    unalloc_s = unallocated.values()
    owed_delivered, owed_series, delivered_series = _owed_delivered(
        record, capacity_obs.values(), running, waiting, observed.n
    )
    preemptions = [0] * span.n
    for p in record.preemptions:
        if span.n and t0 <= p.time <= t_end:
            preemptions[min(int((p.time - t0) // bucket_s), span.n - 1)] += 1

    report: Json = {
        "policy": record.policy,
        "seed": record.seed,
        "span_s": t_end - t0,
        "submissions_s": max(0.0, min(record.last_submit, t_end) - t0),
        "drain_s": max(0.0, t_end - max(record.last_submit, t0)),
        "workloads": len(record.jobs),
        "completed": sum(1 for job in record.jobs if job.state == "completed"),
        "preemptions": len(record.preemptions),
        "requeues": record.requeues,
        "occupancy": _ratio(sum(busy_s), sum(cap_s)),
        "occupancy_observed": _ratio(busy_obs, sum(capacity_obs.values())),
        "unallocated_fraction": _ratio(sum(unalloc_s), sum(busy_s)),
        "unallocated_fraction_observed": _ratio(unalloc_obs, busy_obs),
        "owed_delivered": owed_delivered,
        "wait_s": _waits(record),
        "jct_s": _stats(
            [j.end_time - j.submit_time for j in record.jobs if j.end_time is not None],
            sum(1 for j in record.jobs if j.end_time is None),
        ),
        "timeseries": {
            "bucket_s": bucket_s,
            "start_s": t0,
            "buckets": span.n,
            "observed_buckets": observed.n,
            "capacity_gpu_h": [c / HOUR for c in cap_s],
            "busy_gpu_h": [b / HOUR for b in busy_s],
            "occupancy": [_ratio(b, c) for b, c in zip(busy_s, cap_s, strict=True)],
            "unallocated_share": [_ratio(u, b) for u, b in zip(unalloc_s, busy_s, strict=True)],
            "preemptions": preemptions,
            "owed_gpu_h": owed_series,
            "delivered_gpu_h": delivered_series,
        },
        "final_fairshare": dict(record.final_fairshare),
        "preemption_rate": _preemption_rate(record, sum(busy_s)),
        "unallocated_goodput": unallocated_goodput(record),
        "reservations": {
            "workloads": len(record.reserved),
            "idle_gpu_h": record.reservation_idle_gpu_s / HOUR,
        },
    }
    if record.short_lane:
        report["short_lane"] = list(record.short_lane)
    if record.checkpointing is not None:
        report["checkpointing"] = record.checkpointing
        report["lost_to_preemption"] = lost_to_preemption(record, sum(busy_s))
    if scenario is not None:
        report["scenario"] = dict(scenario)
    return {key: _round(value) for key, value in report.items()}


def write_report(report: Json, out_dir: Path) -> None:
    """Write ``report.json`` (sorted keys, indent 2, trailing newline) and ``report.html``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, sort_keys=True, indent=2, allow_nan=False) + "\n"
    (out_dir / "report.json").write_text(text, encoding="utf-8", newline="\n")
    (out_dir / "report.html").write_text(render_html(report), encoding="utf-8", newline="\n")


# --- preemptions and churn -------------------------------------------------------------

STARTUP_ALLOWANCE_S = 60.0
"""An attempt shorter than this did no useful work: real jobs spend seconds to minutes
starting (image, data, checkpoint load) before the first step."""


def _preemption_rate(record: SimRecord, busy_gpu_s: float) -> Json:
    """Notices per 1,000 delivered GPU-hours (every GPU-hour run over the span), all and
    those that hit allocated work (a notice names the victim's allocation only then)."""
    per = busy_gpu_s / HOUR / 1000.0
    allocated = sum(1 for p in record.preemptions if p.allocation is not None)
    return {
        "per_1000_gpu_h": _ratio(len(record.preemptions), per),
        "allocated_per_1000_gpu_h": _ratio(allocated, per),
    }


def unallocated_goodput(record: SimRecord) -> Json:
    """Unallocated attempts: GPU-hours in attempts longer than ``STARTUP_ALLOWANCE_S``
    (goodput) of all unallocated GPU-hours, and how often one unallocated workload is
    preempted: notices per minute of its life (first start to its last attempt's end, at
    least a minute), mean and max over the unallocated workloads that ran."""
    total = good = 0.0
    attempts = short = 0
    life: dict[str, list[float]] = {}
    for seg in record.segments:
        if seg.allocated:
            continue
        length = seg.end - seg.start
        total += seg.gpus * length
        attempts += 1
        if length > STARTUP_ALLOWANCE_S:
            good += seg.gpus * length
        else:
            short += 1
        span = life.setdefault(seg.workload_id, [seg.start, seg.end])
        span[0] = min(span[0], seg.start)
        span[1] = max(span[1], seg.end)
    notices: dict[str, int] = {}
    for p in record.preemptions:
        if p.workload_id in life and p.allocation is None:
            notices[p.workload_id] = notices.get(p.workload_id, 0) + 1
    rates = [notices.get(w, 0) / max(1.0, (end - start) / 60.0) for w, (start, end) in life.items()]
    return {
        "startup_allowance_s": STARTUP_ALLOWANCE_S,
        "gpu_h": total / HOUR,
        "goodput_gpu_h": good / HOUR,
        "goodput_fraction": _ratio(good, total),
        "attempts": attempts,
        "short_attempts": short,
        "workloads": len(life),
        "preemptions_per_minute_mean": sum(rates) / len(rates) if rates else None,
        "preemptions_per_minute_max": max(rates, default=None),
    }


def lost_to_preemption(record: SimRecord, busy_gpu_s: float) -> Json:
    """GPU-hours lost to preemption, overall, per allocation and per kind (module
    docstring: ``lost_to_preemption``), from ``record.attempt_costs``."""
    ran: dict[str, float] = {}
    for seg in record.segments:
        if seg.allocated and seg.allocation is not None:
            ran[seg.allocation] = ran.get(seg.allocation, 0.0) + seg.gpus * (seg.end - seg.start)
    lost_by_alloc: dict[str, float] = {}
    by_kind: dict[str, float] = {}
    allocated = unallocated = restore = saves = 0.0
    attempts = saved = too_short = 0
    for cost in record.attempt_costs:
        lost = cost.gpus * cost.lost_s
        restore += cost.gpus * cost.restore_s
        saves += cost.gpus * cost.saves_s
        by_kind[cost.kind] = by_kind.get(cost.kind, 0.0) + lost
        if cost.allocated:
            allocated += lost
            if cost.allocation is not None:
                lost_by_alloc[cost.allocation] = lost_by_alloc.get(cost.allocation, 0.0) + lost
        else:
            unallocated += lost
        attempts += cost.preempted
        saved += cost.notice == "saved"
        too_short += cost.notice == "too-short"
    names = sorted(set(record.effective_shares) | set(ran) | set(lost_by_alloc))
    kinds = {job.kind for job in record.jobs} | set(by_kind)
    return {
        "gpu_h": (allocated + unallocated) / HOUR,
        "allocated_gpu_h": allocated / HOUR,
        "unallocated_gpu_h": unallocated / HOUR,
        "restore_gpu_h": restore / HOUR,
        "of_busy": _ratio(allocated + unallocated, busy_gpu_s),
        "by_allocation": {
            name: {
                "gpu_h": lost_by_alloc.get(name, 0.0) / HOUR,
                "of_run": _ratio(lost_by_alloc.get(name, 0.0), ran.get(name, 0.0)),
            }
            for name in names
        },
        "by_kind": {kind: by_kind.get(kind, 0.0) / HOUR for kind in sorted(kinds)},
        "preempted_attempts": attempts,
        "saved_on_notice": saved,
        "notice_too_short": too_short,
        "periodic_save_gpu_h": saves / HOUR,
    }


# --- bucketing ------------------------------------------------------------------------


def bucket_amounts(
    pieces: Iterable[tuple[float, float, float]], t0: float, t1: float, bucket_s: int
) -> list[float]:
    """Per bucket of ``[t0, t1]`` (this report's buckets: width ``bucket_s`` from ``t0``, the
    last partial), the sum over ``(start, end, rate)`` pieces of ``rate x`` the seconds of
    ``[start, end)`` inside the bucket. Live views (``allot.eventlog.timeline``) bucket with it,
    so their series line up with the report's to the second."""
    if isinstance(bucket_s, bool) or not isinstance(bucket_s, int) or bucket_s <= 0:
        raise ValidationError("bucket_s", f"must be a positive integer, got {bucket_s!r}")
    grid = _Grid(t0, t1, bucket_s)
    series = grid.series()
    for start, end, rate in pieces:
        grid.add(start, end, rate, (series,))
    return series.values()


class _Grid:
    """Buckets of width ``b`` from ``t0``; ``n = ceil((t1 - t0) / b)``, the last partial."""

    __slots__ = ("b", "n", "t0", "t1")

    def __init__(self, t0: float, t1: float, b: int) -> None:
        self.t0 = t0
        self.t1 = t1
        self.b = b
        self.n = max(0, math.ceil((t1 - t0) / b))

    def series(self) -> _Series:
        return _Series(self.n)

    def add(self, start: float, end: float, rate: float, targets: tuple[_Series, ...]) -> None:
        """Add ``rate`` per second over ``[start, end)``, clipped to the grid, to each
        target: the partial first and last buckets directly, the whole buckets between
        through the difference array (O(1) whatever the length)."""
        s = max(start, self.t0)
        e = min(end, self.t1)
        if e <= s:
            return
        b = self.b
        t0 = self.t0
        i = int((s - t0) // b)
        j = min(int((e - t0) // b), self.n - 1)  # e on the grid's last edge: last bucket
        if i == j:
            amount = rate * (e - s)
            for target in targets:
                target.part[i] += amount
            return
        head = rate * (t0 + (i + 1) * b - s)
        tail = rate * (e - (t0 + j * b))
        whole = rate * b
        for target in targets:
            target.part[i] += head
            target.part[j] += tail
            if j > i + 1:
                target.diff[i + 1] += whole
                target.diff[j] -= whole


class _Series:
    """Amounts (GPU-seconds) per bucket: ``part`` holds partial buckets at interval ends,
    ``diff`` the difference array of whole buckets (+rate at the first, -rate after the
    last); ``values()`` is their prefix-summed total."""

    __slots__ = ("diff", "part")

    def __init__(self, n: int) -> None:
        self.part = [0.0] * n
        self.diff = [0.0] * (n + 1)

    def values(self) -> list[float]:
        out: list[float] = []
        level = 0.0
        for part, step in zip(self.part, self.diff, strict=False):
            level += step
            out.append(level + part)
        return out


def _capacity_pieces(
    record: SimRecord, t0: float, t_end: float
) -> Iterable[tuple[float, float, int]]:
    """Healthy GPUs as ``(start, end, gpus)`` pieces covering ``[t0, t_end]``; the first
    change's value also holds before its time."""
    changes = sorted(record.capacity, key=lambda c: c.time)  # stable: ties keep order
    for k, change in enumerate(changes):
        start = t0 if k == 0 else max(t0, change.time)
        end = changes[k + 1].time if k + 1 < len(changes) else t_end
        if end > start:
            yield start, min(end, t_end), change.healthy_gpus


# --- owed and delivered ---------------------------------------------------------------


def _owed_delivered(
    record: SimRecord,
    capacity: Sequence[float],
    running: dict[str, _Series],
    waiting: dict[str, _Series],
    n: int,
) -> tuple[Json, dict[str, list[float]], dict[str, list[float]]]:
    allocations = sorted(set(record.effective_shares) | set(running) | set(waiting))
    zeros = [0.0] * n
    by_allocation: Json = {}
    programs: dict[str, list[float]] = {}  # program -> [owed, delivered] GPU-s
    owed_series: dict[str, list[float]] = {}
    delivered_series: dict[str, list[float]] = {}
    total_owed = total_delivered = 0.0
    teams = teams_ok = 0
    for name in allocations:
        share = record.effective_shares.get(name, 0.0)
        run = running[name].values() if name in running else zeros
        wait = waiting[name].values() if name in waiting else zeros
        owed_h: list[float] = []
        delivered_h: list[float] = []
        for cap, r, w in zip(capacity, run, wait, strict=True):
            owed = min(share * cap, r + w)
            owed_h.append(owed)
            delivered_h.append(min(r, owed))
        owed = sum(owed_h)
        delivered = sum(delivered_h)
        ratio = _rounded_ratio(delivered, owed)
        if ratio is not None:
            teams += 1
            teams_ok += ratio >= 0.95
        by_allocation[name] = {
            "owed_gpu_h": owed / HOUR,
            "delivered_gpu_h": delivered / HOUR,
            "ratio": ratio,
        }
        owed_series[name] = [x / HOUR for x in owed_h]
        delivered_series[name] = [x / HOUR for x in delivered_h]
        acc = programs.setdefault(record.programs.get(name, name), [0.0, 0.0])
        acc[0] += owed
        acc[1] += delivered
        total_owed += owed
        total_delivered += delivered
    by_program: Json = {
        program: {
            "owed_gpu_h": owed / HOUR,
            "delivered_gpu_h": delivered / HOUR,
            "ratio": _rounded_ratio(delivered, owed),
        }
        for program, (owed, delivered) in sorted(programs.items())
    }
    result: Json = {
        "overall": _rounded_ratio(total_delivered, total_owed),
        "by_allocation": by_allocation,
        "by_program": by_program,
        "teams": teams,
        "teams_at_or_above_095": teams_ok,
    }
    return result, owed_series, delivered_series


# --- waits ----------------------------------------------------------------------------


def _size_bucket(gpus: int) -> str:
    if gpus <= 1:
        return "1"
    if gpus <= 8:
        return "2-8"
    if gpus <= 63:
        return "9-63"
    return "64+"


UNALLOCATED_KEY = "(none)"
"""``wait_s.by_allocation`` key of jobs that named no allocation."""


def _waits(record: SimRecord) -> Json:
    every: list[float] = []
    never = 0
    allocated = allocated_workloads(record)
    by_contract: dict[bool, tuple[list[float], list[int]]] = {True: ([], [0]), False: ([], [0])}
    by_kind: dict[str, tuple[list[float], list[int]]] = {}
    by_size: dict[str, tuple[list[float], list[int]]] = {k: ([], [0]) for k in SIZE_BUCKETS}
    by_alloc: dict[str, tuple[list[float], list[int]]] = {}
    for job in record.jobs:
        started = job.first_start is not None
        began = job.first_start if job.first_start is not None else record.end_time
        wait = began - job.submit_time
        every.append(wait)
        kind = by_kind.setdefault(job.kind, ([], [0]))
        size = by_size[_size_bucket(job.gpus)]
        alloc = by_alloc.setdefault(job.allocation or UNALLOCATED_KEY, ([], [0]))
        contract = by_contract[job.workload_id in allocated]
        for group in (kind, size, alloc, contract):
            group[0].append(wait)
            if not started:
                group[1][0] += 1
        if not started:
            never += 1
    return {
        "all": _stats(every, never),
        "allocated": _stats(*_values(by_contract[True])),
        "unallocated": _stats(*_values(by_contract[False])),
        "by_kind": {k: _stats(v, n[0]) for k, (v, n) in sorted(by_kind.items())},
        "by_size": {k: _stats(v, n[0]) for k, (v, n) in by_size.items()},
        "by_allocation": {k: _stats(v, n[0]) for k, (v, n) in sorted(by_alloc.items())},
        "cdf_by_kind": {k: _quantiles(v) for k, (v, _) in sorted(by_kind.items())},
    }


def _values(group: tuple[list[float], list[int]]) -> tuple[list[float], int]:
    return group[0], group[1][0]


def _nearest_rank(ordered: Sequence[float], q: int) -> float | None:
    """Nearest-rank percentile of an ascending sequence: ``x[ceil(q*n/100)]``, 1-based,
    at least the first element. Integer arithmetic, so p90 of 10 values is the 9th."""
    if not ordered:
        return None
    rank = max(1, -(-q * len(ordered) // 100))
    return ordered[min(rank, len(ordered)) - 1]


def _quantiles(values: list[float]) -> list[float | None]:
    ordered = sorted(values)
    return [_nearest_rank(ordered, q) for q in range(CDF_POINTS)]


def _stats(values: list[float], never_started: int) -> Json:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "never_started": never_started,
        "mean": sum(ordered) / len(ordered) if ordered else None,
        "p50": _nearest_rank(ordered, 50),
        "p90": _nearest_rank(ordered, 90),
        "p99": _nearest_rank(ordered, 99),
    }


# --- numbers --------------------------------------------------------------------------


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _rounded_ratio(num: float, den: float) -> float | None:
    ratio = _ratio(num, den)
    return None if ratio is None else _round_float(ratio)


def _round_float(x: float) -> float:
    if not math.isfinite(x):
        raise ValidationError("report", f"non-finite number {x!r}")
    return round(x, DECIMALS) + 0.0  # + 0.0 turns -0.0 into 0.0


def _round(value: object) -> object:
    if isinstance(value, float):
        return _round_float(value)
    if isinstance(value, dict):
        return {str(k): _round(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_round(v) for v in value]
    return value
