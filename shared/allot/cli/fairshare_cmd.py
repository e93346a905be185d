"""``allot fairshare TREE.yaml [--json]``: Fair Tree ranking of a budget tree file.

The file is the nested budget tree (``allot.core.budgets.parse_tree``) with each leaf's
``usage`` in GPU-seconds. The command prints an ``sshare -l`` style table, or with
``--json`` a list with one object per node (root excluded), in tree order:

    path             "root/a/b"
    leaf             true for allocations
    raw_shares       integer, or "parent"
    norm_shares      S among the node's Fair Tree siblings
    raw_usage        GPU-seconds (accounts: sum of their leaves)
    effective_usage  raw_usage / the whole tree's usage (0 when nothing was used)
    level_fs         number, "inf", or null for a `parent` account (it has none)
    rank             integer for leaves (n = best), else null
    fairshare        rank / n for leaves, else null

A bad file prints ONE line on stderr naming the file, the node and the problem, and exits 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from allot.config.budget_file import load_tree_file, where_in_file
from allot.core.budgets import PARENT
from allot.core.errors import ValidationError
from allot.core.fairshare import NodeRank, Ranking, rank
from allot.render.live_format import rank_legend

EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``fairshare`` subcommand; ``args.func(args)`` then runs it."""
    parser = subparsers.add_parser(
        "fairshare",
        help="rank a budget tree's allocations with Slurm's Fair Tree",
        description=(
            "Rank every allocation of a budget tree file with Slurm's Fair Tree algorithm, "
            "from the usage (GPU-seconds) written on its leaves."
        ),
    )
    parser.add_argument("tree", type=Path, metavar="TREE.yaml", help="budget tree with usage")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the command; returns the exit status (0, or 2 for a bad file)."""
    path: Path = args.tree
    try:
        tree = load_tree_file(path, "tree")
        ranking = rank(tree, tree.usage())
    except ValidationError as exc:
        where = where_in_file(path, exc)
        reason = " ".join(exc.reason.split())
        print(f"allot fairshare: {where}: {reason}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps([_as_json(node) for node in ranking.nodes], indent=2, allow_nan=False))
    else:
        print(render_table(ranking, total_usage=sum(tree.usage().values())))
        print(rank_legend(sum(1 for node in ranking.nodes if node.leaf)))
    return 0


def _as_json(node: NodeRank) -> dict[str, Any]:
    level_fs: float | str | None = node.level_fs
    if node.level_fs is not None and math.isinf(node.level_fs):
        level_fs = "inf"
    return {
        "path": node.path,
        "leaf": node.leaf,
        "raw_shares": PARENT if node.raw_shares is None else node.raw_shares,
        "norm_shares": node.norm_shares,
        "raw_usage": node.raw_usage,
        "effective_usage": node.effective_usage,
        "level_fs": level_fs,
        "rank": node.rank,
        "fairshare": node.fairshare,
    }


_COLUMNS = (
    ("Account", 24, "<"),
    ("User", 14, "<"),
    ("RawShares", 10, ">"),
    ("NormShares", 11, ">"),
    ("RawUsage", 14, ">"),
    ("EffectvUsage", 13, ">"),
    ("LevelFS", 12, ">"),
    ("Rank", 6, ">"),
    ("FairShare", 10, ">"),
)


def render_table(ranking: Ranking, total_usage: float) -> str:
    """sshare -l layout: accounts indented one space per level in the Account column,
    allocations in the User column under their account. Widths grow to fit long names."""
    rows: list[tuple[str, ...]] = [
        ("root", "", "", _f(1.0), _usage(total_usage), _f(1.0 if total_usage else 0.0), "", "", "")
    ]
    for node in ranking.nodes:
        depth = node.path.count("/")
        if node.leaf:
            account = " " * (depth - 1) + node.path.split("/")[-2]
            user = node.name
        else:
            account = " " * depth + node.name
            user = ""
        rows.append(
            (
                account,
                user,
                PARENT if node.raw_shares is None else str(node.raw_shares),
                _f(node.norm_shares),
                _usage(node.raw_usage),
                _f(node.effective_usage),
                "" if node.level_fs is None else _f(node.level_fs),
                "" if node.rank is None else str(node.rank),
                "" if node.fairshare is None else _f(node.fairshare),
            )
        )
    widths = [
        max(width, *(len(row[c]) for row in rows)) for c, (_, width, _) in enumerate(_COLUMNS)
    ]
    lines = [
        " ".join(
            f"{title:{align}{w}}" for (title, _, align), w in zip(_COLUMNS, widths, strict=True)
        ),
        " ".join("-" * w for w in widths),
    ]
    for row in rows:
        cells = zip(row, _COLUMNS, widths, strict=True)
        lines.append(" ".join(f"{v:{align}{w}}" for v, (_, _, align), w in cells).rstrip())
    return "\n".join(lines)


def _f(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.6f}"


def _usage(value: float) -> str:
    # sshare prints RawUsage as an integer; keep fractions visible when there are any.
    return str(int(value)) if value == int(value) else f"{value:.3f}"
