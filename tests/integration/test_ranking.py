"""The ranking service against real NATS and Redis: bootstrap of the budget tree, budget
changes (and what it rejects), the published ranking and the share query."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
import redis.asyncio as redis_asyncio
from live_harness import eventually
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from allot.adapters.usage_store import RedisUsageStore
from allot.bus import service_main
from allot.proto import codec, subjects
from allot.proto import messages as m
from allot.proto.subjects import Kind
from allot.services.ranking import RankingService

pytestmark = pytest.mark.integration

DEADLINE_S = 5.0
Reply = m.CommandAccepted | m.CommandRejected

TREE_YAML = """\
name: root
children:
  - name: nlp
    shares: 2
    children:
      - name: busy
        shares: 1
      - name: idle
        shares: 1
  - name: vision
    shares: 1
"""


async def until(check: Callable[[], Awaitable[Any]], what: str) -> Any:
    """Poll ``check`` until it returns something truthy; return it."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def last_tree(js: JetStreamContext) -> m.BudgetTreeSet | None:
    try:
        raw = await js.get_last_msg("USAGE", subjects.BUDGET_TREE)
    except NotFoundError:
        return None
    assert raw.data is not None
    record = codec.decode(Kind.BUDGET_TREE, raw.data)
    assert isinstance(record, m.BudgetTreeSet)
    return record


async def tree_records(js: JetStreamContext) -> int:
    info = await js.stream_info("USAGE", subjects_filter=subjects.BUDGET_TREE)
    return sum((info.state.subjects or {}).values())


def shares_of(spec: m.BudgetNodeSpec, name: str) -> int | None:
    stack = [spec]
    while stack:
        node = stack.pop()
        if node.name == name:
            return node.shares
        stack.extend(node.children)
    raise AssertionError(f"no node {name!r}")


@pytest.fixture
def budgets(tmp_path: Path) -> Path:
    path = tmp_path / "budgets.yaml"
    path.write_text(TREE_YAML)
    return path


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def nc(fresh_log: str) -> AsyncIterator[Client]:
    client = await nats.connect(fresh_log)
    yield client
    await client.close()


@asynccontextmanager
async def running(
    nats_url: str, redis_url: str, prefix: str, **kw: Any
) -> AsyncIterator[RankingService]:
    service = RankingService(nats_url, redis_url, redis_prefix=prefix, **kw)
    await service_main.start(service)
    try:
        yield service
    finally:
        await service_main.stop(service)


async def request(nc: Client, subject: str, body: bytes) -> Reply:
    msg = await nc.request(subject, body, timeout=DEADLINE_S)
    return msgspec.json.decode(msg.data, type=Reply)


async def test_bootstrap_publishes_the_file_tree(
    fresh_log: str, redis_url: str, prefix: str, budgets: Path, nc: Client
) -> None:
    js = nc.jetstream()
    async with running(fresh_log, redis_url, prefix, budgets_file=budgets):
        record = await last_tree(js)
    assert record is not None
    assert record.by == "bootstrap"
    assert [c.name for c in record.tree.children] == ["nlp", "vision"]
    assert shares_of(record.tree, "nlp") == 2
    assert shares_of(record.tree, "idle") == 1


