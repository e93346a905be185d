"""The log's streams and the placement's lease bucket: what they are, how a service finds
them as they should be, and what the streams login makes (``allot streams``).

Streams (``allot.proto.subjects.STREAMS``), file storage, one replica unless
``$ALLOT_STREAM_REPLICAS`` says more (a cluster):

* ``WORKLOADS``: workload records and decisions (the log of record; kept until deleted;
  ``allow_atomic``, so intake and dispatch can group-commit a backlog of appends:
  ``allot.bus.group_commit``);
* ``HOSTS``: host registrations and state changes (kept);
* ``USAGE``: the budget tree and ranking snapshots (the last ``USAGE_KEPT_PER_SUBJECT`` of
  each subject, never aged out: the budget tree must outlive a quiet month; the current
  tree is the last message on its subject).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
import nats.errors
import structlog
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig, StreamInfo
from nats.js.errors import APIError, BucketNotFoundError, NotFoundError, ServiceUnavailableError
from nats.js.kv import KeyValue

from allot.core.errors import ValidationError
from allot.proto import subjects as s
from allot.proto.subjects import STREAMS

log = structlog.get_logger("allot.bus")
T = TypeVar("T")

DUPLICATE_WINDOW_S = 120.0
USAGE_KEPT_PER_SUBJECT = 10_000
"""USAGE keeps the last 10,000 messages of each subject, none dropped by age: about 35
days of rankings (one every 300 s, more after budget changes) and the last 10,000 budget
trees. A limit by age would drop a budget tree nobody changed (docs/decisions/0019)."""


REPLICAS_ENV = "ALLOT_STREAM_REPLICAS"
"""Replicas of every stream and KV bucket the services create (1 on a single server; 3 on
a three-node cluster, so the log survives losing one node)."""


def stream_replicas(default: int = 1) -> int:
    """``$ALLOT_STREAM_REPLICAS`` (``default`` when unset); JetStream allows 1 to 5."""
    raw = os.environ.get(REPLICAS_ENV, "").strip() or str(default)
    try:
        n = int(raw)
    except ValueError:
        raise ValidationError(REPLICAS_ENV, f"must be an integer 1-5, got {raw!r}") from None
    if not 1 <= n <= 5:
        raise ValidationError(REPLICAS_ENV, f"must be an integer 1-5, got {n}")
    return n


def replicas_asked(replicas: int | None = None) -> int | None:
    """``replicas``, else ``$ALLOT_STREAM_REPLICAS`` when set, else None: an existing stream
    or bucket keeps its own."""
    if replicas is None and os.environ.get(REPLICAS_ENV, "").strip():
        return stream_replicas()
    return replicas


ATOMIC_STREAMS = ("WORKLOADS",)
"""Streams that take atomic batches (``allow_atomic``; group commit)."""


def stream_configs(replicas: int = 1) -> list[StreamConfig]:
    out = []
    for name, subjects in STREAMS.items():
        out.append(
            StreamConfig(
                name=name,
                subjects=list(subjects),
                storage=StorageType.FILE,
                num_replicas=replicas,
                duplicate_window=DUPLICATE_WINDOW_S,
                max_age=0.0,
                max_msgs_per_subject=USAGE_KEPT_PER_SUBJECT if name == "USAGE" else -1,
                # Group commit (``allot.bus.group_commit``); a server older than 2.12
                # ignores the field, and its appends go one by one.
                allow_atomic=True if name in ATOMIC_STREAMS else None,
            )
        )
    return out


STREAMS_READY_TIMEOUT_S = 30.0
"""How long ``ensure_streams`` waits for JetStream by default: a fresh cluster elects its
meta leader and sees its peers within seconds; a service started with it must not crash
meanwhile (it would be restarted, and start over)."""
_RETRY_FIRST_S = 0.25
_RETRY_MAX_S = 2.0
_TRANSIENT_ERR_CODES = frozenset(
    {
        10005,  # no suitable peers for placement: a replicated stream before its peers are up
        10008,  # JetStream system temporarily unavailable: no meta leader yet
        10009,  # JetStream cluster can not handle request: a leader change
        10023,  # insufficient resources: peers not all known yet
    }
)
_PERMANENT_503 = frozenset(
    {
        10039,  # JetStream not enabled for account
        10076,  # JetStream not enabled
    }
)


class StreamsNotReadyError(RuntimeError):
    """JetStream could not create, update or find the log's streams within the time given."""


