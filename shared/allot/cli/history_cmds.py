"""The live history read back from the log: as the simulator's inputs, replayed under a
proposed budget tree, and the budget tree's changes.

    allot export --since 7d --out DIR
    allot whatif (--since 1h | --from DIR) (--set PATH=SHARES ... | --budgets new.yaml)
                 [--out DIR] [--json] [--policy P] [--short-lane HOSTS]
                 [allot simulate's engine options]
    allot budgets history [--json]

Each reads the log once through NATS (``allot.ops.log_reader``; ``--nats-url`` and the
stack discovery of the live commands, ``allot.cli.stack_url``); ``whatif --from DIR`` reads
a folder ``export`` wrote instead and talks to nothing.

* ``export``: the window ``[now - since, now]`` as ``trace.csv``, ``cluster.yaml`` and
  ``budgets.yaml`` (the tree current now), the files ``allot simulate`` reads, and
  ``export.json`` (the window in epoch seconds and UTC, what the trace holds and leaves
  out). Trace times count from the window's start; what is in it and how work pending or
  running then is carried: ``allot.eventlog.window_history``.
* ``whatif``: the same history, in memory, replayed by the simulator (``allot.sim.engine``,
  the placement service's ``run_cycle``) twice, under the current tree and under the
  proposed one: ``--budgets`` a file, and/or ``--set PATH=SHARES`` edits (as ``allot budgets
  set`` takes them, checked the same way) applied to it or, without ``--budgets``, to the
  current tree. Each replay is cut to the window (``allot.sim.record_window``) and reported
  (``DIR/current/``, ``DIR/proposed/``: report.json, report.html, jobs.csv); ``DIR/report.json``
  and ``DIR/report.html`` hold them side by side (``allot.sim.whatif_report``), which the
  command prints (``--json``: report.json).
* ``budgets history``: every ``BudgetTreeSet`` in the log, oldest first: when, by whom (the
  login that sent it), and each node's shares before and after
  (``allot.eventlog.budget_history``).

Bad input is one line naming the option and the reason, exit status 2; a log that cannot be
read is one line, exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from allot.bus.service_main import add_short_lane_argument, lane_hosts_of
from allot.cli.durations import duration_label, parse_duration
from allot.cli.live_cmds import (
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    _common,
    _nats_url,
    parse_budget_path,
    parse_shares,
    parse_timeout,
)
from allot.cli.simulate_cmd import add_engine_options, check_engine_options, engine_config
from allot.config.budget_file import load_tree_file
from allot.config.yaml_io import load_yaml
from allot.core.budgets import BudgetTree, set_shares
from allot.core.errors import ValidationError
from allot.core.policy import Policy
from allot.eventlog.budget_history import BudgetChange, ShareChange, budget_changes, tree_diff
from allot.eventlog.budget_wire import spec_from_tree, tree_mapping
from allot.eventlog.window_history import ExportedHistory, WindowHistory
from allot.proto import messages as m
from allot.render.live_format import timestamp
from allot.sdk import LoginRefusedError, PermissionDeniedError, SdkError
from allot.sim.baselines import POLICY_NAMES
from allot.sim.cluster import ClusterSpec, load_cluster
from allot.sim.engine import simulate
from allot.sim.jobs_csv import write_jobs_csv
from allot.sim.output_files import make_out_dir, writing_to
from allot.sim.record_window import window_record
from allot.sim.report import build_report, write_report
from allot.sim.scenario import dump_budgets_yaml, dump_cluster_yaml, dump_trace_csv
from allot.sim.trace import TraceJob, read_trace
from allot.sim.whatif_report import SIDES, whatif_figures, whatif_html, whatif_text

TRACE, CLUSTER, BUDGETS, EXPORT = "trace.csv", "cluster.yaml", "budgets.yaml", "export.json"
DEFAULT_WHATIF_OUT = Path("out/whatif")
USAGE_KEPT_PER_SUBJECT = 10_000
"""``allot.bus.USAGE_KEPT_PER_SUBJECT`` (repeated so that building the parser imports no
NATS client): the budget trees the log keeps."""


# -- registration ------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``export`` and ``whatif``; ``budgets history`` is added by ``allot.cli.live_cmds``
    (``register_budget_history``) under its ``budgets``."""
    common = [_common()]
    p = subparsers.add_parser(
        "export",
        parents=common,
        help="write the live history of the last N as the simulator's input files",
        description="Read the log and write the window [now - SINCE, now] as trace.csv, "
        "cluster.yaml and budgets.yaml (allot simulate's inputs) and export.json.",
    )
    p.add_argument("--since", required=True, help="how far back: 90m, 12h, 7d, 1h30m")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.set_defaults(func=run_export)

    p = subparsers.add_parser(
        "whatif",
        parents=common,
        help="replay the live history under the current and a proposed budget tree",
        description="Replay the window [now - SINCE, now] (or a folder allot export wrote) "
        "through the simulator under the current budget tree and under a proposed one, and "
        "compare owed and delivered GPU-hours, waits and preemptions per allocation.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--since", help="how far back: 90m, 12h, 7d, 1h30m")
    source.add_argument("--from", dest="from_dir", type=Path, help="a folder allot export wrote")
    p.add_argument(
        "--budgets",
        type=Path,
        help="the proposed tree (budget YAML); --set edits apply to it when both are given",
    )
    p.add_argument(
        "--set",
        dest="edits",
        action="append",
        default=[],
        metavar="PATH=SHARES",
        help="a proposed change, as allot budgets set takes it (root/nlp=30, nlp=parent); "
        "repeat it for more",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_WHATIF_OUT,
        help="output folder (default %(default)s)",
    )
    p.add_argument(
        "--policy",
        choices=POLICY_NAMES,
        default="fairshare",
        help="the placement service's --policy (default %(default)s)",
    )
    add_short_lane_argument(p, "the placement service's --short-lane hosts (default none)")
    add_engine_options(p)
    p.set_defaults(func=run_whatif)


