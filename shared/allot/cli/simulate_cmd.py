"""``allot simulate``: replay a trace through the core and report, for one or several policies.

    allot simulate --cluster C.yaml --budgets B.yaml --trace T.csv --out DIR
                   [--policy fairshare | --compare priority,fairshare]
                   [--seed N] [--window 7d] [--half-life 3d] [--min-runtime 2h]
                   [--resumable/--no-resumable] [--grace 300] [--unallocated-grace 30]
                   [--unallocated-settle 60] [--rank-every 300] [--jobs N]
                   [--short-lane N] [--checkpoint KIND:SPEC ...]
    allot simulate --philly TRACES_DIR --compare partitioned,fairshare --out DIR

``--philly`` replaces ``--cluster``, ``--budgets`` and ``--trace``, and ``--compare``
replaces ``--policy``: giving both of a pair is refused, not resolved silently.

``--philly`` reads ``philly_pollux.csv`` and ``philly_vc_nodes_heliosartifact.csv`` from the
folder and builds the pooled cluster (352 hosts x 8 GPUs, partitions = the VC node counts)
and budgets (shares = node counts, 1 for the four VCs the file lacks); it writes both YAML
files beside the reports so the run can be repeated with the plain flags.

One policy: ``DIR/report.json``, ``DIR/report.html`` and ``DIR/jobs.csv`` (one row per
job: waits, JCT, preemptions; ``allot.sim.jobs_csv``). ``--compare``: one folder per policy
(``DIR/<policy>/``), ``DIR/compare.json`` and ``DIR/compare.html`` (side by side, linking
each policy's report); the summary prints side by side.

``--checkpoint KIND:SPEC`` (repeatable) says how workloads of a kind checkpoint
(``allot.sim.checkpoints``); ``KIND`` is a kind of the trace or ``*`` (every kind not
named); ``SPEC`` is comma-separated: ``notice`` (save on a preemption notice), ``every=DUR``
(save after each DUR of progress), or ``none``; ``save=DUR`` and ``restore=DUR`` (what a
save and a restore take; 0 by default). A kind no entry names (and every kind, without
``--checkpoint``) saves on notice at no cost: what the simulator always did. With and
without checkpoint on notice: ``--checkpoint '*:notice,save=1m,restore=2m'`` and
``--checkpoint '*:every=1h,save=1m,restore=2m'`` (decision 0052).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from allot.cli.durations import parse_duration
from allot.config.budget_file import load_tree_file, where_in_file
from allot.config.yaml_io import load_yaml
from allot.core.budgets import BudgetTree, parse_tree
from allot.core.duration_text import format_duration
from allot.core.errors import ValidationError
from allot.core.model import DEFAULT_GRACE_S, DEFAULT_UNALLOCATED_GRACE_S, MAX_MIN_RUNTIME_S
from allot.core.policy import DEFAULT_UNALLOCATED_SETTLE_S, check_unallocated_knobs
from allot.sim.baselines import POLICY_NAMES, named_policy
from allot.sim.checkpoints import ALL_KINDS, TODAY, Checkpointing, CheckpointPlan
from allot.sim.cluster import ClusterSpec, load_cluster, short_lane_of
from allot.sim.compare import render_compare_html, render_summary, summary
from allot.sim.engine import SimConfig, simulate
from allot.sim.jobs_csv import write_jobs_csv
from allot.sim.output_files import make_out_dir, writing_to
from allot.sim.report import build_report, write_report
from allot.sim.scenario import (
    dump_budgets_yaml,
    dump_cluster_yaml,
    philly_budgets,
    philly_cluster,
    scenario_of,
)
from allot.sim.trace import TraceDefaults, TraceJob, read_trace

PHILLY_TRACE = "philly_pollux.csv"
PHILLY_VCS = "philly_vc_nodes_heliosartifact.csv"
DEFAULT_POLICY = "fairshare"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="replay a workload trace through the scheduler and report",
        description="Replay a trace through the same scheduling core the live system runs.",
    )
    parser.add_argument("--cluster", type=Path, help="cluster YAML (host groups, partitions)")
    parser.add_argument("--budgets", type=Path, help="budget tree YAML")
    parser.add_argument("--trace", type=Path, help="trace CSV")
    parser.add_argument(
        "--philly", type=Path, metavar="DIR", help="use the Philly trace and VC sizes in DIR"
    )
    parser.add_argument(
        "--philly-window",
        metavar="FROM:TO",
        help="with --philly: only jobs submitted in [FROM, TO), UTC dates on the trace's clock "
        "(2017-09-04 10:30:41 + submit_time_s), e.g. 2017-10-01:2017-10-08",
    )
    # No default here: None tells "--policy not given" apart, so it can clash with --compare.
    parser.add_argument(
        "--policy", choices=POLICY_NAMES, help=f"policy to simulate (default {DEFAULT_POLICY})"
    )
    parser.add_argument("--compare", help="comma-separated policies to run side by side")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="recorded in the report")
    parser.add_argument(
        "--min-runtime",
        type=parse_duration,
        default="2h",
        help="min_runtime for trace rows without one (default 2h)",
    )
    parser.add_argument(
        "--resumable",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="resumable for trace rows without the column (default yes)",
    )
    add_engine_options(parser)
    parser.add_argument(
        "--short-lane",
        type=int,
        default=None,
        metavar="N",
        help="Fair Tree: the last N hosts form the short lane (default: the cluster file's "
        "short_lane, else none)",
    )
    parser.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="KIND:SPEC",
        help="how workloads of KIND (or * for every other kind) checkpoint: SPEC is "
        "comma-separated 'notice' (save on a preemption notice), 'every=DUR', or 'none', "
        "with 'save=DUR' and 'restore=DUR' (default 0); repeatable. Default: on notice at "
        "no cost. E.g. '*:notice,save=1m,restore=2m' or 'training:every=1h,save=1m'",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="policies simulated in parallel with --compare (default: CPU count)",
    )
    parser.set_defaults(func=run)


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """The engine's and the policy's knobs (``allot simulate``, ``allot whatif``)."""
    parser.add_argument(
        "--window", type=parse_duration, default="7d", help="usage window (default %(default)s)"
    )
    parser.add_argument(
        "--half-life", type=parse_duration, default=None, help="decay usage (Slurm-like)"
    )
    parser.add_argument(
        "--grace",
        type=parse_duration,
        default=DEFAULT_GRACE_S,
        help="preemption grace (default %(default)s s)",
    )
    parser.add_argument(
        "--unallocated-grace",
        type=parse_duration,
        default=DEFAULT_UNALLOCATED_GRACE_S,
        help=f"Fair Tree: grace of unallocated victims (default {DEFAULT_UNALLOCATED_GRACE_S}s, "
        "at most --grace)",
    )
    parser.add_argument(
        "--unallocated-settle",
        type=parse_duration,
        default=DEFAULT_UNALLOCATED_SETTLE_S,
        help="Fair Tree: GPUs that came free less than this ago are left to allocated work "
        f"(default {DEFAULT_UNALLOCATED_SETTLE_S:g}s)",
    )
    parser.add_argument(
        "--rank-every",
        type=parse_duration,
        default=300,
        help="Fair Tree refresh interval (default %(default)s s)",
    )


def check_engine_options(args: argparse.Namespace) -> None:
    """Refuse engine knobs the run cannot honour, naming the flag."""
    check_unallocated_knobs(
        "--unallocated-grace",
        args.unallocated_grace,
        "--unallocated-settle",
        args.unallocated_settle,
    )
    for flag, value in (
        ("--window", args.window),
        ("--half-life", args.half_life),
        ("--rank-every", args.rank_every),
    ):
        if value is not None and value <= 0:
            raise ValidationError(flag, f"must be more than 0 seconds, got {value:g}")


def engine_config(
    args: argparse.Namespace, name: str, tree: BudgetTree, cluster: ClusterSpec
) -> SimConfig:
    """The ``SimConfig`` of policy ``name`` under ``tree`` with the engine options."""
    return SimConfig(
        policy_name=name,
        policy=named_policy(
            name,
            tree,
            _capacity(cluster),
            args.grace,
            unallocated_grace_s=int(args.unallocated_grace),
            unallocated_settle_s=args.unallocated_settle,
        ),
        seed=getattr(args, "seed", 0),
        window_s=args.window,
        half_life_s=args.half_life,
        rank_every_s=args.rank_every,
    )


def run(args: argparse.Namespace) -> int:
    _check_flags(args)
    policies = _policies(args)
    # Before reading the trace and simulating (minutes), so a bad --out fails at once.
    make_out_dir(args.out, "--out")
    for name in policies if len(policies) > 1 else ():
        make_out_dir(args.out / name, "--out")
    cluster, tree, jobs = _load_inputs(args)
    if args.short_lane is not None:
        try:
            lane = short_lane_of(cluster.hosts, args.short_lane)
        except ValidationError as exc:
            raise ValidationError("--short-lane", exc.reason) from None
        cluster = replace(cluster, short_lane=lane)
        if lane and all(
            engine_config(args, n, tree, cluster).policy.ordering is not None for n in policies
        ):
            raise ValidationError(
                "--short-lane", "only Fair Tree policies have a short lane; none of these has one"
            )
    _check_checkpoint_kinds(args.checkpoint, {j.workload.kind for j in jobs})
    workers = min(args.jobs or os.cpu_count() or 1, len(policies))
    with writing_to("--out"):
        reports = _run_all(args, cluster, tree, jobs, policies=policies, workers=workers)
        if len(policies) > 1:
            (args.out / "compare.json").write_text(
                json.dumps({n: summary(r) for n, r in reports.items()}, sort_keys=True, indent=2)
                + "\n"
            )
            (args.out / "compare.html").write_text(render_compare_html(reports))
    print(render_summary(reports))
    return 0


# Flags that the other flag makes meaningless: silently ignoring one would simulate
# something other than what the user asked for.
_CONFLICTS: Sequence[tuple[str, str]] = (
    ("--philly", "--cluster"),
    ("--philly", "--budgets"),
    ("--philly", "--trace"),
    ("--compare", "--policy"),
)


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse flag values the run cannot honour. Checked here, not deep inside the core
    (the first ranking, the trace reader), so the error names the flag the user typed."""
    for flag, other in _CONFLICTS:
        if _given(args, flag) and _given(args, other):
            raise ValidationError(flag, f"not allowed with {other}")
    if args.philly_window is not None:
        if args.philly is None:
            raise ValidationError("--philly-window", "needs --philly DIR")
        philly_window(args.philly_window)  # a bad window fails before the trace is read
    check_engine_options(args)
    args.checkpoint_plan = checkpoint_plan(args.checkpoint, args.grace)
    if args.min_runtime > MAX_MIN_RUNTIME_S:
        raise ValidationError(
            "--min-runtime",
            f"must be at most {format_duration(MAX_MIN_RUNTIME_S)}, "
            f"got {format_duration(args.min_runtime)}",
        )
    # 0 would read as "not given" (the CPU count) and a negative count means nothing.
    if args.jobs is not None and args.jobs < 1:
        raise ValidationError("--jobs", f"must be at least 1, got {args.jobs}")