def _not_ready(e: BaseException) -> bool:
    """Whether ``e`` says JetStream cannot answer *yet* (no reply, 503, a cluster still
    electing or gathering its peers) rather than that the request is wrong (a config
    conflict, overlapping subjects, replicas on a server with no cluster)."""
    if isinstance(e, TimeoutError | nats.errors.NoRespondersError):
        return True  # nats-py's TimeoutError is a TimeoutError
    if isinstance(e, APIError):
        if e.err_code in _TRANSIENT_ERR_CODES:
            return True
        return isinstance(e, ServiceUnavailableError) and e.err_code not in _PERMANENT_503
    return False


async def ensure_streams(
    js: JetStreamContext,
    replicas: int | None = None,
    *,
    ready_timeout_s: float = STREAMS_READY_TIMEOUT_S,
) -> dict[str, str]:
    """Create the streams, or bring an existing one up to date where it differs
    (``stream_differs``; an unchanged stream is only read). ``replicas``:
    default ``$ALLOT_STREAM_REPLICAS``; when neither says, a new stream gets 1 and an
    existing one keeps its own (a tool run without the variable must not scale a
    cluster's replicated log down to one copy).

    While JetStream cannot answer yet (``_not_ready``: a fresh cluster without a meta
    leader, or whose peers are not all up), each stream is tried again after a short
    backoff (0.25 s doubling to 2 s), each retry logged, for at most ``ready_timeout_s``
    in all (0: one try each); then ``StreamsNotReadyError`` names the stream and the last
    error. Any other error (a configuration conflict) is raised at once. Returns what was
    done to each stream: ``created``, ``updated (<fields>)`` or ``as wanted``."""
    replicas = replicas_asked(replicas)
    return await _each_stream(
        stream_configs(replicas or 1),
        lambda config: _ensure_stream(js, config, replicas),
        "create or update",
        ready_timeout_s,
    )


async def _each_stream(
    configs: list[StreamConfig],
    step: Callable[[StreamConfig], Awaitable[str]],
    what: str,
    ready_timeout_s: float,
) -> dict[str, str]:
    """``step`` for each stream, each tried again while JetStream is not ready (see
    ``ensure_streams``) until ``ready_timeout_s`` has passed in all."""
    deadline = asyncio.get_running_loop().time() + ready_timeout_s
    done: dict[str, str] = {}
    for config in configs:
        assert config.name is not None
        done[config.name] = await _until_ready(
            functools.partial(step, config),
            f"{what} stream {config.name} (replicas {config.num_replicas})",
            deadline,
            ready_timeout_s,
            config.name,
        )
    return done


async def until_ready(
    step: Callable[[], Awaitable[T]], what: str, ready_timeout_s: float, stream: str
) -> T:
    """``step`` on ``stream`` tried again while JetStream is not ready (``_not_ready``: a
    fresh cluster still electing or placing its replicas), for at most ``ready_timeout_s``;
    then ``StreamsNotReadyError`` saying that JetStream could not ``what``."""
    deadline = asyncio.get_running_loop().time() + ready_timeout_s
    return await _until_ready(step, what, deadline, ready_timeout_s, stream)


