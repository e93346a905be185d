"""The budget tree: who is entitled to how much of the cluster, as Slurm-style shares.

A tree of named nodes. The root is the whole cluster; inner nodes are *accounts* (programs,
projects) that group other nodes; leaves are *allocations*, the names workloads are charged
to. Every non-root node holds ``shares``: an integer >= 0, or ``None`` for Slurm's
``parent`` (written ``shares: parent``). The root's shares are ignored.

Inputs
------
* ``parse_tree(mapping)``: the nested form, as loaded from YAML (``name``, ``shares``,
  ``children``, and ``usage`` on leaves, in GPU-seconds, for ``allot fairshare``).
* ``parse_flat(rows)``: a flat list of ``{name, parent, shares[, usage]}`` under an implicit
  root named ``root``.
* ``BudgetTree(BudgetNode(...))`` built in code; validated the same way.

Names are always strings made of ``[A-Za-z0-9_-]`` (they become NATS subject tokens later:
no ``.``, ``*``, ``>`` or spaces) and are unique across the whole tree, accounts included,
since a leaf name *is* an allocation id. Integer names are accepted and turned into text;
a float or boolean name means YAML already rewrote what was typed (``6214e9``, ``yes``), so
it is rejected with a request to quote it (``allot.config.yaml_io`` loads names as text).

``parent`` semantics (Slurm's ``SLURMDB_FS_USE_PARENT``), exactly as Slurm wires it in
``src/common/assoc_mgr.c`` (``_find_assoc_parent``, ``_set_assoc_parent_and_user``,
``_get_children_level_shares``, ``_normalize_assoc_shares_fair_tree``):

1. A node's *fairshare parent* is its nearest proper ancestor whose shares are not
   ``parent``; the root always qualifies.
2. A node competes in the *sibling set* of its fairshare parent (Slurm's ``children_list``).
   So the children of a ``parent`` account are hoisted into the set one level up
   (recursively, through chains of ``parent`` accounts), and the ``parent`` account stays in
   that set as an empty placeholder: its own set is empty.
3. ``level_shares`` of a set = the sum of the raw shares of its non-``parent`` members, and
   a member's normalised share is ``S = shares / level_shares`` (0 when level_shares is 0).
   A ``parent`` node reports its fairshare parent's ``S`` (display only; the root's is 1).

Effective share (our budget notion; Fair Tree itself only ever uses ``S`` per level): the
fraction of the cluster a leaf is entitled to. Going down from the root (E = 1), each
sibling set divides its owner's E:

    E(member) = E(owner) * shares(member) / level_shares          when level_shares > 0

so a ``parent`` *leaf* gets no slice of its own (it rides on its account's pool, as in
Slurm, where it ranks first inside the account but holds no shares), and a zero-share member
gets 0. When ``level_shares == 0`` (every member holds 0 shares or is ``parent``) the owner's
E is split equally among the members rather than lost. Hence the leaves' effective shares
always sum to 1 (up to float rounding), and with every share positive and no ``parent``
E(leaf) is the plain product of ``shares / sum of sibling shares`` down the path.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from allot.core.errors import ValidationError

ROOT_NAME = "root"
"""The implicit root of ``parse_flat`` and the default root name of ``parse_tree``."""

PARENT = "parent"
"""The spelling of Slurm's ``parent`` shares in the input."""

MAX_DEPTH = 100
"""Deepest tree accepted (levels below the root); a guard for the recursive walks."""

_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")
_TREE_FIELDS = ("name", "shares", "children", "usage")
_FLAT_FIELDS = ("name", "parent", "shares", "usage")


@dataclass(frozen=True, slots=True)
class BudgetNode:
    """One node. ``shares=None`` is Slurm's ``parent``; ``usage`` (GPU-seconds) is only
    meaningful on leaves and only read by ``allot fairshare``."""

    name: str
    shares: int | None
    children: tuple[BudgetNode, ...] = ()
    usage: float = 0.0

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass(frozen=True, slots=True)
class TreeIndex:
    """The validated tree as parallel arrays in depth-first pre-order (root at 0), with the
    ``parent`` flattening of the module docstring already applied. Built once per tree so
    that ranking does no name lookups or tree walks of its own."""

    names: tuple[str, ...]
    paths: tuple[str, ...]
    parent: tuple[int, ...]
    """Direct parent; -1 for the root."""
    children: tuple[tuple[int, ...], ...]
    """Direct children in input order."""
    is_leaf: tuple[bool, ...]
    raw_shares: tuple[int | None, ...]
    """None for ``parent`` nodes and for the root."""
    uses_parent: tuple[bool, ...]
    fs_parent: tuple[int, ...]
    """Nearest non-``parent`` proper ancestor; -1 for the root."""
    fs_members: tuple[tuple[int, ...], ...]
    """Slurm's ``children_list``: the sibling set a node owns (empty for leaves and for
    ``parent`` accounts), in pre-order."""
    norm_shares: tuple[float, ...]
    """Slurm's ``shares_norm`` (S); 1.0 for the root."""
    usage: tuple[float, ...]
    """Usage written in the tree (GPU-seconds); 0.0 for accounts."""
    leaves: tuple[int, ...]
    position: dict[str, int]


