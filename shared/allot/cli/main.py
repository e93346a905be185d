"""The ``allot`` command: one entry point, one subcommand per module.

Bad input anywhere below ends in ONE line on stderr naming the field and the reason, and
exit status 2 (``ValidationError``); nothing prints a traceback for a user's mistake.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from allot.adapters.embedded import unwind_on_sigterm
from allot.cli import (
    accounting_cmd,
    auth_cmd,
    demo_cmd,
    fairshare_cmd,
    history_cmds,
    idle_cmd,
    live_cmds,
    owed_cmd,
    scenario_cmd,
    session_cmd,
    simulate_cmd,
    streams_cmd,
    twin_cmd,
    up_cmd,
)
from allot.cli.command_line import parse_command_line
from allot.core.errors import ValidationError
from allot.ops.run_dir import NoStackError

EXIT_NO_STACK = 1
"""No server named and no running stack found: as a stack that did not answer."""
EXIT_BAD_INPUT = 2
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell reports for a program whose reader went away."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="allot",
        description="Allot: GPU-time budgets, hierarchical fair share and a min-runtime "
        "contract for shared GPU clusters.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    fairshare_cmd.register(subparsers)
    simulate_cmd.register(subparsers)
    scenario_cmd.register(subparsers)
    up_cmd.register(subparsers)
    demo_cmd.register(subparsers)
    live_cmds.register(subparsers)
    session_cmd.register(subparsers)
    owed_cmd.register(subparsers)
    idle_cmd.register(subparsers)
    history_cmds.register(subparsers)
    twin_cmd.register(subparsers)
    accounting_cmd.add_parser(subparsers)
    auth_cmd.register(subparsers)
    streams_cmd.register(subparsers)
    return parser


class _QuietSslEof(logging.Filter):
    """asyncio warns "returning true from eof_received() has no effect when using ssl"
    each time nats-py's TLS connection closes (``allot up --secure``): noise on every
    command, with nothing for the user to do."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("returning true from eof_received()")


def main(argv: Sequence[str] | None = None) -> int:
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _QuietSslEof) for f in asyncio_log.filters):
        asyncio_log.addFilter(_QuietSslEof())
    parser = build_parser()
    args = parse_command_line(parser, argv)
    try:
        code: int = args.func(args)
    except ValidationError as exc:
        print(f"allot {args.command}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except NoStackError as exc:
        print(f"allot {args.command}: {exc}", file=sys.stderr)
        return EXIT_NO_STACK
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of stdout is gone (``allot watch ... | head``): stop quietly, as a C
        # tool killed by SIGPIPE does. Python flushes stdout again at exit and would report
        # the pipe there, so stdout now writes to /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


def run() -> int:
    """The ``allot`` program (console script): ``main`` with SIGTERM unwinding like Ctrl-C,
    so a killed command stops what it started (``unwind_on_sigterm``; ``allot up`` sets a
    handler of its own). Tests call ``main`` in-process and keep SIGTERM's default."""
    unwind_on_sigterm()
    return main()


if __name__ == "__main__":
    sys.exit(run())
