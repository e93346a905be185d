"""Which servers a CLI command talks to: the one it is told, else the stack it was started
with. In this order: ``--nats-url``; ``ALLOT_NATS_URL`` (with ``ALLOT_NATS_USER`` and
``ALLOT_NATS_PASSWORD``); the stack of ``ALLOT_RUN_DIR``; the one stack started from this
folder or its nearest parent that has one (``make up``, ``allot up``:
``allot.ops.run_dir.find_stack``). Nothing found raises ``NoStackError`` saying what to
export; there is no silent default server (127.0.0.1:4222 is often someone else's).

The same for Redis (``allot accounting``): ``--redis-url``, ``ALLOT_REDIS_URL``, the
stack's embedded one."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from allot.auth.client import REDIS_URL_ENV, nats_url_from_env, redis_url_from_env
from allot.ops.run_dir import RUN_DIR_ENV, find_stack, stack_nats_url, stack_redis_url

NATS_URL_HELP = (
    "NATS server (env ALLOT_NATS_URL, with ALLOT_NATS_USER and ALLOT_NATS_PASSWORD when "
    f"set); default: the stack in ${RUN_DIR_ENV}, else the one started from this folder "
    "or a parent (make up, allot up)"
)
REDIS_URL_HELP = (
    f"Redis server (env ALLOT_REDIS_URL); default: the embedded one of the stack in "
    f"${RUN_DIR_ENV}, else of the one started from this folder or a parent"
)


def add_nats_url_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nats-url", default=None, help=NATS_URL_HELP)


def add_redis_url_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", default=None, help=REDIS_URL_HELP)


def nats_url(given: str | None, environ: Mapping[str, str], folder: Path) -> str:
    """The NATS URL a command uses (see the module docstring); ``NoStackError``."""
    if given:
        return given
    if environ.get("ALLOT_NATS_URL"):
        return nats_url_from_env(environ, "")
    return nats_url_from_env(environ, stack_nats_url(find_stack(environ, folder)))


def redis_url(given: str | None, environ: Mapping[str, str], folder: Path) -> str:
    """The Redis URL ``allot accounting`` uses; ``NoStackError``."""
    if given:
        return given
    if environ.get(REDIS_URL_ENV):
        return redis_url_from_env(environ, "")
    # A --secure stack's own Redis takes the password of its auth/redis.env, sourced.
    return redis_url_from_env(environ, stack_redis_url(find_stack(environ, folder)))
