"""``allot twin``: does the core, replayed on the live log, decide what the live leader did?

    allot twin (--since 1h | --from FILE) [--save FILE] [--tolerance-s 1] [--policy P]
               [--grace-s 300] [--unallocated-grace-s 30] [--unallocated-settle-s 60]
               [--short-lane HOSTS] [--json]

Reads the whole log once through NATS (``allot.ops.log_reader``, as ``allot export`` and
``allot whatif`` do; ``--nats-url`` and the stack discovery of the live commands), or a file
``--save`` wrote (talking to nothing), and replays every live cycle of the window through
the core's ``run_cycle`` (``allot.eventlog.twin``): the fraction of identical placements
(workload, hosts, GPUs), notices, and every difference by kind. The placement service's
knobs are not in the log: give the stack's (``allot up --grace-s ...``; ``allot demo`` runs
``--grace-s 3 --unallocated-grace-s 1 --unallocated-settle-s 1``). Notices with other
deadlines (kind ``notice-deadline``) say they differ.

Bad input is one line naming the option and the reason, exit status 2; a log that cannot be
read is one line, exit status 1; otherwise 0, whatever the figures.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from allot.bus.service_main import add_short_lane_argument, lane_hosts_of
from allot.cli.history_cmds import _envelope, _read, parse_since
from allot.cli.live_cmds import _common
from allot.core.errors import ValidationError
from allot.core.model import DEFAULT_UNALLOCATED_GRACE_S
from allot.core.policy import (
    DEFAULT_UNALLOCATED_SETTLE_S,
    POLICIES,
    Policy,
    check_unallocated_knobs,
    make_policy,
)
from allot.eventlog.record_file import decode_records, encode_records
from allot.eventlog.twin import DEFAULT_TOLERANCE_S, Parity, twin_parity
from allot.eventlog.twin_figures import figures
from allot.proto import subjects as s
from allot.render.live_format import timestamp

SHOWN_DIFFERENCES = 10
"""Cycles that differ listed in the text (``--json`` has all)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "twin",
        parents=[_common()],
        help="replay the live history's cycles through the core: the share of identical "
        "placements, and every difference by kind",
        description="Replay each live placement cycle of the window [now - SINCE, now] (or of "
        "a file --save wrote) through the core's run_cycle, on the state the log gives for "
        "the cycle's time, and compare its placements (workload, hosts, GPUs), notices and "
        "drains with the recorded ones.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--since", help="how far back: 90m, 12h, 7d, 1h30m")
    source.add_argument(
        "--from", dest="from_file", type=Path, help="a file allot twin --save wrote"
    )
    p.add_argument("--save", type=Path, help="also write the log read to this file (JSON lines)")
    p.add_argument(
        "--tolerance-s",
        type=float,
        default=DEFAULT_TOLERANCE_S,
        help="how long before a cycle a record may have been stored and still be in flight "
        "(default %(default)g s)",
    )
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default="fairshare",
        help="the placement service's --policy (default %(default)s)",
    )
    p.add_argument(
        "--grace-s",
        type=int,
        default=300,
        help="the stack's preemption grace (default %(default)s)",
    )
    p.add_argument(
        "--unallocated-grace-s",
        type=int,
        default=DEFAULT_UNALLOCATED_GRACE_S,
        help="the stack's grace of unallocated victims (default %(default)s)",
    )
    p.add_argument(
        "--unallocated-settle-s",
        type=float,
        default=DEFAULT_UNALLOCATED_SETTLE_S,
        help="the stack's settling time of freed GPUs (default %(default)g)",
    )
    add_short_lane_argument(
        p, "the placement service's short-lane hosts (comma-separated; default none)"
    )
    p.set_defaults(func=run)


def policy_of(args: argparse.Namespace) -> Policy:
    """The placement service's policy from the options, as it builds its own."""
    if args.grace_s < 0:
        raise ValidationError("--grace-s", f"must be >= 0 seconds, got {args.grace_s}")
    check_unallocated_knobs(
        "--unallocated-grace-s",
        args.unallocated_grace_s,
        "--unallocated-settle-s",
        args.unallocated_settle_s,
    )
    return make_policy(
        args.policy, args.grace_s, args.unallocated_grace_s, args.unallocated_settle_s
    )


