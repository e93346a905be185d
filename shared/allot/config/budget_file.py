"""The budget-tree file (nested YAML form, ``allot.core.budgets.parse_tree``), read one way
by the ranking service, ``allot up``, ``allot fairshare``, ``allot simulate`` and ``allot auth``."""

from __future__ import annotations

from pathlib import Path

from allot.config.yaml_io import load_yaml
from allot.core.budgets import BudgetTree, parse_tree
from allot.core.errors import ValidationError


def load_tree_file(path: Path, field: str | None = None) -> BudgetTree:
    """The tree in ``path``; a file that is not one mapping is refused naming ``field`` (a
    command's option) or, without one, the file."""
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ValidationError(field or str(path), "the file must hold one mapping (the root node)")
    return parse_tree(data)


def where_in_file(path: Path, exc: ValidationError) -> str:
    """Where a bad tree file's error is: the file, or the node's field inside it
    (``budgets.yaml: root/nlp.shares``)."""
    return exc.field if exc.field == str(path) else f"{path}: {exc.field}"
