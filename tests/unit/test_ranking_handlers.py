"""The ranking service's rules with no server: budget changes and the share query (FastStream
subscribers, under ``TestNatsBroker``), the tree read from or bootstrapped into the log (a
``MemoryLog``), rankings over an in-memory usage store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from handler_harness import NOW, Clock, ask, broker, running

from allot.adapters.usage_store import MemoryUsageStore
from allot.config.budget_file import load_tree_file
from allot.core.budgets import parse_tree
from allot.eventlog.budget_wire import spec_from_tree
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.services import ranking as ranking_module
from allot.services.ranking import RankingService
from memory_log import MemoryLog

Reply = m.CommandAccepted | m.CommandRejected
TREE = {
    "name": "root",
    "children": [
        {"name": "nlp", "shares": 1},
        {"name": "lab", "shares": 2, "children": [{"name": "a", "shares": 1}]},
    ],
}
NLP = ("root", "nlp")


def service(log: MemoryLog, clock: Clock | None = None, **kw: object) -> RankingService:
    return RankingService(
        broker=broker("ranking"),
        record_log=log,
        store=MemoryUsageStore(),
        clock=clock or Clock(),
        rank_every_s=3600.0,
        **kw,  # type: ignore[arg-type]
    )


async def seeded_log() -> MemoryLog:
    log = MemoryLog()
    spec = spec_from_tree(parse_tree(TREE))
    await log.seed(s.BUDGET_TREE, m.BudgetTreeSet(at=NOW - 60, by="test", tree=spec))
    return log


def trees(log: MemoryLog) -> list[m.BudgetTreeSet]:
    return [r for r in log.records("USAGE") if isinstance(r, m.BudgetTreeSet)]


def shares(tree: m.BudgetNodeSpec, name: str) -> int | None:
    """The shares of the node ``name`` directly under the root."""
    (node,) = (c for c in tree.children if c.name == name)
    return node.shares


async def until(check: object, what: str) -> None:
    for _ in range(500):
        if callable(check) and check():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"timed out waiting for {what}")


CHANGES = [
    # (subject, body, the field refused or None)
    pytest.param(
        s.budget_set_as(NLP, "mgr"),
        m.SetBudget(path=NLP, shares=3, set_by="mgr"),
        None,
        id="a manager sets shares on its own login's subject",
    ),
    pytest.param(
        s.budget_set(NLP),
        m.SetBudget(path=NLP, shares=3, set_by="anyone"),
        None,
        id="the bare subject carries no login and checks none",
    ),
    pytest.param(
        s.budget_set_as(NLP, "mgr"),
        m.SetBudget(path=NLP, shares=3, set_by="eve"),
        "set_by",
        id="set_by other than the subject's login",
    ),
    pytest.param(
        s.budget_set_as(NLP, "mgr"),
        m.SetBudget(path=("root", "lab"), shares=3, set_by="mgr"),
        "path",
        id="a path other than the subject's",
    ),
    pytest.param(
        s.budget_set_as(("root", "astro"), "mgr"),
        m.SetBudget(path=("root", "astro"), shares=3, set_by="mgr"),
        "path",
        id="a node the tree lacks",
    ),
]


@pytest.mark.parametrize(("subject", "body", "refused"), CHANGES)
async def test_a_budget_change_is_judged_by_its_subject(
    subject: str, body: m.SetBudget, refused: str | None
) -> None:
    log = await seeded_log()
    svc = service(log)
    async with running(svc) as br:
        reply = await ask(br, subject, body, Reply)
    if refused is None:
        assert reply == m.CommandAccepted(at=NOW, detail="root/nlp shares = 3")
        (_, changed) = trees(log)
        assert changed.by == body.set_by
        assert shares(changed.tree, "nlp") == 3
        assert shares(changed.tree, "lab") == 2  # the rest as it was
        assert svc.tree is not None and shares(spec_from_tree(svc.tree), "nlp") == 3
    else:
        assert isinstance(reply, m.CommandRejected)
        assert reply.field == refused
        assert len(trees(log)) == 1


async def test_without_a_tree_a_change_is_refused() -> None:
    svc = service(MemoryLog())
    async with running(svc) as br:
        reply = await ask(
            br, s.budget_set_as(NLP, "mgr"), m.SetBudget(path=NLP, shares=3, set_by="mgr"), Reply
        )
    assert isinstance(reply, m.CommandRejected)
    assert (reply.field, reply.reason) == ("path", "no budget tree yet (start with --budgets)")


async def test_the_file_seeds_an_empty_log_once_and_the_log_wins_after(tmp_path: Path) -> None:
    budgets_first = tmp_path / "first.yaml"
    budgets_first.write_text("name: root\nchildren:\n  - {name: nlp, shares: 5}\n")
    log = MemoryLog()
    async with running(service(log, budgets_file=budgets_first)):
        pass
    budgets = tmp_path / "then.yaml"
    budgets.write_text("name: root\nchildren:\n  - {name: vision, shares: 1}\n")
    again = service(log, budgets_file=budgets)
    async with running(again):
        pass
    (seeded,) = trees(log)
    assert seeded.by == "bootstrap"
    assert log.streams["USAGE"][0].headers["Nats-Msg-Id"] == "budget-tree:bootstrap"
    assert seeded.tree == spec_from_tree(load_tree_file(budgets_first))
    assert again.tree is not None and again.tree.leaves() == ("nlp",)


async def test_a_change_reranks_and_the_share_query_answers_the_latest() -> None:
    log = await seeded_log()
    clock = Clock()
    svc = service(log, clock)
    async with running(svc) as br:
        await until(lambda: svc.latest is not None, "the first ranking")
        first = await ask(br, s.QUERY_SHARE, b"", m.RankingUpdated | m.CommandRejected)
        clock.advance(1)  # a ranking's msg id is its time
        await ask(
            br, s.budget_set_as(NLP, "mgr"), m.SetBudget(path=NLP, shares=3, set_by="mgr"), Reply
        )
        await until(
            lambda: len([r for r in log.records("USAGE") if isinstance(r, m.RankingUpdated)]) == 2,
            "a ranking after the change",
        )
        latest = await ask(br, s.QUERY_SHARE, b"", m.RankingUpdated | m.CommandRejected)
    assert isinstance(first, m.RankingUpdated)
    assert isinstance(latest, m.RankingUpdated)
    raw = {row.path: row.raw_shares for row in latest.nodes}
    assert raw["root/nlp"] == 3
    assert {row.path: row.raw_shares for row in first.nodes}["root/nlp"] == 1


async def test_the_share_query_before_any_ranking_is_refused() -> None:
    svc = service(MemoryLog())
    async with running(svc) as br:
        reply = await ask(br, s.QUERY_SHARE, msgspec.json.encode({}), Reply)
    assert isinstance(reply, m.CommandRejected)
    assert reply.field == "ranking"


class FailingFirst(MemoryUsageStore):
    """Redis away at start: the first read of the usage fails."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def buckets(self, *args: object, **kw: object) -> object:  # type: ignore[override]
        self.reads += 1
        if self.reads == 1:
            raise ConnectionError("usage store away")
        return await super().buckets(*args, **kw)  # type: ignore[arg-type]


async def test_a_failed_first_ranking_is_tried_again_soon(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not ``--rank-every-s`` later (an hour here): the stack waits for a first ranking."""
    monkeypatch.setattr(ranking_module, "FIRST_RETRY_S", 0.05)
    store = FailingFirst()
    svc = RankingService(
        broker=broker("ranking"),
        record_log=await seeded_log(),
        store=store,
        clock=Clock(),
        rank_every_s=3600.0,
    )
    async with running(svc):
        await until(lambda: svc.latest is not None, "a ranking after the failed one")
    assert store.reads == 2
