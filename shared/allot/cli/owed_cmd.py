"""``allot owed``: owed vs delivered GPU-hours per allocation, computed live from the log
exactly as the simulator's report computes them (``allot.sim.report``; the dashboard
service answers ``allot.v1.query.owed`` with ``allot.eventlog.owed_query``).

    allot owed [--window 1d|7d|...] [--bucket 1h] [--json] [--nats-url URL] [--timeout S]

Without ``--window`` it asks twice, for the last day and the last week, and prints one
table per window; ``--window`` asks once. Each table: ALLOCATION, BUDGET % (effective
share), OWED GPU-h, DELIVERED GPU-h (``allot.render.live_format.gpu_h_cell``: a small figure
keeps three significant digits), DELIVERED/OWED (a percentage, ``-`` when nothing was
owed), IDLE GPU-h (held by work flagged idle, ``allot idle``), then an ``overall`` row
(sums, and the report's overall ratio). A legend under the tables says what each figure
counts and as of when: the log up to the answer's ``at``, not the usage accounting has
charged (``allot accounting usage``).

``--json`` prints one envelope (``allot.render.live_format``: ``{"kind": "OwedSnapshot",
"at", "data"}``) per window, one per line (JSON Lines, as ``allot watch --json``), in the
order of the tables.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from allot.cli.durations import duration_label
from allot.cli.live_cmds import _common, _run, parse_duration_option, renamed
from allot.core.errors import ValidationError
from allot.proto import messages as m
from allot.render import live_format as fmt
from allot.sdk import Client

DEFAULT_WINDOWS = (86400, 7 * 86400)
"""The last day and the last week."""

MAX_WINDOW_S = 90 * 86400
"""``OwedQuery.window_s``'s ceiling."""

BUCKET_RANGE = (60, 86400)
"""``OwedQuery.bucket_s``'s range."""

OWED_OPTIONS = {"window_s": "--window", "bucket_s": "--bucket"}

OWED_COLUMNS = (
    fmt.Column("ALLOCATION"),
    fmt.Column("BUDGET %", ">"),
    fmt.Column("OWED GPU-h", ">"),
    fmt.Column("DELIVERED GPU-h", ">"),
    fmt.Column("DELIVERED/OWED", ">"),
    fmt.Column("IDLE GPU-h", ">"),
    fmt.Column("LOST GPU-h", ">"),
)

OVERALL = "overall"


# -- parsing and printing (pure; unit-tested) -------------------------------------------------


def parse_window(text: str) -> int:
    seconds = parse_duration_option("--window", text)
    if not 0 < seconds <= MAX_WINDOW_S:
        raise ValidationError("--window", f"{text!r} is outside (0, 90d]")
    return seconds


def parse_bucket(text: str) -> int:
    seconds = parse_duration_option("--bucket", text)
    low, high = BUCKET_RANGE
    if not low <= seconds <= high:
        raise ValidationError("--bucket", f"{text!r} is outside 1m..1d ({low}..{high} s)")
    return seconds


def ratio_cell(ratio: float | None) -> str:
    """Delivered / owed as a percentage (as the dashboard shows it); ``-``: nothing owed."""
    return fmt.NONE if ratio is None else f"{100.0 * ratio:.1f}%"


def owed_table(snapshot: m.OwedSnapshot) -> str:
    """One window: a heading, the table (allocations by name, then ``overall``)."""
    rows = [
        (
            r.allocation,
            f"{100.0 * r.effective_share:.1f}",
            fmt.gpu_h_cell(r.owed_gpu_h),
            fmt.gpu_h_cell(r.delivered_gpu_h),
            ratio_cell(r.ratio),
            fmt.gpu_h_cell(r.idle_gpu_h),
            fmt.gpu_h_cell(r.lost_gpu_h),
        )
        for r in snapshot.rows
    ]
    rows.append(
        (
            OVERALL,
            f"{100.0 * sum(r.effective_share for r in snapshot.rows):.1f}",
            fmt.gpu_h_cell(sum(r.owed_gpu_h for r in snapshot.rows)),
            fmt.gpu_h_cell(sum(r.delivered_gpu_h for r in snapshot.rows)),
            ratio_cell(snapshot.overall),
            fmt.gpu_h_cell(sum(r.idle_gpu_h for r in snapshot.rows)),
            fmt.gpu_h_cell(sum(r.lost_gpu_h for r in snapshot.rows)),
        )
    )
    heading = (
        f"last {duration_label(snapshot.window_s)}: {fmt.timestamp(snapshot.since)} .. "
        f"{fmt.timestamp(snapshot.at)}, {duration_label(snapshot.bucket_s)} buckets"
    )
    return f"{heading}\n{fmt.render_table(OWED_COLUMNS, rows)}"


def owed_legend(at: float) -> str:
    """What the figures count, and as of when."""
    return "\n".join(
        (
            f"GPU-hours from the log up to {fmt.timestamp(at)} (running work counted up to "
            "then), per bucket:",
            "  OWED      = min(budget x healthy GPU-h, GPU-h its allocated work ran or waited)",
            "  DELIVERED = allocated GPU-h it ran, from each placement, at most OWED",
            "  IDLE      = allocated GPU-h held while flagged idle, every GPU below the "
            "threshold (allot idle)",
            "  LOST      = allocated GPU-h lost to preemptions ended in the window: since each "
            "attempt's last confirmed checkpoint (docs/decisions/0053)",
            "Not the usage accounting has charged (allot accounting usage): that counts from "
            "each run's",
            "reported start in whole slots, running work a slot or so behind.",
        )
    )


def owed_text(snapshots: Sequence[m.OwedSnapshot]) -> str:
    """The tables of every window, a blank line between them, then the legend."""
    tables = "\n\n".join(owed_table(s) for s in snapshots)
    return f"{tables}\n\n{owed_legend(max(s.at for s in snapshots))}" if snapshots else tables


def owed_json_lines(snapshots: Sequence[m.OwedSnapshot]) -> str:
    return "\n".join(fmt.envelope_json(s, s.at, indent=None) for s in snapshots)


# -- registration and running -----------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "owed",
        parents=[_common()],
        help="owed vs delivered GPU-hours per allocation (last day and week)",
        description="Owed vs delivered GPU-hours per allocation, computed from the log as "
        "the simulator's report computes them. Without --window: the last day and the "
        "last week.",
    )
    p.add_argument("--window", help="one window instead of 1d and 7d: 12h, 1d, 7d (at most 90d)")
    p.add_argument("--bucket", default="1h", help="bucket width, 1m..1d (default %(default)s)")
    p.set_defaults(func=run_owed)


def run_owed(args: argparse.Namespace) -> int:
    windows = DEFAULT_WINDOWS if args.window is None else (parse_window(args.window),)
    bucket = parse_bucket(args.bucket)

    async def work(c: Client) -> int:
        snapshots: list[m.OwedSnapshot] = []
        for window in windows:
            try:
                snapshots.append(await c.owed(float(window), bucket))
            except ValidationError as exc:
                raise renamed(exc, OWED_OPTIONS) from None
        print(owed_json_lines(snapshots) if args.json else owed_text(snapshots))
        return 0

    return _run(args, work)