async def test_budget_set_changes_shares_and_reranks(
    fresh_log: str, redis_url: str, prefix: str, budgets: Path, nc: Client
) -> None:
    js = nc.jetstream()
    # A long period: the second ranking can only come from the change.
    async with running(fresh_log, redis_url, prefix, budgets_file=budgets) as service:
        await until(lambda: _value(service.latest), "the first ranking")
        first = service.latest
        assert first is not None
        cmd = m.SetBudget(path=("root", "nlp", "idle"), shares=3, set_by="carol")
        reply = await request(nc, subjects.budget_set(cmd.path), codec.encode(cmd))
        assert isinstance(reply, m.CommandAccepted), reply
        assert "root/nlp/idle" in reply.detail

        record = await last_tree(js)
        assert record is not None
        assert record.by == "carol"
        assert shares_of(record.tree, "idle") == 3
        assert shares_of(record.tree, "busy") == 1

        async def reranked() -> m.RankingUpdated | None:
            latest = service.latest
            return latest if latest is not None and latest is not first else None

        ranking = await until(reranked, "a ranking after the budget change")
        rows = {row.name: row for row in ranking.nodes}
        assert rows["idle"].raw_shares == 3
        assert rows["idle"].norm_shares == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("subject_path", "body", "field"),
    [
        # unknown node
        (
            ("root", "nlp", "nope"),
            b'{"type":"SetBudget","path":["root","nlp","nope"],"shares":1,"set_by":"c"}',
            "path",
        ),
        # negative shares
        (
            ("root", "nlp", "idle"),
            b'{"type":"SetBudget","path":["root","nlp","idle"],"shares":-1,"set_by":"c"}',
            "shares",
        ),
        # the payload's path is not the subject's
        (
            ("root", "nlp", "idle"),
            b'{"type":"SetBudget","path":["root","nlp","busy"],"shares":1,"set_by":"c"}',
            "path",
        ),
        # malformed JSON
        (("root", "nlp", "idle"), b'{"type":"SetBudget","path":', "body"),  # truncated
        (("root", "nlp", "idle"), b'{"type":"SetBudget","shares":NaN}', "shares"),
        (("root", "nlp", "idle"), b"not json", "body"),
        # a missing field
        (
            ("root", "nlp", "idle"),
            b'{"type":"SetBudget","path":["root","nlp","idle"],"shares":1}',
            "set_by",
        ),
    ],
)
async def test_bad_budget_set_is_rejected_naming_the_field(
    *,
    fresh_log: str,
    redis_url: str,
    prefix: str,
    budgets: Path,
    nc: Client,
    subject_path: tuple[str, ...],
    body: bytes,
    field: str,
) -> None:
    js = nc.jetstream()
    async with running(fresh_log, redis_url, prefix, budgets_file=budgets):
        reply = await request(nc, subjects.budget_set(subject_path), body)
        assert isinstance(reply, m.CommandRejected), reply
        assert reply.field == field, reply
        assert reply.reason
        assert await tree_records(js) == 1  # only the bootstrap tree
        record = await last_tree(js)
        assert record is not None
        assert record.by == "bootstrap"


async def test_on_its_identity_subject_set_by_must_be_the_login(
    fresh_log: str, redis_url: str, prefix: str, budgets: Path, nc: Client
) -> None:
    """``budget.set.by.<login>.<path>``: a change naming anyone else is refused naming
    ``set_by`` and logs nothing; the login's own is applied and recorded under it."""
    js = nc.jetstream()
    async with running(fresh_log, redis_url, prefix, budgets_file=budgets):
        forged = m.SetBudget(path=("root", "nlp", "idle"), shares=5, set_by="director")
        reply = await request(nc, subjects.budget_set_as(forged.path, "lead"), codec.encode(forged))
        assert isinstance(reply, m.CommandRejected), reply
        assert (reply.field, reply.reason) == ("set_by", "'director' differs from the login 'lead'")
        assert await tree_records(js) == 1  # only the bootstrap tree
        # the path is read after the login: another path is still refused naming it
        own = m.SetBudget(path=("root", "nlp", "idle"), shares=5, set_by="lead")
        elsewhere = subjects.budget_set_as(("root", "nlp", "busy"), "lead")
        reply = await request(nc, elsewhere, codec.encode(own))
        assert isinstance(reply, m.CommandRejected) and reply.field == "path", reply
        reply = await request(nc, subjects.budget_set_as(own.path, "lead"), codec.encode(own))
        assert isinstance(reply, m.CommandAccepted), reply
        record = await last_tree(js)
        assert record is not None and record.by == "lead"
        assert shares_of(record.tree, "idle") == 5


