"""The live ``allot`` commands, talking to a running stack through ``allot.sdk.Client``:

    allot submit --alloc A [--user U] --gpus N --min-runtime 2h [--kind K] [--priority P]
                 [--not-resumable] [--client-id ID] [--env NAME=VALUE] [--duration 90s] [--array N]
                 -- CMD ARGS...
    allot cancel WORKLOAD [--alloc A] [--user U | --operator [NAME] | --manager [NAME]]
                 [--reason R]
    allot status WORKLOAD
    allot watch WORKLOAD [--alloc A]           (its events, notices and idle flags)
    allot queue [-l] | allot prio | allot share [-l] | allot hosts
    allot drain HOST [--operator NAME] [--reason R] | allot undrain HOST [--operator NAME]
    allot budgets set PATH SHARES [--by NAME]    (PATH root/nlp/pretrain, SHARES N|parent)
    allot budgets history                        (allot.cli.history_cmds)

Each takes ``--nats-url`` (env ``ALLOT_NATS_URL``; without either, the stack started from
this folder: ``allot.cli.stack_url``), ``--timeout`` and ``--json`` (the envelope of
``allot.render.live_format``). ``--alloc`` omitted means unallocated work.

``--user``, ``--operator``, ``--manager`` and ``--by`` name who sends the command and
default to the NATS login (the URL's user, or ``ALLOT_NATS_USER``); with a login, any other
name is refused (the services would refuse it: names come from logins). Without a login
(no auth) they must be given.

Bad input (here or refused by a service) raises ``ValidationError`` naming the option,
which ``allot.cli.main`` prints as one line with exit status 2; an unreachable stack prints
one line and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import msgspec

from allot.auth.client import login_for, masked_url
from allot.cli.command_line import parse_command_line
from allot.cli.durations import parse_duration
from allot.cli.stack_url import add_nats_url_option, nats_url
from allot.core.errors import ValidationError
from allot.ops.run_dir import NoStackError
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.proto.checkpoint_rules import SIGNALS, check_checkpoint, parse_signal
from allot.proto.env_vars import MAX_ENV_BYTES, MAX_VALUE_CHARS, check_env
from allot.proto.subjects import BUDGET_ROOT
from allot.render import live_format as fmt
from allot.sdk import (
    Client,
    LoginRefusedError,
    NoResponderError,
    PermissionDeniedError,
    RequestTimeoutError,
    SdkError,
    new_client_id,
)
from allot.sdk.client import sender

EXIT_UNAVAILABLE = 1
EXIT_REFUSED = 2

MAX_ARRAY = 10_000
"""Most workloads one ``allot submit --array`` sends."""

SUBMIT_OPTIONS = {
    "client_id": "--client-id",
    "user": "--user",
    "gpus": "--gpus",
    "allocation": "--alloc",
    "min_runtime_s": "--min-runtime",
    "kind": "--kind",
    "priority": "--priority",
    "duration_s": "--duration",
    "command": "CMD",
    "env": "--env",
    "checkpoint_signal": "--checkpoint-signal",
    "checkpoint_timeout_s": "--checkpoint-timeout",
    "checkpoint_dir": "--checkpoint-dir",
}
"""Wire field -> the option that set it, so an error names what the user typed."""

CANCEL_OPTIONS = {
    "workload_id": "WORKLOAD",
    "workload": "WORKLOAD",
    "allocation": "--alloc",
    "user": "--user",
    "reason": "--reason",
}
OPERATOR_CANCEL_OPTIONS = {**CANCEL_OPTIONS, "user": "--operator"}
MANAGER_CANCEL_OPTIONS = {**CANCEL_OPTIONS, "user": "--manager"}
SCOPE_OPTIONS = {"allocation": "--alloc"}
HOST_OPTIONS = {"host": "HOST", "operator": "--operator", "reason": "--reason"}
BUDGET_OPTIONS = {"path": "PATH", "shares": "SHARES", "set_by": "--by"}

_NAME = re.compile(m.NAME_PATTERN)

LOGIN_HELP = (
    "default: the NATS login (the URL's user or ALLOT_NATS_USER), the only name accepted "
    "under allot auth gen's credentials; required without a login"
)
_LOGIN = "\0login"
"""``--operator`` or ``--manager`` given without a NAME: the login's."""


# -- argument parsing (pure; unit-tested) ------------------------------------------------------


def parse_duration_option(option: str, text: str) -> int:
    """Seconds in ``30s``, ``15m``, ``2h`` or plain seconds; ``ValidationError(option)``."""
    try:
        return parse_duration(text)
    except argparse.ArgumentTypeError as exc:
        raise ValidationError(option, str(exc)) from None


def parse_run_time(option: str, text: str) -> int:
    """``parse_duration_option`` for a workload's times, where a bare number other than 0
    is refused: ``1`` would be one second here and one minute to a Slurm user
    (``--time=1``); the unit says which."""
    bare = text.strip()
    if re.fullmatch(r"\d+(\.0*)?", bare) and float(bare) != 0:  # 1.5 is refused as such
        raise ValidationError(option, f"{text!r} has no unit: write {bare}s, {bare}m or {bare}h")
    return parse_duration_option(option, text)


