"""The golden cases and how one is run: shared by ``test_golden.py`` and ``regenerate.py``.

A case is a folder ``cases/<name>/`` holding ``cluster.yaml``, ``budgets.yaml``,
``trace.csv``, ``README.md`` (what it probes) and ``expected_report.json``: a JSON object
mapping each policy the case runs (``CASES``) to its report, written as
``json.dumps({policy: report}, sort_keys=True, indent=2)`` plus a newline.

A case runs through the pieces ``allot simulate`` uses (``load_yaml``, ``load_cluster``,
``parse_tree``, ``read_trace``, ``named_policy``, ``simulate``, ``build_report``), with the
defaults of the real ``allot simulate`` parser (grace, window, min_runtime, resumable,
checkpointing, ...),
so a default changed in the CLI shows up here as a golden diff.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from allot.cli.main import build_parser
from allot.cli.simulate_cmd import checkpoint_plan
from allot.config.yaml_io import load_yaml
from allot.core.budgets import parse_tree
from allot.sim.baselines import named_policy
from allot.sim.cluster import load_cluster
from allot.sim.engine import SimConfig, simulate
from allot.sim.record import SimRecord
from allot.sim.report import build_report
from allot.sim.trace import TraceDefaults, read_trace

CASES_DIR = Path(__file__).resolve().parent / "cases"
EXPECTED = "expected_report.json"

CASES: dict[str, tuple[str, ...]] = {
    "reclaim": ("fairshare",),
    "drain": ("fairshare",),
    "gang": ("fairshare",),
    "short-lane": ("fairshare",),
    "baselines": ("fifo", "partitioned", "priority"),
}
"""Case folder -> the policies it is run under (one report each)."""


def mapping(data: object, where: Path) -> Mapping[str, object]:
    if not isinstance(data, dict):
        raise TypeError(f"{where}: expected a YAML mapping")
    return data


def simulate_case(name: str, policy: str) -> tuple[SimRecord, dict[str, Any]]:
    """Run case ``name`` under ``policy``: the engine's record and the report built from it."""
    case = CASES_DIR / name
    args = build_parser().parse_args(
        ["simulate", "--cluster", str(case / "cluster.yaml"), "--out", "unused"]
    )
    cluster = load_cluster(mapping(load_yaml(case / "cluster.yaml"), case / "cluster.yaml"))
    tree = parse_tree(mapping(load_yaml(case / "budgets.yaml"), case / "budgets.yaml"))
    defaults = TraceDefaults(min_runtime_s=args.min_runtime, resumable=args.resumable)
    jobs = read_trace(case / "trace.csv", defaults)
    config = SimConfig(
        policy_name=policy,
        policy=named_policy(policy, tree, cluster.total_gpus, args.grace),
        seed=args.seed,
        window_s=args.window,
        half_life_s=args.half_life,
        rank_every_s=args.rank_every,
        checkpointing=checkpoint_plan(args.checkpoint, args.grace),
    )
    record = simulate(cluster, tree, jobs, config)
    return record, build_report(record)


def render(reports: Mapping[str, Any]) -> str:
    """The bytes of ``expected_report.json``."""
    return json.dumps(reports, sort_keys=True, indent=2, allow_nan=False) + "\n"


def run_case(name: str) -> str:
    """Every policy of case ``name``, rendered."""
    return render({policy: simulate_case(name, policy)[1] for policy in CASES[name]})
