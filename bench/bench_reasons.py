"""Benchmark: what one ``allot queue`` answer costs the placement leader when nothing is
cached: a dry ``run_cycle``, ``queue_order`` (the positions) and ``explain_pending`` (every
pending workload's reason), on 1,000 hosts x 8 GPUs with 10,000 pending from 15
allocations of unequal budgets.

Two snapshots:

* ``mostly-busy`` (judged): 90% busy, running work started over the last 11 h with minimum
  runtimes of 0 to 8 h, so most of it is past its protection. Target: median <= 200 ms for
  the three together (the leader answers between cycles on one event loop; a cached answer
  costs nothing until the fold changes).
* ``full-protected`` (reported, not judged): 100% busy, all work allocated and started in
  the last 2.8 h with minimum runtimes of 0.5 to 8 h, so plans are scarce and
  ``over-entitlement`` appears. It shows where the time goes when preemption plans are
  expensive: in ``run_cycle`` itself (the real cycle pays it too).

Each snapshot is built once (not timed): none of the functions changes it, so every
repetition times the same answer. Prints ``median X ms`` (the judged total) first, for
``bench/run_all.py``; writes ``bench/results/reasons.{md,json}`` unless ``--no-write``.

Run: ``make bench`` (or ``python bench/bench_reasons.py``).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allot.core.cycle import Snapshot, run_cycle
from allot.core.model import Host, Workload
from allot.core.policy import Policy
from allot.core.queue_view import queue_order
from allot.core.reasons import explain_pending
from allot.core.state import ClusterState
from bench_cycle import (  # a sibling script (sys.path[0])
    hold_as_the_service_does,
    machine_reference_s,
    pending_queue,
)

HOSTS, GPUS, PENDING, ALLOCATIONS = 1000, 8, 10_000, 15
REPETITIONS = 15
REPETITIONS_FULL = 3
TARGET_MS = 200.0
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Shape:
    name: str
    busy: float  # fraction of GPUs running work
    started_within_s: float  # running work started up to this long ago
    min_runtimes: tuple[int, ...]  # of running work; 0 is unallocated (never protected)


MOSTLY_BUSY = Shape("mostly-busy", 0.9, 40_000.0, (0, 1800, 7200, 28800))
FULL_PROTECTED = Shape("full-protected", 1.0, 10_000.0, (1800, 7200, 28800))


def build(shape: Shape = MOSTLY_BUSY, seed: int = 11) -> tuple[Snapshot, float]:
    rng = random.Random(seed)
    now = 100_000.0
    allocs = [f"a{i:02d}" for i in range(ALLOCATIONS)]
    # Unequal budgets: a few large allocations, many small ones, so some are over their
    # entitlement (reclaimable) and some under (they reclaim).
    weights = [rng.choice([1, 1, 2, 4, 8]) for _ in allocs]
    total = sum(weights)
    shares = {a: w / total for a, w in zip(allocs, weights, strict=True)}
    state = ClusterState([Host(f"h{i:04d}", GPUS) for i in range(HOSTS)])
    busy_target = int(HOSTS * GPUS * shape.busy)
    busy = 0
    n = 0
    for host in state.host_ids:
        while busy < busy_target:
            free = state.free[host]
            if not free:
                break
            g = min(rng.choice([1, 1, 2, 4, 8]), len(free))
            alloc = rng.choices(allocs, weights=[w * w for w in weights])[0]
            w = Workload(
                f"r{n}",
                alloc,
                "u",
                g,
                rng.choice(shape.min_runtimes),
                submit_time=now - 50_000,
            )
            state.start(w, ((host, tuple(free[:g])),), now - rng.uniform(0, shape.started_within_s))
            busy += g
            n += 1
        if busy >= busy_target:
            break
    queue = pending_queue(rng, allocs, now, PENDING)
    order = {a: i for i, a in enumerate(rng.sample(allocs, len(allocs)))}
    return Snapshot(state, queue, shares, order), now


def _median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


def measure(shape: Shape, repetitions: int) -> dict[str, Any]:
    """The service's sequence (``PlacementService._reasons``): dry run, positions, then the
    reasons over those positions (``entries``: the order is not computed twice)."""
    snapshot, now = build(shape)
    hold_as_the_service_does(snapshot, now)
    policy = Policy()
    cycle_t, explain_t, order_t, total_t, cpu_t = [], [], [], [], []
    result = run_cycle(snapshot, policy, now)
    reasons = explain_pending(snapshot, policy, now, result, dry_run=True)  # warm-up
    for _ in range(repetitions):
        c0 = time.process_time()
        t0 = time.perf_counter()
        result = run_cycle(snapshot, policy, now)
        t1 = time.perf_counter()
        entries = queue_order(snapshot, policy)
        t2 = time.perf_counter()
        reasons = explain_pending(snapshot, policy, now, result, dry_run=True, entries=entries)
        t3 = time.perf_counter()
        cpu_t.append(time.process_time() - c0)
        cycle_t.append(t1 - t0)
        order_t.append(t2 - t1)
        explain_t.append(t3 - t2)
        total_t.append(t3 - t0)
    gc.unfreeze()
    codes = collections.Counter(str(r.code) for r in reasons.values())
    return {
        "snapshot": shape.name,
        "hosts": HOSTS,
        "gpus_per_host": GPUS,
        "busy": shape.busy,
        "pending": len(snapshot.queue),
        "running": len(snapshot.cluster.running),
        "allocations": ALLOCATIONS,
        "repetitions": repetitions,
        "placements": len(result.placements),
        "preemptions": len(result.preemptions),
        "reasons": dict(sorted(codes.items())),
        "median_total_ms": round(_median_ms(total_t), 1),
        "median_total_cpu_ms": round(_median_ms(cpu_t), 1),
        "max_total_ms": round(max(total_t) * 1000, 1),
        "median_run_cycle_ms": round(_median_ms(cycle_t), 1),
        "median_explain_pending_ms": round(_median_ms(explain_t), 1),
        "median_queue_order_ms": round(_median_ms(order_t), 1),
        "target_ms": TARGET_MS,
        "pass": _median_ms(total_t) <= TARGET_MS,
    }


def machine_reference_ms() -> float:
    return round(machine_reference_s() * 1000, 1)


def markdown(figs: list[dict[str, Any]], info: dict[str, Any]) -> str:
    lines = [
        "# Benchmark: the cost of `allot queue` reasons",
        "",
        "Written by `bench/bench_reasons.py` (run by `make bench`). One uncached queue answer",
        "on the placement leader: a dry `run_cycle`, `queue_order` for the positions, and",
        "`explain_pending` over every pending workload (given that order).",
        "",
        f"- date: {info['date']}",
        f"- machine reference: 1M-iteration Python loop in {info['machine_reference_ms']} ms",
        f"- judged: `mostly-busy`, median total <= {TARGET_MS:g} ms: "
        f"{'PASS' if figs[0]['pass'] else 'FAIL'}",
        "",
        "| snapshot | running | dry run (starts, notices) | run_cycle | queue_order "
        "| explain_pending | total (wall) | total (CPU) | max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figs:
        lines.append(
            f"| `{f['snapshot']}` ({f['busy']:.0%} busy) | {f['running']} "
            f"| {f['placements']}, {f['preemptions']} | {f['median_run_cycle_ms']} ms "
            f"| {f['median_queue_order_ms']} ms | {f['median_explain_pending_ms']} ms "
            f"| **{f['median_total_ms']} ms** | {f['median_total_cpu_ms']} ms "
            f"| {f['max_total_ms']} ms |"
        )
    lines += [""]
    for f in figs:
        reasons = ", ".join(f"`{k}` {v}" for k, v in f["reasons"].items())
        lines.append(f"- `{f['snapshot']}` ({f['repetitions']} repetitions, medians): {reasons}.")
    lines += [
        "",
        f"Every snapshot: {HOSTS:,} hosts x {GPUS} GPUs, {PENDING:,} pending from {ALLOCATIONS}",
        "allocations; snapshots gc-frozen. Wall time above CPU time means the 2-CPU VM was",
        "shared with other work during the run.",
        "",
        "Before the memoisation added with issue 6 (per-pool host reads, the shape and",
        "free-fit questions per size, one answer per (allocation, size), plan bounds), the",
        "`mostly-busy` `explain_pending` took 9,621 ms (median of 5; machine reference",
        "36 ms): it re-read every host for every pending workload.",
        "",
    ]
    return "\n".join(lines)


def report(f: dict[str, Any]) -> None:
    judged = f"(target <= {TARGET_MS:.0f} ms): {'PASS' if f['pass'] else 'FAIL'}"
    print(
        f"queue reasons, {f['snapshot']}: median {f['median_total_ms']} ms "
        + (judged if f["snapshot"] == MOSTLY_BUSY.name else "(not judged)")
    )
    print(
        f"  run_cycle {f['median_run_cycle_ms']} ms + queue_order "
        f"{f['median_queue_order_ms']} ms + explain_pending "
        f"{f['median_explain_pending_ms']} ms; CPU {f['median_total_cpu_ms']} ms"
    )
    print(
        f"  {f['busy']:.0%} busy, {f['running']} running, {f['pending']} pending; "
        f"reasons {f['reasons']}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repetitions", type=int, default=REPETITIONS, help="mostly-busy runs")
    ap.add_argument(
        "--repetitions-full", type=int, default=REPETITIONS_FULL, help="full-protected runs"
    )
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)
    if args.repetitions < 1 or args.repetitions_full < 0:
        ap.error("--repetitions must be >= 1 and --repetitions-full >= 0")
    info = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine_reference_ms": machine_reference_ms(),
    }
    figs = [measure(MOSTLY_BUSY, args.repetitions)]
    report(figs[0])  # the judged figure first: run_all.py reads the first "median X ms"
    if args.repetitions_full:
        figs.append(measure(FULL_PROTECTED, args.repetitions_full))
        report(figs[1])
    print(f"  machine reference: 1M-iteration Python loop in {info['machine_reference_ms']} ms")
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        document = {"machine": info, "target_ms": TARGET_MS, "snapshots": figs}
        (RESULTS / "reasons.json").write_text(
            json.dumps(document, indent=2) + "\n", encoding="utf-8", newline="\n"
        )
        (RESULTS / "reasons.md").write_text(markdown(figs, info), encoding="utf-8", newline="\n")
    return 0 if figs[0]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