@dataclass(frozen=True, slots=True)
class BudgetTree:
    """A validated budget tree. Construct it with ``parse_tree``, ``parse_flat`` or
    ``BudgetTree(root_node)``; invalid input raises ``ValidationError`` naming the node."""

    root: BudgetNode
    index: TreeIndex = field(init=False, repr=False, compare=False)
    _effective: dict[str, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _validate(self.root)
        index = _build_index(self.root)
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "_effective", _effective_shares(index))

    # -- queries -----------------------------------------------------------------------

    def leaves(self) -> tuple[str, ...]:
        """Allocation names, depth-first in input order."""
        names = self.index.names
        return tuple(names[i] for i in self.index.leaves)

    def is_leaf(self, name: str) -> bool:
        """True for an allocation; False for an account, the root, or an unknown name."""
        i = self.index.position.get(name)
        return i is not None and self.index.is_leaf[i]

    def require_leaf(self, name: str) -> None:
        """Raise ``ValidationError("allocation", ...)`` unless ``name`` is a leaf."""
        i = self.index.position.get(name)
        if i is None:
            raise ValidationError("allocation", f"unknown allocation {name!r}")
        if not self.index.is_leaf[i]:
            raise ValidationError("allocation", f"{name!r} is an account, not a leaf allocation")

    def effective_share(self, leaf: str) -> float:
        """The leaf's fraction of the whole cluster (see the module docstring)."""
        self.require_leaf(leaf)
        return self._effective[leaf]

    def effective_shares(self) -> dict[str, float]:
        """Every leaf's effective share; the values sum to 1."""
        return dict(self._effective)

    def path(self, name: str) -> str:
        """``root/nlp/pretrain``: the names from the root down to ``name``."""
        return self.index.paths[self._position(name)]

    def program(self, leaf: str) -> str:
        """The child of the root that contains ``leaf`` (a leaf directly under the root is
        its own program)."""
        self.require_leaf(leaf)
        index = self.index
        i = index.position[leaf]
        while index.parent[i] != 0:
            i = index.parent[i]
        return index.names[i]

    def usage(self) -> dict[str, float]:
        """Leaf usages written in the tree file (GPU-seconds), for ``allot fairshare``."""
        index = self.index
        return {index.names[i]: index.usage[i] for i in index.leaves}

    # -- helpers -----------------------------------------------------------------------

    def _position(self, name: str) -> int:
        i = self.index.position.get(name)
        if i is None:
            raise ValidationError("node", f"unknown node {name!r}")
        return i


# -- parsing: nested form ----------------------------------------------------------------


def subtree_allocations(tree: BudgetTree, node: str) -> tuple[str, ...]:
    """The allocations (leaves) at or below ``node``, in the tree's order."""
    below = tree.path(node) + "/"
    return tuple(a for a in tree.leaves() if a == node or tree.path(a).startswith(below))


def parse_tree(data: Mapping[str, object]) -> BudgetTree:
    """Build a tree from the nested mapping form (see the module docstring)."""
    if not isinstance(data, Mapping):
        raise ValidationError(
            "tree", f"must be a mapping with 'name' and 'children', got {_kind(data)}"
        )
    return BudgetTree(_parse_node(data, parent_path=None, position=0, depth=0))


