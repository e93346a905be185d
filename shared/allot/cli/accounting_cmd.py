"""``allot accounting rebuild|usage``: the accounting store, from the command line.

``rebuild`` wipes the usage store (and the running-work hash) under ``--prefix`` and replays
the whole WORKLOADS stream through the accounting service's charging code; running work is
charged up to the wall clock. Stop the accounting service while it runs.

``usage`` prints each allocation's GPU-hours inside the window ``--window-s`` (default 7 days)
ending now, as the ranking service computes them (``allot.core.usage.window_usage`` over the
store's hour buckets), and a legend: what was charged as of when (whole slots from each
run's reported start, running work lagging), unlike ``allot owed``'s figures from the log;
``--json`` prints the listings' envelope ``{"kind": "AccountingUsage", "at", "data":
{"window_s", "gpu_hours": {allocation: x}}}``.

Bad options are usage errors (exit 2); an unreachable server is one line on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from allot.cli.durations import duration_label, parse_duration
from allot.cli.stack_url import add_nats_url_option, add_redis_url_option, nats_url, redis_url
from allot.core.errors import ValidationError
from allot.core.usage import DEFAULT_WINDOW_S, HOUR_S, window_usage
from allot.render.live_format import gpu_h_cell, timestamp

EXIT_UNREACHABLE = 1
CONNECT_TIMEOUT_S = 5.0
# Same value as ``allot.services.accounting``, repeated so that building the ``allot``
# parser does not import FastStream.
DEFAULT_SLOT_S = 60.0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``accounting`` with its ``rebuild`` and ``usage`` subcommands; ``args.func(args)``
    (or ``run(args)``) then runs the chosen one."""
    parser = subparsers.add_parser(
        "accounting",
        help="rebuild or read the GPU-time usage store",
        description="The accounting store: hourly GPU-seconds per allocation in Redis.",
    )
    commands = parser.add_subparsers(dest="accounting_command", metavar="ACTION", required=True)

    rebuild = commands.add_parser(
        "rebuild",
        help="wipe the usage store and recompute it from the WORKLOADS log",
        description="Wipe the usage store under --prefix and replay the whole WORKLOADS "
        "stream through the charging code (stop the accounting service first).",
    )
    _server_options(rebuild, nats=True)
    rebuild.add_argument(
        "--slot-s",
        type=float,
        default=DEFAULT_SLOT_S,
        help="charging grid in seconds, (0, 3600]; the service's --slot-s (default %(default)s)",
    )
    rebuild.set_defaults(func=run_rebuild)

    usage = commands.add_parser(
        "usage",
        help="print GPU-hours per allocation inside the usage window",
        description="GPU-hours per allocation inside the window ending now.",
    )
    _server_options(usage, nats=False)
    usage.add_argument(
        "--window-s",
        type=parse_duration,
        default=DEFAULT_WINDOW_S,
        help="window length: seconds or 90m, 12h, 7d (default %(default)s)",
    )
    usage.add_argument("--json", action="store_true", help="print JSON instead of a table")
    usage.set_defaults(func=run_usage)


def _server_options(parser: argparse.ArgumentParser, *, nats: bool) -> None:
    if nats:
        add_nats_url_option(parser)
    add_redis_url_option(parser)
    parser.add_argument("--prefix", default="allot", help="Redis key prefix (default %(default)s)")


def run(args: argparse.Namespace) -> int:
    """Run the chosen ``accounting`` subcommand (``args.func`` does the same)."""
    code: int = args.func(args)
    return code


def run_rebuild(args: argparse.Namespace) -> int:
    # Imported here, not at the top: the service module pulls in FastStream (~0.3 s), which
    # every other ``allot`` command would otherwise pay for at start-up.
    from allot.adapters.usage_store import check_redis_url  # noqa: PLC0415
    from allot.bus.runtime import configure_logging  # noqa: PLC0415
    from allot.services.accounting import rebuild  # noqa: PLC0415

    redis = redis_url(args.redis_url, os.environ, Path.cwd())
    check_redis_url(redis, "--redis-url")
    nats = nats_url(args.nats_url, os.environ, Path.cwd())
    configure_logging("accounting-rebuild")
    try:
        done = asyncio.run(rebuild(nats, redis, prefix=args.prefix, slot_s=args.slot_s))
    except _unreachable_errors() as e:
        return _unreachable("rebuild", e)
    except ValidationError as exc:  # the service's field names the option the user typed
        raise ValidationError(_OPTION.get(exc.field, exc.field), exc.reason) from None
    print(f"replayed {done.records} records, applied {done.charges} charges")
    return 0


