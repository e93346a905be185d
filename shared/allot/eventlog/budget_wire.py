"""Budget trees on the wire: ``BudgetNodeSpec`` <-> the core's ``BudgetTree``."""

from __future__ import annotations

from allot.core.budgets import PARENT, BudgetNode, BudgetTree, parse_tree
from allot.proto.messages import BudgetNodeSpec


def tree_from_spec(spec: BudgetNodeSpec) -> BudgetTree:
    """Validate a wire tree with the core's rules (errors name the node)."""
    return parse_tree(_as_mapping(spec, is_root=True))


def tree_mapping(tree: BudgetTree) -> dict[str, object]:
    """``tree`` in the nested mapping form ``parse_tree`` reads (a budgets.yaml's)."""
    return _as_mapping(spec_from_tree(tree), is_root=True)


def _as_mapping(spec: BudgetNodeSpec, *, is_root: bool) -> dict[str, object]:
    out: dict[str, object] = {"name": spec.name}
    if not is_root:
        out["shares"] = PARENT if spec.shares is None else spec.shares
    if spec.children:
        out["children"] = [_as_mapping(c, is_root=False) for c in spec.children]
    return out


def spec_from_tree(tree: BudgetTree) -> BudgetNodeSpec:
    return _spec(tree.root)


def _spec(node: BudgetNode) -> BudgetNodeSpec:
    return BudgetNodeSpec(
        name=node.name,
        shares=node.shares,
        children=tuple(_spec(c) for c in node.children),
    )
