"""``allot.sdk.Client``: submit, cancel, query and follow workloads over NATS (async).

Every command and query is a core-NATS request answered by one service (intake, the
placement leader, the ranking service, health); the body and the reply are the msgspec
JSON messages of ``allot.proto.messages``. Commands are idempotent by design (a submission
is keyed by ``client_id``, a second cancel or drain changes nothing), so a request that
times out is simply sent again, the same bytes each time, ``retries`` more times. Nobody
listening is a definite failure (``NoResponderError``) only while no attempt has gone
unanswered: after a timeout the service may have acted and died before replying, so the
request is asked again while it restarts, and otherwise ends as ``RequestTimeoutError``
(outcome unknown).

A body is checked locally before it is sent (encoded, then decoded by the same
``allot.proto.codec`` the services use), so a bad value fails with a ``ValidationError``
naming the field without a round trip.

Commands that record who sent them (a submission's and a cancel's ``user``, a budget
change's ``set_by``, a drain's ``operator``) go to their identity subjects, which carry
that name as a token (``allot.v1.submit.<allocation>.<user>``): the only form ``allot auth
gen`` grants a person, and the service refuses a payload naming someone else. When the
client has a login (``Client.login``: the URL's user, or ``ALLOT_NATS_USER``), the name
defaults to it and any other name is refused here (``ValidationError`` naming the field);
without one (no auth) the name must be given and is sent as given.

``watch`` reads the log (stream ``WORKLOADS``) from the start through a watch the intake
service opens for it (``allot.v1.watch.<allocation>``: users never create consumers);
``on_preemption`` is a plain subscription, live only: a training loop uses it to
checkpoint before ``grace_deadline``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import re
import ssl
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from allot.auth.client import CA_ENV, client_tls, inbox_prefix_for_url, login_for, masked_url
from allot.bus import confirm_subscriptions, decode_record, server_urls
from allot.bus.replays import jetstream_delivery
from allot.core.errors import ValidationError
from allot.proto import codec, subjects
from allot.proto import messages as m
from allot.proto.checkpoint_rules import check_checkpoint, parse_signal
from allot.proto.env_vars import check_env
from allot.proto.subjects import Kind
from allot.sdk.checkpointing import CheckpointFn, confirming
from allot.sdk.errors import (
    BadReplyError,
    CommandRejectedError,
    LoginRefusedError,
    NoResponderError,
    NotConnectedError,
    PermissionDeniedError,
    RequestTimeoutError,
    SdkError,
    SubmitRejectedError,
    UnknownWorkloadError,
)
from allot.sdk.lifecycle import Ending

# stdlib logging, silent unless the application configures it (the CLI prints to stdout).
log = logging.getLogger("allot.sdk")

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
WORKLOADS_STREAM = "WORKLOADS"

T = TypeVar("T")

_SUBMIT_REPLY = msgspec.json.Decoder(m.WorkloadAccepted | m.WorkloadRejected)
_BATCH_REPLY = msgspec.json.Decoder(m.SubmitBatchAnswered | m.WorkloadRejected)
_BATCH_ROOM = codec.MAX_PAYLOAD - 256
"""Bytes of items per ``SubmitBatch`` body (the rest is room for its envelope)."""
BATCHES_IN_FLIGHT = 8
"""``submit_batch`` requests outstanding at once."""
_DENIED_PUBLISH = re.compile(r'permissions violation for publish to "([^"]+)"', re.IGNORECASE)
"""How nats-server words a refused publish (reported to the error callback only)."""
_DENIED_SUBSCRIBE = re.compile(
    r'permissions violation for subscription to "([^"]+)"', re.IGNORECASE
)
"""And a refused subscription: the subscription stays, and nothing ever reaches it."""
_LOGIN_REFUSED = "authorization violation"
"""How nats-server words a refused login (wrong user or password)."""
_COMMAND_REPLY = msgspec.json.Decoder(m.CommandAccepted | m.CommandRejected)
NO_RESPONDER_PAUSE_S = 0.1
"""Between two asks while nobody listens after an unanswered attempt (see ``_request``)."""
MISSING_AFTER_S = 2.0
"""``Client.watch``: when the log has shown nothing of the workload for this long, the
placement leader is asked whether it exists."""
MISSING_ASK_TIMEOUT_S = 2.0
"""How long that ask waits for the leader's answer (then the watch waits and asks again)."""
# Every query's reply may be a refusal: a service answers a body it cannot take (a status
# query's id, the owed window) or a question it cannot answer yet (the ranking service
# before its first ranking) with ``CommandRejected``.
_STATUS_REPLY = msgspec.json.Decoder(m.WorkloadStatus | m.CommandRejected)
_QUEUE_REPLY = msgspec.json.Decoder(m.QueueSnapshot | m.CommandRejected)
_PRIO_REPLY = msgspec.json.Decoder(m.PrioSnapshot | m.CommandRejected)
_HOSTS_REPLY = msgspec.json.Decoder(m.HostsSnapshot | m.CommandRejected)
_SHARE_REPLY = msgspec.json.Decoder(m.RankingUpdated | m.CommandRejected)
_ALLOCATIONS_REPLY = msgspec.json.Decoder(m.AllocationsSnapshot | m.CommandRejected)
_PLACEMENT_STATS_REPLY = msgspec.json.Decoder(m.PlacementStats | m.CommandRejected)
_OWED_REPLY = msgspec.json.Decoder(m.OwedSnapshot | m.CommandRejected)
_USAGE_REPLY = msgspec.json.Decoder(m.UsageSnapshot | m.CommandRejected)
_IDLE_REPLY = msgspec.json.Decoder(m.IdleSnapshot | m.CommandRejected)
_HISTORY_REPLY = msgspec.json.Decoder(m.HistoryPage | m.CommandRejected)

# Who answers what: named in the "no responder" and timeout errors.
INTAKE = "intake service"
PLACEMENT = "placement leader"
RANKING = "ranking service"
HEALTH = "health service"
BUDGETS = "budget service"
DASHBOARD = "dashboard service"
ACCOUNTING = "accounting service"

PreemptionCallback = Callable[[m.PreemptionNotice], Awaitable[None] | None]
IdleCallback = Callable[[m.WorkloadFlaggedIdle | m.WorkloadIdleCleared], Awaitable[None] | None]


def new_client_id() -> str:
    """A fresh idempotency key (16 hex characters)."""
    return uuid.uuid4().hex[:16]


def _checked(msg: msgspec.Struct) -> bytes:
    """The JSON of ``msg``, validated as the service will (msgspec checks constraints on
    decode only): raises ``ValidationError`` naming the field."""
    _require_finite(msg, "")
    data = codec.encode(msg)
    codec.decode_as(type(msg), data)
    return data


