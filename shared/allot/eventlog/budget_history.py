"""Every budget change in the log, node by node (``allot budgets history``; ``allot whatif``
names its proposed change the same way).

Input: the ``BudgetTreeSet`` records of ``allot.v1.budget.tree`` in log order (the USAGE
stream keeps the last ``allot.bus.USAGE_KEPT_PER_SUBJECT`` of them, none dropped by age).
Each record holds the whole tree; a change is what differs from the record before it.

Output: one ``BudgetChange`` per record: ``at``, ``by`` (who sent it: the ranking service
records a change's ``set_by`` only when it equals the login in the request's subject,
``allot.v1.budget.set.by.<login>...``, the only form ``allot auth gen`` grants people, so
under logins it is the login; ``bootstrap`` is the tree the first start published from its
file) and ``changes``: a ``ShareChange(path, old, new)`` per node whose shares differ, in
the new tree's order, then the nodes it lost. Shares are an integer, ``"parent"`` (Slurm's
parent), or None where the node is absent (added or removed). The first record's changes
list every node of its tree (old None). No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from allot.core.budgets import PARENT
from allot.proto import messages as m

Shares = int | str | None
"""An integer, ``"parent"``, or None: no such node."""


@dataclass(frozen=True, slots=True)
class ShareChange:
    path: str
    old: Shares
    new: Shares


@dataclass(frozen=True, slots=True)
class BudgetChange:
    at: float
    by: str
    changes: tuple[ShareChange, ...]


def budget_changes(records: Iterable[m.BudgetTreeSet]) -> list[BudgetChange]:
    """One ``BudgetChange`` per record, in the order given (see the module docstring)."""
    out: list[BudgetChange] = []
    before: m.BudgetNodeSpec | None = None
    for record in records:
        out.append(BudgetChange(record.at, record.by, tree_diff(before, record.tree)))
        before = record.tree
    return out


def tree_diff(old: m.BudgetNodeSpec | None, new: m.BudgetNodeSpec) -> tuple[ShareChange, ...]:
    """The nodes whose shares differ between ``old`` and ``new`` (the root has none)."""
    was = _shares(old) if old is not None else {}
    now = _shares(new)
    changed = [ShareChange(p, was.get(p), s) for p, s in now.items() if p not in was or was[p] != s]
    changed += [ShareChange(p, s, None) for p, s in was.items() if p not in now]
    return tuple(changed)


def _shares(root: m.BudgetNodeSpec) -> dict[str, Shares]:
    """``path -> shares`` of every node below the root, depth first in tree order."""
    out: dict[str, Shares] = {}

    def walk(node: m.BudgetNodeSpec, path: str) -> None:
        for child in node.children:
            here = f"{path}/{child.name}"
            out[here] = PARENT if child.shares is None else child.shares
            walk(child, here)

    walk(root, root.name)
    return out
