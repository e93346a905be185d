"""Intake: validates submissions and cancels, dedupes by ``client_id``, appends to the log.

``allot.v1.submit.<allocation>.<login>`` and ``allot.v1.submit.<allocation>`` (requests,
``SubmitWorkload``) are answered with
``WorkloadAccepted`` or ``WorkloadRejected(field, reason)``; a ``SubmitBatch`` of up to 256
is answered with ``SubmitBatchAnswered``, one of those per item in order, each item judged
by the same steps:

1. the body decodes (``allot.proto.codec``: types, ranges, unknown fields, duplicate keys,
   size, nesting), its ``user`` is the sender's login on the identity form
   ``allot.v1.submit.<allocation>.<login>`` (the only form ``allot auth gen`` grants a
   person; the bare form carries no login and checks none), and its ``allocation`` equals
   the subject's token (identity comes from the subject, never from the payload alone);
2. the allocation is a leaf of the current budget tree;
3. ``gpus`` is at most the GPUs registered in the cluster;
4. dedupe, forever and in one round trip: the workload id is derived from (allocation,
   client_id), and so is its submission's subject ``allot.v1.events.<allocation>.<id>.submitted``,
   which holds nothing else. Intake appends ``WorkloadSubmitted`` with
   ``Nats-Expected-Last-Subject-Sequence: 0``, so JetStream stores it only if that subject
   holds nothing yet (the check and the write are one atomic step in the stream's leader),
   and with ``Nats-Msg-Id = submitted:<id>`` for a retry inside the duplicate window. A
   repeat, now or months later, is refused by the stream; intake then reads the first
   submission (the subject's first record) and compares what the submitter chose: every
   field of ``SubmitWorkload`` (user, gpus, min_runtime_s, resumable, kind, priority,
   command, duration_s; client_id and allocation are equal by construction), not the
   server's time or trace context. The same values are a retry, answered with the first
   submission's time and ``duplicate=True`` (so is, rarely, a first submission whose append
   was acknowledged only on its second try: ``allot.bus.PUBLISH_ATTEMPTS``); other
   values are refused naming ``client_id`` and each field that differs, the first
   submission's value first ("gpus 1, not 2"), as Stripe refuses an idempotency key reused
   with other parameters. A first submission only appends, so this costs nothing until a
   client_id comes again.
   The log is the only record: no key can stand for a workload the log lacks.
   Appends go through ``allot.bus.group_commit``: a backlog of submissions (a
   ``SubmitBatch``, many clients at once) is committed as atomic batches, with the same
   conditions and msg ids, and each submission keeps its own answer.

``allot.v1.cancel.<allocation>.<workload>.user.<login>`` (``CancelWorkload``; also the
bare ``allot.v1.cancel.<allocation>.<workload>``), answered with ``CommandAccepted`` or
``CommandRejected(field, reason)``. Its ``user`` must be the subject's login (identity
forms), its ``workload_id`` the subject's, and its ``allocation`` the subject's (left out,
it means the subject's). The workload's submission and its latest record are read at once,
then:

1. the workload must exist under that allocation (its ``submitted`` record), else
   ``workload_id`` is refused;
2. ``user`` must be the submission's ``user``: only the owner cancels a workload, as only
   the owner (or an operator) may ``scancel`` a Slurm job. Under ``allot auth gen``'s
   credentials both names are logins (the submission's and the cancel's were checked
   against their subjects), so only the login that submitted may cancel; without auth
   they are what the senders wrote. On ``...<w>.operator.<login>`` and
   ``...<w>.manager.<login>`` (``subjects.ON_BEHALF``: ``allot auth gen`` grants the
   first to operators, the second to the managers of ``a``'s subtree) this step is
   skipped and ``user`` names who cancels;
3. idempotent, like the submission: a workload that ended cancelled (its latest record is
   ``WorkloadCancelled``) is answered accepted, with "already cancelled" in ``detail`` and
   nothing logged; one that ended otherwise (``WorkloadCompleted``, ``WorkloadFailed``) is
   refused ("has already ended");
4. ``CancelRequested`` is appended on the same condition as a submission: its subject
   ``...<id>.cancel_requested`` must hold no record yet (and ``Nats-Msg-Id =
   cancel:<id>``). A cancel already requested (a retry of one whose answer was lost, two
   at once) is refused by the stream and answered accepted with "already requested" in
   ``detail``: once logged, a cancel of live work always takes effect (the fold stops it
   or drops it), so a second record would add nothing. Placement drops pending work, the
   agent stops running work.

Intake's own state is the HOSTS stream and the budget tree, folded with ``LogFold``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import re
from collections.abc import Sequence
from typing import NamedTuple

import msgspec
import structlog
from faststream.nats import NatsBroker
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.errors import APIError
from opentelemetry.sdk.trace import TracerProvider

from allot import bus
from allot.bus import group_commit
from allot.bus.log_watch import LogWatchServer
from allot.bus.record_log import Follower, JetStreamLog, RecordLog
from allot.bus.request_server import REQUEST_HEADERS, RequestServer, raw_connection
from allot.bus.runtime import (
    Delivery,
    configure_logging,
    given_broker,
    tracer_provider,
    wall_clock,
)
from allot.bus.service_main import base_parser, run_main
from allot.core.budgets import BudgetTree, subtree_allocations
from allot.core.errors import ValidationError
from allot.core.model import DEFAULT_UNALLOCATED_GRACE_S
from allot.core.reasons import fits_empty
from allot.eventlog.logfold import LogFold
from allot.proto import codec
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.proto.checkpoint_rules import check_checkpoint
from allot.proto.env_vars import check_env

EXPECT_NEW_SUBJECT = {"Nats-Expected-Last-Subject-Sequence": "0"}
"""The append's condition: the workload's subject holds no record yet."""
WRONG_LAST_SEQUENCE = (10071, 10164)
"""JetStream's error codes for a failed ``Nats-Expected-Last-Subject-Sequence`` check."""
_ENDED_OTHERWISE = (m.WorkloadCompleted, m.WorkloadFailed)
"""Ends a cancel cannot follow (an end by cancelling answers a cancel as accepted)."""
_FIRST_RECORD = msgspec.json.Decoder(m.WorkloadSubmitted)
CHOSEN_FIELDS: tuple[str, ...] = m.SubmitWorkload.__struct_fields__
"""What a submitter chooses, compared when a ``client_id`` comes again (module docstring,
step 4); ``WorkloadSubmitted`` carries each of them, plus the server's ``at``."""
_SHOWN_LEN = 60