def parse_min_runtime(text: str) -> int:
    seconds = parse_run_time("--min-runtime", text)
    if seconds > m.MAX_MIN_RUNTIME_S:
        raise ValidationError(
            "--min-runtime", f"{text!r} is over the 8 h ceiling ({m.MAX_MIN_RUNTIME_S} s)"
        )
    return seconds


def check_command_after_dashes(args: argparse.Namespace) -> None:
    """The command must follow ``--``: a word that came without it is most likely part of
    an option's value (``--duration 10 minutes`` made ``minutes`` the command)."""
    argv = getattr(args, "argv", None)
    after = argv[argv.index("--") + 1 :] if argv is not None and "--" in argv else None
    if args.cmd and argv is not None and after != list(args.cmd):
        raise ValidationError(
            "CMD",
            f"put the command after --, as in `allot submit ... -- python train.py` "
            f"({' '.join(args.cmd)!r} came without it: is it part of an option's value?)",
        )


def parse_int_option(option: str, text: str, low: int, high: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValidationError(option, f"{text!r} is not an integer") from None
    if not low <= value <= high:
        raise ValidationError(option, f"{value} is outside {low}..{high}")
    return value


def parse_budget_path(text: str) -> tuple[str, ...]:
    """``root/nlp/pretrain`` -> ``("root", "nlp", "pretrain")``; the leading ``root/`` may
    be left out (``nlp/pretrain``)."""
    parts = tuple(text.strip().split("/"))
    if parts and parts[0] != BUDGET_ROOT:
        parts = (BUDGET_ROOT, *parts)
    if len(parts) < 2:
        raise ValidationError("PATH", f"{text!r} names the root, which has no shares")
    for part in parts:
        if not part:
            raise ValidationError("PATH", f"{text!r} has an empty level (a doubled or end '/')")
        if len(part) > m.MAX_NAME_LEN or _NAME.match(part) is None:
            raise ValidationError(
                "PATH",
                f"{part!r} is not a budget node name (letters, digits, '_' and '-', "
                f"1..{m.MAX_NAME_LEN} characters)",
            )
    if len(parts) > m.MAX_BUDGET_DEPTH + 1:
        raise ValidationError("PATH", f"is deeper than {m.MAX_BUDGET_DEPTH} levels")
    return parts


def parse_shares(text: str) -> int | None:
    """An integer 0..MAX_SHARES, or ``parent`` (None on the wire)."""
    if text.strip().lower() == "parent":
        return None
    try:
        return parse_int_option("SHARES", text, 0, m.MAX_SHARES)
    except ValidationError:
        raise ValidationError(
            "SHARES", f"{text!r} is not an integer 0..{m.MAX_SHARES} or 'parent'"
        ) from None


def parse_scope(text: str | None) -> str | None:
    """``--alloc`` of the queries: an allocation name, ``~``, or None (whole cluster)."""
    if text is None or text == s.UNALLOCATED:
        return text
    try:
        return s.validate_token(text, "--alloc")
    except ValidationError as exc:
        raise ValidationError("--alloc", exc.reason) from None


def _allocation(text: str | None) -> str | None:
    """``--alloc`` of submit and cancel: ``~`` names unallocated work, as the listings
    print it and take it, and as omitting the option does. A budget path (as `allot budgets
    set` takes) is refused naming the allocation's own name."""
    if text is not None and "/" in text:
        raise ValidationError(
            "--alloc",
            f"{text!r} is a path of the budget tree: give the allocation's own name "
            f"({text.rstrip('/').rsplit('/', 1)[-1]!r})",
        )
    return None if text == s.UNALLOCATED else text


def parse_timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValidationError("--timeout", f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 3600:
        raise ValidationError("--timeout", f"{value:g} is outside (0, 3600] seconds")
    return value


PLAIN_REASONS = {
    "Expected `str` of length >= 1": "must not be empty (a name of letters, digits, '_' and '-')",
}
"""msgspec's wording of a wire constraint -> what a user reads instead. The SDK checks a
message as intake will (``allot.proto.codec``), so an empty ``--user``, ``--kind``,
``--operator`` or ``--by`` comes back in msgspec's words; every wire name is ``m.Name``."""


def renamed(exc: ValidationError, options: dict[str, str]) -> ValidationError:
    """``exc`` with its wire field replaced by the option that carries it, when known, and
    msgspec's wording replaced by ``PLAIN_REASONS``."""
    head = exc.field.split(".")[0].split("[")[0]
    option = options.get(head)
    reason = PLAIN_REASONS.get(exc.reason, exc.reason)
    if option is None and reason == exc.reason:
        return exc
    return ValidationError(option or exc.field, reason)


# -- registration ------------------------------------------------------------------------------


CHECKPOINT_DIR_HELP = (
    "checkpoint protocol: where checkpoints go, an absolute path on shared storage inside "
    "the roots the agents allow (default: a directory the agents manage); given to the "
    "workload as ALLOT_CHECKPOINT_DIR"
)


def add_checkpoint_options(p: argparse.ArgumentParser) -> None:
    """``--checkpoint-signal`` and ``--checkpoint-timeout`` (issue 40; ``allot submit``
    and ``allot session start``)."""
    p.add_argument(
        "--checkpoint-signal",
        help=f"checkpoint protocol: signal sent at a preemption notice, before SIGTERM "
        f"({', '.join(SIGNALS)}; USR1 or SIGUSR1)",
    )
    p.add_argument(
        "--checkpoint-timeout",
        help="checkpoint protocol: how long the checkpoint may take after the notice (60s, "
        "2m), at most the grace period; SIGTERM follows the confirmation or this",
    )


def checkpoint_fields(args: argparse.Namespace) -> dict[str, object]:
    """The checkpoint options as wire fields, checked (``ValidationError`` naming the
    option)."""
    signal = None if args.checkpoint_signal is None else parse_signal(args.checkpoint_signal)
    timeout = None
    if args.checkpoint_timeout is not None:
        timeout = float(parse_duration_option("--checkpoint-timeout", args.checkpoint_timeout))
    directory = getattr(args, "checkpoint_dir", None)
    try:
        check_checkpoint(signal=signal, timeout_s=timeout, directory=directory, grace_s=None)
    except ValidationError as exc:
        raise renamed(exc, SUBMIT_OPTIONS) from None
    return {
        "checkpoint_signal": signal,
        "checkpoint_timeout_s": timeout,
        "checkpoint_dir": directory,
    }


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # No default server: the stack started from this folder, or an error saying what to
    # export (allot.cli.stack_url), never whatever answers on :4222.
    add_nats_url_option(common)
    common.add_argument(
        "--timeout", default="5", help="seconds to wait for each answer (default %(default)s)"
    )
    common.add_argument(
        "--json",
        action="store_true",
        help='print {"kind", "at", "data"} JSON instead of text',
    )
    return common


SCOPE_HELP = (
    "only this allocation's work (~: unallocated), through the per-allocation subject a "
    "team user is granted; omitted: the whole cluster (operators, managers)"
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the live commands; ``args.func(args)`` then runs one."""
    common = [_common()]

    p = subparsers.add_parser(
        "submit",
        parents=common,
        help="submit a workload",
        description="Submit a workload; prints its id. Retrying with the same --client-id "
        "never queues a second one.",
    )
    p.add_argument("--alloc", help="allocation (budget leaf); omitted = unallocated")
    p.add_argument("--user", help=f"who submits ({LOGIN_HELP})")
    p.add_argument(
        "--gpus", required=True, help="GPUs, on one host or, above a host's size, a gang"
    )
    p.add_argument(
        "--min-runtime",
        default="0",
        help="protected window, with its unit: 30s, 15m, 2h (at most 8h); it protects only "
        "work with --alloc, and the default 0 makes the work unallocated even with --alloc "
        "(free, never charged, preemptible at any moment)",
    )
    p.add_argument(
        "--kind",
        default="training",
        help="a label of yours (default training; e.g. debug, eval): the dashboard, allot "
        "whatif and the simulator count waits by it; scheduling does not read it "
        "(`session` is allot session's own)",
    )
    p.add_argument("--priority", default="0", help="user priority inside the allocation")
    p.add_argument("--not-resumable", action="store_true", help="do not requeue if preempted")
    p.add_argument("--client-id", help="idempotency key (default: a fresh one)")
    p.add_argument(
        "--duration", help="fake agents only: how long to pretend to run, with its unit: 30m, 2h"
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the workload's processes, as sbatch's --export "
        f"(repeat it for more: at most {m.MAX_ENV}, values of at most {MAX_VALUE_CHARS} "
        f"characters, {MAX_ENV_BYTES // 1024} KiB in all; the names the agent sets, such as "
        "CUDA_VISIBLE_DEVICES and ALLOT_WORKLOAD_ID, are refused; values are kept in the "
        "log: no secrets)",
    )
    p.add_argument(
        "--array",
        help="N tasks in one request, like Slurm's --array (client ids ID-0 .. ID-(N-1); "
        f"at most {MAX_ARRAY}); each task gets {ARRAY_TASK_ID} (0 .. N-1) and "
        f"{ARRAY_TASK_COUNT} (N) in its environment, as Slurm's SLURM_ARRAY_TASK_ID and "
        "_COUNT, and %%a in the command becomes its index, as Slurm's %%a; prints one line "
        "per task, labelled with its client id: 'ID-i: WORKLOAD', 'ID-i: WORKLOAD "
        "(duplicate)' (sent before with the same values: nothing queued again) or 'ID-i: "
        "refused: OPTION: REASON'; exit status 0 when every task is accepted or a "
        "duplicate, 2 when any is refused (the others stay queued)",
    )
    add_checkpoint_options(p)
    p.add_argument("--checkpoint-dir", help=CHECKPOINT_DIR_HELP)
    p.add_argument("cmd", nargs="*", metavar="CMD", help="the command to run (after --)")
    p.set_defaults(func=run_submit)

    p = subparsers.add_parser(
        "cancel",
        parents=common,
        help="cancel a workload",
        description="Cancel a pending or running workload: its owner (--user), an "
        "operator (--operator) cancelling anyone's, as scancel run by root, or a budget "
        "manager (--manager) cancelling its subtree's, as a Slurm account coordinator. The "
        "name defaults to the NATS login (the URL's user or ALLOT_NATS_USER), the only name "
        "accepted under allot auth gen's credentials.",
    )
    p.add_argument("workload", metavar="WORKLOAD")
    p.add_argument(
        "--alloc",
        help="its allocation (~: unallocated); omitted: where the placement leader says it is "
        "(unallocated when it cannot be asked)",
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument(
        "--user", help=f"the owner, the submission's --user (the default form; {LOGIN_HELP})"
    )
    who.add_argument(
        "--operator",
        metavar="NAME",
        nargs="?",
        const=_LOGIN,
        help="cancel as this operator, whoever owns it (a subject only operators are "
        f"granted under allot auth gen); logged as cancelled by NAME ({LOGIN_HELP})",
    )
    who.add_argument(
        "--manager",
        metavar="NAME",
        nargs="?",
        const=_LOGIN,
        help="cancel as this budget manager, whoever owns it (a subject allot auth gen "
        "grants a manager for the allocations of its subtree only); logged as cancelled by "
        f"NAME ({LOGIN_HELP})",
    )
    p.add_argument("--reason", default="")
    p.set_defaults(func=run_cancel)

    p = subparsers.add_parser("status", parents=common, help="one workload's state")
    p.add_argument("workload", metavar="WORKLOAD")
    p.add_argument("--alloc", dest="scope", help=SCOPE_HELP)
    p.set_defaults(func=run_status)

    p = subparsers.add_parser(
        "watch",
        parents=common,
        help="follow one workload's events, notices and idle flags until it ends",
        description="Follow one workload: its events and preemption notices from the log "
        "(replayed, then live), and, for an allocation's workload, each idle flag and clear "
        "from now on (allot idle lists the runs flagged before), until it ends.",
    )
    p.add_argument("workload", metavar="WORKLOAD")
    p.add_argument("--alloc", help="its allocation; omitted = unallocated")
    p.set_defaults(func=run_watch)

    p = subparsers.add_parser(
        "queue",
        parents=common,
        help="pending work in service order, why each waits, an estimated start",
    )
    p.add_argument(
        "-l", "--long", action="store_true", help="also the user priority and age columns"
    )
    p.add_argument("--alloc", dest="scope", help=SCOPE_HELP)
    p.set_defaults(func=run_queue)
    p = subparsers.add_parser(
        "prio", parents=common, help="each pending position broken into its inputs (sprio -l)"
    )
    p.add_argument("--alloc", dest="scope", help=SCOPE_HELP)
    p.set_defaults(func=run_prio)
    p = subparsers.add_parser("share", parents=common, help="Fair Tree fairshare factors (sshare)")
    p.add_argument(
        "-l",
        "--long",
        action="store_true",
        help="sshare -l columns (with Slurm's Rank) plus budget, entitlement, held GPUs",
    )
    p.set_defaults(func=run_share)
    p = subparsers.add_parser("hosts", parents=common, help="hosts, their state and work")
    p.set_defaults(func=run_hosts)

    p = subparsers.add_parser("drain", parents=common, help="drain a host")
    p.add_argument("host", metavar="HOST")
    p.add_argument("--operator", help=f"who drains it ({LOGIN_HELP})")
    p.add_argument("--reason", default="")
    p.set_defaults(func=run_drain)

    p = subparsers.add_parser("undrain", parents=common, help="return a drained host")
    p.add_argument("host", metavar="HOST")
    p.add_argument("--operator", help=f"who returns it ({LOGIN_HELP})")
    p.set_defaults(func=run_undrain)

    budgets = subparsers.add_parser("budgets", help="change the budget tree, or list its changes")
    actions = budgets.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser(
        "set",
        parents=common,
        help="set one node's shares",
        description="Set the shares "
        "of the budget node at PATH (root/nlp/pretrain) to SHARES (an integer or 'parent').",
    )
    p.add_argument("path", metavar="PATH")
    p.add_argument("shares", metavar="SHARES")
    p.add_argument("--by", help=f"who sets it ({LOGIN_HELP})")
    p.set_defaults(func=run_budget_set)
    # Imported here: history_cmds imports this module's parsing helpers.
    from allot.cli.history_cmds import register_budget_history  # noqa: PLC0415

    register_budget_history(actions, common)


# -- running -----------------------------------------------------------------------------------


def _sender(args: argparse.Namespace, option: str, given: str | None) -> str:
    """Who sends the command (``given``, or the NATS login), checked before connecting: a
    name that is not the login's is refused naming ``option``."""
    try:
        url = _nats_url(args)
    except NoStackError:
        url = ""  # said by _run, once every option has been checked
    return sender(login_for(url, os.environ), option, given)


def _nats_url(args: argparse.Namespace) -> str:
    """``--nats-url``, else the server ``allot.cli.stack_url`` finds (kept in ``args``);
    ``NoStackError`` (exit 1 in ``allot.cli.main``) when there is none."""
    if not getattr(args, "nats_url_found", False):
        args.nats_url = nats_url(args.nats_url, os.environ, Path.cwd())
        args.nats_url_found = True
    url: str = args.nats_url
    return url


def _run(args: argparse.Namespace, work: Callable[[Client], Awaitable[int]]) -> int:
    """Connect, run ``work``, close; an unreachable stack is one line and exit 1."""
    timeout = parse_timeout(args.timeout)
    url = _nats_url(args)

    async def main() -> int:
        async with Client(url, name=f"allot-cli-{args.command}", timeout=timeout) as c:
            return await work(c)

    try:
        return asyncio.run(main())
    except SdkError as exc:
        text = str(exc)
        if isinstance(exc, NoResponderError):
            # Name the server asked: the usual slip is a shell without allot up's export,
            # asking the default 127.0.0.1:4222 while the stack runs elsewhere.
            text += f" [asked {masked_url(url)}; allot up prints the URL to export]"
        print(f"allot {args.command}: {text}", file=sys.stderr)
        # A refusal by NATS is an answer (exit 2, as a service's refusal), not an outage.
        refused = isinstance(exc, (PermissionDeniedError, LoginRefusedError))
        return EXIT_REFUSED if refused else EXIT_UNAVAILABLE


def tell_connection(
    args: argparse.Namespace, c: Client, on_back: Callable[[], None] | None = None
) -> None:
    """A following command says on stderr when its connection to NATS is lost (it keeps
    trying, until Ctrl-C) and when it is back; ``on_back`` then runs too."""
    where = masked_url(c.nats_url)

    def changed(up: bool) -> None:
        if up:
            print(f"allot {args.command}: reconnected to NATS at {where}", file=sys.stderr)
            if on_back is not None:
                on_back()
        else:
            print(
                f"allot {args.command}: lost NATS at {where}; reconnecting (Ctrl-C to stop)",
                file=sys.stderr,
                flush=True,
            )

    c.on_connection(changed)


def _too_many_gpus(args: argparse.Namespace, gpus: int) -> str | None:
    """Why the stack would refuse ``gpus`` (more than its registered hosts hold), asked
    quietly: None when it would not, or when no stack answers within a second."""

    async def ask() -> int:
        async with Client(_nats_url(args), timeout=1.0, retries=0, connect_timeout=1) as c:
            return sum(h.gpus for h in (await c.hosts()).hosts)

    try:
        total = asyncio.run(ask())
    except (SdkError, NoStackError, ValidationError, OSError):
        return None
    if total and gpus > total:
        return f"asks for {gpus} GPUs; the cluster has {total} registered"
    return None


def _print_reply(args: argparse.Namespace, msg: msgspec.Struct, text: str) -> int:
    print(fmt.envelope_json(msg, time.time()) if args.json else text)
    return 0


def run_submit(args: argparse.Namespace) -> int:
    gpus = parse_int_option("--gpus", args.gpus, 1, m.MAX_GPUS)
    min_runtime = parse_min_runtime(args.min_runtime)
    priority = parse_int_option("--priority", args.priority, -1000, 1000)
    duration = None if args.duration is None else parse_run_time("--duration", args.duration)
    if duration is not None and duration <= 0:
        raise ValidationError("--duration", "must be more than 0 seconds")
    check_command_after_dashes(args)
    if not args.cmd and duration is None:
        # A real agent fails such work at once, after it may have preempted others; only
        # fake agents run without a command (for --duration). What the stack would also
        # refuse is said in the same line, so one fix is not followed by another error.
        also = _too_many_gpus(args, gpus)
        raise ValidationError(
            "CMD",
            "give the command to run after --, or --duration for a fake run"
            + (f"; also --gpus: {also}" if also else ""),
        )

    fields = {
        "user": _sender(args, "--user", args.user),
        "gpus": gpus,
        "allocation": _allocation(args.alloc),
        "min_runtime_s": min_runtime,
        "resumable": not args.not_resumable,
        "kind": args.kind,
        "priority": priority,
        "command": tuple(args.cmd),
        "env": parse_env_options(args.env, array=args.array is not None),
        "duration_s": None if duration is None else float(duration),
        **checkpoint_fields(args),
    }
    if args.array is not None:
        return _submit_array(args, parse_int_option("--array", args.array, 1, MAX_ARRAY), fields)

    async def work(c: Client) -> int:
        try:
            reply = await c.submit(client_id=args.client_id, **fields)
        except ValidationError as exc:
            raise renamed(exc, SUBMIT_OPTIONS) from None
        text = reply.workload_id + (" (duplicate)" if reply.duplicate else "")
        _print_note(unallocated_note(args.alloc, min_runtime, args.min_runtime))
        return _print_reply(args, reply, text)

    return _run(args, work)


def parse_env_options(values: Sequence[str], *, array: bool = False) -> dict[str, str]:
    """``--env NAME=VALUE`` options as a dict (the value may hold ``=``; the last of a name
    wins, as in a shell), checked here as intake will (``env_vars.check_env``), so bad input
    is refused before connecting. ``array``: two of the 64 variables are ``--array``'s."""
    env: dict[str, str] = {}
    for value in values:
        name, eq, rest = value.partition("=")
        if not eq or not name:
            raise ValidationError("--env", f"{value!r} is not NAME=VALUE")
        if name in (ARRAY_TASK_ID, ARRAY_TASK_COUNT):
            raise ValidationError("--env", f"{name} is set by --array, for each task")
        env[name] = rest
    return check_env(env, max_vars=m.MAX_ENV - 2 * array, field="--env")


ARRAY_TASK_ID = "ALLOT_ARRAY_TASK_ID"
ARRAY_TASK_COUNT = "ALLOT_ARRAY_TASK_COUNT"


def array_command(command: Sequence[str], index: int) -> tuple[str, ...]:
    """Task ``index``'s command: each ``%a`` replaced by the index (Slurm's filename
    pattern for the array index; the task also finds it in ``ARRAY_TASK_ID``)."""
    return tuple(arg.replace(ARRAY_INDEX, str(index)) for arg in command)


ARRAY_INDEX = "%a"


def unallocated_note(alloc: str | None, min_runtime_s: int, typed: str) -> str | None:
    """The contract's rule, easy to miss: work is allocated (protected, charged) only with
    an allocation AND a minimum runtime; one without the other runs unallocated. Intake
    accepts either half alone (the SDK's default min_runtime_s is 0, and a minimum runtime
    without an allocation is simply unused), so this is a note, not a refusal. ``typed``:
    ``--min-runtime`` as the user wrote it."""
    allocation = _allocation(alloc)
    if min_runtime_s == 0 and allocation is not None:
        return (
            f"allot submit: note: --min-runtime 0: this work runs unallocated (free, "
            f"preemptible at any moment, not charged to {alloc}); give --min-runtime "
            "to have it protected and charged"
        )
    if min_runtime_s > 0 and allocation is None:
        return (
            f"allot submit: note: --min-runtime {typed} protects nothing without an "
            "allocation (--alloc): this work runs unallocated (free, preemptible at any "
            "moment, charged to no one); give --alloc to have it protected and charged"
        )
    return None


def _print_note(note: str | None) -> None:
    """On stderr once the work is accepted: stdout keeps the ids scripts read."""
    if note is not None:
        print(note, file=sys.stderr)


def _submit_array(args: argparse.Namespace, n: int, fields: dict[str, object]) -> int:
    """``--array N``: N workloads sent as batches; ``array_lines`` print the answers; exit
    status 2 if any was refused, as one submission refused, else 0 (a duplicate is the
    first answer again, as for one submission)."""
    base = args.client_id or new_client_id()
    task = m.SubmitWorkload(client_id=base, **fields)  # type: ignore[arg-type]
    items = [
        msgspec.structs.replace(
            task,
            client_id=f"{base}-{i}",
            command=array_command(task.command, i),
            env={**task.env, ARRAY_TASK_ID: str(i), ARRAY_TASK_COUNT: str(n)},
        )
        for i in range(n)
    ]

    async def work(c: Client) -> int:
        try:
            results = await c.submit_batch(items)
        except ValidationError as exc:  # the same options in every item: name the option
            raise renamed(
                ValidationError(codec.item_field(exc.field), exc.reason), SUBMIT_OPTIONS
            ) from None
        if any(isinstance(r, m.WorkloadAccepted) for r in results):
            _print_note(unallocated_note(args.alloc, task.min_runtime_s, args.min_runtime))
        lines = array_lines([item.client_id for item in items], results)
        _print_reply(
            args, m.SubmitBatchAnswered(at=time.time(), results=tuple(results)), "\n".join(lines)
        )
        return EXIT_REFUSED if any(isinstance(r, m.WorkloadRejected) for r in results) else 0

    return _run(args, work)


def array_lines(
    client_ids: Sequence[str], results: Sequence[m.WorkloadAccepted | m.WorkloadRejected]
) -> list[str]:
    """One line per task, each labelled with the task's client id (``results`` in the order
    of ``client_ids``): a re-submission mixing duplicates, refusals and new tasks must say
    which line is which task. A refusal names the option, as one submission's does."""
    lines = []
    for client_id, r in zip(client_ids, results, strict=True):
        if isinstance(r, m.WorkloadAccepted):
            lines.append(f"{client_id}: {r.workload_id}" + (" (duplicate)" if r.duplicate else ""))
        else:
            exc = renamed(ValidationError(codec.item_field(r.field), r.reason), SUBMIT_OPTIONS)
            lines.append(f"{client_id}: refused: {exc}")
    return lines


def run_cancel(args: argparse.Namespace) -> int:
    if args.operator == "":
        raise ValidationError("--operator", "must not be empty: the operator's name")
    if args.manager == "":
        raise ValidationError("--manager", "must not be empty: the manager's name")
    options = CANCEL_OPTIONS
    if args.operator is not None:
        options = OPERATOR_CANCEL_OPTIONS
    elif args.manager is not None:
        options = MANAGER_CANCEL_OPTIONS

    option, given = "--user", args.user
    if args.operator is not None:
        option, given = "--operator", args.operator
    elif args.manager is not None:
        option, given = "--manager", args.manager
    name = _sender(args, option, None if given == _LOGIN else given)

    async def work(c: Client) -> int:
        try:
            alloc = args.alloc
            if alloc is None:  # ids are unique: the leader says where it is
                alloc = await _allocation_of(c, args.workload)
            reply = await c.cancel(
                args.workload,
                allocation=_allocation(alloc),
                user=name,
                reason=args.reason,
                as_operator=args.operator is not None,
                as_manager=args.manager is not None,
            )
        except ValidationError as exc:
            raise renamed(exc, options) from None
        return _print_reply(args, reply, _accepted_text(f"cancel {args.workload}", reply))

    return _run(args, work)


async def _allocation_of(c: Client, workload: str) -> str | None:
    """Where ``workload`` is, as the placement leader says (its allocation's token, ``~``
    for unallocated work), for commands given no ``--alloc``: ids are unique, so a user
    need not repeat it. None when the leader does not know it or cannot be asked (no
    leader; a team under --secure may not ask cluster-wide)."""
    with contextlib.suppress(NoResponderError, RequestTimeoutError, PermissionDeniedError):
        found = await c.status(workload)
        if found.state != "unknown":
            return found.allocation or s.UNALLOCATED
    return None


def _require_known(status: m.WorkloadStatus, workload: str, scope: str | None) -> None:
    """``status`` and ``watch`` of a workload the placement leader does not know: one line
    naming WORKLOAD (worded as intake words a cancel of one), exit status 2."""
    if status.state == "unknown":
        where = "" if scope is None else f" in allocation {scope!r}"
        raise ValidationError("WORKLOAD", f"no workload {workload!r}{where}")


def run_status(args: argparse.Namespace) -> int:
    """A workload the leader does not know (never submitted, or another allocation's under
    ``--alloc``) is an error, as ``scontrol show job`` says of an invalid job id."""
    scope = parse_scope(args.scope)

    async def work(c: Client) -> int:
        try:
            status = await c.status(args.workload, scope=scope)
        except ValidationError as exc:
            raise renamed(exc, CANCEL_OPTIONS) from None
        _require_known(status, args.workload, scope)
        waiting, at = None, None
        if status.state == "pending" and not args.json:
            # why it waits: its row of the leader's queue (as the dashboard shows it)
            with contextlib.suppress(SdkError, ValidationError):
                queue = await c.queue(scope=scope or status.allocation or s.UNALLOCATED)
                at = queue.at
                waiting = next((r for r in queue.rows if r.workload_id == status.workload_id), None)
        return _print_reply(args, status, fmt.status_text(status, waiting, at))

    return _run(args, work)


def run_watch(args: argparse.Namespace) -> int:
    """Asks the leader first, so a mistyped id or ``--alloc`` is an error at once instead of
    a wait for records that will never come. The log alone serves the watch: without a
    leader's answer it goes on (``Client.watch`` then waits for the workload's records).

    An allocation's workload is also followed on its idle subject
    (``allot.v1.usage.idle.<a>.<w>``): each idle flag and clear the health service records
    from now on is a line of its own among the events (the flags before the watch began:
    ``allot idle``). A login that may not read that subject watches the events alone, told
    so on stderr."""
    given = parse_scope(args.alloc)

    def show(record: msgspec.Struct) -> None:
        if args.json:
            print(fmt.envelope_json(record, time.time(), indent=None), flush=True)
        else:
            print(fmt.event_line(record), flush=True)

    async def work(c: Client) -> int:
        tell_connection(args, c)  # the log's records resume where they were
        try:
            scope = given or await _allocation_of(c, args.workload) or s.UNALLOCATED
            with contextlib.suppress(NoResponderError, RequestTimeoutError):  # no leader
                status = await c.status(args.workload, scope=scope)
                _require_known(status, args.workload, scope)
            allocation = None if scope == s.UNALLOCATED else scope
            # One queue, printed in one place: the log's records and the idle records in
            # the order they came (and a closed stdout ends the command from here).
            lines: asyncio.Queue[msgspec.Struct | None] = asyncio.Queue()
            idle = None
            if allocation is not None:  # unallocated work is never flagged idle
                try:
                    idle = await c.on_idle(
                        lines.put_nowait, allocation=allocation, workload_id=args.workload
                    )
                except PermissionDeniedError as exc:
                    print(f"allot {args.command}: idle flags not shown: {exc}", file=sys.stderr)

            async def follow() -> None:
                try:
                    # Closed here, while the client is open, whatever ends the loop.
                    async with contextlib.aclosing(c.watch(args.workload, allocation)) as events:
                        async for record in events:
                            lines.put_nowait(record)
                finally:
                    lines.put_nowait(None)

            following = asyncio.create_task(follow())
            try:
                while (record := await lines.get()) is not None:
                    show(record)
                await following  # its error, if any
            finally:
                if not following.done():
                    following.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await following
                elif not following.cancelled():
                    following.exception()  # raised above, or dropped for stdout's own error
                if idle is not None and not c.nc.is_closed:
                    await idle.unsubscribe()
        except ValidationError as exc:
            raise renamed(exc, CANCEL_OPTIONS) from None
        return 0

    return _run(args, work)


def run_prio(args: argparse.Namespace) -> int:
    scope = parse_scope(args.scope)

    async def work(c: Client) -> int:
        try:
            snapshot = await c.prio(scope=scope)
        except ValidationError as exc:  # an allocation the budget tree lacks
            raise renamed(exc, SCOPE_OPTIONS) from None
        return _print_reply(args, snapshot, fmt.prio_table(snapshot))

    return _run(args, work)


def run_queue(args: argparse.Namespace) -> int:
    scope = parse_scope(args.scope)

    async def work(c: Client) -> int:
        try:
            snapshot = await c.queue(scope=scope)
        except ValidationError as exc:  # an allocation the budget tree lacks
            raise renamed(exc, SCOPE_OPTIONS) from None
        return _print_reply(args, snapshot, fmt.queue_table(snapshot, long=args.long))

    return _run(args, work)


def run_share(args: argparse.Namespace) -> int:
    """``allot share``: the ranking service's ``RankingUpdated``. ``allot share -l`` joins it
    with the placement leader's ``AllocationsSnapshot`` (``Client.allocations()``); with
    ``--json`` it prints the two envelopes as JSON Lines, the ``RankingUpdated`` first, then
    the ``AllocationsSnapshot`` (only the first when the leader did not answer, which the
    text form says in its footer instead of failing)."""

    async def work(c: Client) -> int:
        ranking = await c.share()
        if not args.long:
            return _print_reply(args, ranking, fmt.share_table(ranking))
        allocations: m.AllocationsSnapshot | None
        try:
            allocations = await c.allocations()
        except (NoResponderError, RequestTimeoutError) as exc:
            print(f"allot {args.command}: {exc}", file=sys.stderr)
            allocations = None
        if args.json:
            replies: list[msgspec.Struct] = [ranking]
            if allocations is not None:
                replies.append(allocations)
            print(fmt.envelope_lines(replies, time.time()))
        else:
            print(fmt.share_long_table(ranking, allocations))
        return 0

    return _run(args, work)


def run_hosts(args: argparse.Namespace) -> int:
    async def work(c: Client) -> int:
        snapshot = await c.hosts()
        return _print_reply(args, snapshot, fmt.hosts_table(snapshot))

    return _run(args, work)


def run_drain(args: argparse.Namespace) -> int:
    operator = _sender(args, "--operator", args.operator)

    async def work(c: Client) -> int:
        try:
            reply = await c.drain(args.host, operator=operator, reason=args.reason)
        except ValidationError as exc:
            raise renamed(exc, HOST_OPTIONS) from None
        return _print_reply(args, reply, _accepted_text(f"drain {args.host}", reply))

    return _run(args, work)


def run_undrain(args: argparse.Namespace) -> int:
    operator = _sender(args, "--operator", args.operator)

    async def work(c: Client) -> int:
        try:
            reply = await c.undrain(args.host, operator=operator)
        except ValidationError as exc:
            raise renamed(exc, HOST_OPTIONS) from None
        return _print_reply(args, reply, _accepted_text(f"undrain {args.host}", reply))

    return _run(args, work)


def run_budget_set(args: argparse.Namespace) -> int:
    path = parse_budget_path(args.path)
    shares = parse_shares(args.shares)
    set_by = _sender(args, "--by", args.by)

    async def work(c: Client) -> int:
        try:
            reply = await c.set_budget(path, shares, set_by=set_by)
        except ValidationError as exc:
            raise renamed(exc, BUDGET_OPTIONS) from None
        shown = "parent" if shares is None else str(shares)
        return _print_reply(args, reply, _accepted_text(f"{'/'.join(path)} = {shown}", reply))

    return _run(args, work)


def _accepted_text(what: str, reply: m.CommandAccepted) -> str:
    return f"accepted: {what}" + (f" ({reply.detail})" if reply.detail else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one live command without the rest of ``allot`` (what ``allot.cli.main`` does:
    bad input is one line on stderr and exit status 2)."""
    parser = argparse.ArgumentParser(prog="allot")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parse_command_line(parser, argv)
    try:
        code: int = args.func(args)
    except ValidationError as exc:
        print(f"allot {args.command}: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
