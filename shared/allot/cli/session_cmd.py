"""``allot session start`` and ``allot session attach`` (issue 40): interactive sessions
whose state directory (``ALLOT_SESSION_DIR``) the agent saves after a preemption notice and
restores at the next placement. To the policy a session is an ordinary allocated,
resumable workload (kind ``session``): same 8-hour cap on protection, same fair share; a
requeued session keeps its id and original submit time."""

from __future__ import annotations

import argparse

from allot.cli import live_cmds as live
from allot.core.errors import ValidationError
from allot.proto import messages as m
from allot.render import live_format as fmt
from allot.sdk import Client

DEFAULT_MIN_RUNTIME = "8h"
START_OPTIONS = {**live.SUBMIT_OPTIONS, "command": "--command"}
"""Wire field -> ``session start``'s option (its program is ``--command``, not ``CMD``)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    session = subparsers.add_parser("session", help="interactive sessions that survive preemption")
    actions = session.add_subparsers(dest="action", metavar="ACTION", required=True)
    common = [live._common()]
    p = actions.add_parser(
        "start",
        parents=common,
        help="start a session; prints its id",
        description="An allocated workload of kind 'session': the agent saves its "
        "ALLOT_SESSION_DIR after a preemption notice and restores it at its next placement.",
    )
    p.add_argument("--alloc", required=True, help="allocation (budget leaf)")
    p.add_argument("--gpus", required=True)
    p.add_argument("--user", help=f"who starts it ({live.LOGIN_HELP})")
    p.add_argument(
        "--min-runtime",
        default=DEFAULT_MIN_RUNTIME,
        help="protected window (default %(default)s, the most there is)",
    )
    p.add_argument("--client-id", help="idempotency key (default: a fresh one)")
    p.add_argument(
        "--duration", help="fake agents only: how long to pretend to run, with its unit: 30m, 2h"
    )
    live.add_checkpoint_options(p)
    p.add_argument(
        "--command",
        # Not ``command``: that is the subcommand's name (``allot session``), which errors
        # and the client's connection name are printed with.
        dest="program",
        nargs=argparse.REMAINDER,
        default=[],
        help="the session's program and its arguments (the rest of the line)",
    )
    p.set_defaults(func=run_start, checkpoint_dir=None)

    p = actions.add_parser(
        "attach", parents=common, help="where a session runs now: host, attempt, state dir"
    )
    p.add_argument("workload", metavar="ID")
    p.add_argument("--alloc", help=live.SCOPE_HELP)
    p.set_defaults(func=run_attach)


def run_start(args: argparse.Namespace) -> int:
    gpus = live.parse_int_option("--gpus", args.gpus, 1, m.MAX_GPUS)
    min_runtime = live.parse_min_runtime(args.min_runtime)
    if min_runtime <= 0:
        raise ValidationError("--min-runtime", "a session is allocated work: give more than 0")
    duration = None if args.duration is None else live.parse_run_time("--duration", args.duration)
    if not args.program and duration is None:
        raise ValidationError(
            "--command", "give the session's program, or --duration for a fake run"
        )
    checkpoint = live.checkpoint_fields(args)
    user = live._sender(args, "--user", args.user)

    async def work(c: Client) -> int:
        try:
            reply = await c.start_session(
                client_id=args.client_id,
                user=user,
                allocation=args.alloc,
                gpus=gpus,
                min_runtime_s=min_runtime,
                command=args.program,
                duration_s=None if duration is None else float(duration),
                checkpoint_signal=checkpoint["checkpoint_signal"],  # type: ignore[arg-type]
                checkpoint_timeout_s=checkpoint["checkpoint_timeout_s"],  # type: ignore[arg-type]
            )
        except ValidationError as exc:
            raise live.renamed(exc, START_OPTIONS) from None
        text = reply.workload_id + (" (duplicate)" if reply.duplicate else "")
        return live._print_reply(args, reply, text)

    return live._run(args, work)


def attach_text(status: m.WorkloadStatus) -> str:
    """Where the session runs now (or why it does not), its attempt and its state."""
    hosts = ", ".join(hg.host for hg in status.assignment) or "-"
    lines = [
        ("session", status.workload_id),
        ("state", status.state),
        ("host", hosts if status.state in m.LIVE_STATES else "-"),
        ("attempt", str(status.attempt)),
        ("submitted", fmt.timestamp(status.submitted_at)),
        ("state dir", status.checkpoint_dir or "- (not started yet)"),
        *((f"preempted {c.attempt}", fmt.checkpoint_cell(c)) for c in status.checkpoints),
    ]
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k + ':':{width + 1}} {v}" for k, v in lines)


def run_attach(args: argparse.Namespace) -> int:
    scope = live.parse_scope(args.alloc)

    async def work(c: Client) -> int:
        try:
            status = await c.session(args.workload, scope=scope)
        except ValidationError as exc:
            raise live.renamed(exc, live.CANCEL_OPTIONS) from None
        live._require_known(status, args.workload, scope)
        return live._print_reply(args, status, attach_text(status))

    return live._run(args, work)
