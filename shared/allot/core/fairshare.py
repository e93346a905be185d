"""Fair Tree: rank every allocation from the budget tree and the windowed usage.

A port of Slurm's Fair Tree (``src/plugins/priority/multifactor/fair_tree.c``, documented in
``doc/html/fair_tree.shtml``), with Slurm's *users* being our leaf allocations and its
*accounts* our inner nodes. ``rank(tree, usage)`` is the whole algorithm: a pure function
of its arguments, no globals (``fair_tree.c`` reads the association manager's globals).

Inputs: a ``BudgetTree`` and ``usage[leaf]`` = raw usage (GPU-seconds in the window; a
missing leaf has used 0). Output: a ``Ranking``.

Level fairshare, per sibling set (``_calc_assoc_fs``)
    LF = S / U,   S = shares / level_shares,   U = usage / usage(fairshare parent)

    An account's usage is the sum over its subtree. LF ranges over 0.0 .. ∞: above 1 the
    node is under-served, below 1 over-served.
    * S == 0 gives LF = 0 (checked first: a zero-share node is always last).
    * NOT A BUG: U == 0 gives LF = ∞ (an idle node with shares is always first); this
      includes the case where the whole set is idle (the parent's usage is 0).
    * A ``parent`` leaf gets LF = ∞ ("rank highest in their account, subject to ties").
    * A ``parent`` account gets Slurm's sentinel NO_VAL (4294967294.0): it is an empty
      placeholder whose children were hoisted into this set (see ``allot.core.budgets``).

Traversal (``_calc_tree_fs``)
    Start with rank = rnt = n (the number of leaves). Visit the root's sibling set:
    1. sort the set by LF descending; at equal LF leaves come before accounts;
    2. walk it in order; ``tied`` = (LF equals the previous member's LF), and the first member
       of a set inherits ``tied`` from the account that led into it;
    3. a leaf gets ``rank = rnt`` unless tied (then it keeps the previous leaf's rank), and
       ``fairshare = rank / n``; ``rnt`` decreases by one per leaf either way;
    4. an account is descended into (depth first), carrying its ``tied``.
    So the best leaf gets rank n and fairshare 1.0, the worst untied leaf rank 1.

Ties (numbered as in ``fair_tree.c``)
    1. Sibling leaves with the same LF get the same rank.
    2. Sibling accounts with the same LF have their sets merged before descending: the union
       is sorted and walked as one set (each member keeps the LF computed against its own
       parent).
    3. A leaf with the same LF as a sibling account gets the same rank as that account's
       highest ranked leaf (leaves sort first, and the account inherits ``tied``).

    Flagged, looks wrong but is what ships: in the versions of ``fair_tree.c`` we read
    (2014 onward), ``_count_tied_accounts`` breaks on ``if (!next_assoc->user)``, i.e. on
    the first *account*. The next member after an account is either an account (break) or
    a leaf, which sorts after it only with a lower LF (break), so it always returns 0 and
    rule 2 never fires: stock slurmctld walks tied accounts one after the other, the later
    ones starting "tied" with the last leaf ranked before them, and the result depends on
    their order. ``rank`` follows the documented rule 2 by default (which is also
    independent of sibling order); ``merge_tied_accounts=False`` gives the shipped
    behaviour, with tied accounts in tree order (``qsort`` leaves the order of equal
    elements unspecified; a stable sort keeps ``children_list`` order).

Precision: Slurm computes in ``long double``, we in double; ties are exact float equality
in both. Subtree usage is summed with ``math.fsum``, so it does not depend on sibling order.

Display values (sshare -l): ``norm_shares`` is S (a ``parent`` node shows its fairshare
parent's S), ``raw_usage`` the node's (subtree) usage, and ``effective_usage`` the node's
usage over the whole tree's usage (0.0 when nothing was used); note that sshare's
EffectvUsage under Fair Tree is the per-level U instead. ``level_fs`` is None for ``parent``
accounts, which have none; a ``parent`` leaf shows the ∞ it is ranked by (sshare prints
both blank). The root is not a row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from allot.core.budgets import BudgetTree
from allot.core.errors import ValidationError

NO_VAL = 4294967294.0
"""Slurm's ``(long double) NO_VAL``: the LF of a ``parent`` account, and the "previous LF"
that each sibling set starts from."""


class NodeRank(NamedTuple):
    """One row of the ranking (one node of the tree, the root excluded). A named tuple,
    not a frozen dataclass: a ranking builds 1,000+ of them, and a tuple's constructor is
    several times cheaper than a frozen dataclass's per-field ``object.__setattr__``."""

    path: str
    name: str
    leaf: bool
    raw_shares: int | None  # None: `parent`
    norm_shares: float
    raw_usage: float
    effective_usage: float
    level_fs: float | None  # math.inf allowed; None for a `parent` account
    rank: int | None  # leaves only
    fairshare: float | None  # leaves only


@dataclass(frozen=True, slots=True)
class Ranking:
    """The result of ``rank``: rows in tree order plus per-leaf lookups."""

    nodes: tuple[NodeRank, ...]
    fairshare_of: dict[str, float]
    rank_of: dict[str, int]

    def order_key(self, leaf: str) -> int:
        """Smaller is served first: ``n - rank`` (0 for the best leaf). Tied leaves get
        equal keys."""
        r = self.rank_of.get(leaf)
        if r is None:
            raise ValidationError("allocation", f"unknown allocation {leaf!r}")
        return len(self.rank_of) - r


