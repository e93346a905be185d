"""``allot scenario ai2 --seed N --out DIR``: write an Ai2-like month (cluster.yaml,
budgets.yaml, trace.csv). The mix and its knobs: ``allot.sim.scenario`` and the README."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from allot.sim.scenario import Ai2Knobs, generate_ai2, write_scenario


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "scenario", help="generate a synthetic scenario (cluster, budgets, trace)"
    )
    parser.add_argument("name", choices=["ai2"], help="which scenario")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--days", type=int, help="length in days (default 30)")
    parser.add_argument("--demand", type=float, help="demand / capacity (default 2.5)")
    parser.add_argument("--hosts", type=int, help="hosts of 8 GPUs (default 48)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    knobs = Ai2Knobs()
    if args.days is not None:
        knobs = replace(knobs, days=args.days)
    if args.demand is not None:
        knobs = replace(knobs, demand_factor=args.demand)
    if args.hosts is not None:
        knobs = replace(knobs, hosts=args.hosts)
    scenario = generate_ai2(args.seed, knobs)
    write_scenario(scenario, args.out)
    capacity = knobs.capacity_gpu_h
    print(
        f"wrote {args.out}/cluster.yaml, budgets.yaml, trace.csv: {len(scenario.jobs)} jobs, "
        f"{scenario.requested_gpu_h:,.0f} GPU-h requested = "
        f"{scenario.requested_gpu_h / capacity:.2f} x capacity"
    )
    return 0