def _submission(msg: m.SubmitWorkload) -> bytes:
    """``_checked`` for a ``submit_batch`` item, with ``submit``'s checks of what the wire
    types cannot say: a reserved or oversized ``env`` (intake refuses it) and a ``command``
    no host can run. An item is built by the caller, and msgspec checks nothing then."""
    checked = msgspec.structs.replace(msg, command=_argv(msg.command), env=check_env(msg.env))
    return _checked(checked)


def _argv(command: object) -> tuple[str, ...]:
    """``command`` as an argument vector. A string is a ``Sequence[str]`` too, and would go
    one character per argument; there is no shell on the host to split it. A NUL cannot
    be passed to ``exec`` and an empty program name cannot be run: refused here, not on the
    host after the work may have preempted others. (An empty command stays allowed here,
    unlike the CLI's ``CMD``: fake agents run it for ``duration_s`` or their own default,
    as the demo and the tests do.)"""
    if isinstance(command, str | bytes | bytearray):
        raise ValidationError(
            "command",
            f"must be a list of strings, not one string ({command!r}): no shell splits it, "
            "so pass the program and each argument as its own item",
        )
    if not isinstance(command, Sequence):
        raise ValidationError("command", f"must be a list of strings, got {type(command).__name__}")
    for i, arg in enumerate(command):
        if isinstance(arg, str) and "\x00" in arg:
            raise ValidationError(f"command[{i}]", "holds a NUL character (exec refuses it)")
    if command and command[0] == "":
        raise ValidationError("command[0]", "must not be empty: it names the program to run")
    return tuple(command)


_NAME = re.compile(m.NAME_PATTERN)


def check_notice(notice: m.PreemptionNotice, subject: str, environ: Mapping[str, str]) -> None:
    """A notice names the workload and allocation of the subject it came on, and, inside
    that workload (the agent's ``ALLOT_WORKLOAD_ID``, ``ALLOT_ATTEMPT``), its attempt; raises
    ``ValidationError`` otherwise. The placement leader writes each notice so; one that is
    not is an old record replayed onto another subject (docs/security.md), not a notice for
    this run."""
    _, _, _, allocation, workload = subject.split(".", 4)
    if notice.workload_id != workload:
        raise ValidationError(
            "workload_id", f"{notice.workload_id!r} is not the subject's {workload!r}"
        )
    if subjects.allocation_token(notice.allocation) != allocation:
        raise ValidationError(
            "allocation", f"{notice.allocation!r} is not the subject's {allocation!r}"
        )
    mine = environ.get("ALLOT_WORKLOAD_ID") == workload
    if mine and str(notice.attempt) != environ.get("ALLOT_ATTEMPT", str(notice.attempt)):
        raise ValidationError(
            "attempt", f"{notice.attempt} is not this run's ({environ.get('ALLOT_ATTEMPT')})"
        )


def _require_name(name: str, field: str) -> str:
    """``name`` if the wire takes it as a name or id (``messages.Name``). ``validate_token``
    alone lets through what a service then refuses (``'ünï'`` is a NATS token, not a
    name): a status query got a ``CommandRejected``, a subscription waited for nothing."""
    subjects.validate_token(name, field)
    if _NAME.match(name) is None:
        raise ValidationError(field, f"{codec.PATTERN_WORDS[m.NAME_PATTERN]}, got {name!r}")
    return name


def _require_seconds(field: str, value: float | None) -> None:
    """Refuse ``value`` unless it is a usable wait (None passes: the caller's default). NaN
    made a deadline no clock reaches (a watch hung forever), and zero or less timed out
    at once, reported as a silent service."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field, f"must be a number of seconds, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValidationError(field, f"must be a positive number of seconds, got {value!r}")


def _require_finite(value: object, path: str) -> None:
    """msgspec writes NaN and infinity as JSON null, which the service then reads as "not
    given" (a NaN duration became no duration): refuse them here, naming the field."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValidationError(path, f"must be a finite number, got {value!r}")
    if isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            _require_finite(getattr(value, name), f"{path}.{name}" if path else name)
    elif isinstance(value, tuple | list):
        for i, item in enumerate(value):
            _require_finite(item, f"{path}[{i}]")


def sender(login: str | None, field: str, given: str | None) -> str:
    """The name a command records for its sender: ``given``, or ``login`` when None; with a
    login, any other name is refused (``ValidationError(field)``), as the service would
    refuse it on the login's subject."""
    if given is None:
        if login is None:
            raise ValidationError(
                field, "must be given: the connection has no NATS login to take it from"
            )
        return login
    if login is not None and given != login:
        raise ValidationError(field, f"{given!r} differs from the login {login!r}")
    return given


def _scoped(query: str, scope: str | None) -> str:
    """The cluster-wide query subject, or its per-allocation form for ``scope``."""
    if scope is None:
        return query
    allocation = None if scope == subjects.UNALLOCATED else _require_name(scope, "scope")
    return subjects.query_scoped(query, allocation)


class PreemptionSubscription:
    """Handle returned by ``Client.on_preemption`` (and ``Client.on_idle``)."""

    def __init__(self, sub: Subscription, subject: str) -> None:
        self._sub = sub
        self.subject = subject

    async def unsubscribe(self) -> None:
        await self._sub.unsubscribe()