def _parse_node(
    data: Mapping[str, object], parent_path: str | None, position: int, depth: int
) -> BudgetNode:
    is_root = parent_path is None
    where = ROOT_NAME if is_root else f"{parent_path}/children[{position}]"
    if is_root and "name" not in data:
        name = ROOT_NAME
    else:
        name = _parse_name(data.get("name"), f"{where}.name")
    path = name if parent_path is None else f"{parent_path}/{name}"
    _reject_unknown_fields(data, _TREE_FIELDS, path)
    if depth > MAX_DEPTH:
        raise ValidationError(path, f"tree is deeper than {MAX_DEPTH} levels")

    raw_children = data.get("children")
    if raw_children is None:
        if is_root:
            raise ValidationError(path, "empty tree: the root has no children")
        children: tuple[BudgetNode, ...] = ()
    else:
        if isinstance(raw_children, str | bytes | Mapping) or not isinstance(
            raw_children, Sequence
        ):
            raise ValidationError(
                f"{path}.children", f"must be a list of nodes, got {_kind(raw_children)}"
            )
        if not raw_children:
            reason = (
                "empty tree: the root has no children"
                if is_root
                else "an account needs at least one child; omit 'children' for a leaf"
            )
            raise ValidationError(f"{path}.children", reason)
        parsed = []
        for i, child in enumerate(raw_children):
            if not isinstance(child, Mapping):
                raise ValidationError(
                    f"{path}/children[{i}]", f"must be a mapping, got {_kind(child)}"
                )
            parsed.append(_parse_node(child, path, i, depth + 1))
        children = tuple(parsed)

    # The root's shares are ignored: it owns the whole cluster.
    shares = None if is_root else _parse_shares(data, f"{path}.shares")
    usage = 0.0
    if "usage" in data:
        if children:
            raise ValidationError(
                f"{path}.usage",
                "usage is only allowed on leaf allocations "
                "(an account's usage is the sum of its leaves)",
            )
        usage = _parse_usage(data["usage"], f"{path}.usage")
    return BudgetNode(name=name, shares=shares, children=children, usage=usage)


# -- parsing: flat form ------------------------------------------------------------------


def parse_flat(rows: Sequence[Mapping[str, object]]) -> BudgetTree:
    """Build a tree from rows ``{name, parent, shares[, usage]}``. ``parent`` names another
    row, or is absent / null / ``root`` for a child of the implicit root ``root``. Children
    keep row order."""
    if isinstance(rows, str | bytes | Mapping) or not isinstance(rows, Sequence):
        raise ValidationError("rows", f"must be a list of rows, got {_kind(rows)}")
    if not rows:
        raise ValidationError("rows", "empty tree: no rows")

    parent_of: dict[str, str] = {}
    row_of: dict[str, int] = {}
    shares_of: dict[str, int | None] = {}
    usage_of: dict[str, tuple[float, str]] = {}
    order: list[str] = []
    for i, row in enumerate(rows):
        where = f"rows[{i}]"
        if not isinstance(row, Mapping):
            raise ValidationError(where, f"must be a mapping, got {_kind(row)}")
        name = _parse_name(row.get("name"), f"{where}.name")
        label = f"{where} ({name})"
        _reject_unknown_fields(row, _FLAT_FIELDS, label)
        if name == ROOT_NAME:
            raise ValidationError(
                f"{label}.name", f"{ROOT_NAME!r} is the implicit root; pick another name"
            )
        if name in row_of:
            raise ValidationError(
                f"{label}.name", f"duplicate name {name!r} (also rows[{row_of[name]}])"
            )
        raw_parent = row.get("parent")
        parent = ROOT_NAME if raw_parent is None else _parse_name(raw_parent, f"{label}.parent")
        row_of[name] = i
        parent_of[name] = parent
        shares_of[name] = _parse_shares(row, f"{label}.shares")
        if "usage" in row:
            usage_of[name] = (_parse_usage(row["usage"], f"{label}.usage"), label)
        order.append(name)

    children_of: dict[str, list[str]] = {ROOT_NAME: []}
    for name in order:
        parent = parent_of[name]
        if parent != ROOT_NAME and parent not in row_of:
            raise ValidationError(
                f"rows[{row_of[name]}] ({name}).parent", f"unknown parent {parent!r}"
            )
        children_of.setdefault(parent, []).append(name)

    _reject_cycles(order, parent_of, row_of)
    for name, (_, label) in usage_of.items():
        if name in children_of:
            raise ValidationError(
                f"{label}.usage",
                "usage is only allowed on leaf allocations "
                "(an account's usage is the sum of its leaves)",
            )
    if not children_of[ROOT_NAME]:
        raise ValidationError("rows", "empty tree: no row is a child of the root")

    def build(name: str, depth: int) -> BudgetNode:
        if depth > MAX_DEPTH:
            raise ValidationError(name, f"tree is deeper than {MAX_DEPTH} levels")
        kids = tuple(build(c, depth + 1) for c in children_of.get(name, ()))
        shares = None if name == ROOT_NAME else shares_of[name]
        usage = usage_of[name][0] if name in usage_of else 0.0
        return BudgetNode(name=name, shares=shares, children=kids, usage=usage)

    return BudgetTree(build(ROOT_NAME, 0))


