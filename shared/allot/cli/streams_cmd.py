"""``allot streams``: make the log's streams and the placement's lease bucket.

Run as the roles file's ``streams`` login (``source auth/users/allot-streams.env``) before
the services start and after each upgrade: under a roles file the services' own login may
not create or update a stream (decision 0082), and a service whose streams are missing or
out of date says so and stops. Without a roles file the services make them themselves.
Idempotent: a stream as it should be is only read. Prints one line per stream: created,
updated (which fields) or as wanted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import nats.errors

from allot import bus
from allot.auth.client import masked_url
from allot.cli.stack_url import add_nats_url_option, nats_url
from allot.core.errors import ValidationError
from allot.ops.log_streams import StreamsRefusedError, make_streams


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "streams",
        help="make the log's streams and the lease bucket (the roles file's streams login)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_nats_url_option(p)
    p.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="copies of each stream, 1-5 (default $ALLOT_STREAM_REPLICAS; when neither says, "
        "a new stream gets 1 and an existing one keeps its own)",
    )
    p.add_argument(
        "--lease-ttl-s",
        type=float,
        default=bus.LEASE_TTL_S,
        help="the lease bucket's TTL: placement's --lease-ttl-s (default %(default)s)",
    )
    p.add_argument(
        "--timeout-s",
        type=float,
        default=bus.STREAMS_READY_TIMEOUT_S,
        help="how long to wait for JetStream to answer (default %(default)s)",
    )
    p.set_defaults(func=run_streams)


def run_streams(args: argparse.Namespace) -> int:
    if args.replicas is not None and not 1 <= args.replicas <= 5:
        raise ValidationError("--replicas", f"must be 1-5, got {args.replicas}")
    if not args.lease_ttl_s > 0:
        raise ValidationError("--lease-ttl-s", f"must be above 0, got {args.lease_ttl_s:g}")
    if not args.timeout_s >= 0:
        raise ValidationError("--timeout-s", f"must be 0 or more, got {args.timeout_s:g}")
    url = nats_url(args.nats_url, os.environ, Path.cwd())
    try:
        done = asyncio.run(
            make_streams(url, args.replicas, lease_ttl_s=args.lease_ttl_s, timeout_s=args.timeout_s)
        )
    except (
        bus.StreamsNotReadyError,
        bus.LeaseBucketError,
        StreamsRefusedError,
        nats.errors.Error,
        OSError,
    ) as e:
        print(f"allot streams: {masked_url(url)}: {e}")
        return 1
    for name, what in done.items():
        print(f"{name}: {what}")
    return 0
