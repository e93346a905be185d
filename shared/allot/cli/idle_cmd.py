"""``allot idle``: allocated work whose GPUs sit idle (squatting), as the health service
flags it (``allot.eventlog.idle_watch``; the policy ``allot.core.idle``).

    allot idle [--alloc A] [--follow] [--json] [--nats-url URL] [--timeout S]

Prints the runs flagged idle now (``IdleSnapshot``): WORKLOAD, ALLOCATION, USER, GPUS,
IDLE SINCE, FLAGGED, HIGHEST % (the highest utilization seen in the stretch), REASON, under
a line naming the policy. ``--alloc``: that allocation's only, on the per-allocation subject
a team user is granted (a team's login needs it). ``--follow`` (with ``--alloc``): then
every flag and clear of that allocation's work as it happens (``allot.v1.usage.idle.<a>.*``),
one line each (``--json``: one envelope a line), until Ctrl-C. A lost connection to NATS
is said on stderr and retried; once back, the flagged runs are printed again as they are
then (what came meanwhile was not heard). Idle GPU-hours per allocation: ``allot owed``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import msgspec

from allot.cli.live_cmds import _common, _run, parse_scope, tell_connection
from allot.core.duration_text import format_duration
from allot.core.errors import ValidationError
from allot.proto import messages as m
from allot.proto.subjects import UNALLOCATED
from allot.render import live_format as fmt
from allot.sdk import Client, NoResponderError, SdkError

RESYNC_TRIES = 10
RESYNC_PAUSE_S = 1.0
"""Once reconnected, ``--follow`` asks for the flagged runs up to this many times, this far
apart, while no health service answers (a stack restarted with its NATS)."""

IDLE_COLUMNS = (
    fmt.Column("WORKLOAD"),
    fmt.Column("ALLOCATION"),
    fmt.Column("USER"),
    fmt.Column("GPUS", ">"),
    fmt.Column("IDLE SINCE"),
    fmt.Column("FLAGGED"),
    fmt.Column("HIGHEST %", ">"),
    fmt.Column("REASON"),
)


def idle_text(snapshot: m.IdleSnapshot) -> str:
    """The policy line, then the table (or a line saying nothing is flagged)."""
    head = (
        f"flagged idle: every GPU below {snapshot.threshold_pct:g}% for "
        f"{format_duration(snapshot.window_s)} (as of {fmt.timestamp(snapshot.at)})"
    )
    if not snapshot.rows:
        return f"{head}\nno allocated work is idle"
    rows = [
        (
            r.workload_id,
            r.allocation,
            r.user or fmt.NONE,
            str(r.gpus),
            fmt.timestamp(r.idle_since),
            fmt.timestamp(r.flagged_at),
            f"{r.peak_pct:.1f}",
            r.reason,
        )
        for r in snapshot.rows
    ]
    table = fmt.render_table(IDLE_COLUMNS, rows)
    if snapshot.total > len(snapshot.rows):
        table += f"\n{snapshot.total} flagged idle (first {len(snapshot.rows)} shown)"
    return f"{head}\n{table}"


def idle_line(record: msgspec.Struct) -> str:
    """One flag or clear: ``<workload>  <time>  <type>  key=value ...``."""
    return f"{getattr(record, 'workload_id', '')}  {fmt.event_line(record)}"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "idle",
        parents=[_common()],
        help="allocated work whose GPUs sit idle (flagged by the health service)",
        description="Allocated work whose GPUs all stayed below the idle threshold long "
        "enough to be flagged (squatting). Flag only, unless the health service runs with "
        "--idle-preempt: then a flagged run is preempted (reason idle, not requeued) once "
        "its minimum runtime has passed.",
    )
    p.add_argument("--alloc", help="this allocation's work only (what a team may ask)")
    p.add_argument(
        "--follow",
        action="store_true",
        help="then print each flag and clear of --alloc's work as it comes, until Ctrl-C",
    )
    p.set_defaults(func=run_idle)


def run_idle(args: argparse.Namespace) -> int:
    scope = parse_scope(args.alloc)
    if scope == UNALLOCATED:
        raise ValidationError("--alloc", "unallocated work is never flagged idle (it is free)")
    if args.follow and scope is None:
        raise ValidationError("--follow", "needs --alloc (a team hears its own work only)")

    def print_snapshot(snapshot: m.IdleSnapshot) -> None:
        if args.json:
            print(fmt.envelope_json(snapshot, snapshot.at, indent=None), flush=True)
        else:
            print(idle_text(snapshot), flush=True)

    async def work(c: Client) -> int:
        print_snapshot(await c.idle(scope=scope))
        if not args.follow:
            return 0
        assert scope is not None
        back: asyncio.Queue[None] = asyncio.Queue()
        tell_connection(args, c, lambda: back.put_nowait(None))

        def show(record: msgspec.Struct) -> None:
            if args.json:
                print(fmt.envelope_json(record, time.time(), indent=None), flush=True)
            else:
                print(idle_line(record), flush=True)

        await c.on_idle(show, allocation=scope)
        while True:  # until Ctrl-C
            await back.get()
            # What was flagged or cleared while the connection was lost was not heard: the
            # flagged runs as they are now, as at the start.
            await resync(c)

    async def resync(c: Client) -> None:
        for attempt in range(1, RESYNC_TRIES + 1):
            try:
                print_snapshot(await c.idle(scope=scope))
                return
            except NoResponderError as exc:  # health not back yet (a restarted stack)
                if attempt == RESYNC_TRIES:
                    print(f"allot {args.command}: {exc}", file=sys.stderr)
                    return
                await asyncio.sleep(RESYNC_PAUSE_S)
            except SdkError as exc:
                print(f"allot {args.command}: {exc}", file=sys.stderr)
                return

    return _run(args, work)


__all__ = ["idle_line", "idle_text", "register", "run_idle"]