class Client:
    """One NATS connection. ``async with Client(nats_url=...) as c:`` or
    ``c = await Client.connect(...)`` then ``await c.close()``."""

    def __init__(
        self,
        nats_url: str = DEFAULT_NATS_URL,
        *,
        name: str = "allot-sdk",
        timeout: float = 5.0,
        retries: int = 2,
        connect_timeout: int = 2,
    ) -> None:
        if retries < 0:
            raise ValidationError("retries", f"must be >= 0, got {retries}")
        _require_seconds("timeout", timeout)
        _require_seconds("connect_timeout", connect_timeout)
        self.nats_url = nats_url
        self.name = name
        self.login = login_for(nats_url, os.environ)
        """The NATS login this client speaks as (None: no auth): the name its commands
        record for their sender (``identity``)."""
        self.timeout = timeout
        self.retries = retries
        self.connect_timeout = connect_timeout
        self._nc: NatsClient | None = None
        self._refusals: dict[str, list[asyncio.Future[None]]] = {}
        """Requests in flight by lowercased subject, woken when the server refuses it."""
        self._on_connection: list[Callable[[bool], None]] = []

    # -- connection ----------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        nats_url: str = DEFAULT_NATS_URL,
        *,
        name: str = "allot-sdk",
        timeout: float = 5.0,
        retries: int = 2,
    ) -> Client:
        client = cls(nats_url, name=name, timeout=timeout, retries=retries)
        await client.open()
        return client

    async def open(self) -> None:
        if self._nc is not None:
            return
        failed = asyncio.Event()
        errors: list[BaseException] = []

        async def on_error(exc: Exception) -> None:
            # nats-py prints every connection error to stderr by default; a CLI user gets
            # one clear line from us instead. A refused first connection fails fast.
            log.debug("nats error: %s", exc)
            denied = _DENIED_PUBLISH.search(str(exc)) or _DENIED_SUBSCRIBE.search(str(exc))
            if denied is not None:
                # nats-py lowercases the server's error line, subject included.
                for waiter in self._refusals.get(denied.group(1).lower(), ()):
                    if not waiter.done():
                        waiter.set_result(None)
            elif self._nc is None:
                errors.append(exc)
                failed.set()

        # nats-py keeps retrying an unreachable server inside connect(), whatever
        # allow_reconnect says: bound the first connection ourselves. Once connected,
        # reconnect forever: a training loop must keep receiving preemption notices.
        nc = NatsClient()

        async def disconnected() -> None:
            self._connection_changed(nc, False)

        async def reconnected() -> None:
            self._connection_changed(nc, True)

        connecting = asyncio.ensure_future(
            nc.connect(
                server_urls(self.nats_url),
                name=self.name,
                connect_timeout=max(1, math.ceil(self.connect_timeout)),
                max_reconnect_attempts=-1,
                reconnect_time_wait=1,
                error_cb=on_error,
                disconnected_cb=disconnected,
                reconnected_cb=reconnected,
                # A user reads replies only under its own inbox prefix (allot auth gen).
                inbox_prefix=inbox_prefix_for_url(self.nats_url),
                tls=client_tls(self.nats_url),
            )
        )
        gave_up = asyncio.ensure_future(failed.wait())
        await asyncio.wait(
            {connecting, gave_up},
            timeout=self.connect_timeout + 1.0,
            return_when=asyncio.FIRST_COMPLETED,
        )
        gave_up.cancel()
        if connecting.done() and connecting.exception() is None:
            self._nc = nc
            return
        if connecting.done() and not connecting.cancelled():
            errors.append(connecting.exception() or RuntimeError("no connection"))
        connecting.cancel()
        with contextlib.suppress(BaseException):
            await connecting
        with contextlib.suppress(Exception):
            await nc.close()
        texts = [str(e) or type(e).__name__ for e in errors]
        detail = texts[-1] if texts else "timed out"
        where = masked_url(self.nats_url)
        # A refused login may be followed by the server closing the socket (an EOF error
        # after it): any error saying so is the answer.
        refusal = next((t for t in texts if _LOGIN_REFUSED in t.lower()), None)
        if refusal is not None:
            raise LoginRefusedError(
                f"NATS at {where} refused the login ({refusal}): check the user and password "
                "in ALLOT_NATS_URL (or ALLOT_NATS_USER and ALLOT_NATS_PASSWORD)"
            )
        untrusted = next((e for e in errors if isinstance(e, ssl.SSLCertVerificationError)), None)
        if untrusted is not None:
            raise NotConnectedError(
                f"NATS at {where} answered, but its TLS certificate is not trusted "
                f"({untrusted.verify_message}): set {CA_ENV} to the CA file that signed it "
                "(allot up --secure and allot auth gen --tls write it into each user's env "
                "file)"
            )
        raise NotConnectedError(
            f"cannot reach NATS at {where}: is the stack running? (allot up) [{detail}]"
        )

    def on_connection(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(False)`` each time the connection to NATS is lost (the client
        reconnects on its own, forever) and ``callback(True)`` once it is back; not when
        this client is closed. While it is lost, nothing is heard: a subscription of core
        NATS (``on_idle``, ``on_preemption``) misses what was sent meanwhile."""
        self._on_connection.append(callback)

    def _connection_changed(self, nc: NatsClient, up: bool) -> None:
        if self._nc is not nc:  # closing, or a first connection that was given up
            return
        for callback in list(self._on_connection):
            try:
                callback(up)
            except Exception:  # a caller's callback must not end nats-py's reconnect loop
                log.exception("connection callback failed")

    async def close(self) -> None:
        if self._nc is not None:
            nc, self._nc = self._nc, None
            if not nc.is_closed:
                await nc.close()

    async def __aenter__(self) -> Client:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def nc(self) -> NatsClient:
        if self._nc is None:
            raise NotConnectedError("the client is not connected (use `await Client.connect(...)`)")
        return self._nc

    def identity(self, field: str, given: str | None) -> str:
        """The name a command records for its sender (``field``: ``user``, ``set_by``,
        ``operator``): ``sender`` with this client's login."""
        return sender(self.login, field, given)

    # -- requests ------------------------------------------------------------------------------

    async def _request(
        self,
        subject: str,
        body: bytes,
        decoder: msgspec.json.Decoder[T],
        who: str,
        timeout: float | None,
    ) -> T:
        _require_seconds("timeout", timeout)
        wait = self.timeout if timeout is None else timeout
        attempts = self.retries + 1
        loop = asyncio.get_running_loop()
        attempt, give_up_at = 0, None
        # One id for every attempt: a submission an earlier attempt stored is then answered
        # as this request's, not as a duplicate (subjects.REQUEST_ID_HEADER).
        headers = {subjects.REQUEST_ID_HEADER: uuid.uuid4().hex}
        refused = self._watch_refusal(subject)
        try:
            while attempt < attempts:
                try:
                    reply: Msg = await self._unless_refused(
                        self.nc.request(subject, body, timeout=wait, headers=headers),
                        refused,
                        subject,
                    )
                except nats.errors.NoRespondersError:
                    if give_up_at is None:  # no attempt reached anyone: certainly not done
                        raise NoResponderError(subject, who) from None
                    # An earlier attempt reached a service that never answered (killed after
                    # acting, before replying): its outcome is unknown, so "nobody listens
                    # now" must not be reported as "not done". Ask again while the service
                    # restarts (the same bytes: idempotent), up to ``wait`` after that timeout;
                    # then the outcome stays unknown (``RequestTimeoutError``).
                    if loop.time() >= give_up_at:
                        break
                    await asyncio.sleep(NO_RESPONDER_PAUSE_S)
                    continue
                except nats.errors.TimeoutError:
                    attempt += 1
                    give_up_at = loop.time() + wait
                    log.debug("request on %s timed out (attempt %d)", subject, attempt)
                    continue
                except nats.errors.ConnectionClosedError:
                    raise NotConnectedError(
                        f"the connection to {masked_url(self.nats_url)} is closed"
                    ) from None
                try:
                    return decoder.decode(reply.data)
                except (msgspec.DecodeError, RecursionError) as exc:
                    raise BadReplyError(
                        f"{who} answered {subject} with an unexpected message: {exc}"
                    ) from None
            if not self.nc.is_connected:
                # The server is gone, not the service: say so (a NATS outage must not read
                # as "placement leader did not answer"). Like a timeout, the outcome is
                # unknown: a request sent before the outage may have been done.
                raise NotConnectedError(
                    f"NATS at {masked_url(self.nats_url)} is unreachable (reconnecting): no "
                    f"answer on {subject} from the {who}; whether it was done is unknown"
                )
            raise RequestTimeoutError(subject, who, wait, attempts)
        finally:
            self._unwatch_refusal(subject, refused)

    def _watch_refusal(self, subject: str) -> asyncio.Future[None]:
        """A future the error callback completes if nats-server refuses ``subject`` for this
        user (a publish or a subscription); give it back with ``_unwatch_refusal``."""
        refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._refusals.setdefault(subject.lower(), []).append(refused)
        return refused

    def _unwatch_refusal(self, subject: str, refused: asyncio.Future[None]) -> None:
        waiters = self._refusals[subject.lower()]
        waiters.remove(refused)
        if not waiters:
            del self._refusals[subject.lower()]

    @staticmethod
    async def _unless_refused(
        request: Awaitable[T], refused: asyncio.Future[None], subject: str
    ) -> T:
        """``request``'s reply, or ``PermissionDeniedError`` as soon as the server refuses
        the subject (nats-py reports that only to the error callback; the request itself
        would wait for its timeout, three times)."""
        task = asyncio.ensure_future(request)
        either: set[asyncio.Future[Any]] = {task, refused}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise PermissionDeniedError(subject)
        return task.result()

    async def _ask(
        self,
        subject: str,
        body: bytes,
        decoder: msgspec.json.Decoder[T | m.CommandRejected],
        who: str,
        timeout: float | None,
    ) -> T:
        """``_request`` whose ``CommandRejected`` answer is raised as the refusal it is,
        naming the field (not a ``BadReplyError``: "unexpected message")."""
        reply = await self._request(subject, body, decoder, who, timeout)
        if isinstance(reply, m.CommandRejected):
            raise CommandRejectedError(reply.field, reply.reason)
        return reply

    async def submit(
        self,
        *,
        client_id: str | None = None,
        user: str | None = None,
        gpus: int,
        allocation: str | None = None,
        min_runtime_s: int = 0,
        resumable: bool = True,
        kind: str = "training",
        priority: int = 0,
        command: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        duration_s: float | None = None,
        timeout: float | None = None,
        checkpoint_signal: str | None = None,
        checkpoint_timeout_s: float | None = None,
        checkpoint_dir: str | None = None,
    ) -> m.WorkloadAccepted:
        """Submit a workload; raises ``SubmitRejectedError`` (a ``ValidationError``) when intake
        refuses it. Retrying with the same ``client_id`` never queues a second workload
        (the reply then says ``duplicate=True``); without one, a fresh id is used for this
        call (and its retries).

        The scheduling contract: work is *allocated* (protected for ``min_runtime_s``,
        charged to ``allocation``) only with an ``allocation`` AND ``min_runtime_s > 0``.
        With the default ``min_runtime_s=0`` it is unallocated even when ``allocation``
        is given: free, never charged, preemptible at any moment.

        ``env``: environment variables for the workload's processes (sbatch's ``--export
        NAME=VALUE``); the names the agent sets itself (``messages.RESERVED_ENV``:
        ``CUDA_VISIBLE_DEVICES``, ``ALLOT_WORKLOAD_ID``, ...) are refused.

        ``user``: who submits (default: the login; see the module docstring).

        The checkpoint protocol (issue 40; docs/user-guide.md): ``checkpoint_signal``
        (``"USR1"``...) is sent at a notice before SIGTERM, ``checkpoint_timeout_s`` bounds
        the checkpoint (at most the grace period), ``checkpoint_dir`` names a directory on
        shared storage (default: one the agents manage); any of them turns it on."""
        user = self.identity("user", user)
        if checkpoint_signal is not None:
            checkpoint_signal = parse_signal(checkpoint_signal)
        check_checkpoint(
            signal=checkpoint_signal,
            timeout_s=checkpoint_timeout_s,
            directory=checkpoint_dir,
            grace_s=None,  # intake knows it
        )
        msg = m.SubmitWorkload(
            client_id=new_client_id() if client_id is None else client_id,
            user=user,
            gpus=gpus,
            allocation=allocation,
            min_runtime_s=min_runtime_s,
            resumable=resumable,
            kind=kind,
            priority=priority,
            command=_argv(command),
            env=check_env({} if env is None else env),
            duration_s=duration_s,
            checkpoint_signal=checkpoint_signal,  # type: ignore[arg-type]  # checked above
            checkpoint_timeout_s=checkpoint_timeout_s,
            checkpoint_dir=checkpoint_dir,
        )
        body = _checked(msg)
        subject = subjects.submit_as(allocation, user)
        reply = await self._request(subject, body, _SUBMIT_REPLY, INTAKE, timeout)
        if isinstance(reply, m.WorkloadRejected):
            raise SubmitRejectedError(reply.field, reply.reason, reply.client_id)
        return reply

    async def start_session(
        self,
        *,
        allocation: str,
        gpus: int,
        min_runtime_s: int,
        command: Sequence[str] = (),
        client_id: str | None = None,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        checkpoint_signal: str | None = None,
        checkpoint_timeout_s: float | None = None,
        duration_s: float | None = None,
        timeout: float | None = None,
    ) -> m.WorkloadAccepted:
        """An interactive session (issue 40): an allocated workload of kind ``session``
        whose ``ALLOT_SESSION_DIR`` the agent saves after a notice and restores at its next
        placement (same id, original submit time: an ordinary resumable workload to the
        policy). ``session(id)`` tells where it runs now."""
        return await self.submit(
            client_id=client_id,
            user=user,
            gpus=gpus,
            allocation=allocation,
            min_runtime_s=min_runtime_s,
            kind=m.SESSION_KIND,
            command=command,
            env=env,
            duration_s=duration_s,
            timeout=timeout,
            checkpoint_signal=checkpoint_signal,
            checkpoint_timeout_s=checkpoint_timeout_s,
        )

    async def session(
        self, workload_id: str, *, scope: str | None = None, timeout: float | None = None
    ) -> m.WorkloadStatus:
        """Where a session runs now: ``assignment`` (hosts), ``attempt``, ``checkpoint_dir``
        (its saved state) and ``checkpoints`` (each preemption's outcome); ``ValidationError``
        naming ``workload_id`` for work that is not a session."""
        status = await self.status(workload_id, scope=scope, timeout=timeout)
        if status.state != "unknown" and status.kind != m.SESSION_KIND:
            raise ValidationError(
                "workload_id", f"{workload_id} is a {status.kind!r}, not a session"
            )
        return status

    async def submit_batch(
        self, workloads: Sequence[m.SubmitWorkload], *, timeout: float | None = None
    ) -> list[m.WorkloadAccepted | m.WorkloadRejected]:
        """Submit many workloads in few requests (``SubmitBatch``, as Armada's job sets):
        one result per workload, in order; a refused item is a ``WorkloadRejected`` naming
        ``workloads[i].<field>``, the others are queued. Items are sent per allocation in
        batches of at most ``MAX_BATCH`` and 64 KiB (and per ``user``: each batch goes to
        its sender's identity subject). A bad item fails the whole call locally
        (``ValidationError`` naming ``workloads[i]...``) before anything is sent; so does,
        with a login, an item whose ``user`` is not the login."""
        groups: dict[tuple[str | None, str], list[tuple[int, bytes]]] = {}
        for i, item in enumerate(workloads):
            if not isinstance(item, m.SubmitWorkload):
                raise ValidationError(
                    f"workloads[{i}]", f"must be a SubmitWorkload, got {type(item).__name__}"
                )
            try:
                self.identity("user", item.user)
                body = _submission(item)
            except ValidationError as e:
                raise ValidationError(f"workloads[{i}].{e.field}", e.reason) from None
            groups.setdefault((item.allocation, item.user), []).append((i, body))
        results: list[m.WorkloadAccepted | m.WorkloadRejected | None] = [None] * len(workloads)
        gate = asyncio.Semaphore(BATCHES_IN_FLIGHT)

        async def send(group: tuple[str | None, str], chunk: list[tuple[int, bytes]]) -> None:
            body = b'{"type":"SubmitBatch","workloads":[' + b",".join(b for _, b in chunk) + b"]}"
            async with gate:
                reply = await self._request(
                    subjects.submit_as(*group), body, _BATCH_REPLY, INTAKE, timeout
                )
            if isinstance(reply, m.WorkloadRejected):  # the whole body: one item near 64 KiB
                raise SubmitRejectedError(reply.field, reply.reason, reply.client_id)
            if len(reply.results) != len(chunk):
                raise BadReplyError(
                    f"{INTAKE} answered {len(reply.results)} results to {len(chunk)} workloads"
                )
            for (i, _), answer in zip(chunk, reply.results, strict=True):
                if isinstance(answer, m.WorkloadRejected):  # name the caller's index
                    field = f"workloads[{i}].{codec.item_field(answer.field)}"
                    results[i] = msgspec.structs.replace(answer, field=field)
                else:
                    results[i] = answer

        sends = []
        for group, bodies in groups.items():
            chunk: list[tuple[int, bytes]] = []
            size = 0
            for entry in bodies:
                if chunk and (len(chunk) == m.MAX_BATCH or size + len(entry[1]) > _BATCH_ROOM):
                    sends.append(send(group, chunk))
                    chunk, size = [], 0
                chunk.append(entry)
                size += len(entry[1]) + 1
            sends.append(send(group, chunk))
        await asyncio.gather(*sends)
        answered = [r for r in results if r is not None]
        assert len(answered) == len(workloads)  # every chunk filled its own places
        return answered

    async def cancel(
        self,
        workload_id: str,
        *,
        allocation: str | None,
        user: str | None = None,
        reason: str = "",
        as_operator: bool = False,
        as_manager: bool = False,
        timeout: float | None = None,
    ) -> m.CommandAccepted:
        """Cancel a pending or running workload; ``allocation`` None means unallocated. Only
        its owner may (``user``, default the login), unless ``as_operator``: then ``user``
        names an operator, the request goes to the operators' form
        (``...<w>.operator.<user>``, which ``allot auth gen`` grants only to operators)
        and anyone's workload may be cancelled; or unless ``as_manager``: then ``user``
        names a budget manager, and the managers' form (``...<w>.manager.<user>``) is
        granted only for the allocations of its subtree."""
        if as_operator and as_manager:
            raise ValidationError("as_manager", "a cancel is sent as an operator or a manager")
        user = self.identity("user", user)
        msg = m.CancelWorkload(
            workload_id=workload_id, user=user, allocation=allocation, reason=reason
        )
        form = subjects.OWNER
        if as_manager:
            form = subjects.MANAGER
        elif as_operator:
            form = subjects.OPERATOR
        body = _checked(msg)  # first: the subject would name a bad id "workload", not "workload_id"
        subject = subjects.cancel_as(allocation, workload_id, user, form)
        return await self._ask(subject, body, _COMMAND_REPLY, INTAKE, timeout)

    async def status(
        self, workload_id: str, *, scope: str | None = None, timeout: float | None = None
    ) -> m.WorkloadStatus:
        """One workload's state. ``scope`` (an allocation, ``~`` for unallocated work) asks
        the per-allocation subject a team is granted: another allocation's workload is
        then ``unknown``. Without it, the cluster-wide subject (operators, managers)."""
        _require_name(workload_id, "workload_id")  # worded as watch and on_preemption word it
        body = _checked(m.StatusQuery(workload_id=workload_id))
        subject = _scoped(subjects.QUERY_STATUS, scope)
        return await self._ask(subject, body, _STATUS_REPLY, PLACEMENT, timeout)

    async def queue(
        self, *, scope: str | None = None, timeout: float | None = None
    ) -> m.QueueSnapshot:
        """Pending work in service order; with ``scope``, that allocation's rows only (their
        positions stay cluster-wide)."""
        subject = _scoped(subjects.QUERY_QUEUE, scope)
        return await self._ask(subject, b"", _QUEUE_REPLY, PLACEMENT, timeout)

    async def prio(
        self, *, scope: str | None = None, timeout: float | None = None
    ) -> m.PrioSnapshot:
        """``allot prio``: each pending workload's position broken into its inputs; with
        ``scope``, that allocation's rows only."""
        subject = _scoped(subjects.QUERY_PRIO, scope)
        return await self._ask(subject, b"", _PRIO_REPLY, PLACEMENT, timeout)

    async def hosts(self, *, timeout: float | None = None) -> m.HostsSnapshot:
        """Every host, page by page (one answer holds as many rows as one NATS message
        does), as one snapshot with the first page's time; ``timeout`` per page."""
        first = await self.hosts_page(timeout=timeout)
        rows = list(first.hosts)
        page = first
        while page.hosts and len(rows) < page.total:
            page = await self.hosts_page(after=rows[-1].host, timeout=timeout)
            rows.extend(page.hosts)
        return m.HostsSnapshot(at=first.at, hosts=tuple(rows), total=len(rows))

    async def hosts_page(
        self, *, after: str | None = None, timeout: float | None = None
    ) -> m.HostsSnapshot:
        """One page of ``allot hosts``: the hosts whose ids sort after ``after``."""
        body = b"" if after is None else _checked(m.HostsQuery(after=after))
        return await self._ask(subjects.QUERY_HOSTS, body, _HOSTS_REPLY, PLACEMENT, timeout)

    async def share(self, *, timeout: float | None = None) -> m.RankingUpdated:
        return await self._ask(subjects.QUERY_SHARE, b"", _SHARE_REPLY, RANKING, timeout)

    async def allocations(self, *, timeout: float | None = None) -> m.AllocationsSnapshot:
        """Held GPUs vs entitlement per allocation, now (placement leader)."""
        return await self._ask(
            subjects.QUERY_ALLOCATIONS, b"", _ALLOCATIONS_REPLY, PLACEMENT, timeout
        )

    async def placement_stats(self, *, timeout: float | None = None) -> m.PlacementStats:
        """The leader's scheduling-cycle duration histogram."""
        return await self._ask(
            subjects.QUERY_PLACEMENT_STATS, b"", _PLACEMENT_STATS_REPLY, PLACEMENT, timeout
        )

    async def owed(
        self, window_s: float = 7 * 86400.0, bucket_s: int = 3600, *, timeout: float | None = None
    ) -> m.OwedSnapshot:
        """Owed vs delivered GPU-hours per allocation over the last ``window_s`` (dashboard
        service; computed from the log as the simulator computes it)."""
        body = _checked(m.OwedQuery(window_s=window_s, bucket_s=bucket_s))
        return await self._ask(subjects.QUERY_OWED, body, _OWED_REPLY, DASHBOARD, timeout)

    async def usage(
        self, window_s: int = 7 * 86400, *, timeout: float | None = None
    ) -> m.UsageSnapshot:
        """The GPU-seconds charged to each allocation over the last ``window_s`` (accounting
        service; running work counted up to ``charged_until``)."""
        body = _checked(m.UsageQuery(window_s=window_s))
        return await self._ask(subjects.QUERY_USAGE, body, _USAGE_REPLY, ACCOUNTING, timeout)

    async def history_page(
        self,
        stream: str,
        *,
        start_seq: int | None = None,
        start_time: float | None = None,
        limit: int = 500,
        idle: bool = False,
        rankings: bool = False,
        subject: str = subjects.QUERY_HISTORY,
        timeout: float | None = None,
    ) -> m.HistoryPage:
        """One page of a log stream (``WORKLOADS``, ``HOSTS``, or ``USAGE``: its budget
        trees, with ``idle`` its idle records, with ``rankings`` its rankings), read by the
        ranking service for a login
        that may not read the log itself (operators, managers, the dashboard); ask again
        from ``next_seq`` until ``end``. ``subject``: ``subjects.DASHBOARD_LOG`` for the
        dashboard's own reads."""
        query = m.HistoryQuery(
            stream=stream,  # type: ignore[arg-type]  # checked by _checked
            start_seq=start_seq,
            start_time=start_time,
            limit=limit,
            idle=idle,
            rankings=rankings,
        )
        body = _checked(query)
        return await self._ask(subject, body, _HISTORY_REPLY, RANKING, timeout)

    async def idle(
        self, *, scope: str | None = None, timeout: float | None = None
    ) -> m.IdleSnapshot:
        """The runs flagged idle now (health service); with ``scope``, that allocation's
        (what a team is granted)."""
        if scope == subjects.UNALLOCATED:
            raise ValidationError("scope", "unallocated work is never flagged idle")
        subject = _scoped(subjects.QUERY_IDLE, scope)
        return await self._ask(subject, b"", _IDLE_REPLY, HEALTH, timeout)

    async def on_idle(
        self, callback: IdleCallback, *, allocation: str, workload_id: str | None = None
    ) -> PreemptionSubscription:
        """Call ``callback(record)`` (sync or async) for each ``WorkloadFlaggedIdle`` and
        ``WorkloadIdleCleared`` of ``allocation``'s workloads (of ``workload_id`` only, when
        given) from now on (core NATS: what the health service appends to USAGE reaches
        subscribers as it is stored)."""
        _require_name(allocation, "allocation")
        if workload_id is None:
            subject = subjects.allocation_idle(allocation)
        else:
            subject = subjects.idle(allocation, _require_name(workload_id, "workload_id"))
        return await self._on_messages(subject, Kind.IDLE, callback, "idle record")

    async def drain(
        self,
        host: str,
        *,
        operator: str | None = None,
        reason: str = "",
        timeout: float | None = None,
    ) -> m.CommandAccepted:
        """Drain ``host``; ``operator``: who (default: the login)."""
        operator = self.identity("operator", operator)
        msg = m.DrainHost(host=host, operator=operator, reason=reason)
        body = _checked(msg)
        subject = subjects.drain_as(host, operator)
        return await self._ask(subject, body, _COMMAND_REPLY, HEALTH, timeout)

    async def undrain(
        self, host: str, *, operator: str | None = None, timeout: float | None = None
    ) -> m.CommandAccepted:
        """Return a drained ``host``; ``operator``: who (default: the login)."""
        operator = self.identity("operator", operator)
        msg = m.UndrainHost(host=host, operator=operator)
        body = _checked(msg)
        subject = subjects.undrain_as(host, operator)
        return await self._ask(subject, body, _COMMAND_REPLY, HEALTH, timeout)

    async def set_budget(
        self,
        path: Sequence[str],
        shares: int | None,
        *,
        set_by: str | None = None,
        timeout: float | None = None,
    ) -> m.CommandAccepted:
        """Set the shares of the node at ``path`` (``("root", "nlp", "pretrain")``);
        ``shares`` None is Slurm's ``parent``. ``set_by``: who (default: the login)."""
        set_by = self.identity("set_by", set_by)
        subjects.budget_set(path)  # first: a string, or a path not from the root, is "path"
        body = _checked(m.SetBudget(path=tuple(path), shares=shares, set_by=set_by))
        subject = subjects.budget_set_as(path, set_by)
        return await self._ask(subject, body, _COMMAND_REPLY, BUDGETS, timeout)

    # -- following -----------------------------------------------------------------------------

    async def watch(
        self,
        workload_id: str,
        allocation: str | None,
        *,
        idle_timeout: float | None = None,
        missing_after: float | None = MISSING_AFTER_S,
    ) -> AsyncGenerator[msgspec.Struct, None]:
        """Every record of one workload (lifecycle events and preemption notices) from the
        beginning of the log, then live; stops after a terminal one (see
        ``allot.sdk.lifecycle``). ``allocation`` None means unallocated. ``idle_timeout``:
        raise ``RequestTimeoutError`` when nothing arrives for that long (default: wait).
        An empty ``allocation`` (``ALLOT_ALLOCATION`` of unallocated work) is None.

        A workload the log has no record of would be waited for forever: while nothing of it
        has come, every ``missing_after`` seconds (None: never ask) the placement leader is
        asked, and if it does not know the workload under ``allocation`` either,
        ``UnknownWorkloadError`` (a ``ValidationError`` of ``workload_id``) is raised. Both
        must miss it: the log is read first, so a workload whose submission was answered is
        never called unknown because the leader had not read it yet. Without a leader's
        answer (none elected, a failover) the watch waits and asks again."""
        allocation = None if allocation in ("", subjects.UNALLOCATED, None) else allocation
        _require_name(workload_id, "workload_id")
        if allocation is not None:
            _require_name(allocation, "allocation")
        _require_seconds("idle_timeout", idle_timeout)
        _require_seconds("missing_after", missing_after)
        events = subjects.workload_events(allocation, workload_id)
        feeds = [_LogFeed(self, allocation, workload_id, r) for r in ("events", "notices")]
        try:
            # Two watches (one filter each: nats-server 2.9 has no multi-subject filter),
            # merged by stream sequence so notices come in log order with the events.
            for feed in feeds:
                await feed.open()
        except CommandRejectedError as exc:
            for feed in feeds:
                await feed.close()
            if exc.field == "stream":
                raise SdkError(f"{exc.reason}: is the stack running? (allot up)") from None
            raise
        except BaseException:
            for feed in feeds:
                await feed.close()
            raise
        subs = feeds
        ending = Ending()
        merged = _Merged(subs[0], subs[1])
        loop = asyncio.get_running_loop()
        deadline = None if idle_timeout is None else loop.time() + idle_timeout
        try:
            # Until the first record: the leader is asked every ``missing_after`` (one ask
            # that got no answer, a failover, must not leave a typo waiting forever).
            msg = None
            while msg is None:
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    break
                ask = missing_after is not None and (left is None or missing_after < left)
                msg = await merged.next(missing_after if ask else left)
                if msg is None and ask:
                    await self._require_workload(workload_id, allocation)
            while msg is not None:
                try:
                    record = decode_record(msg.subject, msg.data)
                except ValidationError as exc:
                    log.warning("record skipped on %s: %s", msg.subject, exc)
                else:
                    yield record
                    if ending.ends(record):
                        return
                msg = await merged.next(idle_timeout)
            raise RequestTimeoutError(events, "the log", idle_timeout or 0.0, 1)
        finally:
            # Closed by the garbage collector after the client itself was closed: nothing
            # left to unsubscribe from.
            if self._nc is not None and not self._nc.is_closed:
                for sub in subs:
                    await sub.close()

    async def _require_workload(self, workload_id: str, allocation: str | None) -> None:
        """``watch``'s check while the log has shown nothing of ``workload_id``: raise
        ``UnknownWorkloadError`` if the leader does not know it either (see ``watch``)."""
        scope = allocation or subjects.UNALLOCATED
        try:
            status = await self.status(workload_id, scope=scope, timeout=MISSING_ASK_TIMEOUT_S)
        except (NoResponderError, RequestTimeoutError, PermissionDeniedError, BadReplyError):
            return  # nobody to ask: the log alone serves the watch
        if status.state == "unknown":
            where = "unallocated work" if allocation is None else f"allocation {allocation!r}"
            raise UnknownWorkloadError(
                "workload_id", f"no workload {workload_id!r} in {where} (the log has no record)"
            )

    async def on_preemption(
        self,
        callback: PreemptionCallback,
        *,
        allocation: str | None = None,
        workload_id: str | None = None,
        checkpoint: CheckpointFn | None = None,
    ) -> PreemptionSubscription:
        """Call ``callback(notice)`` (sync or async) for each preemption notice published
        from now on: of one workload (``workload_id``; with ``allocation`` when known, any
        allocation otherwise), of one allocation's workloads (``allocation`` only; pass
        ``subjects.UNALLOCATED`` for unallocated work), or of all (neither). An exception
        in the callback is logged; later notices still arrive. An empty ``allocation``
        (``ALLOT_ALLOCATION`` of unallocated work, as the agent sets it) means unallocated,
        as ``subjects.UNALLOCATED`` does. ``checkpoint``: inside a workload under the
        checkpoint protocol, ``checkpoint(notice)`` runs after ``callback`` and, if it
        returns, confirms the checkpoint to the agent (``checkpointing.confirm_checkpoint``)."""
        if checkpoint is not None:
            callback = confirming(callback, checkpoint)
        if allocation == "":
            allocation = None if workload_id is not None else subjects.UNALLOCATED
        # Checked as names, not only as tokens: a subscription to a subject no service
        # ever publishes on waits silently for notices that never come.
        if workload_id is not None:
            _require_name(workload_id, "workload_id")
        if allocation is not None and allocation != subjects.UNALLOCATED:
            _require_name(allocation, "allocation")
        if workload_id is not None:
            if allocation is None:
                token = subjects.validate_token(workload_id, "workload_id")
                subject = f"{subjects.PREFIX}.preempt.*.{token}"
            else:
                subject = subjects.preempt(allocation, workload_id)
        elif allocation is not None:
            subject = subjects.allocation_preempt(allocation)
        else:
            subject = subjects.ALL_PREEMPT

        return await self._on_messages(subject, Kind.PREEMPT, callback, "notice")

    async def _on_messages(
        self, subject: str, kind: Kind, callback: Callable[[Any], Any], what: str
    ) -> PreemptionSubscription:
        """Subscribe ``subject``: each message decoded as ``kind`` goes to ``callback``
        (sync or async); one that does not decode, or a copy the log delivered there
        (``allot.bus.replays``), is skipped, a callback's exception logged, and later
        messages still arrive."""

        async def handle(msg: Msg) -> None:
            if jetstream_delivery(msg):
                log.warning("%s skipped on %s: a copy delivered from the log", what, msg.subject)
                return
            try:
                record = codec.decode(kind, msg.data)
                if isinstance(record, m.PreemptionNotice):
                    check_notice(record, msg.subject, os.environ)
            except ValidationError as exc:
                log.warning("%s skipped on %s: %s", what, msg.subject, exc)
                return
            try:
                result: Any = callback(record)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("%s callback failed on %s", what, msg.subject)

        if not callable(callback):
            raise ValidationError("callback", f"must be callable, got {type(callback).__name__}")
        sub = await self._subscribe(subject, handle)
        return PreemptionSubscription(sub, subject)

    async def _subscribe(
        self, subject: str, cb: Callable[[Msg], Awaitable[None]] | None = None
    ) -> Subscription:
        """A subscription in place once this returns (nothing published after it is lost),
        or ``PermissionDeniedError``: the server's refusal, if any, has come before the
        round trip ends (nats-py hands it to the error callback in order), so a user whose
        role does not allow ``subject`` is told so, not left waiting for what never comes."""
        refused = self._watch_refusal(subject)
        try:
            sub = await self.nc.subscribe(subject, cb=cb)
            await confirm_subscriptions(self.nc)
        finally:
            self._unwatch_refusal(subject, refused)
        if refused.done():
            await sub.unsubscribe()
            raise PermissionDeniedError(subject)
        return sub


_WATCH_REPLY = msgspec.json.Decoder(m.WatchStarted | m.CommandRejected)
_HEARTBEAT_STATUS = "100"
SILENT_HEARTBEATS = 3
"""A watch that hears neither a record nor a heartbeat for this many heartbeats is asked
for again from where it stopped (the server restarted, the consumer expired)."""


class _LogFeed:
    """One workload's events or notices, read through a consumer the services create for
    the asker (``WatchLog``; ``allot.bus.log_watch``): teams never touch the JetStream API.
    Like nats-py's ordered consumer, a gap in the consumer's sequence, or silence past
    ``SILENT_HEARTBEATS`` heartbeats, opens a new watch after the last record seen."""

    def __init__(
        self, client: Client, allocation: str | None, workload_id: str, records: str
    ) -> None:
        self.client = client
        self.allocation = allocation
        self.workload_id = workload_id
        self.records = records
        self.sub: Subscription | None = None
        self.consumer = ""
        self.last_stream = 0
        self.last_consumer = 0
        self.silence_s = 3.0
        self.heard = 0.0

    async def open(self) -> None:
        """Ask for a watch from the record after the last one seen (raises what the ask
        raises: ``PermissionDeniedError``, ``NoResponderError``, ``CommandRejectedError``)."""
        await self.close()
        deliver = uuid.uuid4().hex
        sub = await self.client._subscribe(subjects.watched(self.allocation, deliver))
        body = _checked(
            m.WatchLog(
                workload_id=self.workload_id,
                records="events" if self.records == "events" else "notices",
                deliver=deliver,
                start_seq=self.last_stream + 1 if self.last_stream else 0,
            )
        )
        try:
            started = await self.client._ask(
                subjects.watch(self.allocation), body, _WATCH_REPLY, INTAKE, None
            )
        except BaseException:
            await sub.unsubscribe()
            raise
        self.sub, self.consumer, self.last_consumer = sub, started.consumer, 0
        self.silence_s = SILENT_HEARTBEATS * started.heartbeat_s
        self.heard = asyncio.get_running_loop().time()

    async def close(self) -> None:
        if self.sub is not None:
            sub, self.sub = self.sub, None
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def _reopen(self, why: str) -> None:
        log.debug("watch of %s %s asked again: %s", self.workload_id, self.records, why)
        try:
            await self.open()
        except (SdkError, nats.errors.Error) as exc:  # nobody answers now: try again later
            log.debug("watch not reopened: %s", exc)
            self.heard = asyncio.get_running_loop().time()

    async def next_msg(self, timeout: float) -> Msg:
        """The next record, or ``nats.errors.TimeoutError`` after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if loop.time() - self.heard > self.silence_s:
                await self._reopen("silent")
            left = deadline - loop.time()
            if left <= 0 or self.sub is None:
                raise nats.errors.TimeoutError
            msg = await self.sub.next_msg(timeout=min(left, self.silence_s))
            self.heard = loop.time()
            if msg.headers and msg.headers.get("Status") == _HEARTBEAT_STATUS:
                last = int(msg.headers.get("Nats-Last-Consumer", "0") or 0)
                if last > self.last_consumer:  # records were sent that never came
                    await self._reopen("gap at a heartbeat")
                continue
            if not msg.reply:
                continue
            meta = msg.metadata
            if meta.consumer != self.consumer or meta.sequence.stream <= self.last_stream:
                continue  # another watch's delivery, or one seen already
            if meta.sequence.consumer != self.last_consumer + 1:
                await self._reopen("gap")
                continue
            self.last_consumer = meta.sequence.consumer
            self.last_stream = meta.sequence.stream
            return msg


class _Merged:
    """Two watches (``_LogFeed``) of one stream read as one, by stream sequence.
    A record is handed out once the other side has had ``settle_s`` to show an earlier
    one (records of one workload are milliseconds apart at most when both exist)."""

    def __init__(self, a: Any, b: Any, settle_s: float = 0.05) -> None:
        self.subs = (a, b)
        self.heads: list[Msg | None] = [None, None]
        self.settle_s = settle_s

    async def _fill(self, i: int, timeout: float) -> None:
        if self.heads[i] is None:
            with contextlib.suppress(nats.errors.TimeoutError):
                self.heads[i] = await self.subs[i].next_msg(timeout=timeout)

    async def next(self, idle_timeout: float | None) -> Msg | None:
        loop = asyncio.get_running_loop()
        deadline = None if idle_timeout is None else loop.time() + idle_timeout
        while self.heads == [None, None]:
            step = 0.25 if deadline is None else min(0.25, max(0.0, deadline - loop.time()))
            await self._fill(0, max(step / 2, 0.001))
            await self._fill(1, 0.001 if self.heads[0] is not None else max(step / 2, 0.001))
            if deadline is not None and loop.time() >= deadline and self.heads == [None, None]:
                return None
        for i in (0, 1):  # give the empty side a moment to show an earlier record
            await self._fill(i, self.settle_s)
        seqs = [h.metadata.sequence.stream if h is not None else None for h in self.heads]
        later_first = seqs[1] is not None and (seqs[0] is None or seqs[1] < seqs[0])
        i = 1 if later_first else 0
        msg, self.heads[i] = self.heads[i], None
        return msg