def _reject_cycles(order: list[str], parent_of: dict[str, str], row_of: dict[str, int]) -> None:
    """Every row's parent chain must reach the root; report the first loop found."""
    reaches_root: set[str] = {ROOT_NAME}
    for start in order:
        chain: list[str] = []
        seen: set[str] = set()
        name = start
        while name not in reaches_root:
            if name in seen:
                loop = [*chain[chain.index(name) :], name]
                raise ValidationError(
                    f"rows[{row_of[name]}] ({name}).parent", "cycle: " + " -> ".join(loop)
                )
            seen.add(name)
            chain.append(name)
            name = parent_of[name]
        reaches_root.update(chain)


# -- field parsers -----------------------------------------------------------------------


def _parse_name(value: object, where: str) -> str:
    if value is None:
        raise ValidationError(where, "missing name")
    if isinstance(value, bool):
        raise ValidationError(
            where,
            f"name {value!r} was read as a boolean; quote it in the YAML "
            f'(name: "{str(value).lower()}")',
        )
    if isinstance(value, int):
        value = str(value)
    elif isinstance(value, float):
        raise ValidationError(
            where,
            f"name {value!r} was read as a number, so its spelling is lost; "
            'quote it in the YAML (e.g. name: "6214e9")',
        )
    if not isinstance(value, str):
        raise ValidationError(where, f"name must be text, got {_kind(value)}")
    if not value:
        raise ValidationError(where, "missing name")
    if not _NAME_RE.fullmatch(value):
        raise ValidationError(
            where,
            f"name {value!r} may only contain letters, digits, '_' and '-' "
            "(names become NATS subject tokens: no '.', '*', '>' or spaces)",
        )
    return value