_SPEC_EXAMPLES = "e.g. '*:notice,save=1m,restore=2m' or 'training:every=1h,save=1m'"


def checkpoint_plan(specs: Sequence[str], grace_s: float) -> CheckpointPlan:
    """The ``--checkpoint`` values as a plan; a kind named twice, a bad word or duration,
    or a save on notice longer than ``grace_s`` (it could never finish) is refused."""
    by_kind: dict[str, Checkpointing] = {}
    for text in specs:
        kind, cp = _checkpoint_spec(text, grace_s)
        if kind in by_kind:
            raise ValidationError("--checkpoint", f"names kind {kind!r} twice ({text!r})")
        by_kind[kind] = cp
    default = by_kind.pop(ALL_KINDS, TODAY)
    return CheckpointPlan(by_kind, default)


def _checkpoint_spec(text: str, grace_s: float) -> tuple[str, Checkpointing]:
    kind, colon, spec = (part.strip() for part in text.partition(":"))
    if not colon or not kind or not spec:
        raise ValidationError("--checkpoint", f"{text!r} is not KIND:SPEC ({_SPEC_EXAMPLES})")
    words: dict[str, str] = {}
    for word in (w.strip() for w in spec.split(",")):
        name, equals, value = (part.strip() for part in word.partition("="))
        takes_value = name in ("every", "save", "restore")
        if name not in ("notice", "none") and not takes_value:
            raise ValidationError(
                "--checkpoint",
                f"{text!r}: unknown word {word!r} (notice, none, every=DUR, save=DUR, restore=DUR)",
            )
        if bool(equals) != takes_value:
            hint = f"{name}=DUR" if takes_value else name
            raise ValidationError("--checkpoint", f"{text!r}: write {hint}, not {word!r}")
        if name in words:
            raise ValidationError("--checkpoint", f"{text!r}: {name} given twice")
        words[name] = value
    seconds = {
        name: _spec_duration(text, name, value)
        for name, value in words.items()
        if name in ("every", "save", "restore")
    }
    if "none" in words and len(words) > 1:
        raise ValidationError(
            "--checkpoint", f"{text!r}: none saves nothing, so takes no other word"
        )
    if not words.keys() & {"notice", "every", "none"}:
        raise ValidationError(
            "--checkpoint", f"{text!r}: say when it saves: notice, every=DUR, or none"
        )
    if seconds.get("every") == 0:
        raise ValidationError("--checkpoint", f"{text!r}: every must be more than 0 seconds")
    save = seconds.get("save", 0)
    if "notice" in words and save > grace_s:
        raise ValidationError(
            "--checkpoint",
            f"{text!r}: save={format_duration(save)} is longer than the grace period "
            f"(--grace {format_duration(grace_s)}): a save on notice could never finish",
        )
    return kind, Checkpointing(
        every_s=seconds.get("every"),
        on_notice="notice" in words,
        save_s=float(save),
        restore_s=float(seconds.get("restore", 0)),
    )