log = structlog.get_logger("allot.intake")


BATCH_ITEM_STEP_S = 1e-6
"""Submit-time step between the items of one ``SubmitBatch`` (see ``on_submit``)."""
DEFAULT_GRACE_S = 300
"""Placement's default ``--grace-s`` (intake's, for the checkpoint timeout's bound)."""
TREE_WAIT_S = 2.0
"""How long a submission waits for a budget tree that the log holds and this intake has not
read yet (``Intake._read_tree``)."""


def workload_id(allocation: str | None, client_id: str) -> str:
    """Deterministic: the same (allocation, client_id) is always the same workload."""
    digest = hashlib.blake2b(f"{allocation or s.UNALLOCATED}\0{client_id}".encode(), digest_size=8)
    return "w" + digest.hexdigest()


class Intake:
    def __init__(
        self,
        nats_url: str | None = None,
        *,
        tracing: bool = True,
        provider: TracerProvider | None = None,
        broker: NatsBroker | None = None,
        record_log: RecordLog | None = None,
        grace_s: float = DEFAULT_GRACE_S,
        unallocated_grace_s: float = DEFAULT_UNALLOCATED_GRACE_S,
    ) -> None:
        """``provider``: the tracer provider (default: from ``ALLOT_OTEL_EXPORTER``).
        ``broker`` (default: one for ``nats_url``) and ``record_log`` (default: the log on a
        connection of its own to ``nats_url``, with the teams' log watches) may be given,
        as unit tests give them."""
        if nats_url is None and record_log is None:
            raise ValueError("intake: a NATS URL or a record log is needed")
        self.nats_url = nats_url
        if provider is None and tracing:
            provider = tracer_provider("intake")
        self.provider = provider
        self.broker = given_broker(broker, nats_url, "intake", provider)
        self.submits: list[RequestServer] = []
        """Submissions, served with nats-py (docs/decisions/0010-raw-nats-on-hot-subjects.md):
        one server for the identity form, one for the bare form."""
        for cancels in (
            s.ALL_CANCEL,
            s.ALL_OPERATOR_CANCEL,
            s.ALL_MANAGER_CANCEL,
            s.ALL_CANCEL_AS,
            s.ALL_OPERATOR_CANCEL_AS,
            s.ALL_MANAGER_CANCEL_AS,
        ):
            self.broker.subscriber(cancels, queue="intake")(self.on_cancel)
        self.fold = LogFold()
        self.record_log = record_log
        self.nc: NatsClient | None = None
        self.js: JetStreamContext | None = None
        self.appends: group_commit.GroupCommit | None = None
        """Submissions: a backlog of them is stored as atomic batches (the log intake
        builds itself; None when given one)."""
        self.follower: Follower | None = None
        self.serving: RequestServer | None = None
        """Answers ``QUERY_INTAKE`` once the submissions are served (the stack's readiness)."""
        self.watches: LogWatchServer | None = None
        """Reads the log for teams (``allot.bus.log_watch``): they never create consumers."""
        self._host_sizes: tuple[list[int], int] | None = None
        self._fits: dict[int, bool] = {}
        """GPUs asked -> whether the registered hosts hold that shape (``fits_empty``)."""
        self.accepted = 0
        self.rejected = 0
        self.duplicates = 0
        self.grace_s = grace_s
        self.unallocated_grace_s = min(unallocated_grace_s, grace_s)
        """Placement's grace periods (the same flags): a checkpoint timeout beyond them
        is refused (issue 40)."""

    async def on_started(self) -> None:
        if self.record_log is None:
            assert self.nats_url is not None
            self.nc, self.js = await bus.connect(self.nats_url, "allot-intake-log")
            await bus.ensure_streams(self.js)
            self.appends = await group_commit.for_stream(self.nc, self.js, "WORKLOADS")
            self.record_log = JetStreamLog(self.js, self.appends)
        nc = raw_connection(self.broker)
        self.submits = [
            RequestServer(nc, subject, "intake", self.on_submit, provider=self.provider)
            for subject in (s.ALL_SUBMIT_AS, s.ALL_SUBMIT)
            if nc is not None
        ]
        self.follower = self.record_log.follower(
            self._on_record,
            streams=("HOSTS", "USAGE"),
            subjects={"USAGE": s.BUDGET_TREE},
        )
        await self.follower.start()
        for server in self.submits:  # once the hosts and the budget tree are known
            await server.start()
        if nc is not None:
            # After the submissions, on their connection: an answer proves the server (in a
            # cluster, the node that answered through) has their subscriptions too.
            self.serving = RequestServer(nc, s.QUERY_INTAKE, "intake", self._on_serving)
            await self.serving.start()
        if self.nc is not None and self.js is not None:
            self.watches = LogWatchServer(self.nc, self.js, wall_clock)
            await self.watches.start()
        log.info("intake ready", hosts=len(self.fold.state.host_ids))

    def _on_record(self, _subject: str, record: msgspec.Struct) -> None:
        if self.fold.apply(record).changed and isinstance(record, m.HostRegistered):
            self._host_sizes = None
            self._fits.clear()

    def _sizes(self) -> tuple[list[int], int]:
        """GPUs of each registered host and their sum (hosts only join), read once per
        change."""
        if self._host_sizes is None:
            st = self.fold.state
            sizes = [st.host(h).gpus for h in st.host_ids]
            self._host_sizes = (sizes, sum(sizes))
        return self._host_sizes

    async def on_stopping(self) -> None:
        if self.watches is not None:
            await self.watches.stop()
        if self.serving is not None:
            await self.serving.stop()
        for server in self.submits:
            await server.stop()
        if self.follower is not None:
            await self.follower.stop()
        if self.nc is not None:
            await self.nc.close()

    async def _on_serving(self, _subject: str, _body: bytes) -> bytes:
        hosts = len(self.fold.state.host_ids)
        tree = "a budget tree" if self.fold.tree is not None else "no budget tree yet"
        detail = f"intake serves submissions ({hosts} hosts, {tree})"
        return codec.encode(m.CommandAccepted(at=wall_clock(), detail=detail))

    # ------------------------------------------------------------------ submit
    async def on_submit(self, subject: str, body: bytes) -> bytes:
        now = wall_clock()
        try:
            # submit.<allocation> or submit.<allocation>.<login> (the subscriptions' shapes)
            _, _, _, token, *login = subject.split(".")
            cmd = codec.decode(s.Kind.SUBMIT, body)
        except ValidationError as e:
            return codec.encode(self._reject(now, None, None, e.field, e.reason))
        ident = Identity(token, login[0] if login else None)
        if ident.allocation != s.UNALLOCATED and self.fold.tree is None:
            await self._read_tree()  # once per request, not per item of a batch
        if isinstance(cmd, m.SubmitBatch):
            # Each item on its own (its appends run concurrently: their acks overlap),
            # answered in order; a field is named as in the body, ``workloads[3].gpus``.
            # Item i is stamped now + i µs: the queue breaks ties of submit time by id,
            # which would put a job array's tasks in hash order; this keeps the batch's
            # order, as Slurm queues array tasks by index.
            results = await asyncio.gather(
                *(
                    self._submit(item, ident, now + i * BATCH_ITEM_STEP_S, f"workloads[{i}].")
                    for i, item in enumerate(cmd.workloads)
                )
            )
            return codec.encode(m.SubmitBatchAnswered(at=now, results=tuple(results)))
        assert isinstance(cmd, m.SubmitWorkload)
        return codec.encode(await self._submit(cmd, ident, now))

    async def _submit(
        self, cmd: m.SubmitWorkload, ident: Identity, now: float, where: str = ""
    ) -> m.WorkloadAccepted | m.WorkloadRejected:
        try:
            if cmd.allocation is None and ident.allocation != s.UNALLOCATED:
                # left out: the subject's, as for a cancel (unallocated work says ``~``)
                cmd = msgspec.structs.replace(cmd, allocation=ident.allocation)
            self._validate(cmd, ident)
            return await self._accept(cmd, now)
        except ValidationError as e:
            return self._reject(now, cmd.client_id, cmd.allocation, where + e.field, e.reason)

    async def _read_tree(self) -> None:
        """Before a submission is refused for want of a budget tree: the log may hold one
        this intake has not read yet (it serves as soon as its follower has started, and
        the ranking service bootstraps the tree beside it; a submission right after the
        stack says it is ready could be refused). Wait, at most ``TREE_WAIT_S``, until the
        follower has handed over the last tree the log holds; none there: refuse at once."""
        if self.record_log is None or self.follower is None:
            return
        last = await self.record_log.read("USAGE", s.BUDGET_TREE)
        if last is not None and last.seq is not None:
            await self.follower.wait_for("USAGE", last.seq, TREE_WAIT_S)

    def _validate(self, cmd: m.SubmitWorkload, ident: Identity) -> None:
        s.check_login("user", cmd.user, ident.login)
        if ident.allocation != s.allocation_token(cmd.allocation):
            raise ValidationError("allocation", _differs(cmd.allocation, ident.allocation))
        tree = self.fold.tree
        if cmd.allocation is not None:
            if tree is None:
                raise ValidationError("allocation", "no budget tree has been set yet")
            if not tree.is_leaf(cmd.allocation):
                raise ValidationError("allocation", _not_an_allocation(tree, cmd.allocation))
        check_env(cmd.env)  # the names the agent sets, and the total size
        allocated = cmd.allocation is not None and cmd.min_runtime_s > 0
        check_checkpoint(
            signal=cmd.checkpoint_signal,
            timeout_s=cmd.checkpoint_timeout_s,
            directory=cmd.checkpoint_dir,
            grace_s=self.grace_s if allocated else self.unallocated_grace_s,
        )
        sizes, total = self._sizes()
        if cmd.gpus > total:
            raise ValidationError(
                "gpus", f"asks for {cmd.gpus} GPUs; the cluster has {total} registered"
            )
        fits = self._fits.get(cmd.gpus)
        if fits is None:  # O(hosts) each: asked once per size until the hosts change
            fits = self._fits[cmd.gpus] = fits_empty(sizes, cmd.gpus)
        if not fits:
            # The placement shape (one host, or whole hosts of the largest size plus one for
            # the rest) fits no set of the registered hosts even empty: it would wait for
            # ever as `too-large`, so it is refused now, as Slurm refuses a job no node
            # configuration can satisfy.
            largest = max(sizes)
            whole, rest = divmod(cmd.gpus, largest)
            shape = f"{whole} whole hosts of {largest} GPUs" + (
                f" plus {rest} on one more" * bool(rest)
            )
            raise ValidationError(
                "gpus",
                f"asks for {cmd.gpus} GPUs: its placement shape ({shape}) fits no set of the "
                f"registered hosts ({sizes.count(largest)} of {largest} GPUs, "
                f"{len(sizes) - sizes.count(largest)} smaller)",
            )

    async def _accept(self, cmd: m.SubmitWorkload, now: float) -> m.WorkloadAccepted:
        """One conditional append (see the module docstring, step 4); raises
        ``ValidationError`` for a ``client_id`` already used with other values."""
        wid = workload_id(cmd.allocation, cmd.client_id)
        record = submitted_record(cmd, wid, now)
        subject = bus.event_subject(cmd.allocation, record)
        # The request's own id travels with the record: a retry of the same request that
        # finds it is this request's, not a duplicate (``subjects.REQUEST_ID_HEADER``).
        request_id = REQUEST_HEADERS.get().get(s.REQUEST_ID_HEADER)
        if request_id is not None and not _REQUEST_ID.fullmatch(request_id):
            request_id = None  # not a name: nothing a client sends is copied into the log
        extra = {s.REQUEST_ID_HEADER: request_id} if request_id else {}
        if not await self._append_new(subject, record, f"submitted:{wid}", extra):
            # a repeat: refused by the subject check, or by the msg id
            first, first_request = await self._first_submission(subject)
            if first is None:  # not readable (never seen): a duplicate, uncompared
                log.warning("first submission not readable", workload=wid)
            elif differences := differing_choices(first, cmd):
                raise ValidationError(
                    "client_id",
                    f"client_id {cmd.client_id!r} was already used for a different "
                    f"submission ({'; '.join(differences)})",
                )
            if first is not None and request_id and first_request == request_id:
                return self._accepted(cmd, wid, first.at, False)  # stored by our own attempt
            self.duplicates += 1
            return self._accepted(cmd, wid, now if first is None else first.at, True)
        self.accepted += 1
        log.debug("accepted", workload=wid, allocation=cmd.allocation, gpus=cmd.gpus)
        return self._accepted(cmd, wid, now, False)

    async def _append_new(
        self, subject: str, record: msgspec.Struct, msg_id: str, extra: dict[str, str]
    ) -> bool:
        """Append ``record`` (with the ``extra`` headers) only if ``subject`` holds no record
        yet (module docstring, step 4); False when it already did, or the stream knew
        ``msg_id``: a repeat."""
        assert self.record_log is not None
        try:
            ack = await self.record_log.append(
                subject, record, msg_id, {**EXPECT_NEW_SUBJECT, **extra}
            )
        except APIError as e:
            if e.err_code not in WRONG_LAST_SEQUENCE:
                raise
            return False
        return not ack.duplicate

    async def _first_submission(
        self, subject: str
    ) -> tuple[m.WorkloadSubmitted | None, str | None]:
        """The workload's first accepted submission, its ``submitted`` subject's first
        record (None if there is none, or it does not decode), and the id of the request
        that stored it (None without one)."""
        assert self.record_log is not None
        first = await self.record_log.read("WORKLOADS", subject, first=True)
        if first is None:
            return None, None
        request_id = (first.headers or {}).get(s.REQUEST_ID_HEADER)
        try:
            return _FIRST_RECORD.decode(first.data or b""), request_id
        except msgspec.DecodeError:
            return None, request_id

    @staticmethod
    def _accepted(
        cmd: m.SubmitWorkload, wid: str, at: float, duplicate: bool
    ) -> m.WorkloadAccepted:
        return m.WorkloadAccepted(
            workload_id=wid,
            client_id=cmd.client_id,
            allocation=cmd.allocation,
            at=at,
            duplicate=duplicate,
            allocated=cmd.allocation is not None and cmd.min_runtime_s > 0,
            note=unallocated_note(cmd),
        )

    def _reject(
        self, now: float, client_id: str | None, allocation: str | None, field: str, reason: str
    ) -> m.WorkloadRejected:
        self.rejected += 1
        log.info("rejected", field=field, reason=reason, client_id=client_id)
        return m.WorkloadRejected(
            client_id=client_id,
            allocation=allocation,
            at=now,
            field=field[: m.MAX_TEXT_LEN],
            reason=reason[: m.MAX_TEXT_LEN],
        )

    # ------------------------------------------------------------------ cancel
    async def on_cancel(self, msg: Delivery) -> bytes:
        now = wall_clock()
        try:
            # cancel.<a>.<w>, then the form (user, operator, manager), then the login
            # (the subscriptions' shapes).
            _, _, _, token, wid, *rest = msg.raw_message.subject.split(".")
            form = rest[0] if rest else s.OWNER
            # For someone else's workload: only operators, or the allocation's managers,
            # are granted these subjects (``allot auth gen``).
            on_behalf = form if form in s.ON_BEHALF else None
            cmd = codec.decode(s.Kind.CANCEL, msg.body)
            assert isinstance(cmd, m.CancelWorkload)
            s.check_login("user", cmd.user, rest[1] if rest[1:] else None)
            if cmd.workload_id != wid:
                raise ValidationError(
                    "workload_id", f"{cmd.workload_id!r} does not match the subject's {wid!r}"
                )
            if cmd.allocation is None:  # left out: the subject's
                cmd = msgspec.structs.replace(
                    cmd, allocation=None if token == s.UNALLOCATED else token
                )
            elif token != s.allocation_token(cmd.allocation):
                raise ValidationError("allocation", _differs(cmd.allocation, token))
            detail = await self._cancel(cmd, now, on_behalf=on_behalf)
        except ValidationError as e:
            self.rejected += 1
            return codec.encode(
                m.CommandRejected(at=now, field=e.field[:1024], reason=e.reason[:1024])
            )
        return codec.encode(m.CommandAccepted(at=now, detail=detail))

    async def _cancel(
        self, cmd: m.CancelWorkload, now: float, *, on_behalf: str | None = None
    ) -> str:
        """The cancel's steps (module docstring); the accepted answer's ``detail``, or
        ``ValidationError``. ``on_behalf``: sent on the operators' or the managers' subject
        (``subjects.ON_BEHALF``), so not only the owner may cancel."""
        wid = cmd.workload_id
        submitted = s.events(cmd.allocation, wid, m.EVENT_NAME[m.WorkloadSubmitted])
        (first, _), last = await asyncio.gather(
            self._first_submission(submitted), self._last_record(cmd)
        )
        if first is None:
            raise ValidationError(
                "workload_id",
                f"no workload {wid!r} in allocation {s.allocation_token(cmd.allocation)!r}",
            )
        if cmd.user != first.user and on_behalf is None:
            raise ValidationError(
                "user",
                f"{cmd.user!r} may not cancel {wid!r}: it was submitted by {first.user!r}, "
                "and only its owner cancels it (or an operator: allot cancel --operator, or "
                "a manager of its allocation: allot cancel --manager)",
            )
        if isinstance(last, m.WorkloadCancelled):
            by = f" by {last.by!r}" if last.by else ""
            return f"{wid} was already cancelled{by}; nothing new logged"
        # A preempted workload may have been requeued: the fold decides (it ignores a
        # cancel of work that has ended).
        if isinstance(last, _ENDED_OTHERWISE):
            ended = m.EVENT_NAME[type(last)]
            raise ValidationError("workload_id", f"{wid!r} has already ended ({ended})")
        record = m.CancelRequested(
            workload_id=wid, allocation=cmd.allocation, by=cmd.user, reason=cmd.reason, at=now
        )
        subject = bus.event_subject(cmd.allocation, record)
        if not await self._append_new(subject, record, f"cancel:{wid}", {}):
            return f"cancel of {wid} already requested; nothing new logged"
        log.info(
            "cancel requested",
            workload=wid,
            allocation=cmd.allocation,
            by=cmd.user,
            on_behalf=on_behalf,
        )
        return f"cancel of {wid} logged"

    async def _last_record(self, cmd: m.CancelWorkload) -> msgspec.Struct | None:
        """The workload's latest record (None: none, or one that does not decode)."""
        assert self.record_log is not None
        subject = s.workload_events(cmd.allocation, cmd.workload_id)
        last = await self.record_log.read("WORKLOADS", subject)
        if last is None:
            return None
        try:
            return bus.decode_record(last.subject or "", last.data or b"")
        except ValidationError:
            return None