def _parse_shares(data: Mapping[str, object], where: str) -> int | None:
    if "shares" not in data:
        raise ValidationError(where, "missing shares (an integer >= 0, or 'parent')")
    value = data["shares"]
    if value == PARENT and isinstance(value, str):
        return None
    if isinstance(value, bool):
        raise ValidationError(where, f"shares must be an integer >= 0 or 'parent', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValidationError(where, f"negative shares {value}; shares must be >= 0")
        return value
    if isinstance(value, float):
        raise ValidationError(where, f"non-integer shares {value!r}; shares must be an integer")
    raise ValidationError(where, f"shares must be an integer >= 0 or 'parent', got {value!r}")


def _parse_usage(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(where, f"usage must be a number of GPU-seconds, got {value!r}")
    usage = float(value)
    if not math.isfinite(usage) or usage < 0:
        raise ValidationError(where, f"usage must be a finite number >= 0, got {value!r}")
    return usage


def _reject_unknown_fields(data: Mapping[str, object], known: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise ValidationError(
            where,
            f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}"
            f" (allowed: {', '.join(known)})",
        )


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__


# -- validation of the node objects ------------------------------------------------------


def _validate(root: BudgetNode) -> None:
    """Checks that hold however the nodes were built (parse_tree already checked types)."""
    if not isinstance(root, BudgetNode):
        raise ValidationError("tree", f"root must be a BudgetNode, got {_kind(root)}")
    _check_name(root.name, root.name)
    if not root.children:
        raise ValidationError(root.name, "empty tree: the root has no children")
    seen: dict[str, str] = {root.name: root.name}

    def walk(node: BudgetNode, path: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ValidationError(path, f"tree is deeper than {MAX_DEPTH} levels")
        if node.children and node.usage != 0:
            raise ValidationError(
                f"{path}.usage",
                "usage is only allowed on leaf allocations "
                "(an account's usage is the sum of its leaves)",
            )
        for i, child in enumerate(node.children):
            if not isinstance(child, BudgetNode):
                raise ValidationError(
                    f"{path}/children[{i}]", f"must be a BudgetNode, got {_kind(child)}"
                )
            _check_name(child.name, f"{path}/children[{i}].name")
            child_path = f"{path}/{child.name}"
            if child.name in seen:
                raise ValidationError(
                    child_path, f"duplicate name {child.name!r} (also {seen[child.name]})"
                )
            seen[child.name] = child_path
            shares = child.shares
            if shares is not None and (
                isinstance(shares, bool) or not isinstance(shares, int) or shares < 0
            ):
                raise ValidationError(
                    f"{child_path}.shares",
                    f"shares must be an integer >= 0 or None ('parent'), got {shares!r}",
                )
            usage = child.usage
            if (
                isinstance(usage, bool)
                or not isinstance(usage, int | float)
                or not math.isfinite(usage)
                or usage < 0
            ):
                raise ValidationError(
                    f"{child_path}.usage", f"usage must be a finite number >= 0, got {usage!r}"
                )
            walk(child, child_path, depth + 1)

    walk(root, root.name, 0)


def _check_name(name: object, where: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValidationError(
            where,
            f"name {name!r} must be non-empty text of letters, digits, '_' and '-'",
        )


# -- the index and effective shares ------------------------------------------------------


def _build_index(root: BudgetNode) -> TreeIndex:
    names: list[str] = []
    paths: list[str] = []
    parent: list[int] = []
    children: list[list[int]] = []
    is_leaf: list[bool] = []
    raw_shares: list[int | None] = []
    uses_parent: list[bool] = []
    usage: list[float] = []

    def visit(node: BudgetNode, up: int, path: str, is_root: bool) -> int:
        i = len(names)
        names.append(node.name)
        paths.append(path)
        parent.append(up)
        children.append([])
        is_leaf.append(node.is_leaf)
        raw_shares.append(None if is_root else node.shares)
        uses_parent.append(not is_root and node.shares is None)
        usage.append(float(node.usage))
        for child in node.children:
            children[i].append(visit(child, i, f"{path}/{child.name}", False))
        return i

    visit(root, -1, root.name, True)
    n = len(names)

    # Rule 1: the fairshare parent skips `parent` ancestors (pre-order: ancestors first).
    fs_parent = [-1] * n
    for i in range(1, n):
        up = parent[i]
        fs_parent[i] = fs_parent[up] if uses_parent[up] else up
    # Rule 2: the sibling set of each owner, in pre-order.
    fs_members: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        fs_members[fs_parent[i]].append(i)
    # Rule 3: level shares and S; `parent` nodes show their fairshare parent's S.
    norm = [0.0] * n
    norm[0] = 1.0
    for owner in range(n):
        members = fs_members[owner]
        if not members:
            continue
        level = sum(s for m in members if (s := raw_shares[m]) is not None)
        for m in members:
            s = raw_shares[m]
            if s is not None:
                norm[m] = s / level if level else 0.0
    for i in range(1, n):
        if uses_parent[i]:
            norm[i] = norm[fs_parent[i]]

    return TreeIndex(
        names=tuple(names),
        paths=tuple(paths),
        parent=tuple(parent),
        children=tuple(tuple(c) for c in children),
        is_leaf=tuple(is_leaf),
        raw_shares=tuple(raw_shares),
        uses_parent=tuple(uses_parent),
        fs_parent=tuple(fs_parent),
        fs_members=tuple(tuple(m) for m in fs_members),
        norm_shares=tuple(norm),
        usage=tuple(usage),
        leaves=tuple(i for i in range(n) if is_leaf[i]),
        position={name: i for i, name in enumerate(names)},
    )


def _effective_shares(index: TreeIndex) -> dict[str, float]:
    """E(member) = E(owner) * shares / level_shares, or an equal split of E(owner) when the
    set's level_shares is 0. `parent` accounts are placeholders: their children already sit
    in the set, so they take nothing themselves."""
    n = len(index.names)
    share = [0.0] * n
    share[0] = 1.0
    for owner in range(n):  # pre-order: an owner's E is final before its members'
        members = [
            m for m in index.fs_members[owner] if index.is_leaf[m] or not index.uses_parent[m]
        ]
        if not members:
            continue
        level = sum(s for m in members if (s := index.raw_shares[m]) is not None)
        for m in members:
            if level:
                s = index.raw_shares[m]
                share[m] = share[owner] * s / level if s is not None else 0.0
            else:
                share[m] = share[owner] / len(members)
    return {index.names[i]: share[i] for i in index.leaves}


# -- changes -------------------------------------------------------------------------------


def set_shares(tree: BudgetTree, path: Sequence[str], shares: int | None) -> BudgetTree:
    """A new tree where the node at ``path`` (names from the root down, root included) has
    ``shares`` (None is Slurm's ``parent``). The result is validated like any tree."""
    if len(path) < 2 or path[0] != tree.root.name:
        raise ValidationError(
            "path", f"must start at the root {tree.root.name!r} and name a node below it"
        )

    def rebuild(node: BudgetNode, rest: Sequence[str], where: str) -> BudgetNode:
        if not rest:
            return replace(node, shares=shares)
        for i, child in enumerate(node.children):
            if child.name == rest[0]:
                new = rebuild(child, rest[1:], f"{where}/{child.name}")
                children = (*node.children[:i], new, *node.children[i + 1 :])
                return replace(node, children=children)
        raise ValidationError("path", f"{where} has no child named {rest[0]!r}")

    return BudgetTree(rebuild(tree.root, path[1:], tree.root.name))