async def _until_ready(
    step: Callable[[], Awaitable[T]],
    what: str,
    deadline: float,
    ready_timeout_s: float,
    stream: str,
) -> T:
    loop = asyncio.get_running_loop()
    delay, attempt = _RETRY_FIRST_S, 0
    while True:
        attempt += 1
        left = deadline - loop.time()
        try:
            # A try that would start past the deadline still runs once, bounded by the
            # requests' own timeouts (``ready_timeout_s=0``: one try, no retry).
            return await asyncio.wait_for(step(), left if left > 0 else None)
        except Exception as e:
            if not _not_ready(e):
                raise
            left = deadline - loop.time()
            if left <= 0:
                raise StreamsNotReadyError(
                    f"JetStream could not {what} within {ready_timeout_s:g} s, "
                    f"{attempt} tries; last error: {_describe(e)}"
                ) from e
            wait = min(delay, left)
            log.warning(
                "jetstream not ready; retrying",
                stream=stream,
                attempt=attempt,
                error=_describe(e),
                retry_in_s=round(wait, 2),
                gives_up_in_s=round(left, 1),
            )
            await asyncio.sleep(wait)
            delay = min(delay * 2, _RETRY_MAX_S)


async def _ensure_stream(js: JetStreamContext, config: StreamConfig, replicas: int | None) -> str:
    """One stream, created or updated; idempotent, so a try cut short is simply repeated."""
    assert config.name is not None
    try:
        info = await js.stream_info(config.name)
    except NotFoundError:
        await js.add_stream(config)
        return "created"
    else:
        _refuse_unnamed_events(config.name, info)
        if replicas is None:
            config.num_replicas = info.config.num_replicas
        # Updated only when it differs: a service's own login may not update a stream
        # (decision 0082), and finds the streams the streams login made as they should be.
        differs = stream_differs(config, info.config, _takes_atomic(js))
        if not differs:
            return "as wanted"
        if set(differs) <= OPTIONAL_FIELDS:
            return await _update_if_allowed(js, config, differs)
        await js.update_stream(config)
        return f"updated ({', '.join(differs)})"


OPTIONAL_FIELDS = frozenset({"allow_atomic"})
"""Fields a service can do without (``group_commit`` appends one by one without atomic
batches): a stream made before the server took them (an upgrade of NATS alone) is updated
when the login may, else used as it is until ``allot streams`` updates it."""
OPTIONAL_UPDATE_S = 2.0


async def _update_if_allowed(js: JetStreamContext, config: StreamConfig, differs: list[str]) -> str:
    """Update a stream that lacks only ``OPTIONAL_FIELDS``; one try, briefly: a login that
    may not update a stream is not answered."""
    lacks = ", ".join(differs)
    try:
        await asyncio.wait_for(js.update_stream(config), OPTIONAL_UPDATE_S)
    except (TimeoutError, nats.errors.Error) as e:
        log.warning(
            "stream used without what it lacks; `allot streams` (the streams login) adds it",
            stream=config.name,
            lacks=lacks,
            error=_describe(e),
        )
        return f"as found, without {lacks}"
    return f"updated ({lacks})"


def stream_differs(wanted: StreamConfig, has: StreamConfig, takes_atomic: bool) -> list[str]:
    """The fields ``stream_configs`` sets in which an existing stream's ``has`` differs
    from ``wanted`` (empty: nothing to update). ``allow_atomic`` counts only where the
    server takes it (2.12 and later; an older one drops the field)."""
    fields = ["storage", "num_replicas", "max_msgs_per_subject"]
    out = [f for f in fields if getattr(wanted, f) != getattr(has, f)]
    if sorted(wanted.subjects or []) != sorted(has.subjects or []):
        out.append("subjects")
    for f in ("duplicate_window", "max_age"):  # seconds, sent and read back as nanoseconds
        if abs((getattr(wanted, f) or 0.0) - (getattr(has, f) or 0.0)) > 1e-6:
            out.append(f)
    if takes_atomic and bool(wanted.allow_atomic) != bool(has.allow_atomic):
        out.append("allow_atomic")
    return out


