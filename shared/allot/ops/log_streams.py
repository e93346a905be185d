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

import os

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
    done to each, the bucket under its stream's name (``KV_allot_leader``)."""
    nc, js = await bus.connect(url, "allot-streams")
    try:
        done = await bus.ensure_streams(js, replicas, ready_timeout_s=timeout_s)
        if replicas is None and os.environ.get(bus.REPLICAS_ENV, "").strip():
            replicas = bus.stream_replicas()  # as ensure_streams reads it
        done[BUCKET_STREAM] = await _lease_bucket(js, lease_ttl_s, replicas)
        return done
    finally:
        await nc.close()


async def _lease_bucket(js: JetStreamContext, ttl_s: float, replicas: int | None) -> str:
    """The lease bucket made, or its TTL (and, when given, replicas) brought to these."""
    try:
        info = await js.stream_info(BUCKET_STREAM)
    except NotFoundError:
        await js.create_key_value(
            bucket=bus.LEADER_BUCKET, ttl=ttl_s, history=1, replicas=replicas or 1
        )
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
