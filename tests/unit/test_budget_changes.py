"""``set_shares`` and the wire form of budget trees."""

from __future__ import annotations

import pytest

from allot.core.budgets import parse_tree, set_shares
from allot.core.errors import ValidationError
from allot.eventlog.budget_wire import spec_from_tree, tree_from_spec

TREE = {
    "name": "root",
    "children": [
        {
            "name": "research",
            "shares": 60,
            "children": [{"name": "nlp", "shares": 50}, {"name": "vision", "shares": "parent"}],
        },
        {"name": "product", "shares": 40},
    ],
}


def test_set_shares_changes_one_node_and_revalidates() -> None:
    tree = parse_tree(TREE)
    changed = set_shares(tree, ["root", "product"], 60)
    assert changed.effective_share("product") == pytest.approx(0.5)
    # vision has `parent` shares, so nlp is research's only share holder: research's half.
    assert changed.effective_share("nlp") == pytest.approx(0.5)
    assert tree.effective_share("nlp") == parse_tree(TREE).effective_share("nlp")  # unchanged


@pytest.mark.parametrize(
    ("path", "shares", "field"),
    [
        (["root", "research", "chem"], 1, "path"),
        (["root"], 1, "path"),
        (["top", "research"], 1, "path"),
        (["root", "research", "nlp"], -1, "root/research/nlp.shares"),
    ],
)
def test_bad_changes_name_the_problem(path: list[str], shares: int, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        set_shares(parse_tree(TREE), path, shares)
    assert err.value.field == field or err.value.field.startswith(field.split(".", maxsplit=1)[0])


def test_wire_round_trip_keeps_parent_shares() -> None:
    tree = parse_tree(TREE)
    back = tree_from_spec(spec_from_tree(tree))
    assert back.effective_shares() == tree.effective_shares()
    assert spec_from_tree(back) == spec_from_tree(tree)