def rank(
    tree: BudgetTree,
    usage: Mapping[str, float],
    *,
    merge_tied_accounts: bool = True,
) -> Ranking:
    """Rank every leaf of ``tree`` by Fair Tree from ``usage`` (leaf -> raw usage, missing
    = 0). See the module docstring for the formula and the tie rules."""
    ix = tree.index
    n = len(ix.names)
    is_leaf = ix.is_leaf
    subtree = _subtree_usage(tree, usage)
    level_fs = _level_fs(tree, subtree)

    n_leaves = len(ix.leaves)
    ranks = [0] * n
    # [rank, rnt]: the rank last given, and the rank the next leaf gets if not tied.
    counters = [n_leaves, n_leaves]
    fs_members = ix.fs_members

    # Sort key: LF descending, then leaves before accounts (``_cmp_level_fs``).
    sort_key = [(-lf, not leaf) for lf, leaf in zip(level_fs, is_leaf, strict=True)].__getitem__

    def calc_tree_fs(siblings: list[int], account_tied: bool) -> None:
        siblings.sort(key=sort_key)  # stable: equal keys keep tree order
        prev = NO_VAL
        count = len(siblings)
        k = 0
        while k < count:
            i = siblings[k]
            lf = level_fs[i]
            tied = True if (k == 0 and account_tied) else (prev == lf)
            if is_leaf[i]:
                if not tied:
                    counters[0] = counters[1]
                ranks[i] = counters[0]
                counters[1] -= 1
            else:
                merged = (
                    _count_tied_accounts(siblings, k, level_fs, is_leaf)
                    if merge_tied_accounts
                    else 0  # as shipped: see "Flagged" in the module docstring
                )
                if merged:
                    children = [
                        m for j in range(k, k + merged + 1) for m in fs_members[siblings[j]]
                    ]
                else:
                    children = list(fs_members[i])
                if children:
                    calc_tree_fs(children, tied)
                k += merged
            prev = lf
            k += 1

    calc_tree_fs(list(fs_members[0]), False)

    total = subtree[0]
    names, paths, raw_shares, norm = ix.names, ix.paths, ix.raw_shares, ix.norm_shares
    uses_parent = ix.uses_parent
    rank_of = {names[i]: ranks[i] for i in ix.leaves}
    fairshare_of = {name: r / n_leaves for name, r in rank_of.items()}
    # Positional construction: faster than keywords for 1,000+ rows.
    nodes = [
        NodeRank(
            paths[i],
            names[i],
            is_leaf[i],
            raw_shares[i],
            norm[i],
            subtree[i],
            subtree[i] / total if total else 0.0,
            None if uses_parent[i] and not is_leaf[i] else level_fs[i],
            ranks[i] if is_leaf[i] else None,
            ranks[i] / n_leaves if is_leaf[i] else None,
        )
        for i in range(1, n)
    ]
    return Ranking(nodes=tuple(nodes), fairshare_of=fairshare_of, rank_of=rank_of)


def _subtree_usage(tree: BudgetTree, usage: Mapping[str, float]) -> list[float]:
    """Raw usage per node: the given value on leaves, the subtree sum on accounts."""
    ix = tree.index
    n = len(ix.names)
    used = [0.0] * n
    position = ix.position
    for name, value in usage.items():
        i = position.get(name)
        if i is None or not ix.is_leaf[i]:
            tree.require_leaf(name)  # raises the precise message
            continue
        if type(value) is not float and (  # fast path for the common case
            isinstance(value, bool) or not isinstance(value, int | float)
        ):
            raise ValidationError(
                f"usage[{name!r}]", f"must be a finite number of GPU-seconds >= 0, got {value!r}"
            )
        if not 0.0 <= value < math.inf:  # also rejects NaN
            raise ValidationError(
                f"usage[{name!r}]", f"must be a finite number of GPU-seconds >= 0, got {value!r}"
            )
        used[i] = float(value)
    children = ix.children
    for i in range(n - 1, -1, -1):  # reverse pre-order: children before parents
        kids = children[i]
        if kids:
            used[i] = math.fsum([used[c] for c in kids])
    return used


def _level_fs(tree: BudgetTree, used: list[float]) -> list[float]:
    """LF = S / U for every node (see the module docstring for the special values)."""
    ix = tree.index
    n = len(ix.names)
    out = [NO_VAL] * n
    norm, fs_parent, is_leaf, uses_parent = ix.norm_shares, ix.fs_parent, ix.is_leaf, ix.uses_parent
    for i in range(1, n):
        if uses_parent[i]:
            out[i] = math.inf if is_leaf[i] else NO_VAL
            continue
        s = norm[i]
        if s == 0.0:
            out[i] = 0.0
            continue
        parent_used = used[fs_parent[i]]
        u = used[i] / parent_used if parent_used else 0.0
        out[i] = s / u if u else math.inf
    return out


def _count_tied_accounts(
    siblings: list[int], k: int, level_fs: list[float], is_leaf: tuple[bool, ...]
) -> int:
    """How many accounts right after position k tie with it (rule 2). Leaves sort before
    accounts at equal LF, so the first leaf met ends the run: this is the test
    ``fair_tree.c`` means to make (it tests ``!user``, see the module docstring)."""
    lf = level_fs[siblings[k]]
    count = 0
    for j in range(k + 1, len(siblings)):
        m = siblings[j]
        if is_leaf[m] or level_fs[m] != lf:
            break
        count += 1
    return count
