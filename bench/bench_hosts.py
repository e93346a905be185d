"""Benchmark: a fleet's host records folded as a service replays them (``LogFold``).

10,000 hosts x 8 GPUs register in a random order (agents appear in any order), then one in
ten is drained and one in twenty made healthy again: the HOSTS stream a service replays
on every start, and that a standby keeps folding. Each host that joins takes an order key
between its neighbours' (``allot.core.state``), so a join costs O(log hosts), not a
reindex of every host (issue 38; decision 0061).

Target: median <= 1,000 ms for the whole fold (three folds from scratch).
Run: ``make bench`` (or ``python bench/bench_hosts.py [--hosts N]``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import msgspec

from allot import compiled_core
from allot.eventlog.logfold import LogFold
from allot.proto import messages as m

HOSTS, GPUS = 10_000, 8
TARGET_MS = 1000.0


def records(hosts: int, seed: int = 5) -> list[msgspec.Struct]:
    rng = random.Random(seed)
    names = [f"gpu-{i:05d}" for i in range(hosts)]
    rng.shuffle(names)
    out: list[msgspec.Struct] = [
        m.HostRegistered(host=h, gpus=GPUS, at=1_000.0 + i) for i, h in enumerate(names)
    ]
    later = 1_000.0 + hosts
    drained = names[::10]
    out += [m.HostDraining(host=h, at=later, reason="ecc errors") for h in drained]
    out += [m.HostHealthy(host=h, at=later + 60) for h in drained[::2]]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=HOSTS)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    log = records(args.hosts)
    times = []
    fold = LogFold()
    for _ in range(args.repeat):
        fold = LogFold()
        t0 = time.perf_counter()
        for record in log:
            fold.apply(record)
        times.append((time.perf_counter() - t0) * 1000)
    state = fold.state
    assert len(state.host_ids) == args.hosts, len(state.host_ids)
    median = statistics.median(times)
    print(
        f"host records folded: {args.hosts} hosts x {GPUS} GPUs joining in random order, "
        f"{len(state.draining)} left draining ({len(log)} records, {args.repeat} folds)"
    )
    print(
        f"  median {median:.1f} ms, max {max(times):.1f} ms (target <= {TARGET_MS:.0f} ms): "
        f"{'PASS' if median <= TARGET_MS else 'FAIL'}; core: {compiled_core.STATE}"
    )
    return 0 if median <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