class Identity(NamedTuple):
    """What a submission's subject says of it: the allocation token and the sender's login
    (None on the bare form)."""

    allocation: str
    login: str | None


def _not_an_allocation(tree: BudgetTree, name: str) -> str:
    """Why ``name`` takes no work, and which names do: an account of the tree (a budget
    manager's node) is charged through its leaves, the allocations."""
    if name in tree.index.position:
        leaves = subtree_allocations(tree, name)[:20]
        return (
            f"{name!r} is an account of the budget tree, not an allocation: submit to one "
            f"of its allocations ({', '.join(leaves)})"
        )
    return f"unknown allocation {name!r} (allocations: {', '.join(tree.leaves()[:20])})"


def _differs(allocation: str | None, token: str) -> str:
    """A payload's allocation that is not the subject's, in words (no Python ``None``)."""
    given = "unallocated work (no allocation)" if allocation is None else repr(allocation)
    subject = "unallocated work ('~')" if token == s.UNALLOCATED else repr(token)
    return f"{given} differs from the subject's allocation, {subject}"


_REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What a request id may be (the SDK sends 32 hex digits)."""


def unallocated_note(cmd: m.SubmitWorkload) -> str:
    """Why work given half of what makes it allocated runs unallocated ("" otherwise)."""
    if cmd.allocation is None and cmd.min_runtime_s > 0:
        return (
            f"unallocated: min_runtime_s {cmd.min_runtime_s} protects nothing without an "
            "allocation; the work runs free and may be preempted at any moment"
        )
    if cmd.allocation is not None and cmd.min_runtime_s == 0:
        return (
            f"unallocated: min_runtime_s is 0, so the work is neither protected nor charged "
            f"to {cmd.allocation}; it runs free and may be preempted at any moment"
        )
    return ""


def submitted_record(cmd: m.SubmitWorkload, wid: str, now: float) -> m.WorkloadSubmitted:
    """The log record of ``cmd``'s acceptance at ``now``: every chosen field as given
    (``CHOSEN_FIELDS``, so a field added to the submission is logged with it), plus the
    workload's id and the time."""
    return m.WorkloadSubmitted(workload_id=wid, at=now, **msgspec.structs.asdict(cmd))


