"""Benchmark: one ``run_cycle`` on 1,000 hosts x 8 GPUs with 10,000 pending.

Layouts (``--layout``):

- ``mixed`` (default): 60% busy with work of 100 allocations, pending work of 1 to 32 GPUs;
- ``full``: a hard case, the state an earlier ``make bench-live`` drove the live stack
  into (docs/decisions/0024): 900 hosts held by an allocation far over its entitlement
  (protected 8-GPU runs, and 10,000 pending requests of 1,000 GPUs), the other 100 hosts
  full of an owed allocation's 1-GPU runs, and 50 more of those owed 1-GPU requests
  waiting, blocked by protected work (each cycle asks for an earmark that nothing reads).

``--hosts N --pending M`` scales the mixed layout (one allocation per 10 hosts, the same
rules); ``make bench`` also runs it 10x (10,000 hosts, 100,000 pending; issue 38's target
<= 250 ms and <= 12x the 1x figure, judged by ``bench/run_all.py``).

Target (issue 2): median <= 50 ms. The snapshot is built once (not timed): the cycle
itself never changes it, so every repetition times the same decision.
Run: ``make bench`` (or ``python bench/bench_cycle.py [--layout full] [--hosts N
--pending M] [--repeat R]``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import yaml

from allot import compiled_core
from allot.core.budgets import parse_tree
from allot.core.cycle import Snapshot, run_cycle
from allot.core.model import Host, Workload
from allot.core.policy import Policy
from allot.core.state import ClusterState, PendingQueue
from allot.long_lived import tune_gc

HOSTS, GPUS, PENDING, BUSY = 1000, 8, 10_000, 0.6
TARGET_MS = 50.0


def build(seed: int = 7, hosts: int = HOSTS, pending: int = PENDING) -> tuple[Snapshot, float]:
    rng = random.Random(seed)
    now = 100_000.0
    allocs = [f"a{i:03d}" for i in range(max(1, hosts // 10))]
    state = ClusterState([Host(f"h{i:05d}", GPUS) for i in range(hosts)])
    busy_target = int(hosts * GPUS * BUSY)
    busy = 0
    n = 0
    for host in state.host_ids:
        while busy < busy_target:
            free = state.free[host]
            if not free:
                break
            g = min(rng.choice([1, 1, 2, 4, 8]), len(free))
            alloc = rng.choice(allocs)
            w = Workload(
                f"r{n}", alloc, "u", g, rng.choice([0, 1800, 7200, 28800]), submit_time=now - 50_000
            )
            state.start(w, ((host, tuple(free[:g])),), now - rng.uniform(0, 40_000))
            busy += g
            n += 1
        if busy >= busy_target:
            break
    queue = pending_queue(rng, allocs, now, pending)
    shares = dict.fromkeys(allocs, 1 / len(allocs))
    order = {a: i for i, a in enumerate(rng.sample(allocs, len(allocs)))}
    return Snapshot(state, queue, shares, order), now


def build_full() -> tuple[Snapshot, float]:
    now = 100_000.0
    state = ClusterState([Host(f"h{i:04d}", GPUS) for i in range(HOSTS)])
    n = 0
    for i, host in enumerate(state.host_ids):
        if i < HOSTS * 9 // 10:
            w = Workload(f"s{i}", "search", "u", GPUS, 8 * 3600, submit_time=now - 200)
            state.start(w, ((host, tuple(range(GPUS))),), now - 100)
            continue
        for g in range(GPUS):
            w = Workload(f"n{n}", "nlp", "u", 1, 60, submit_time=now - 1)
            state.start(w, ((host, (g,)),), now - 0.5)
            n += 1
    queue = PendingQueue()
    for i in range(PENDING):
        queue.add(Workload(f"big{i}", "search", "u", 1000, 3600, submit_time=now - 50 + i / 1e3))
    for i in range(50):
        queue.add(Workload(f"probe{i}", "nlp", "u", 1, 60, submit_time=now - 0.01 + i / 1e5))
    # The embedded default tree's effective shares (the live stack's, imported here only:
    # the mixed layout stays a core-only process); nlp (under its share) ranks first.
    from allot.ops.stack import DEFAULT_BUDGETS  # noqa: PLC0415

    shares = parse_tree(yaml.safe_load(DEFAULT_BUDGETS)).effective_shares()
    order = {"nlp": 0, "vision": 1, "speech": 2, "ads": 3, "search": 4}
    return Snapshot(state, queue, shares, order), now


def pending_queue(
    rng: random.Random, allocs: list[str], now: float, n: int = PENDING
) -> PendingQueue:
    """``n`` pending workloads: sizes 1 to 32 GPUs, 10% unallocated, the rest spread over
    ``allocs`` with a 1 h minimum runtime, submitted over the last ~14 h."""
    queue = PendingQueue()
    for i in range(n):
        g = rng.choice([1, 1, 1, 2, 2, 4, 8, 8, 16, 32])
        unalloc = rng.random() < 0.1
        queue.add(
            Workload(
                f"p{i}",
                None if unalloc else rng.choice(allocs),
                "u",
                g,
                0 if unalloc else 3600,
                priority=rng.randint(0, 3),
                submit_time=now - rng.uniform(0, 50_000),
            )
        )
    return queue


def hold_as_the_service_does(snapshot: Snapshot, now: float) -> None:
    """As the placement service holds its state: its fold drops lapsed protections as the
    clock moves (``apply_result``), and the state is long-lived, out of every collection,
    with the service's young threshold (``tune_gc`` after its replay; decision 0060)."""
    snapshot.cluster.prune_protection(now)
    tune_gc()


def machine_reference_s() -> float:
    """Seconds for a fixed pure-Python loop: how fast this machine is right now. A shared
    machine's speed drifts, so the figure travels with the result (docs/decisions/0025)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=("mixed", "full"), default="mixed")
    parser.add_argument("--hosts", type=int, default=HOSTS, help="hosts (mixed layout)")
    parser.add_argument("--pending", type=int, default=PENDING, help="pending (mixed layout)")
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args(argv)
    reference = machine_reference_s()
    snapshot, now = (
        build_full() if args.layout == "full" else build(hosts=args.hosts, pending=args.pending)
    )
    hold_as_the_service_does(snapshot, now)
    policy = Policy()
    times = []
    result = run_cycle(snapshot, policy, now)
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        result = run_cycle(snapshot, policy, now)
        times.append((time.perf_counter() - t0) * 1000)
    median = statistics.median(times)
    hosts = len(snapshot.cluster.host_ids)
    busy = snapshot.cluster.running_gpus / (hosts * GPUS)
    print(
        f"run_cycle ({args.layout}): {hosts} hosts x {GPUS} GPUs, {busy:.0%} busy, "
        f"{len(snapshot.queue)} pending, {len(snapshot.cluster.running)} running"
    )
    print(
        f"  placements={len(result.placements)} preemptions={len(result.preemptions)}"
        f" ({args.repeat} repetitions, snapshot gc-frozen)"
    )
    print(
        f"  median {median:.1f} ms, p90 {sorted(times)[int(len(times) * 0.9)]:.1f} ms, "
        f"max {max(times):.1f} ms (target <= {TARGET_MS:.0f} ms): "
        f"{'PASS' if median <= TARGET_MS else 'FAIL'}"
    )
    print(
        f"  machine reference: 1M-iteration Python loop in {reference * 1000:.0f} ms; "
        f"core: {compiled_core.STATE}"
    )
    return 0 if median <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
