"""Fair Tree, case by case from Slurm's documentation and fair_tree.c, then by property.

Each hand-worked case states LF = S / U for every node it relies on. Ranks count down from
n (the number of leaves): the best leaf has rank n and fairshare 1.0.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allot.core.budgets import BudgetNode, BudgetTree
from allot.core.errors import ValidationError
from allot.core.fairshare import NodeRank, Ranking, rank

# -- builders ------------------------------------------------------------------------------


def leaf(name: str, shares: int | None = 1) -> BudgetNode:
    return BudgetNode(name, shares)


def acct(name: str, shares: int | None, *children: BudgetNode) -> BudgetNode:
    return BudgetNode(name, shares, children)


def tree(*children: BudgetNode) -> BudgetTree:
    return BudgetTree(BudgetNode("root", None, children))


def row(ranking: Ranking, name: str) -> NodeRank:
    return next(n for n in ranking.nodes if n.name == name)


# -- hand-worked cases ---------------------------------------------------------------------

# (id, tree, usage, expected ranks)
CASES: list[tuple[str, BudgetTree, dict[str, float], dict[str, int]]] = [
    (
        # The doc's promise: if account A1 has a higher LF than its sibling A2, every leaf
        # of A1 ranks above every leaf of A2, even A2's idle leaf (LF = inf inside A2).
        # Total usage 100. A1: S .5, U .4 -> 1.25; A2: S .5, U .6 -> 0.833.
        # Inside A1 (usage 40): a1 .5/.25 = 2, a2 .5/.75 = 0.667. Inside A2: b1 inf, b2 1.
        "higher-account-beats-all-leaves-of-lower-account",
        tree(acct("A1", 1, leaf("a1"), leaf("a2")), acct("A2", 1, leaf("b1"), leaf("b2"))),
        {"a1": 10, "a2": 30, "b1": 0, "b2": 60},
        {"a1": 4, "a2": 3, "b1": 2, "b2": 1},
    ),
    (
        # Sibling leaves with equal LF share a rank; the next leaf's rank skips the tie
        # (rnt keeps counting). S = 1/3 each; U .25, .25, .5 -> 1.333, 1.333, 0.667.
        "tied-leaves-share-a-rank",
        tree(leaf("u1"), leaf("u2"), leaf("u3")),
        {"u1": 10, "u2": 10, "u3": 20},
        {"u1": 3, "u2": 3, "u3": 1},
    ),
    (
        # Zero usage gives U = 0 and LF = inf: an idle leaf is served first, and two idle
        # leaves tie.
        "zero-usage-is-infinitely-under-served",
        tree(leaf("busy", 100), leaf("idle1", 1), leaf("idle2", 1)),
        {"busy": 5},
        {"idle1": 3, "idle2": 3, "busy": 1},
    ),
    (
        # Nothing used anywhere: every LF is inf and everyone ties at the top.
        "nothing-used-everyone-ties-at-the-top",
        tree(acct("A", 1, leaf("a1"), leaf("a2")), leaf("b", 5)),
        {},
        {"a1": 3, "a2": 3, "b": 3},
    ),
    (
        # S = 0 gives LF = 0, checked before U: a zero-share leaf is last even when idle.
        "zero-shares-is-always-last",
        tree(leaf("free", 0), leaf("paid", 1), leaf("paid2", 1)),
        {"paid": 10, "paid2": 30},
        {"paid": 3, "paid2": 2, "free": 1},
    ),
    (
        # Tie rule 3: a leaf tied with a sibling account gets the rank of that account's
        # highest ranked leaf. u: S .5, U .5 -> 1; A: S .5, U .5 -> 1 (tied, leaf first).
        # Inside A (usage 10): x .5/.2 = 2.5 inherits the tie, y .5/.8 = 0.625.
        "leaf-tied-with-account-shares-its-best-rank",
        tree(leaf("u"), acct("A", 1, leaf("x"), leaf("y"))),
        {"u": 10, "x": 2, "y": 8},
        {"u": 3, "x": 3, "y": 1},
    ),
    (
        # Tie rule 2: tied sibling accounts are merged and their leaves sorted together.
        # A and B: S .5, U .5 -> 1, tied. Each leaf's LF is against its own account:
        # a1 .5/.1 = 5, a2 .5/.9 = 0.556, b1 = b2 = .5/.5 = 1. Merged: a1, b1 = b2, a2.
        "tied-accounts-merge-their-children",
        tree(acct("A", 1, leaf("a1"), leaf("a2")), acct("B", 1, leaf("b1"), leaf("b2"))),
        {"a1": 1, "a2": 9, "b1": 5, "b2": 5},
        {"a1": 4, "b1": 3, "b2": 3, "a2": 1},
    ),
    (
        # A `parent` leaf has LF = inf: first in its account whatever it used, and its
        # shares do not count in the level shares (x's S is 1/1). At the root, idle B
        # (inf) beats A (S .5, U 1 -> .5). Inside A (usage 101): p inf, x 1/(1/101) = 101.
        "parent-leaf-ranks-first-in-its-account",
        tree(acct("A", 1, leaf("p", None), leaf("x")), leaf("B")),
        {"p": 100, "x": 1},
        {"B": 3, "p": 2, "x": 1},
    ),
    (
        # A `parent` account is flattened: its children join the set one level up, so c
        # can sit between a and b. Root set {P, a, b, c}, level shares 1 + 3 + 4 = 8,
        # total usage 100: b .375/.1 = 3.75, c .5/.6 = 0.833, a .125/.3 = 0.417.
        "parent-account-children-compete-one-level-up",
        tree(acct("P", None, leaf("a", 1), leaf("b", 3)), leaf("c", 4)),
        {"a": 30, "b": 10, "c": 60},
        {"b": 3, "c": 2, "a": 1},
    ),
    (
        # Looks wrong, is Slurm: u and A tie (LF 1), so A's set starts tied; but A's set is
        # {P (placeholder, LF NO_VAL), x, y} and the placeholder sorts first and absorbs
        # the inherited tie. x (.5/.2 = 2.5) therefore gets rnt = 2, not u's rank 3.
        "parent-account-placeholder-absorbs-an-inherited-tie",
        tree(leaf("u"), acct("A", 1, acct("P", None, leaf("x"), leaf("y")))),
        {"u": 10, "x": 2, "y": 8},
        {"u": 3, "x": 2, "y": 1},
    ),
    (
        # Idle siblings inside a used account: the account's usage is 0 so U is 0 for all
        # of them (inf), and the used program falls behind the idle one.
        "idle-account-children-all-infinite",
        tree(acct("A", 1, leaf("a1"), leaf("a2")), acct("B", 1, leaf("b1"))),
        {"b1": 7},
        {"a1": 3, "a2": 3, "b1": 1},
    ),
]


@pytest.mark.parametrize(
    ("budget", "usage", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_hand_worked_rankings(
    budget: BudgetTree, usage: dict[str, float], expected: dict[str, int]
) -> None:
    ranking = rank(budget, usage)
    n = len(budget.leaves())
    assert ranking.rank_of == expected
    assert ranking.fairshare_of == {k: v / n for k, v in expected.items()}


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        # As shipped, _count_tied_accounts never merges: tied accounts are walked in tree
        # order, and the second starts tied with the last leaf of the first.
        (("A", "B"), {"a1": 4, "a2": 3, "b1": 3, "b2": 3}),
        (("B", "A"), {"b1": 4, "b2": 4, "a1": 4, "a2": 1}),
    ],
    ids=["A-listed-first", "B-listed-first"],
)
def test_shipped_slurm_walks_tied_accounts_in_tree_order(
    order: tuple[str, str], expected: dict[str, int]
) -> None:
    accounts = {
        "A": acct("A", 1, leaf("a1"), leaf("a2")),
        "B": acct("B", 1, leaf("b1"), leaf("b2")),
    }
    budget = tree(*(accounts[k] for k in order))
    usage = {"a1": 1, "a2": 9, "b1": 5, "b2": 5}
    assert rank(budget, usage, merge_tied_accounts=False).rank_of == expected
    # The documented rule does not care about the order.
    assert rank(budget, usage).rank_of == {"a1": 4, "b1": 3, "b2": 3, "a2": 1}


def test_rows_carry_sshare_columns_in_tree_order() -> None:
    budget = tree(
        acct("nlp", 40, leaf("pretrain", 30), leaf("evals", None)),
        acct("P", None, leaf("v1", 10)),
    )
    ranking = rank(budget, {"pretrain": 20, "evals": 5})
    assert [n.path for n in ranking.nodes] == [
        "root/nlp",
        "root/nlp/pretrain",
        "root/nlp/evals",
        "root/P",
        "root/P/v1",
    ]
    # Root set {nlp, P, v1}: level shares 40 + 10 = 50. nlp: S .8, U 1 -> .8; v1 idle.
    assert row(ranking, "nlp") == NodeRank(
        path="root/nlp",
        name="nlp",
        leaf=False,
        raw_shares=40,
        norm_shares=0.8,
        raw_usage=25.0,
        effective_usage=1.0,
        level_fs=0.8,
        rank=None,
        fairshare=None,
    )
    # pretrain: S 30/30 (evals' `parent` holds no shares), U .8 -> 1.25.
    assert row(ranking, "pretrain").level_fs == pytest.approx(1.25)
    assert row(ranking, "pretrain").norm_shares == 1.0
    assert row(ranking, "pretrain").effective_usage == pytest.approx(0.8)
    # A `parent` node shows its fairshare parent's S; a parent leaf has LF inf.
    evals = row(ranking, "evals")
    assert (evals.raw_shares, evals.norm_shares, evals.level_fs) == (None, 0.8, math.inf)
    # A `parent` account has no LF of its own; its child is in the root set.
    p = row(ranking, "P")
    assert (p.level_fs, p.norm_shares, p.rank, p.fairshare) == (None, 1.0, None, None)
    assert row(ranking, "v1").norm_shares == pytest.approx(0.2)
    assert ranking.rank_of == {"v1": 3, "evals": 2, "pretrain": 1}
    assert row(ranking, "v1").fairshare == 1.0


def test_effective_usage_is_zero_when_nothing_was_used() -> None:
    ranking = rank(tree(acct("A", 1, leaf("a")), leaf("b")), {})
    assert [n.effective_usage for n in ranking.nodes] == [0.0, 0.0, 0.0]
    assert [n.raw_usage for n in ranking.nodes] == [0.0, 0.0, 0.0]


def test_order_key_puts_the_best_first_and_keeps_ties_equal() -> None:
    ranking = rank(tree(leaf("u1"), leaf("u2"), leaf("u3")), {"u1": 10, "u2": 10, "u3": 20})
    assert [ranking.order_key(x) for x in ("u1", "u2", "u3")] == [0, 0, 2]
    with pytest.raises(ValidationError, match="unknown allocation 'zz'"):
        ranking.order_key("zz")


@pytest.mark.parametrize(
    ("usage", "field", "reason"),
    [
        ({"ghost": 1.0}, "allocation", "unknown allocation 'ghost'"),
        ({"A": 1.0}, "allocation", "'A' is an account"),
        ({"a": -1.0}, "usage['a']", ">= 0"),
        ({"a": math.nan}, "usage['a']", "finite"),
        ({"a": math.inf}, "usage['a']", "finite"),
        ({"a": True}, "usage['a']", "GPU-seconds"),
        ({"a": "5"}, "usage['a']", "GPU-seconds"),
    ],
    ids=["unknown", "account", "negative", "nan", "infinite", "bool", "text"],
)
def test_bad_usage_is_rejected(usage: dict[str, object], field: str, reason: str) -> None:
    with pytest.raises(ValidationError) as err:
        rank(tree(acct("A", 1, leaf("a"))), usage)  # type: ignore[arg-type]
    assert err.value.field == field
    assert reason in err.value.reason


def test_integer_usage_is_accepted() -> None:
    assert rank(tree(leaf("a"), leaf("b")), {"a": 3, "b": 0}).rank_of == {"b": 2, "a": 1}


# -- properties ----------------------------------------------------------------------------


@st.composite
def budget_trees(draw: st.DrawFn, *, zero_shares: bool = True) -> BudgetTree:
    """Random trees up to four levels deep; zero shares (unless ``zero_shares`` is False)
    and `parent` mixed in."""
    ids = itertools.count()
    shares = st.sampled_from([0, 1, 1, 2, 3, 5, None] if zero_shares else [1, 1, 2, 3, 5, None])

    def make(depth: int) -> BudgetNode:
        i = next(ids)
        if depth < 4 and draw(st.booleans()):
            kids = tuple(make(depth + 1) for _ in range(draw(st.integers(1, 3))))
            return BudgetNode(f"a{i}", draw(shares), kids)
        return BudgetNode(f"l{i}", draw(shares))

    return BudgetTree(
        BudgetNode("root", None, tuple(make(1) for _ in range(draw(st.integers(1, 4)))))
    )


@st.composite
def ranked_inputs(
    draw: st.DrawFn, *, zero_shares: bool = True
) -> tuple[BudgetTree, dict[str, float]]:
    budget = draw(budget_trees(zero_shares=zero_shares))
    # Whole GPU-seconds (exact in floats) with plenty of zeros and repeats, to make ties.
    amounts = st.sampled_from([0, 0, 1, 2, 5, 10, 100, 3600]) | st.integers(0, 10**6)
    usage = {name: float(draw(amounts)) for name in budget.leaves() if draw(st.booleans())}
    return budget, usage


@given(ranked_inputs())
def test_ranks_are_a_competition_ranking_counting_down_from_n(
    inputs: tuple[BudgetTree, dict[str, float]],
) -> None:
    budget, usage = inputs
    ranking = rank(budget, usage)
    n = len(budget.leaves())
    assert set(ranking.rank_of) == set(budget.leaves())
    assert all(1 <= r <= n for r in ranking.rank_of.values())
    # Ranks descend in groups: the best group has rank n, and each group's rank is the
    # previous group's minus its size (ties never leave a gap inside, always after).
    counts: dict[int, int] = {}
    for r in ranking.rank_of.values():
        counts[r] = counts.get(r, 0) + 1
    expected = n
    for r in sorted(counts, reverse=True):
        assert r == expected
        expected -= counts[r]
    assert expected == 0
    for name, r in ranking.rank_of.items():
        assert ranking.fairshare_of[name] == r / n
        assert ranking.order_key(name) == n - r


@given(ranked_inputs())
def test_ranking_is_deterministic(inputs: tuple[BudgetTree, dict[str, float]]) -> None:
    budget, usage = inputs
    assert rank(budget, usage) == rank(budget, dict(reversed(list(usage.items()))))


def _shuffled(node: BudgetNode, rng: random.Random) -> BudgetNode:
    kids = [_shuffled(c, rng) for c in node.children]
    rng.shuffle(kids)
    return BudgetNode(node.name, node.shares, tuple(kids), node.usage)


@given(ranked_inputs(), st.randoms(use_true_random=False))
def test_sibling_order_does_not_change_any_fairshare(
    inputs: tuple[BudgetTree, dict[str, float]], rng: random.Random
) -> None:
    budget, usage = inputs
    shuffled = BudgetTree(_shuffled(budget.root, rng))
    assert rank(shuffled, usage).fairshare_of == rank(budget, usage).fairshare_of


@settings(max_examples=300)
@given(ranked_inputs(zero_shares=False), st.data())
def test_using_more_never_earns_a_better_rank(
    inputs: tuple[BudgetTree, dict[str, float]], data: st.DataObject
) -> None:
    """With every share positive. Zero-share nodes keep LF 0 whatever they use, so they stay
    tied, and tie rule 3 can then rank a zero-share leaf higher after it used more (see
    ``test_zero_share_ties_follow_rule_3_not_monotonicity``)."""
    budget, usage = inputs
    who = data.draw(st.sampled_from(budget.leaves()))
    more = data.draw(st.integers(1, 10**6))
    before = rank(budget, usage).rank_of[who]
    after = rank(budget, {**usage, who: usage.get(who, 0.0) + more}).rank_of[who]
    assert after <= before


@given(ranked_inputs())
def test_shipped_and_documented_tie_rules_agree_without_account_ties(
    inputs: tuple[BudgetTree, dict[str, float]],
) -> None:
    budget, usage = inputs
    ranking = rank(budget, usage)
    # Do any two accounts of one Fair Tree sibling set (same fairshare parent) share an LF?
    index = budget.index
    lf: dict[int, list[float]] = {}
    for node in ranking.nodes:
        if not node.leaf and node.level_fs is not None:
            owner = index.fs_parent[index.position[node.name]]
            lf.setdefault(owner, []).append(node.level_fs)
    if all(len(set(v)) == len(v) for v in lf.values()):
        assert rank(budget, usage, merge_tied_accounts=False) == ranking


def test_zero_share_ties_follow_rule_3_not_monotonicity() -> None:
    """Found by the property above with zero shares allowed: ``l3`` (0 shares, below a
    0-share account ``a2``) ranks 2 while ``a1`` and ``a5`` are both idle and tied, since
    their sets are merged and ``l7`` (LF inf) takes the tie of ``l4`` (rule 3) before it;
    once ``l3`` uses 1 GPU-second ``a1`` falls behind ``a5``, ``a2`` ties ``l4`` in its own
    set and ``l3`` inherits rank 3. Slurm's rules, kept: zero-share work is served last
    whichever way its ties fall."""
    n = BudgetNode
    budget = BudgetTree(
        n(
            "root",
            None,
            (
                n("l0", 0),
                n("a1", 1, (n("a2", 0, (n("l3", 0),)), n("l4", 0))),
                n("a5", 1, (n("a6", 0, (n("l7", 1),)),)),
            ),
        )
    )
    assert rank(budget, {}).rank_of == {"l0": 1, "l3": 2, "l4": 4, "l7": 4}
    assert rank(budget, {"l3": 1.0}).rank_of == {"l0": 1, "l3": 3, "l4": 3, "l7": 4}
