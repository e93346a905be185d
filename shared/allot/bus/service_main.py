"""Running one service: the shared command line and the FastStream app around it.

Every service object has a ``broker`` (FastStream ``NatsBroker`` with its handlers),
``on_started`` (after the broker connected: streams, replays, background tasks) and
``on_stopping``. ``start``/``stop`` run it inside another program (tests, ``allot up``);
``run_main`` runs it as a process (``python -m allot.services.<name>``) with FastStream's
signal handling: SIGINT or SIGTERM stops it cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

from faststream import FastStream
from faststream.nats import NatsBroker

from allot.auth.client import add_nats_url_argument, masked_url, redis_url_from_env
from allot.bus.open_server import OpenServerError, refuse_an_open_server
from allot.core.errors import ValidationError
from allot.long_lived import tune_gc
from allot.proto.subjects import validate_token

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"


class Service(Protocol):
    broker: NatsBroker

    async def on_started(self) -> None: ...

    async def on_stopping(self) -> None: ...


def positive_seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def host_ids(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated host ids (``--short-lane``), each one subject token."""
    ids = [h.strip() for h in text.split(",")] if text.strip() else []
    try:
        return tuple(validate_token(h, "host id") for h in ids)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(f"{exc.field}: {exc.reason}") from None


def add_short_lane_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--short-lane HOSTS`` (comma-separated, repeatable: the lists add up) into
    ``short_lane``, a tuple of host ids (empty when not given)."""
    parser.add_argument(
        "--short-lane",
        type=host_ids,
        action="extend",
        default=None,
        metavar="HOSTS",
        help=help_text,
    )


def lane_hosts_of(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``--short-lane`` hosts given, in order, each once."""
    return tuple(dict.fromkeys(args.short_lane or ()))


def base_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=description)
    add_nats_url_argument(ap, DEFAULT_NATS_URL)
    redis_url = redis_url_from_env(os.environ, DEFAULT_REDIS_URL)
    shown = masked_url(redis_url).replace("%", "%%")
    ap.add_argument(
        "--redis-url",
        default=redis_url,
        help=f"Redis server (env ALLOT_REDIS_URL, with ALLOT_REDIS_PASSWORD when set; "
        f"default {shown})",
    )
    return ap


async def start(service: Service) -> None:
    await service.broker.start()
    await service.on_started()


async def stop(service: Service) -> None:
    try:
        await service.on_stopping()
    finally:
        await service.broker.stop()


def app_of(service: Service, nats_url: str | None = None, name: str = "") -> FastStream:
    """The service's app; with ``nats_url``, once its broker has connected it refuses a
    server that lets clients in without the login the URL carries (``OpenServerError``:
    ``allot.bus.open_server``)."""

    async def started() -> None:
        if nats_url is not None:
            await refuse_an_open_server(nats_url, name)
        await service.on_started()
        tune_gc()

    return FastStream(
        service.broker,
        after_startup=[started],
        on_shutdown=[service.on_stopping],
    )


def run_main(
    build: Callable[[argparse.Namespace], Service],
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
) -> int:
    args = parser.parse_args(argv)
    try:
        service = build(args)
    except ValidationError as exc:  # a bad option value: its name and why, no traceback
        parser.error(str(exc))
    try:
        asyncio.run(app_of(service, getattr(args, "nats_url", None), parser.prog).run())
    except OpenServerError as exc:  # a deployment that looks secured and is open: stop
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 1
    return 0
