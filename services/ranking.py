"""The ranking service: owns the budget tree and publishes the Fair Tree ranking
(``python -m allot.services.ranking --budgets budgets.yaml``).

* **The tree.** The current tree is the last ``BudgetTreeSet`` on ``allot.v1.budget.tree``
  (USAGE stream). At start the service reads it; when there is none it loads ``--budgets``
  (the nested YAML form of ``allot fairshare``) and publishes it as ``by="bootstrap"``. So a
  restart keeps every change made since: the file only seeds an empty log.
* **Changes.** ``allot.v1.budget.set.by.<login>.<path>`` requests (``SetBudget``; also the
  bare ``allot.v1.budget.set.<path>``); the payload's ``set_by`` must be the subject's
  login and its path the subject's (NATS permissions grant subjects, so the subject is what
  was authorised: ``allot auth gen`` grants a manager only its own login's form). The new
  tree is validated by the core, published whole, and answered with ``CommandAccepted``;
  any fault is a ``CommandRejected`` naming the field. A change re-ranks at once.
* **Ranking.** Every ``--rank-every-s`` and after each change: the leaves' usage over the
  window (``--window-s``, default 7 days) from the accounting service's Redis buckets,
  ``allot.core.fairshare.rank``, and one ``RankingUpdated`` on ``allot.v1.ranking`` (USAGE
  stream). The latest answers ``allot.v1.query.share`` requests.
* **History pages.** ``allot.v1.query.history`` (``HistoryQuery`` -> one bounded page of a
  log stream, ``allot.bus.history_pages``; at most ``history_pages.IN_FLIGHT`` at once),
  read with this service's credentials for the logins that may not read the log
  (operators, managers), and the same on ``allot.v1.dashboard.log`` for the dashboard
  alone, in slots of its own (decision 0080).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import msgspec
import redis.asyncio as redis_asyncio
import structlog
from faststream.nats import NatsBroker
from nats.js.api import RawStreamMsg
from opentelemetry.sdk.trace import TracerProvider

from allot import bus
from allot.adapters.usage_store import RedisUsageStore, UsageStore
from allot.bus import history_pages, runtime
from allot.bus.record_log import JetStreamLog, RecordLog
from allot.bus.replays import replayed
from allot.bus.request_server import RequestServer
from allot.bus.runtime import Delivery
from allot.bus.service_main import base_parser, positive_seconds, run_main
from allot.bus.tasks import stop_tasks
from allot.config.budget_file import load_tree_file
from allot.core.budgets import BudgetTree, set_shares
from allot.core.errors import ValidationError
from allot.core.fairshare import NodeRank, rank
from allot.core.usage import DEFAULT_WINDOW_S, window_usage
from allot.eventlog.budget_wire import spec_from_tree, tree_from_spec
from allot.proto import codec, subjects
from allot.proto import messages as m
from allot.proto.subjects import Kind

SERVICE = "ranking"
DEFAULT_RANK_EVERY_S = 300.0
REDIS_TIMEOUT_S = 10.0
"""Longest wait for Redis's answer to one request (a ranking's read of the usage counters)."""
BOOTSTRAP = "bootstrap"
FIRST_RETRY_S = 1.0
"""How soon a first ranking that failed is tried again, doubling up to ``--rank-every-s``."""

log = structlog.get_logger("allot.ranking", service=SERVICE)  # lazy: configured in main


def rank_row(node: NodeRank) -> m.RankRow:
    level_fs: float | Literal["inf"] | None = node.level_fs
    if node.level_fs is not None and math.isinf(node.level_fs):
        level_fs = "inf"  # JSON has no infinity; the wire spells it as text
    return m.RankRow(
        path=node.path,
        name=node.name,
        leaf=node.leaf,
        raw_shares=node.raw_shares,
        norm_shares=node.norm_shares,
        raw_usage=node.raw_usage,
        effective_usage=node.effective_usage,
        level_fs=level_fs,
        rank=node.rank,
        fairshare=node.fairshare,
    )


class RankingService:
    """See the module docstring. ``broker`` (default: one for ``nats_url``), ``record_log``
    (default: USAGE on the broker's connection, from ``on_started``) and ``store`` (default:
    the buckets in ``redis_url``) may be given, as unit tests give them."""

    def __init__(
        self,
        nats_url: str | None = None,
        redis_url: str | None = None,
        *,
        broker: NatsBroker | None = None,
        record_log: RecordLog | None = None,
        store: UsageStore | None = None,
        budgets_file: Path | None = None,
        rank_every_s: float = DEFAULT_RANK_EVERY_S,
        window_s: int = DEFAULT_WINDOW_S,
        redis_prefix: str = "allot",
        provider: TracerProvider | None = None,
        clock: Callable[[], float] = runtime.wall_clock,
    ) -> None:
        if rank_every_s <= 0:
            raise ValidationError("rank_every_s", f"must be positive, got {rank_every_s!r}")
        if window_s <= 0:
            raise ValidationError("window_s", f"must be positive, got {window_s!r}")
        self.budgets_file = budgets_file
        self.rank_every_s = rank_every_s
        self.window_s = window_s
        self.clock = clock
        self.tree: BudgetTree | None = None
        self.latest: m.RankingUpdated | None = None
        self._redis: redis_asyncio.Redis | None = None
        if store is None:
            if redis_url is None:
                raise ValueError("ranking: a Redis URL or a usage store is needed")
            # Bounded: a ranking is stamped before its read, and one stored past the
            # duplicate window after its stamp is refused as a copy (decision 0085).
            self._redis = redis_asyncio.from_url(
                redis_url, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S
            )
            store = RedisUsageStore(self._redis, prefix=redis_prefix)
        self.store: UsageStore = store
        self.record_log = record_log
        self._lock = asyncio.Lock()
        """Serialises tree changes and ranking runs (each reads the tree it publishes)."""
        self._kick = asyncio.Event()
        self._closing = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self._history: tuple[RequestServer, ...] = ()

        self.broker: NatsBroker = runtime.given_broker(broker, nats_url, SERVICE, provider)
        self.broker.subscriber(subjects.ALL_BUDGET_SET)(self._set_handler)
        self.broker.subscriber(subjects.QUERY_SHARE)(self._share_handler)

    # -- lifecycle ---------------------------------------------------------------------

    async def on_started(self) -> None:
        if self.record_log is None:
            js = self.broker.connection.jetstream()
            await bus.ensure_streams(js)
            self.record_log = JetStreamLog(js)
            # Two servers, two sets of slots: the dashboard's reads are not held back by
            # the pages other logins ask.
            nc = self.broker.connection
            self._history = (
                history_pages.request_server(nc, js, f"{SERVICE}-history"),
                history_pages.request_server(
                    nc, js, f"{SERVICE}-dashboard-log", subjects.DASHBOARD_LOG
                ),
            )
            for server in self._history:
                await server.start()
        await self._load_tree(self.record_log)
        self._loop = asyncio.create_task(self._rank_loop())

    async def on_stopping(self) -> None:
        # nats-py swallows a cancellation that lands inside a publish (its flush catches
        # CancelledError), so the loop also checks a flag; the kick ends its wait.
        self._closing.set()
        self._kick.set()
        for server in self._history:
            await server.stop()
        self._history = ()
        if self._loop is not None:
            await stop_tasks([self._loop])
            self._loop = None
        if self._redis is not None:
            await self._redis.aclose()

    async def _load_tree(self, record_log: RecordLog) -> None:
        last = await record_log.read("USAGE", subjects.BUDGET_TREE)
        if last is not None and last.data is not None:
            # Every follower skips what no reader takes, and so does this start.
            found = _taken_tree(last) or await _last_tree_followed(record_log)
            if found is not None:
                self.tree = tree_from_spec(found.tree)
                log.info("budget tree from the log", by=found.by, at=found.at)
                return
        if self.budgets_file is None:
            log.warning("no budget tree in the log and no --budgets file: nothing to rank")
            return
        tree = load_tree_file(self.budgets_file)
        # One msg id for every bootstrap: two instances starting together store one tree.
        await self._publish_tree(tree, BOOTSTRAP, msg_id="budget-tree:bootstrap")
        log.info("budget tree bootstrapped", file=str(self.budgets_file))

    async def _publish_tree(self, tree: BudgetTree, by: str, msg_id: str | None = None) -> None:
        assert self.record_log is not None
        at = self.clock()
        record = m.BudgetTreeSet(at=at, by=by, tree=spec_from_tree(tree))
        await self.record_log.append(
            subjects.BUDGET_TREE, record, msg_id or f"budget-tree:{by}:{at}"
        )
        self.tree = tree

    # -- budget changes ----------------------------------------------------------------

    async def _set_handler(self, msg: Delivery) -> bytes:
        reply = await self.set_budget(msg.raw_message.subject, msg.body)
        return codec.encode(reply)

    async def set_budget(self, subject: str, body: bytes) -> m.CommandAccepted | m.CommandRejected:
        """Apply one ``SetBudget`` request; every fault is a ``CommandRejected``."""
        try:
            cmd = codec.decode(Kind.BUDGET_SET, body)
            assert isinstance(cmd, m.SetBudget)
            subjects.check_login("set_by", cmd.set_by, subjects.login_of(subject))
            subject_path = subjects.budget_path_of(subject)
            if cmd.path != subject_path:
                raise ValidationError(
                    "path",
                    f"{'/'.join(cmd.path)!r} differs from the subject's {'/'.join(subject_path)!r}",
                )
            async with self._lock:
                if self.tree is None:
                    raise ValidationError("path", "no budget tree yet (start with --budgets)")
                tree = set_shares(self.tree, cmd.path, cmd.shares)
                await self._publish_tree(tree, cmd.set_by)
        except ValidationError as e:
            log.warning("budget change rejected", subject=subject, field=e.field, reason=e.reason)
            return m.CommandRejected(at=self.clock(), field=e.field, reason=e.reason)
        shares = "parent" if cmd.shares is None else cmd.shares
        detail = f"{'/'.join(cmd.path)} shares = {shares}"
        log.info("budget changed", path="/".join(cmd.path), shares=shares, by=cmd.set_by)
        self._kick.set()  # re-rank right after this reply
        return m.CommandAccepted(at=self.clock(), detail=detail)

    # -- ranking -----------------------------------------------------------------------

    async def _rank_loop(self) -> None:
        retry_s = FIRST_RETRY_S
        while not self._closing.is_set():
            self._kick.clear()
            try:
                await self.rank_now()
            except Exception:  # Redis or NATS away: keep the last ranking, retry next tick
                log.exception("ranking failed")
            if self._closing.is_set():
                return
            wait = self.rank_every_s
            if self.latest is None:  # sooner, doubling: the stack is not ready without one
                wait, retry_s = min(wait, retry_s), retry_s * 2
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), wait)

    async def rank_now(self) -> m.RankingUpdated | None:
        """Rank the current tree over the window ending now and publish the result."""
        async with self._lock:
            tree = self.tree
            if tree is None or self.record_log is None:
                return None
            now = self.clock()
            buckets = await self.store.buckets(tree.leaves(), now, self.window_s)
            usage = window_usage(buckets, now, self.window_s)
            ranking = rank(tree, usage)
            record = m.RankingUpdated(
                at=now,
                window_s=float(self.window_s),
                nodes=tuple(rank_row(node) for node in ranking.nodes),
            )
            await self.record_log.append(subjects.RANKING, record, f"ranking:{now}")
            self.latest = record
        log.info("ranking published", leaves=len(tree.leaves()), at=now)
        return record

    async def _share_handler(self, _msg: Delivery) -> bytes:
        if self.latest is None:
            return codec.encode(
                m.CommandRejected(at=self.clock(), field="ranking", reason="no ranking yet")
            )
        return codec.encode(self.latest)


def build(args: argparse.Namespace) -> RankingService:
    runtime.configure_logging(SERVICE)
    return RankingService(
        args.nats_url,
        args.redis_url,
        budgets_file=args.budgets,
        rank_every_s=args.rank_every_s,
        window_s=args.window_s,
        redis_prefix=args.redis_prefix,
        provider=runtime.tracer_provider(SERVICE),
    )


def parser() -> argparse.ArgumentParser:
    ap = base_parser("python -m allot.services.ranking", __doc__.splitlines()[0])
    ap.add_argument(
        "--budgets",
        type=Path,
        default=None,
        help="budget tree YAML (nested form), published only when the log has no tree",
    )
    ap.add_argument(
        "--rank-every-s",
        type=positive_seconds,
        default=DEFAULT_RANK_EVERY_S,
        help="seconds between rankings (default %(default)s)",
    )
    ap.add_argument(
        "--window-s",
        type=_positive_int,
        default=DEFAULT_WINDOW_S,
        help="usage window in seconds (default %(default)s, 7 days)",
    )
    ap.add_argument(
        "--redis-prefix",
        default="allot",
        help="key prefix of the usage buckets (default %(default)s)",
    )
    return ap


def _taken_tree(last: RawStreamMsg) -> m.BudgetTreeSet | None:
    """The last stored tree, or None (logged) where no reader takes it: a message no
    service wrote (a JetStream answer steered there: docs/security.md) or an earlier tree
    stored again (decision 0085)."""
    try:
        record = codec.decode_as(m.BudgetTreeSet, last.data or b"", own=True)
    except ValidationError as e:
        log.warning("last budget tree skipped", seq=last.seq, field=e.field)
        return None
    copy = replayed(record, last.time)
    if copy is not None:
        log.warning("last budget tree skipped", seq=last.seq, reason=copy)
        return None
    return record


async def _last_tree_followed(record_log: RecordLog) -> m.BudgetTreeSet | None:
    """The last budget tree of the log that a follower hands over (followers skip what does
    not decode); None without one."""
    found: list[m.BudgetTreeSet] = []

    def keep(_subject: str, record: msgspec.Struct) -> None:
        if isinstance(record, m.BudgetTreeSet):
            found[:] = [record]

    follower = record_log.follower(
        keep, streams=("USAGE",), subjects={"USAGE": subjects.BUDGET_TREE}
    )
    await follower.start()  # returns once the stream is replayed
    await follower.stop()
    return found[0] if found else None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.budgets is not None:
        try:  # a bad file is reported before connecting to anything
            load_tree_file(args.budgets)
        except ValidationError as e:
            parser().exit(2, f"ranking: --budgets: {e.field}: {e.reason}\n")
    return run_main(build, parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
