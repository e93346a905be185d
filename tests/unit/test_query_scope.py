"""``query_scope``: which allocation a per-allocation query subject asks about. An
allocation the budget tree lacks is refused naming ``allocation``, so ``allot queue --alloc
nosuch`` is an error rather than an empty queue; ``~`` (unallocated work) is always valid."""

from __future__ import annotations

import pytest

from allot.core.budgets import BudgetTree, parse_tree
from allot.core.errors import ValidationError
from allot.proto import subjects as s
from allot.services.placement.answers import query_scope

TREE = parse_tree(
    {
        "name": "root",
        "children": [
            {"name": "research", "shares": 1, "children": [{"name": "nlp", "shares": 1}]},
            {"name": "vision", "shares": 1},
        ],
    }
)


@pytest.mark.parametrize("query", [s.QUERY_QUEUE, s.QUERY_PRIO, s.QUERY_STATUS])
@pytest.mark.parametrize(
    ("allocation", "tree", "scope"),
    [
        ("nlp", TREE, "nlp"),
        ("vision", TREE, "vision"),
        (None, TREE, s.UNALLOCATED),
        (None, None, s.UNALLOCATED),
    ],
    ids=["a-leaf", "another-leaf", "unallocated", "unallocated-before-any-tree"],
)
def test_a_leaf_or_unallocated_work_is_a_scope(
    query: str, allocation: str | None, tree: BudgetTree | None, scope: str
) -> None:
    assert query_scope(s.query_scoped(query, allocation), query, tree) == scope


def test_the_cluster_wide_subject_has_no_scope() -> None:
    assert query_scope(s.QUERY_QUEUE, s.QUERY_QUEUE, TREE) is None
    assert query_scope(s.QUERY_QUEUE, s.QUERY_QUEUE, None) is None


@pytest.mark.parametrize("query", [s.QUERY_QUEUE, s.QUERY_PRIO, s.QUERY_STATUS])
@pytest.mark.parametrize(
    ("allocation", "tree", "reason"),
    [
        ("nosuch", TREE, "no allocation 'nosuch' in the budget tree (allocations: nlp, vision)"),
        (
            "research",
            TREE,
            "'research' is an account, not an allocation (allocations: nlp, vision)",
        ),
        ("root", TREE, "'root' is an account, not an allocation (allocations: nlp, vision)"),
        ("nlp", None, "no allocation 'nlp': no budget tree is set yet"),
    ],
    ids=["a-typo", "an-inner-node", "the-root", "before-any-tree"],
)
def test_anything_but_a_leaf_is_refused_naming_allocation(
    query: str, allocation: str, tree: BudgetTree | None, reason: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        query_scope(s.query_scoped(query, allocation), query, tree)
    assert (caught.value.field, caught.value.reason) == ("allocation", reason)
