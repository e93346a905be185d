"""``allot scenario ai2 --seed N --out DIR``: write an Ai2-like month (cluster.yaml,
budgets.yaml, trace.csv, and scenario.json: its name and seed, which ``allot simulate``
carries into the report). The mix and its knobs: ``allot.sim.scenario`` and the README.
Host failures (4 by default) are capped at ``--hosts``, the short lane (1 host) at
``--hosts`` - 1; a bad flag is named as typed."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from allot.core.errors import ValidationError
from allot.sim.output_files import make_out_dir, writing_to
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
    parser.add_argument(
        "--max-gang",
        type=int,
        help="every team also submits gangs up to this many GPUs, whatever its entitlement "
        "(default: only the pretraining and multimodal programs, capped by entitlement)",
    )
    parser.add_argument(
        "--short-lane",
        type=int,
        help="the last N hosts form Fair Tree's short lane (default 1; 0: none)",
    )
    parser.add_argument(
        "--debug-share",
        type=float,
        help="share of the GPU-hours in debug jobs (default 0.008)",
    )
    parser.set_defaults(func=run)


# The knobs the flags set, so an error names the flag the user typed, not the field.
_FLAG_OF_KNOB = {
    "knobs.days": "--days",
    "knobs.demand_factor": "--demand",
    "knobs.hosts": "--hosts",
    "knobs.max_gang": "--max-gang",
    "knobs.debug_fraction": "--debug-share",
    "knobs.short_lane": "--short-lane",
    "knobs": "--debug-share",
}


def run(args: argparse.Namespace) -> int:
    knobs = _knobs(args)
    make_out_dir(args.out, "--out")
    scenario = generate_ai2(args.seed, knobs)
    with writing_to("--out"):
        write_scenario(scenario, args.out)
    capacity = knobs.capacity_gpu_h
    print(
        f"wrote {args.out}/cluster.yaml, budgets.yaml, trace.csv, scenario.json: "
        f"{len(scenario.jobs)} jobs, "
        f"{scenario.requested_gpu_h:,.0f} GPU-h requested = "
        f"{scenario.requested_gpu_h / capacity:.2f} x capacity"
    )
    return 0


def _knobs(args: argparse.Namespace) -> Ai2Knobs:
    default = Ai2Knobs()
    flags = {
        "days": args.days,
        "demand_factor": args.demand,
        "hosts": args.hosts,
        "max_gang": args.max_gang,
        "debug_fraction": args.debug_share,
        "short_lane": args.short_lane,
    }
    changes: dict[str, Any] = {k: v for k, v in flags.items() if v is not None}
    if args.hosts is not None:
        # No flag sets the failures, so they follow --hosts: a cluster smaller than the
        # default failure count loses every host once instead of being refused.
        changes["host_failures"] = max(0, min(default.host_failures, args.hosts))
        if args.short_lane is None:  # and the lane leaves the rest of a small cluster
            changes["short_lane"] = max(0, min(default.short_lane, args.hosts - 1))
    try:
        return replace(default, **changes)
    except ValidationError as exc:
        flag = _FLAG_OF_KNOB.get(exc.field)
        if flag is None:
            raise
        raise ValidationError(flag, exc.reason) from None
