"""No dated notes in the code: a date in a comment or docstring is a lab note, and lab notes
(measurements, dates, rejected alternatives) live in ``docs/decisions/`` (issue 35, item 6).

Docstrings here are every bare string statement (module, class, function and attribute
docstrings). A timestamp's example (``2026-01-02T03:04:05Z``) is a format, not a note; a
date in a string the code uses (a report's text) is behaviour, not a comment."""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("shared", "services", "bench")
SKIPPED_DIRS = {"bench/results", "__pycache__"}
NOT_YET: frozenset[str] = frozenset()
"""Paths not scanned yet (none: every file under SCANNED is)."""
DATE = re.compile(r"(?<![\w-])\d{4}-\d{2}-\d{2}(?![\w-])")


def dated_notes(source: str) -> list[tuple[int, str]]:
    """(line, text) of each comment or docstring line of ``source`` holding a date."""
    found: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and DATE.search(tok.string):
            found.append((tok.start[0], tok.string))
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            for k, line in enumerate(node.value.value.splitlines()):
                if DATE.search(line):
                    found.append((node.lineno + k, line.strip()))
    return sorted(found)


def _scanned_files() -> list[str]:
    """Repository-relative ``.py`` paths under ``SCANNED``, minus ``NOT_YET``. Links are not
    followed (``shared/allot/services`` is ``services/``, decision 0003)."""
    paths: list[str] = []
    for top in SCANNED:
        for folder, dirs, files in os.walk(ROOT / top):
            rel = Path(folder).relative_to(ROOT).as_posix()
            skipped = SKIPPED_DIRS | NOT_YET
            dirs[:] = [d for d in dirs if d not in skipped and f"{rel}/{d}" not in skipped]
            paths += [
                f"{rel}/{f}" for f in files if f.endswith(".py") and f"{rel}/{f}" not in NOT_YET
            ]
    return sorted(paths)


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        pytest.param("X = 1  # until 2026-12-03 it was 2\n", [1], id="a-dated-comment"),
        pytest.param("# (found 2026-12-03: a NATS outage)\n", [1], id="a-date-before-a-colon"),
        pytest.param('"""Found 2026-12-03."""\n', [1], id="a-dated-module-docstring"),
        pytest.param(
            'def f():\n    """What f does.\n\n    Measured on 2026-12-02."""\n',
            [4],
            id="a-date-on-a-docstrings-later-line",
        ),
        pytest.param('X = 1\n"""Kept 30 days (2026-12-03)."""\n', [2], id="an-attribute-docstring"),
        pytest.param('X = "on 2026-12-02 alone"\n', [], id="a-string-the-code-uses-is-not-a-note"),
        pytest.param('"""UTC: ``2026-01-02T03:04:05Z``."""\n', [], id="a-timestamp-format-example"),
        pytest.param("# issue 35, 2,000-3,500 a second\n", [], id="numbers-that-are-no-date"),
    ],
)
def test_a_date_in_a_comment_or_docstring_is_found(source: str, lines: list[int]) -> None:
    assert [n for n, _ in dated_notes(source)] == lines


def test_the_scan_covers_the_services_the_bench_and_the_shared_package() -> None:
    files = _scanned_files()
    assert "services/dispatch.py" in files
    assert "bench/bench_live.py" in files
    assert "shared/allot/bus/group_commit.py" in files
    assert not any(f.startswith(("bench/results/", "shared/allot/services/")) for f in files)
    assert not any(f.startswith(tuple(NOT_YET)) for f in files)


def test_no_comment_or_docstring_in_the_code_holds_a_date() -> None:
    notes = [
        f"{path}:{line}: {text}"
        for path in _scanned_files()
        for line, text in dated_notes((ROOT / path).read_text(encoding="utf-8"))
    ]
    assert not notes, "dated notes belong in docs/decisions/:\n" + "\n".join(notes)