def register_budget_history(
    actions: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    p = actions.add_parser(
        "history",
        parents=common,
        help="every budget change: when, by whom, what",
        description="Every budget tree the log holds, oldest first: when it was set, by "
        "whom (the login that sent the change), and each node's shares before and after.",
    )
    p.set_defaults(func=run_budget_history)


# -- reading the log ---------------------------------------------------------------------------


def _read(
    args: argparse.Namespace, on_record: Callable[[msgspec.Struct], None], **kw: Any
) -> int | None:
    """Read the log into ``on_record``; None when read, else the exit status (said on
    stderr in one line)."""
    from allot.ops.log_reader import LogUnreadableError, read_log  # noqa: PLC0415 - nats-py

    timeout = parse_timeout(args.timeout)
    url = _nats_url(args)
    try:
        asyncio.run(read_log(url, on_record, timeout=timeout, **kw))
    except (SdkError, LogUnreadableError) as exc:
        print(f"allot {args.command}: {exc}", file=sys.stderr)
        refused = isinstance(exc, PermissionDeniedError | LoginRefusedError)
        return EXIT_REFUSED if refused else EXIT_UNAVAILABLE
    return None


def parse_since(text: str) -> int:
    try:
        seconds = parse_duration(text)
    except argparse.ArgumentTypeError as exc:
        raise ValidationError("--since", str(exc)) from None
    if seconds <= 0:
        raise ValidationError("--since", f"{text!r} must be more than 0 seconds")
    return seconds


def _history(args: argparse.Namespace) -> ExportedHistory | int:
    """The window ``[now - --since, now]`` read from the log, or an exit status."""
    seconds = parse_since(args.since)
    until = time.time()
    window = WindowHistory(until - seconds, until)
    failed = _read(args, window.apply)
    if failed is not None:
        return failed
    try:
        return window.result()
    except ValidationError as exc:
        if exc.field == "since":
            raise ValidationError("--since", f"{args.since}: {exc.reason}") from None
        raise


# -- export ------------------------------------------------------------------------------------


def run_export(args: argparse.Namespace) -> int:
    parse_since(args.since)  # before connecting
    make_out_dir(args.out, "--out")
    history = _history(args)
    if isinstance(history, int):
        return history
    meta = write_export(history, args.out)
    if args.json:
        print(_envelope("Export", meta))
        return 0
    print(
        f"{_window_line(meta)}\n"
        f"wrote {args.out}/{TRACE}, {CLUSTER}, {BUDGETS}, {EXPORT}; replay it with:\n"
        f"  allot simulate --cluster {args.out}/{CLUSTER} --budgets {args.out}/{BUDGETS} "
        f"--trace {args.out}/{TRACE} --out {args.out}/sim"
    )
    return 0


def write_export(history: ExportedHistory, out: Path) -> dict[str, Any]:
    """Write the four files of ``out``; returns export.json's content."""
    if history.tree is None:
        raise ValidationError("--since", "the log holds no budget tree up to now")
    meta = export_meta(history)
    with writing_to("--out"):
        (out / TRACE).write_text(dump_trace_csv(history.jobs), encoding="utf-8")
        (out / CLUSTER).write_text(dump_cluster_yaml(history.cluster), encoding="utf-8")
        (out / BUDGETS).write_text(dump_budgets_yaml(tree_mapping(history.tree)), encoding="utf-8")
        (out / EXPORT).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return meta


def export_meta(history: ExportedHistory) -> dict[str, Any]:
    """``export.json``: the window and what the trace holds."""
    hosts = history.cluster.get("hosts")
    return {
        "since": history.since,
        "until": history.until,
        "since_utc": timestamp(history.since),
        "until_utc": timestamp(history.until),
        "window_s": history.window_s,
        "time_origin": "trace and cluster times are seconds from since",
        "workloads": len(history.jobs),
        "pending_at_start": history.pending_at_start,
        "running_at_start": history.running_at_start,
        "left_out": dict(history.left_out),
        "hosts": len(hosts) if isinstance(hosts, list) else 0,
        # JSON keys are strings: hours of the trace's clock (negative: before since).
        "prior_usage": {
            alloc: {str(hour): gpu_s for hour, gpu_s in sorted(hours.items())}
            for alloc, hours in sorted(history.prior_usage.items())
        },
    }


def _prior_usage(meta: dict[str, Any], where: Path) -> dict[str, dict[int, float]]:
    """export.json's ``prior_usage`` (absent in a folder written before it existed: none)."""
    raw = meta.get("prior_usage", {})
    out: dict[str, dict[int, float]] = {}
    try:
        for alloc, hours in raw.items():
            out[str(alloc)] = {int(h): float(v) for h, v in hours.items()}
    except (AttributeError, TypeError, ValueError) as exc:
        raise ValidationError(
            "--from", f"{where}: prior_usage must map allocations to {{hour: GPU-seconds}} ({exc})"
        ) from None
    for alloc, hours in out.items():
        if any(not (math.isfinite(v) and v >= 0) for v in hours.values()):
            raise ValidationError("--from", f"{where}: prior_usage of {alloc} must be >= 0")
    return out


def _window_line(meta: dict[str, Any]) -> str:
    left = sum(meta["left_out"].values())
    return (
        f"{duration_label(meta['window_s'])} of history, {meta['since_utc']} .. "
        f"{meta['until_utc']}: {meta['workloads']} workloads ({meta['running_at_start']} "
        f"running and {meta['pending_at_start']} pending at the start"
        + (f"; {left} left out: {', '.join(meta['left_out'])}" if left else "")
        + f"), {meta['hosts']} host{'' if meta['hosts'] == 1 else 's'}"
    )


# -- whatif ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Inputs:
    jobs: list[TraceJob]
    cluster: ClusterSpec
    tree: BudgetTree
    meta: dict[str, Any] = field(default_factory=dict)
    prior_usage: dict[str, dict[int, float]] = field(default_factory=dict)


def parse_edit(text: str) -> tuple[tuple[str, ...], int | None]:
    """``--set PATH=SHARES`` as ``allot budgets set PATH SHARES`` reads it."""
    path, eq, shares = text.partition("=")
    if not eq:
        raise ValidationError("--set", f"{text!r} is not PATH=SHARES (root/nlp=30)")
    try:
        return parse_budget_path(path), parse_shares(shares)
    except ValidationError as exc:
        raise ValidationError("--set", f"{text!r}: {exc.reason}") from None


def proposed_tree(current: BudgetTree, edits: Sequence[str], budgets: Path | None) -> BudgetTree:
    """``--budgets`` (or the current tree) with each ``--set`` applied, in order, by the
    ranking service's rule (``set_shares``: the path must exist, the tree stay valid)."""
    tree = current if budgets is None else load_tree_file(budgets, "--budgets")
    for text in edits:
        path, shares = parse_edit(text)
        try:
            tree = set_shares(tree, path, shares)
        except ValidationError as exc:
            raise ValidationError("--set", f"{text!r}: {exc.reason}") from None
    return tree


def _check_allocations(jobs: Sequence[TraceJob], tree: BudgetTree, option: str) -> None:
    for job in jobs:
        allocation = job.workload.allocation
        if allocation is not None and not tree.is_leaf(allocation):
            raise ValidationError(
                option,
                f"workload {job.workload.id} of the history is charged to {allocation!r}, "
                f"which is no allocation of this tree (allocations: {', '.join(tree.leaves())})",
            )


def _from_folder(folder: Path) -> _Inputs:
    for name in (TRACE, CLUSTER, BUDGETS, EXPORT):
        if not (folder / name).is_file():
            raise ValidationError("--from", f"{folder} holds no {name} (allot export writes it)")
    try:
        meta = json.loads((folder / EXPORT).read_text(encoding="utf-8"))
        window_s = float(meta["window_s"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValidationError("--from", f"{folder / EXPORT}: no window_s in it ({exc})") from None
    if not window_s > 0:
        raise ValidationError("--from", f"{folder / EXPORT}: window_s must be > 0")
    data = load_yaml(folder / CLUSTER)
    if not isinstance(data, dict):
        raise ValidationError(str(folder / CLUSTER), "must be a YAML mapping at the top level")
    if "short_lane" in data:  # it would be dropped: the lane is named as placement names it
        raise ValidationError(
            f"{folder / CLUSTER}: short_lane",
            "not read here: name the lane's hosts with --short-lane, as placement takes them",
        )
    return _Inputs(
        jobs=read_trace(folder / TRACE),
        cluster=load_cluster(data),
        tree=load_tree_file(folder / BUDGETS),
        meta=meta,
        prior_usage=_prior_usage(meta, folder / EXPORT),
    )


def _from_log(args: argparse.Namespace) -> _Inputs | int:
    history = _history(args)
    if isinstance(history, int):
        return history
    if history.tree is None:
        raise ValidationError("--since", "the log holds no budget tree up to now")
    return _Inputs(
        jobs=list(history.jobs),
        cluster=load_cluster(history.cluster),
        tree=history.tree,
        meta=export_meta(history),
        prior_usage=history.prior_usage,
    )


def _history_lane(
    args: argparse.Namespace, cluster: ClusterSpec, policy: Policy
) -> tuple[str, ...]:
    """``--short-lane``, checked against the history's hosts and the policy."""
    lane = lane_hosts_of(args)
    policy.check_short_lane(lane, "--short-lane")
    if not lane:
        return ()
    known = {h.id for h in cluster.hosts}
    unknown = [h for h in lane if h not in known]
    if unknown:
        raise ValidationError("--short-lane", f"{unknown[0]!r} is no host of the history")
    if len(lane) == len(known):
        raise ValidationError("--short-lane", "must leave some of the history's hosts outside")
    return lane


def run_whatif(args: argparse.Namespace) -> int:
    check_engine_options(args)
    if args.since is not None:
        parse_since(args.since)
    for text in args.edits:
        parse_edit(text)  # bad syntax is refused before the log is read
    if args.budgets is None and not args.edits:
        raise ValidationError("--set", "give the proposed change: --set PATH=SHARES or --budgets")
    make_out_dir(args.out, "--out")
    inputs = _from_folder(args.from_dir) if args.from_dir is not None else _from_log(args)
    if isinstance(inputs, int):
        return inputs
    proposed = proposed_tree(inputs.tree, args.edits, args.budgets)
    _check_allocations(inputs.jobs, inputs.tree, "--from" if args.from_dir else "--since")
    _check_allocations(inputs.jobs, proposed, "--budgets" if args.budgets else "--set")
    trees = dict(zip(SIDES, (inputs.tree, proposed), strict=True))
    window_s = float(inputs.meta["window_s"])
    policy = engine_config(args, args.policy, inputs.tree, inputs.cluster).policy
    cluster = replace(inputs.cluster, short_lane=_history_lane(args, inputs.cluster, policy))
    reports, records = {}, {}
    for side, tree in trees.items():
        config = replace(
            engine_config(args, args.policy, tree, cluster), prior_usage=inputs.prior_usage
        )
        record = window_record(simulate(cluster, tree, inputs.jobs, config), 0.0, window_s)
        records[side] = record
        reports[side] = build_report(record)
    changes = tree_diff(spec_from_tree(inputs.tree), spec_from_tree(proposed))
    document = {
        "window": inputs.meta,
        "policy": args.policy,
        "proposed_changes": [_change_json(c) for c in changes],
        **whatif_figures(reports, records),
    }
    with writing_to("--out"):
        for side in SIDES:
            write_report(reports[side], args.out / side)
            write_jobs_csv(records[side], args.out / side)
        (args.out / "report.json").write_text(
            json.dumps(document, sort_keys=True, indent=2, allow_nan=False) + "\n",
            encoding="utf-8",
        )
        title = f"What if: {_changes_text(changes)}"
        note = (
            f"{_window_line(inputs.meta)}, replayed by the simulator ({args.policy}) under the "
            "current budget tree and under the proposed one, each cut to the window."
        )
        (args.out / "report.html").write_text(
            whatif_html(document, reports, title, note), encoding="utf-8"
        )
    if args.json:
        print(_envelope("WhatIf", document))
        return 0
    print(f"{_window_line(inputs.meta)}\nproposed: {_changes_text(changes)}\n")
    print(whatif_text(document))
    print(
        f"\nwrote {args.out}/report.html and report.json; each replay's own report in "
        + " and ".join(f"{args.out}/{side}/" for side in SIDES)
    )
    return 0


def _envelope(kind: str, data: dict[str, Any]) -> str:
    """The live commands' ``--json`` envelope (``allot.render.live_format.envelope``)."""
    document = {"kind": kind, "at": time.time(), "data": data}
    return json.dumps(document, sort_keys=True, indent=2, allow_nan=False)


def _shares_text(shares: int | str | None) -> str:
    return "(none)" if shares is None else str(shares)


def _change_json(c: ShareChange) -> dict[str, Any]:
    return {"path": c.path, "old": c.old, "new": c.new}


def _changes_text(changes: Sequence[ShareChange]) -> str:
    if not changes:
        return "no change (the proposed tree is the current one)"
    return ", ".join(f"{c.path} {_shares_text(c.old)} -> {_shares_text(c.new)}" for c in changes)


# -- budgets history ---------------------------------------------------------------------------


def run_budget_history(args: argparse.Namespace) -> int:
    from allot.ops.log_reader import BUDGET_TREES  # noqa: PLC0415 - see _read

    trees: list[m.BudgetTreeSet] = []

    def take(record: msgspec.Struct) -> None:
        if isinstance(record, m.BudgetTreeSet):
            trees.append(record)

    failed = _read(args, take, streams=("USAGE",), subjects=BUDGET_TREES)
    if failed is not None:
        return failed
    history = budget_changes(trees)
    if args.json:
        data = {
            "changes": [
                {"at": h.at, "by": h.by, "changes": [_change_json(c) for c in h.changes]}
                for h in history
            ],
            "kept": USAGE_KEPT_PER_SUBJECT,
        }
        print(_envelope("BudgetHistory", data))
        return 0
    print("\n".join(history_lines(history)) if history else "no budget tree in the log")
    if len(history) >= USAGE_KEPT_PER_SUBJECT:
        print(f"(the log keeps the last {USAGE_KEPT_PER_SUBJECT:,} trees: older ones are gone)")
    return 0


def history_lines(history: Sequence[BudgetChange]) -> list[str]:
    """One line per tree: time, author, then what changed (the first: the whole tree)."""
    width = max((len(h.by) for h in history), default=0)
    lines = []
    for k, h in enumerate(history):
        if k == 0:
            what = "tree set: " + ", ".join(f"{c.path} {_shares_text(c.new)}" for c in h.changes)
        else:
            what = _changes_text(h.changes) if h.changes else "no change (the same tree again)"
        lines.append(f"{timestamp(h.at)}  {h.by:<{width}}  {what}")
    return lines
