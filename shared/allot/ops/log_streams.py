"""The log's streams and the placement's lease bucket, made before the services start.

Under a roles file (``allot auth gen``) the services' own login may not create, update,
purge or delete a stream (decision 0082): whoever may create or update one can have the
server republish its records anywhere or drop them by a limit. The roles file's
``streams`` login makes them instead, at deploy time and at each upgrade: ``allot
streams`` (compose's secure override and the Kubernetes Job ``allot-streams`` run it;
``allot up --secure`` does it before starting the services). Without a roles file the
services make them themselves at start, as before (``allot.bus.ensure_streams``), and
``allot up --nats-cluster`` makes them here at one replica per node first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from allot import bus

BUCKET_STREAM = f"KV_{bus.LEADER_BUCKET}"


async def make_streams(
    url: str,
    replicas: int | None = None,
    *,
    lease_ttl_s: float = bus.LEASE_TTL_S,
    timeout_s: float = bus.STREAMS_READY_TIMEOUT_S,
) -> dict[str, str]:
    """Create or update the streams (``allot.bus.ensure_streams``: each tried again until
    ``timeout_s`` while JetStream cannot answer yet) and the lease bucket; returns what was
    done to each, the bucket under its stream's name (``KV_allot_leader``). A server not
    reached within about ``timeout_s`` raises nats-py's ``NoServersError``."""
    loop = asyncio.get_running_loop()
    refused: asyncio.Future[str] = loop.create_future()

    def on_error(e: Exception) -> None:  # a refused request is never answered: say it now
        if "permissions violation" in str(e).lower() and not refused.done():
            refused.set_result(str(e))

    nc, js = await bus.connect(url, "allot-streams", on_error, for_s=max(timeout_s, 1.0))
    try:
        work = asyncio.ensure_future(_make(js, replicas, lease_ttl_s, timeout_s))
        either: set[asyncio.Future[Any]] = {work, refused}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
        raise StreamsRefusedError(
            f"{refused.result()}: this login may not make the log's streams; run `allot "
            "streams` as the roles file's streams login (auth/users/allot-streams.env)"
        )
    finally:
        await nc.close()


class StreamsRefusedError(RuntimeError):
    """The server refused the login a stream request (it is not the streams login)."""


async def _make(
    js: JetStreamContext, replicas: int | None, lease_ttl_s: float, timeout_s: float
) -> dict[str, str]:
    replicas = bus.replicas_asked(replicas)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    done = await bus.ensure_streams(js, replicas, ready_timeout_s=timeout_s)
    # A fresh cluster places the bucket's replicas as it does a stream's: tried again too.
    done[BUCKET_STREAM] = await bus.until_ready(
        functools.partial(_lease_bucket, js, lease_ttl_s, replicas),
        f"create or update the lease bucket {bus.LEADER_BUCKET}",
        max(deadline - loop.time(), 0.0),
        BUCKET_STREAM,
    )
    return done


async def _lease_bucket(js: JetStreamContext, ttl_s: float, replicas: int | None) -> str:
    """The lease bucket made, or its TTL (and, when given, replicas) brought to these."""
    try:
        info = await js.stream_info(BUCKET_STREAM)
    except NotFoundError:
        await bus.new_lease_bucket(js, ttl_s, replicas or 1)
        return f"created (leases last {ttl_s:g} s)"
    config, differs = info.config, list[str]()
    if abs((config.max_age or 0.0) - ttl_s) > 1e-6:
        config.max_age = ttl_s
        differs.append("max_age")
    if replicas is not None and config.num_replicas != replicas:
        config.num_replicas = replicas
        differs.append("num_replicas")
    if not differs:
        return f"as wanted (leases last {ttl_s:g} s)"
    await js.update_stream(config)
    return f"updated ({', '.join(differs)}; leases last {ttl_s:g} s)"
