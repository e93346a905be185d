"""The budget tree: parsing, validation, queries, and Slurm's `parent` flattening."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allot.core.budgets import BudgetNode, BudgetTree, parse_flat, parse_tree
from allot.core.errors import ValidationError

# -- builders ------------------------------------------------------------------------------


def leaf(name: object, shares: object = 1, **extra: object) -> dict[str, object]:
    """A leaf allocation as YAML would load it."""
    return {"name": name, "shares": shares, **extra}


def account(
    name: object, shares: object, *children: dict[str, object], **extra: object
) -> dict[str, object]:
    return {"name": name, "shares": shares, "children": list(children), **extra}


def root(*children: dict[str, object], **extra: object) -> dict[str, object]:
    return {"name": "root", "children": list(children), **extra}


def row(
    name: object, parent: object = None, shares: object = 1, **extra: object
) -> dict[str, object]:
    data: dict[str, object] = {"name": name, "shares": shares, **extra}
    if parent is not None:
        data["parent"] = parent
    return data


def node(
    name: str, shares: int | None = 1, *children: BudgetNode, usage: float = 0.0
) -> BudgetNode:
    return BudgetNode(name, shares, tuple(children), usage)


def tree(*children: BudgetNode) -> BudgetTree:
    return BudgetTree(BudgetNode("root", None, tuple(children)))


EXAMPLE = root(
    account("nlp", 40, leaf("pretrain", 30, usage=20), leaf("evals", "parent", usage=5)),
    leaf("vision", 10, usage=0),
)


# -- parsing and queries -------------------------------------------------------------------


def test_the_example_tree_parses_into_leaves_in_depth_first_order() -> None:
    t = parse_tree(EXAMPLE)
    assert t.leaves() == ("pretrain", "evals", "vision")
    assert t.root.children[0] == BudgetNode(
        "nlp", 40, (BudgetNode("pretrain", 30, (), 20.0), BudgetNode("evals", None, (), 5.0))
    )
    assert t.usage() == {"pretrain": 20.0, "evals": 5.0, "vision": 0.0}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("pretrain", True),
        ("vision", True),
        ("nlp", False),  # an account
        ("root", False),
        ("nobody", False),
    ],
    ids=["leaf-in-account", "leaf-under-root", "account", "root", "unknown"],
)
def test_is_leaf(name: str, expected: bool) -> None:
    assert parse_tree(EXAMPLE).is_leaf(name) is expected


@pytest.mark.parametrize(
    ("name", "path", "program"),
    [
        ("pretrain", "root/nlp/pretrain", "nlp"),
        ("evals", "root/nlp/evals", "nlp"),
        ("vision", "root/vision", "vision"),  # a leaf directly under root is its own program
    ],
    ids=["nested-leaf", "parent-leaf", "top-level-leaf-is-its-own-program"],
)
def test_path_and_program(name: str, path: str, program: str) -> None:
    t = parse_tree(EXAMPLE)
    assert t.path(name) == path
    assert t.program(name) == program


def test_program_is_the_top_level_ancestor_of_a_deep_leaf() -> None:
    t = tree(node("prog", 1, node("proj", 1, node("team", 1, node("x")))))
    assert t.program("x") == "prog"
    assert t.path("team") == "root/prog/proj/team"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("nobody", "unknown allocation 'nobody'"),
        ("nlp", "'nlp' is an account, not a leaf allocation"),
        ("root", "'root' is an account, not a leaf allocation"),
    ],
    ids=["unknown", "account", "root"],
)
def test_require_leaf_rejects_non_leaves(name: str, reason: str) -> None:
    t = parse_tree(EXAMPLE)
    with pytest.raises(ValidationError) as err:
        t.require_leaf(name)
    assert (err.value.field, err.value.reason) == ("allocation", reason)
    with pytest.raises(ValidationError):
        t.effective_share(name)
    with pytest.raises(ValidationError):
        t.program(name)


def test_path_of_an_unknown_node_is_an_error() -> None:
    with pytest.raises(ValidationError, match="unknown node 'ghost'"):
        parse_tree(EXAMPLE).path("ghost")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(103959, "103959"), (0, "0"), ("0e4a51", "0e4a51"), ("6214e9", "6214e9")],
    ids=["int-id", "zero", "hex-looking-text", "exponent-looking-text"],
)
def test_names_are_always_text(raw: object, expected: str) -> None:
    t = parse_tree(root(leaf(raw)))
    assert t.leaves() == (expected,)


def test_root_name_defaults_to_root_and_root_shares_are_ignored() -> None:
    t = parse_tree({"shares": "whatever", "children": [leaf("a")]})
    assert t.path("a") == "root/a"
    assert t.root.shares is None


# -- validation ----------------------------------------------------------------------------

BAD_TREES: list[tuple[str, Any, str, str]] = [
    # (id, data, expected field, expected words in the reason)
    ("not-a-mapping", ["a"], "tree", "must be a mapping"),
    ("empty-tree-no-children", {"name": "root"}, "root", "empty tree"),
    ("empty-tree-empty-list", root(), "root.children", "empty tree"),
    ("account-with-empty-children", root(account("a", 1)), "root/a.children", "at least one child"),
    ("children-not-a-list", root(leaf("a", children="b")), "root/a.children", "must be a list"),
    ("child-not-a-mapping", {"children": ["a"]}, "root/children[0]", "must be a mapping"),
    ("missing-name", root(leaf("a"), {"shares": 1}), "root/children[1].name", "missing name"),
    ("empty-name", root(leaf("")), "root/children[0].name", "missing name"),
    ("float-name", root(leaf(6214e9)), "root/children[0].name", "quote it"),
    ("bool-name", root(leaf(True)), "root/children[0].name", "quote it"),
    ("dot-in-name", root(leaf("a.b")), "root/children[0].name", "no '.'"),
    ("space-in-name", root(leaf("a b")), "root/children[0].name", "letters, digits"),
    ("star-in-name", root(leaf("a*")), "root/children[0].name", "letters, digits"),
    ("gt-in-name", root(leaf("a>")), "root/children[0].name", "letters, digits"),
    ("list-name", root(leaf(["a"])), "root/children[0].name", "must be text"),
    (
        "duplicate-across-levels",
        root(account("a", 1, leaf("x")), account("b", 1, leaf("x"))),
        "root/b/x",
        "duplicate name 'x' (also root/a/x)",
    ),
    ("duplicate-of-an-account", root(account("a", 1, leaf("a"))), "root/a/a", "duplicate name"),
    ("duplicate-of-the-root", root(leaf("root")), "root/root", "duplicate name"),
    ("negative-shares", root(leaf("a", -3)), "root/a.shares", "negative shares -3"),
    ("non-integer-shares", root(leaf("a", 2.5)), "root/a.shares", "non-integer shares 2.5"),
    ("integral-float-shares", root(leaf("a", 2.0)), "root/a.shares", "non-integer shares"),
    ("text-shares", root(leaf("a", "lots")), "root/a.shares", "integer >= 0 or 'parent'"),
    ("bool-shares", root(leaf("a", True)), "root/a.shares", "integer >= 0 or 'parent'"),
    ("missing-shares", root({"name": "a"}), "root/a.shares", "missing shares"),
    ("unknown-field", root(leaf("a", gpus=8)), "root/a", "unknown field 'gpus'"),
    ("unknown-field-on-root", root(leaf("a"), owner="me"), "root", "unknown field 'owner'"),
    ("negative-usage", root(leaf("a", usage=-1)), "root/a.usage", ">= 0"),
    ("nan-usage", root(leaf("a", usage=math.nan)), "root/a.usage", "finite"),
    ("text-usage", root(leaf("a", usage="1h")), "root/a.usage", "number of GPU-seconds"),
    (
        "usage-on-an-account",
        root(account("a", 1, leaf("b"), usage=0)),
        "root/a.usage",
        "only allowed on leaf",
    ),
]


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [case[1:] for case in BAD_TREES],
    ids=[case[0] for case in BAD_TREES],
)
def test_bad_trees_name_the_node_and_the_problem(data: Any, field: str, reason: str) -> None:
    with pytest.raises(ValidationError) as err:
        parse_tree(data)
    assert err.value.field == field
    assert reason in err.value.reason


def test_a_tree_deeper_than_the_limit_is_rejected() -> None:
    data: dict[str, object] = leaf("x0")
    for i in range(1, 120):
        data = account(f"x{i}", 1, data)
    with pytest.raises(ValidationError, match="deeper than"):
        parse_tree(root(data))


@pytest.mark.parametrize(
    ("build", "field", "reason"),
    [
        (lambda: tree(node("a"), node("a")), "root/a", "duplicate name"),
        (lambda: tree(node("a.b")), "root/children[0].name", "letters, digits"),
        (lambda: tree(node("a", -1)), "root/a.shares", "integer >= 0"),
        (lambda: tree(node("a", 1, node("b"), usage=3.0)), "root/a.usage", "only allowed on leaf"),
        (lambda: tree(node("a", usage=-2.0)), "root/a.usage", ">= 0"),
        (lambda: BudgetTree(BudgetNode("root", None)), "root", "empty tree"),
    ],
    ids=["duplicate", "bad-name", "negative-shares", "usage-on-account", "negative-usage", "empty"],
)
def test_trees_built_in_code_are_validated_too(build: Any, field: str, reason: str) -> None:
    with pytest.raises(ValidationError) as err:
        build()
    assert err.value.field == field
    assert reason in err.value.reason


# -- the flat form -------------------------------------------------------------------------


def test_flat_rows_build_the_same_tree_as_the_nested_form() -> None:
    flat = parse_flat(
        [
            row("nlp", shares=40),
            row("pretrain", "nlp", 30, usage=20),
            row("evals", "nlp", "parent", usage=5),
            row("vision", "root", 10),  # an explicit "root" parent is the implicit root
        ]
    )
    assert flat == parse_tree(EXAMPLE)


def test_flat_rows_may_come_in_any_order_and_names_may_be_ints() -> None:
    flat = parse_flat([row(7, 103959), row(103959, None, 2)])
    assert flat.path("7") == "root/103959/7"


BAD_FLAT: list[tuple[str, Any, str, str]] = [
    ("not-a-list", {"name": "a"}, "rows", "must be a list"),
    ("no-rows", [], "rows", "empty tree"),
    ("row-not-a-mapping", ["a"], "rows[0]", "must be a mapping"),
    ("unknown-parent", [row("a", "ghost")], "rows[0] (a).parent", "unknown parent 'ghost'"),
    ("self-parent", [row("a", "a")], "rows[0] (a).parent", "cycle: a -> a"),
    (
        "two-cycle",
        [row("x"), row("a", "b"), row("b", "a")],
        "rows[1] (a).parent",
        "cycle: a -> b -> a",
    ),
    ("duplicate", [row("a"), row("a")], "rows[1] (a).name", "duplicate name 'a' (also rows[0])"),
    ("named-root", [row("root")], "rows[0] (root).name", "implicit root"),
    ("unknown-field", [row("a", color="red")], "rows[0] (a)", "unknown field 'color'"),
    ("negative-shares", [row("a", shares=-1)], "rows[0] (a).shares", "negative shares"),
    ("float-parent", [row("a"), row("b", 1.5)], "rows[1] (b).parent", "quote it"),
    (
        "usage-on-account",
        [row("a", usage=3), row("b", "a")],
        "rows[0] (a).usage",
        "only allowed on leaf",
    ),
]


@pytest.mark.parametrize(
    ("rows", "field", "reason"),
    [case[1:] for case in BAD_FLAT],
    ids=[case[0] for case in BAD_FLAT],
)
def test_bad_flat_rows_name_the_row_and_the_problem(rows: Any, field: str, reason: str) -> None:
    with pytest.raises(ValidationError) as err:
        parse_flat(rows)
    assert err.value.field == field
    assert reason in err.value.reason


# -- effective shares ----------------------------------------------------------------------

EFFECTIVE: list[tuple[str, BudgetTree, dict[str, float]]] = [
    (
        "product-of-normalised-shares",
        tree(node("nlp", 40, node("pretrain", 30), node("evals", 10)), node("vision", 10)),
        {"pretrain": 0.8 * 0.75, "evals": 0.8 * 0.25, "vision": 0.2},
    ),
    (
        "parent-leaf-rides-on-its-account",
        tree(node("nlp", 40, node("pretrain", 30), node("evals", None)), node("vision", 10)),
        {"pretrain": 0.8, "evals": 0.0, "vision": 0.2},
    ),
    (
        "parent-account-children-hoisted-one-level",
        # root's set is {x (placeholder), a, b, c}: level shares 1 + 1 + 2.
        tree(node("x", None, node("a", 1), node("b", 1)), node("c", 2)),
        {"a": 0.25, "b": 0.25, "c": 0.5},
    ),
    (
        "chain-of-parent-accounts",
        tree(node("x", None, node("y", None, node("a", 3))), node("c", 1)),
        {"a": 0.75, "c": 0.25},
    ),
    (
        "zero-share-subtree-gets-nothing",
        tree(node("a", 1, node("a1", 1)), node("b", 0, node("b1", 5))),
        {"a1": 1.0, "b1": 0.0},
    ),
    (
        "all-zero-sibling-set-splits-equally",
        tree(node("a", 10, node("x", 0), node("y", 0)), node("b", 0, node("z", 5))),
        {"x": 0.5, "y": 0.5, "z": 0.0},
    ),
    (
        "all-parent-set-splits-equally",
        tree(node("a", 1, node("p", None), node("q", None)), node("b", 1)),
        {"p": 0.25, "q": 0.25, "b": 0.5},
    ),
]


@pytest.mark.parametrize(
    ("budget", "expected"),
    [case[1:] for case in EFFECTIVE],
    ids=[case[0] for case in EFFECTIVE],
)
def test_effective_shares(budget: BudgetTree, expected: dict[str, float]) -> None:
    assert budget.effective_shares() == pytest.approx(expected)
    for name, share in expected.items():
        assert budget.effective_share(name) == pytest.approx(share)


def test_effective_shares_returns_a_copy() -> None:
    t = parse_tree(EXAMPLE)
    t.effective_shares()["vision"] = 99.0
    assert t.effective_share("vision") == pytest.approx(0.2)


@st.composite
def budget_trees(draw: st.DrawFn) -> BudgetTree:
    """Random trees up to four levels deep, with zero shares and `parent` mixed in."""
    ids = itertools.count()
    shares = st.sampled_from([0, 1, 1, 2, 3, 7, 100, None])

    def make(depth: int) -> BudgetNode:
        i = next(ids)
        if depth < 4 and draw(st.booleans()):
            kids = tuple(make(depth + 1) for _ in range(draw(st.integers(1, 3))))
            return BudgetNode(f"a{i}", draw(shares), kids)
        return BudgetNode(f"l{i}", draw(shares))

    return BudgetTree(
        BudgetNode("root", None, tuple(make(1) for _ in range(draw(st.integers(1, 4)))))
    )


@given(budget_trees())
def test_effective_shares_always_sum_to_one(budget: BudgetTree) -> None:
    shares = budget.effective_shares()
    assert set(shares) == set(budget.leaves())
    assert all(s >= 0 for s in shares.values())
    assert math.fsum(shares.values()) == pytest.approx(1.0, abs=1e-12)


@given(budget_trees())
def test_flat_and_nested_forms_agree(budget: BudgetTree) -> None:
    rows: list[dict[str, object]] = []

    def walk(n: BudgetNode, parent: str | None) -> None:
        rows.append(row(n.name, parent, "parent" if n.shares is None else n.shares))
        for c in n.children:
            walk(c, n.name)

    for top in budget.root.children:
        walk(top, None)
    assert parse_flat(rows) == budget
