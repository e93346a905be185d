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

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from allot import bus


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
        existed = await _bucket_exists(js)
        await bus.lease_bucket(js, lease_ttl_s, replicas)
        done[f"KV_{bus.LEADER_BUCKET}"] = (
            "as wanted" if existed else "created"
        ) + f" (leases last {lease_ttl_s:g} s)"
        return done
    finally:
        await nc.close()


async def _bucket_exists(js: JetStreamContext) -> bool:
    try:
        await js.stream_info(f"KV_{bus.LEADER_BUCKET}")
    except NotFoundError:
        return False
    return True
