"""Every module run with ``python -m`` ends with its ``if __name__ == "__main__":`` block.

Under ``python -m`` the block runs when the interpreter reaches it: a function defined below
it does not exist yet, while an import of the module (what every other test does) defines
everything first. A ranking helper defined below the block passed its tests and failed
every real start with a ``NameError`` (found by a review playing an attacker).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(
    p
    for folder in ("services", "shared/allot")
    for p in (ROOT / folder).rglob("*.py")
    if 'if __name__ == "__main__":' in p.read_text(encoding="utf-8")
)


def _is_main_block(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
    )


def test_the_services_are_among_the_modules_checked() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in MODULES}
    assert {"services/ranking.py", "services/intake.py", "services/placement/service.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_main_block_is_the_last_statement(path: Path) -> None:
    body = ast.parse(path.read_text(encoding="utf-8")).body
    blocks = [i for i, node in enumerate(body) if _is_main_block(node)]
    assert blocks == [len(body) - 1], (
        f"{path.name}: statements after `if __name__ == '__main__':` "
        f"({', '.join(type(n).__name__ for n in body[blocks[0] + 1 :]) if blocks else 'no block'})"
    )
