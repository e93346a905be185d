"""Budget changes from the log's trees (``allot.eventlog.budget_history``): what changed,
node by node, and that the author is the login the ranking service checked."""

from __future__ import annotations

import pytest
from handler_harness import NOW, ask, broker, running

from allot.adapters.usage_store import MemoryUsageStore
from allot.core.budgets import parse_tree
from allot.eventlog.budget_history import BudgetChange, ShareChange, budget_changes, tree_diff
from allot.eventlog.budget_wire import spec_from_tree
from allot.proto import messages as m
from allot.proto import subjects as s
from allot.services.ranking import RankingService
from memory_log import MemoryLog


def spec(*children: tuple[str, int | None, tuple[tuple[str, int | None], ...]]) -> m.BudgetNodeSpec:
    """``root`` with ``(name, shares, ((leaf, shares), ...))`` children."""
    return m.BudgetNodeSpec(
        name="root",
        children=tuple(
            m.BudgetNodeSpec(
                name=name,
                shares=shares,
                children=tuple(m.BudgetNodeSpec(name=n, shares=x) for n, x in leaves),
            )
            for name, shares, leaves in children
        ),
    )


BEFORE = spec(("research", 2, (("nlp", 1), ("cv", 1))), ("ops", 1, ()))

DIFFS = [
    pytest.param(
        spec(("research", 2, (("nlp", 3), ("cv", 1))), ("ops", 1, ())),
        (ShareChange("root/research/nlp", 1, 3),),
        id="one leaf's shares",
    ),
    pytest.param(
        spec(("research", None, (("nlp", 1), ("cv", 1))), ("ops", 1, ())),
        (ShareChange("root/research", 2, "parent"),),
        id="an account to Slurm's parent",
    ),
    pytest.param(
        spec(("research", 2, (("nlp", 1), ("cv", 1), ("rl", 4))), ("ops", 1, ())),
        (ShareChange("root/research/rl", None, 4),),
        id="a node added",
    ),
    pytest.param(
        spec(("research", 2, (("nlp", 1),)), ("ops", 1, ())),
        (ShareChange("root/research/cv", 1, None),),
        id="a node removed",
    ),
    pytest.param(BEFORE, (), id="the same tree again"),
]


@pytest.mark.parametrize(("after", "changes"), DIFFS)
def test_a_change_names_each_node_whose_shares_differ(
    after: m.BudgetNodeSpec, changes: tuple[ShareChange, ...]
) -> None:
    assert tree_diff(BEFORE, after) == changes


def test_every_tree_is_one_entry_in_order_the_first_listing_the_whole_tree() -> None:
    raised = spec(("research", 2, (("nlp", 5), ("cv", 1))), ("ops", 1, ()))
    trees = [
        m.BudgetTreeSet(at=10.0, by="bootstrap", tree=BEFORE),
        m.BudgetTreeSet(at=20.0, by="alice", tree=raised),
        m.BudgetTreeSet(at=30.0, by="bob", tree=BEFORE),
    ]
    assert budget_changes(trees) == [
        BudgetChange(
            10.0,
            "bootstrap",
            (
                ShareChange("root/research", None, 2),
                ShareChange("root/research/nlp", None, 1),
                ShareChange("root/research/cv", None, 1),
                ShareChange("root/ops", None, 1),
            ),
        ),
        BudgetChange(20.0, "alice", (ShareChange("root/research/nlp", 1, 5),)),
        BudgetChange(30.0, "bob", (ShareChange("root/research/nlp", 5, 1),)),
    ]


async def test_the_author_is_the_login_the_ranking_service_checked() -> None:
    """A change sent on a login's subject is logged by that login; one naming someone else
    is refused and leaves no entry (so the history cannot be forged by a payload)."""
    log = MemoryLog()
    tree = parse_tree({"name": "root", "children": [{"name": "nlp", "shares": 1}]})
    await log.seed(
        s.BUDGET_TREE, m.BudgetTreeSet(at=NOW - 60, by="bootstrap", tree=spec_from_tree(tree))
    )
    svc = RankingService(
        broker=broker("ranking"), record_log=log, store=MemoryUsageStore(), rank_every_s=3600.0
    )
    path = ("root", "nlp")
    reply = m.CommandAccepted | m.CommandRejected
    async with running(svc) as br:
        ok = await ask(
            br,
            s.budget_set_as(path, "lead"),
            m.SetBudget(path=path, shares=4, set_by="lead"),
            reply,
        )
        forged = await ask(
            br, s.budget_set_as(path, "lead"), m.SetBudget(path=path, shares=9, set_by="eve"), reply
        )
    assert isinstance(ok, m.CommandAccepted)
    assert isinstance(forged, m.CommandRejected) and forged.field == "set_by"
    trees = [r for r in log.records("USAGE") if isinstance(r, m.BudgetTreeSet)]
    history = budget_changes(trees)
    assert [(h.by, h.changes) for h in history[1:]] == [("lead", (ShareChange("root/nlp", 1, 4),))]