async def test_ranking_puts_the_idle_allocation_above_the_busy_one(
    fresh_log: str, redis_url: str, prefix: str, budgets: Path, nc: Client
) -> None:
    js = nc.jetstream()
    client = redis_asyncio.from_url(redis_url)
    store = RedisUsageStore(client, prefix=prefix)
    now = time.time()
    assert await store.charge("c1", "busy", now - 3600, now - 60, 4)
    assert await store.charge("c2", "vision", now - 600, now - 60, 1)
    try:
        async with running(
            fresh_log, redis_url, prefix, budgets_file=budgets, rank_every_s=0.2
        ) as service:
            await until(lambda: _value(service.latest), "a ranking")

            async def share() -> m.RankingUpdated | None:
                msg = await nc.request(subjects.QUERY_SHARE, b"{}", timeout=DEADLINE_S)
                record = codec.decode(Kind.RANKING, msg.data)
                assert isinstance(record, m.RankingUpdated)
                return record

            ranking = await share()
            raw = await js.get_last_msg("USAGE", subjects.RANKING)
            assert raw.data is not None
            stored = codec.decode(Kind.RANKING, raw.data)
    finally:
        await store.wipe()
        await client.aclose()

    assert isinstance(stored, m.RankingUpdated)
    assert ranking.window_s == 7 * 86400
    rows = {row.name: row for row in ranking.nodes}
    assert set(rows) == {"nlp", "busy", "idle", "vision"}
    assert rows["busy"].raw_usage == pytest.approx((3600 - 60) * 4)
    assert rows["idle"].raw_usage == 0
    assert rows["idle"].level_fs == "inf"
    assert rows["busy"].rank is not None
    assert rows["idle"].rank is not None
    assert rows["idle"].rank > rows["busy"].rank  # higher rank = served first
    assert rows["idle"].fairshare is not None
    assert rows["busy"].fairshare is not None
    assert rows["idle"].fairshare > rows["busy"].fairshare
    # The latest published ranking is the one the query answers (or a newer one).
    assert stored.at >= ranking.at or stored == ranking


async def test_share_query_before_any_tree_is_rejected(
    fresh_log: str, redis_url: str, prefix: str, nc: Client
) -> None:
    async with running(fresh_log, redis_url, prefix):
        reply = await request(nc, subjects.QUERY_SHARE, b"{}")
        assert isinstance(reply, m.CommandRejected)
        assert reply.field == "ranking"
        cmd = m.SetBudget(path=("root", "nlp"), shares=1, set_by="carol")
        reply = await request(nc, subjects.budget_set(cmd.path), codec.encode(cmd))
        assert isinstance(reply, m.CommandRejected)
        assert reply.field == "path"


@pytest.mark.parametrize("steered", [False, True], ids=["tree-last", "junk-last"])
async def test_restart_takes_the_tree_from_the_log_not_the_file(
    *,
    fresh_log: str,
    redis_url: str,
    prefix: str,
    budgets: Path,
    tmp_path: Path,
    nc: Client,
    steered: bool,
) -> None:
    """``junk-last``: a JetStream answer steered onto the tree's subject (any login with the
    API can name it as a reply subject: docs/security.md) is the subject's last message;
    ranking starts from the last tree that decodes, as every follower does, and neither
    fails nor takes the file's tree."""
    js = nc.jetstream()
    async with running(fresh_log, redis_url, prefix, budgets_file=budgets):
        cmd = m.SetBudget(path=("root", "vision"), shares=5, set_by="carol")
        reply = await request(nc, subjects.budget_set(cmd.path), codec.encode(cmd))
        assert isinstance(reply, m.CommandAccepted), reply
    kept = 2  # bootstrap + the change
    if steered:
        await nc.publish("$JS.API.STREAM.INFO.USAGE", b"", reply=subjects.BUDGET_TREE)
        kept += 1
        await eventually(lambda: tree_records(js), lambda n: n == kept)
        junk = await js.get_last_msg("USAGE", subjects.BUDGET_TREE)
        assert b"stream_info_response" in (junk.data or b"")
    other = tmp_path / "other.yaml"
    other.write_text("name: root\nchildren:\n  - name: solo\n    shares: 1\n")
    async with running(fresh_log, redis_url, prefix, budgets_file=other) as service:
        assert service.tree is not None
        assert service.tree.leaves() == ("busy", "idle", "vision")
        assert service.tree.root.children[1].shares == 5
        assert await tree_records(js) == kept  # nothing new
        if not steered:
            record = await last_tree(js)
            assert record is not None
            assert record.by == "carol"


async def _value(x: Any) -> Any:
    return x