def _spec_duration(text: str, name: str, value: str) -> float:
    try:
        return float(parse_duration(value))
    except argparse.ArgumentTypeError as exc:
        raise ValidationError("--checkpoint", f"{text!r}: {name}: {exc}") from None


def _check_checkpoint_kinds(specs: Sequence[str], kinds: set[str]) -> None:
    """A ``--checkpoint`` kind no workload has would change nothing: likely a typo."""
    for text in specs:
        kind = text.partition(":")[0].strip()
        if kind != ALL_KINDS and kind not in kinds:
            raise ValidationError(
                "--checkpoint",
                f"{text!r}: no workload of kind {kind!r} in the trace "
                f"(kinds: {', '.join(sorted(kinds))})",
            )


def _given(args: argparse.Namespace, flag: str) -> bool:
    return getattr(args, flag.removeprefix("--").replace("-", "_")) is not None


def _run_all(
    args: argparse.Namespace,
    cluster: ClusterSpec,
    tree: BudgetTree,
    jobs: list[TraceJob],
    *,
    policies: list[str],
    workers: int,
) -> dict[str, dict[str, Any]]:
    if workers == 1:
        return {
            name: _run_one(args, cluster, tree, jobs, name, per_policy_folder=len(policies) > 1)
            for name in policies
        }
    # One process per policy: each run is deterministic on its own, so running them
    # side by side changes nothing in the reports, only the wall time.
    args.quiet = True
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {
            name: pool.submit(_run_one, args, cluster, tree, jobs, name, per_policy_folder=True)
            for name in policies
        }
        return {name: futures[name].result() for name in policies}