def run_usage(args: argparse.Namespace) -> int:
    from allot.adapters.usage_store import check_redis_url  # noqa: PLC0415 - see run_rebuild

    redis = redis_url(args.redis_url, os.environ, Path.cwd())
    check_redis_url(redis, "--redis-url")
    try:
        at, gpu_hours, charged_until = asyncio.run(usage(redis, args.prefix, args.window_s))
    except _unreachable_errors() as e:
        return _unreachable("usage", e)
    except ValidationError as exc:
        raise ValidationError(_OPTION.get(exc.field, exc.field), exc.reason) from None
    if args.json:  # the envelope every --json listing prints
        data = {"window_s": args.window_s, "gpu_hours": gpu_hours, "charged_until": charged_until}
        print(json.dumps({"kind": "AccountingUsage", "at": at, "data": data}))
        return 0
    print(usage_text(at, args.window_s, gpu_hours, charged_until))
    return 0


def usage_text(
    at: float, window_s: int, gpu_hours: dict[str, float], charged_until: float | None = None
) -> str:
    """The usage table and its legend: what the store holds as charged at ``at``, which
    lags the log (``allot owed`` counts from the log up to now); ``charged_until``: the end
    of the last slot the accounting service charged running work for."""
    head = f"GPU-h (last {duration_label(window_s)})"
    width = max([len("allocation"), *map(len, gpu_hours)])
    cells = {name: gpu_h_cell(hours) for name, hours in gpu_hours.items()}
    right = max([len(head), *map(len, cells.values())])
    lines = [f"{'allocation':<{width}}  {head:>{right}}"]
    lines += [f"{name:<{width}}  {cell:>{right}}" for name, cell in cells.items()]
    until = (
        f"up to {timestamp(charged_until)}"
        if charged_until is not None
        else "not yet (no accrual so far)"
    )
    lines += [
        f"Charged as of {timestamp(at)}: ended runs in full, running ones in whole slots",
        f"{until} (the accounting service's --slot-s, {DEFAULT_SLOT_S:g} s by default), each run",
        "from the start its host reported. allot owed counts from the log instead: from",
        "placement, running work up to now.",
    ]
    return "\n".join(lines)


async def usage(
    redis_url: str, prefix: str, window_s: int, now: float | None = None
) -> tuple[float, dict[str, float], float | None]:
    """``(now, {allocation: GPU-hours in the window}, charged until)`` for every allocation
    in the store (raises ``ValidationError`` for a bad prefix or window); the last is the
    end of the last slot running work was charged for (None before any)."""
    import redis.asyncio as redis_asyncio  # noqa: PLC0415 - see run_rebuild

    from allot.adapters.usage_store import RedisUsageStore  # noqa: PLC0415
    from allot.bus.runtime import wall_clock  # noqa: PLC0415

    if isinstance(window_s, bool) or not isinstance(window_s, int) or window_s <= 0:
        raise ValidationError("window_s", f"must be a positive number of seconds, got {window_s!r}")
    at = wall_clock() if now is None else now
    client = redis_asyncio.Redis.from_url(redis_url, socket_connect_timeout=CONNECT_TIMEOUT_S)
    try:
        store = RedisUsageStore(client, prefix)
        names = await store.allocations()
        buckets = await store.buckets(names, at, window_s)
        charged_until = await store.charged_until()
    finally:
        await client.aclose()
    seconds = window_usage(buckets, at, window_s)
    return at, {name: seconds[name] / HOUR_S for name in sorted(seconds)}, charged_until


_OPTION = {"window_s": "--window-s", "slot_s": "--slot-s", "prefix": "--prefix"}
"""The accounting functions' field names -> the options that set them."""


def _unreachable(action: str, error: BaseException) -> int:
    from allot.adapters.usage_store import redis_failure  # noqa: PLC0415 - see run_rebuild

    print(
        f"allot accounting {action}: cannot reach the server: {redis_failure(error)}",
        file=sys.stderr,
    )
    return EXIT_UNREACHABLE


def _unreachable_errors() -> tuple[type[BaseException], ...]:
    import nats.errors  # noqa: PLC0415 - see run_rebuild
    import redis.exceptions  # noqa: PLC0415

    # RedisError: also a server that is not Redis (a protocol error), e.g. the NATS port.
    return (OSError, TimeoutError, redis.exceptions.RedisError, nats.errors.NoServersError)
