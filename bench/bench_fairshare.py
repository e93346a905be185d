"""Median time of ``allot.core.fairshare.rank`` over a 1,000-leaf tree.

Tree: 10 programs x 10 projects x 10 allocations (1,111 nodes), shares and usage drawn from
a seeded ``random.Random`` so every run measures the same input. Prints the median over 200
repetitions (after a warm-up) and exits 1 when it is above the 5 ms budget.

Run: ``PYTHONPATH=shared .venv/bin/python bench/bench_fairshare.py``
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from allot.core.budgets import BudgetNode, BudgetTree
from allot.core.fairshare import rank

BUDGET_MS = 5.0
REPETITIONS = 200
FANOUT = 10


def build(seed: int = 7) -> tuple[BudgetTree, dict[str, float]]:
    rng = random.Random(seed)
    usage: dict[str, float] = {}
    programs = []
    for p in range(FANOUT):
        projects = []
        for q in range(FANOUT):
            leaves = []
            for a in range(FANOUT):
                name = f"p{p}-q{q}-a{a}"
                leaves.append(BudgetNode(name, rng.randint(0, 100)))
                if rng.random() < 0.8:  # a fifth of the allocations idle (LF = inf)
                    usage[name] = rng.uniform(0, 3.6e6)
            projects.append(BudgetNode(f"p{p}-q{q}", rng.randint(1, 100), tuple(leaves)))
        programs.append(BudgetNode(f"p{p}", rng.randint(1, 100), tuple(projects)))
    return BudgetTree(BudgetNode("root", None, tuple(programs))), usage


def main() -> int:
    tree, usage = build()
    assert len(tree.leaves()) == FANOUT**3
    for _ in range(20):  # warm-up
        rank(tree, usage)
    samples = []
    for _ in range(REPETITIONS):
        t0 = time.perf_counter()
        rank(tree, usage)
        samples.append((time.perf_counter() - t0) * 1000.0)
    median = statistics.median(samples)
    print(
        f"rank() over {FANOUT**3} leaves: median {median:.3f} ms "
        f"(min {min(samples):.3f}, max {max(samples):.3f}, n={REPETITIONS}; budget {BUDGET_MS} ms)"
    )
    return 0 if median <= BUDGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