def _run_one(
    args: argparse.Namespace,
    cluster: ClusterSpec,
    tree: BudgetTree,
    jobs: list[TraceJob],
    name: str,
    *,
    per_policy_folder: bool,
) -> dict[str, Any]:
    config = replace(engine_config(args, name, tree, cluster), checkpointing=args.checkpoint_plan)
    started = time.perf_counter()
    progress = None if args.quiet else _progress_bar(name)
    record = simulate(cluster, tree, jobs, config, progress)
    made = scenario_of(args.trace) if args.trace is not None else None
    report = build_report(record, scenario=made)
    if progress is not None:
        progress(1.0)
        print(file=sys.stderr)
    out = args.out / name if per_policy_folder else args.out
    write_report(report, out)
    write_jobs_csv(record, out)
    print(
        f"{name}: {len(jobs)} workloads simulated in {time.perf_counter() - started:.1f} s"
        f" -> {out}/report.json, report.html, jobs.csv",
        file=sys.stderr,
    )
    return report


def _policies(args: argparse.Namespace) -> list[str]:
    if args.compare is None:
        return [args.policy or DEFAULT_POLICY]
    names = [n.strip() for n in args.compare.split(",")]
    choices = f"choose from {', '.join(POLICY_NAMES)}"
    if "" in names:
        raise ValidationError(
            "--compare", f"{args.compare!r} is not a comma-separated list of policies ({choices})"
        )
    for name in names:
        if name not in POLICY_NAMES:
            raise ValidationError("--compare", f"unknown policy {name!r} ({choices})")
    if len(set(names)) < len(names):
        # Two runs of one policy would write the same folder and show one column.
        raise ValidationError("--compare", f"names a policy twice in {args.compare!r}")
    return names