def _takes_atomic(js: JetStreamContext) -> bool:
    version = js._nc.connected_server_version
    return (version.major, version.minor) >= (2, 12)


LEADER_BUCKET = "allot_leader"
"""The placement leader's lease (a KV bucket: ``services/placement/lease.py``)."""
LEASE_TTL_S = 3.0
"""How long a lease lasts unless renewed: the bucket's TTL, placement's ``--lease-ttl-s``."""


async def new_lease_bucket(js: JetStreamContext, ttl_s: float, replicas: int) -> KeyValue:
    """Create the lease bucket: one value per key (the lease), kept ``ttl_s``."""
    return await js.create_key_value(bucket=LEADER_BUCKET, ttl=ttl_s, history=1, replicas=replicas)


class LeaseBucketError(RuntimeError):
    """The lease bucket is missing and could not be made, or keeps leases for another TTL."""


async def lease_bucket(js: JetStreamContext, ttl_s: float) -> KeyValue:
    """The lease bucket, looked up first and created (at ``$ALLOT_STREAM_REPLICAS``) only
    when missing: under a roles file the services' own login may not create a stream, and
    the streams login makes it (``allot streams``). A bucket whose TTL is not ``ttl_s`` is
    refused: leases renewed at a third of one TTL in a bucket that keeps them for another
    either lapse between renewals or outlive a dead leader."""
    try:
        kv = await js.key_value(LEADER_BUCKET)
    except BucketNotFoundError:
        try:
            return await new_lease_bucket(js, ttl_s, stream_replicas())
        except Exception as e:  # refused (not answered), or JetStream not ready
            raise LeaseBucketError(
                f"the lease bucket {LEADER_BUCKET} is missing and could not be made "
                f"({_describe(e)})"
            ) from e
    kept = (await kv.status()).ttl or 0.0
    if abs(kept - ttl_s) > 1e-6:
        raise LeaseBucketError(
            f"the lease bucket {LEADER_BUCKET} keeps a lease {kept:g} s, this placement's "
            f"--lease-ttl-s is {ttl_s:g}: give every placement the bucket's TTL, or have the "
            f"streams login set this one: allot streams --lease-ttl-s {ttl_s:g}"
        )
    return kv


def _describe(e: BaseException) -> str:
    no_responders = isinstance(e, ServiceUnavailableError) and e.code is None  # nats-py's form
    if no_responders or isinstance(e, TimeoutError | nats.errors.NoRespondersError):
        # A refused $JS.API request is not answered either: it ends the same way.
        return (
            f"no answer ({type(e).__name__}): no JetStream leader yet, JetStream not "
            "enabled, or this login may not make this request (the services' own login may "
            "not create or update a stream: make the streams first with `allot streams` as "
            "the streams login of the roles file)"
        )
    return f"{type(e).__name__}: {e}"


UNNAMED_EVENTS = f"{s.PREFIX}.events.*.*"
"""Lifecycle events' subjects before they ended with the event's name (a form no release
wrote): ``allot.v1.events.<allocation>.<workload>``."""


class UnreadableLogError(RuntimeError):
    """The log holds records this version cannot read."""


def _refuse_unnamed_events(name: str, info: StreamInfo) -> None:
    """A WORKLOADS stream that captured lifecycle events without their names and holds
    records: no reader of this version would apply them (``kind_of`` refuses the form), so
    every service would start from a log missing its history. Refuse to start instead."""
    if UNNAMED_EVENTS in (info.config.subjects or []) and info.state.messages:
        raise UnreadableLogError(
            f"stream {name} holds {info.state.messages} records written before lifecycle "
            f"events were named in their subjects ({UNNAMED_EVENTS}, now "
            f"{s.ALL_EVENTS}); this version cannot read them. Start from an empty store "
            f"(no release wrote that form), or delete the stream: nats stream rm {name}"
        )