def differing_choices(first: m.WorkloadSubmitted, cmd: m.SubmitWorkload) -> list[str]:
    """Each chosen field (``CHOSEN_FIELDS``) where ``cmd`` differs from the first
    submission, worded ``"gpus 1, not 2"`` (the first's value first); empty for a retry."""
    return [
        f"{name} {_shown(getattr(first, name))}, not {_shown(getattr(cmd, name))}"
        if name != "env"
        else _env_differs(first.env, cmd.env)
        for name in CHOSEN_FIELDS
        if getattr(first, name) != getattr(cmd, name)
    ]


def _env_differs(first: dict[str, str], again: dict[str, str]) -> str:
    """The variables whose values differ (or that one of the two lacks), never a value: a
    value may be a token, and the refusal is logged."""
    names = sorted(n for n in first.keys() | again.keys() if first.get(n) != again.get(n))
    return _shown_text("env differs in " + ", ".join(names))


def _shown(value: object) -> str:
    return _shown_text(
        "unset" if value is None else repr(list(value) if isinstance(value, tuple) else value)
    )


def _shown_text(text: str) -> str:
    return text if len(text) <= _SHOWN_LEN else text[: _SHOWN_LEN - 3] + "..."


def build_parser() -> argparse.ArgumentParser:
    ap = base_parser("python -m allot.services.intake", __doc__)
    # Placement's grace periods, given the same values (``allot up`` does): a checkpoint
    # timeout longer than the victim's grace is refused at submit (issue 40).
    ap.add_argument("--grace-s", type=float, default=DEFAULT_GRACE_S)
    ap.add_argument("--unallocated-grace-s", type=float, default=DEFAULT_UNALLOCATED_GRACE_S)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging("intake")
    return run_main(
        lambda a: Intake(a.nats_url, grace_s=a.grace_s, unallocated_grace_s=a.unallocated_grace_s),
        build_parser(),
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