def _capacity(cluster: ClusterSpec) -> int:
    return sum(h.gpus for h in cluster.hosts)


PHILLY_START = dt.datetime(2017, 9, 4, 10, 30, 41, tzinfo=dt.UTC)
"""The Philly trace's first submission: its ``submit_time_s`` 0."""


def philly_window(text: str) -> tuple[float, float]:
    """``FROM:TO`` (UTC dates) as ``[lo, hi)`` in the trace's ``submit_time_s``."""
    try:
        start, end = (
            dt.datetime.strptime(part, "%Y-%m-%d").replace(tzinfo=dt.UTC)
            for part in text.split(":")
        )
    except ValueError:
        raise ValidationError(
            "--philly-window", f"{text!r} is not FROM:TO, two dates such as 2017-10-01:2017-10-08"
        ) from None
    if end <= start:
        raise ValidationError("--philly-window", f"{text!r} ends before it starts")
    return (start - PHILLY_START).total_seconds(), (end - PHILLY_START).total_seconds()


def _load_inputs(args: argparse.Namespace) -> tuple[ClusterSpec, BudgetTree, list[TraceJob]]:
    defaults = TraceDefaults(min_runtime_s=args.min_runtime, resumable=args.resumable)
    if args.philly is not None:
        for name in (PHILLY_TRACE, PHILLY_VCS):
            if not (args.philly / name).is_file():
                raise ValidationError(
                    "--philly",
                    f"{args.philly} holds no {name} (where to get the Philly trace files: "
                    "README, 'Data')",
                )
        jobs = read_trace(args.philly / PHILLY_TRACE, defaults)
        if args.philly_window is not None:
            lo, hi = philly_window(args.philly_window)
            jobs = [j for j in jobs if lo <= j.workload.submit_time < hi]
        teams = sorted({j.workload.allocation for j in jobs if j.workload.allocation})
        cluster_data = philly_cluster(args.philly / PHILLY_VCS, teams)
        budgets_data = philly_budgets(args.philly / PHILLY_VCS, teams)
        with writing_to("--out"):
            (args.out / "cluster.yaml").write_text(dump_cluster_yaml(cluster_data))
            (args.out / "budgets.yaml").write_text(dump_budgets_yaml(budgets_data))
        return load_cluster(cluster_data), parse_tree(budgets_data), jobs
    for flag in ("cluster", "budgets", "trace"):
        if getattr(args, flag) is None:
            raise ValidationError(f"--{flag}", "is required (or use --philly DIR)")
    cluster = load_cluster(
        _mapping(load_yaml(args.cluster), str(args.cluster)),
        lane_of_file=args.short_lane is None,  # the flag replaces the file's lane
    )
    try:
        tree = load_tree_file(args.budgets)
    except ValidationError as exc:  # name the file, as allot fairshare does
        raise ValidationError(f"--budgets {where_in_file(args.budgets, exc)}", exc.reason) from None
    jobs = read_trace(args.trace, defaults)
    if jobs and all(job.workload.allocation is None for job in jobs):
        print(
            f"allot simulate: note: no job of {args.trace} names an allocation (no "
            "`allocation` column?): every job runs unallocated, so nothing is owed and "
            "owed->delivered has nothing to show",
            file=sys.stderr,
        )
    for job in jobs:
        alloc = job.workload.allocation
        if alloc is not None:
            try:
                tree.require_leaf(alloc)
            except ValidationError as exc:
                raise ValidationError(
                    f"{args.trace}: job {job.workload.id}: allocation", exc.reason
                ) from None
    return cluster, tree, jobs


def _mapping(data: object, where: str) -> Mapping[str, object]:
    if not isinstance(data, dict):
        raise ValidationError(where, "must be a YAML mapping at the top level")
    return data


def _progress_bar(name: str) -> Callable[[float], None] | None:
    if not sys.stderr.isatty():
        return None

    def show(fraction: float) -> None:
        filled = int(fraction * 30)
        sys.stderr.write(f"\r{name:>12} [{'#' * filled}{'.' * (30 - filled)}] {fraction:4.0%}")
        sys.stderr.flush()

    return show