def run(args: argparse.Namespace) -> int:
    policy = policy_of(args)
    policy.check_short_lane(lane_hosts_of(args), "--short-lane")
    if not 0 <= args.tolerance_s < math.inf:
        raise ValidationError("--tolerance-s", f"must be >= 0 seconds, got {args.tolerance_s:g}")
    if args.save is not None and args.from_file is not None:
        raise ValidationError("--save", "goes with --since (the log read), not with --from")
    if args.save is not None and not args.save.parent.is_dir():
        raise ValidationError("--save", f"{args.save.parent} is no folder")  # before reading
    since, until = -math.inf, math.inf
    if args.from_file is not None:
        records = _from_file(args.from_file)
    else:
        seconds = parse_since(args.since)  # before connecting
        until = time.time()
        since = until - seconds
        records = []
        failed = _read(
            args, records.append, subjects={"USAGE": (s.BUDGET_TREE, s.RANKING, s.ALL_IDLE)}
        )
        if failed is not None:
            return failed
        if args.save is not None:
            _save(args.save, records)
    parity = twin_parity(
        records,
        policy,
        since=since,
        until=until,
        tolerance_s=args.tolerance_s,
        short_lane=lane_hosts_of(args),
    )
    if args.json:
        print(_envelope("TwinParity", figures(parity)))
        return 0
    print("\n".join(parity_lines(parity)))
    if args.save is not None:
        print(f"wrote {args.save}; replay it with allot twin --from {args.save} and these knobs")
    return 0


def _from_file(path: Path) -> list[msgspec.Struct]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValidationError("--from", f"{path}: {exc.strerror or exc}") from None
    return decode_records(data, f"--from {path}")


def _save(path: Path, records: Sequence[msgspec.Struct]) -> None:
    try:
        path.write_bytes(encode_records(records))
    except OSError as exc:
        raise ValidationError("--save", f"{path}: {exc.strerror or exc}") from None


# -- text --------------------------------------------------------------------------------------


def parity_lines(parity: Parity) -> list[str]:
    """What ``allot twin`` prints: the window, the figures, the kinds, the first cycles
    that differ."""
    f = figures(parity)
    cycles = parity.cycles
    if not cycles:
        return [f"no placement decision in the window ({f['records']} records read)"]
    epochs = sorted({c.epoch for c in cycles})
    lines = [
        f"{len(cycles)} live cycles, {timestamp(cycles[0].at)} .. {timestamp(cycles[-1].at)}, "
        f"epoch{'s' if len(epochs) > 1 else ''} {', '.join(map(str, epochs))} "
        f"({f['records']} records read), replayed through run_cycle:",
        _figure_line("placements", f["placements"]),
        _figure_line("notices", f["notices"]),
        f"  timing tolerance: a record stored up to {parity.tolerance_s:g} s before a cycle, "
        "after its leader's previous decisions, may have been in flight"
        + (f" (largest lag used: {_ms(f['largest_lag_s'])})" if f["largest_lag_s"] else ""),
    ]
    if f["kinds"]:
        lines.append("by kind:")
        width = max(len(k) for k in f["kinds"])
        for kind, row in sorted(f["kinds"].items(), key=lambda kv: -kv[1]["cycles"]):
            lines.append(
                f"  {kind:<{width}}  {_count(row['cycles'], 'cycle')}, "
                f"{_count(row['placements'], 'placement')}: {row['meaning']}"
            )
    different = [d for d in f["differences"] if d["verdict"] == "different"]
    if different:
        lines.append("cycles that differ:")
        lines += [f"  {_difference_line(d)}" for d in different[:SHOWN_DIFFERENCES]]
        if len(different) > SHOWN_DIFFERENCES:
            lines.append(f"  ... {len(different) - SHOWN_DIFFERENCES} more (--json lists all)")
    return lines


def _figure_line(what: str, t: dict[str, Any]) -> str:
    line = (
        f"  {what} identical: {t['identical']} of {t['live'] + t['replay_only']} "
        f"({100 * t['fraction_identical']:.1f}%): {t['exact']} at the cycle's time, "
        f"{t['within_tolerance']} within the timing tolerance"
    )
    if t["different"] or t["replay_only"]:
        line += f"; {t['different']} differ, {t['replay_only']} made by the replay alone"
    return line


def _difference_line(d: dict[str, Any]) -> str:
    def side(decisions: dict[str, Any]) -> str:
        placed = [
            f"{p['workload']}@"
            + "+".join(f"{h}:{','.join(map(str, g))}" for h, g in p["hosts"].items())
            for p in decisions["placements"]
        ]
        noticed = [f"notice {n['workload']} ({n['reason']})" for n in decisions["notices"]]
        return ", ".join(placed + noticed) or "nothing"

    return (
        f"{timestamp(d['at'])} epoch {d['epoch']} {d['kind']}: live {side(d['live'])}; "
        f"replay {side(d['replay'])}"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.0f} ms"
