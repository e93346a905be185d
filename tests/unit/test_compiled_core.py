"""``allot.compiled_core``: a build stands for the core only while it is current, and
``make test`` runs on the build it made (tools/build_core.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import allot.core
import allot.core.cycle
from allot import compiled_core

CORE = Path(allot.core.__file__).parent
FORCED_PURE = bool(os.environ.get("ALLOT_PURE_CORE"))  # as this process started


def write_build(root: Path, core: Path, **overrides: object) -> None:
    manifest: dict[str, object] = {
        "python": compiled_core.python_tag(),
        "compiled": True,
        "sources": {"cycle.py": compiled_core.digest(core / "cycle.py")},
        **overrides,
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / compiled_core.MANIFEST).write_text(json.dumps(manifest))


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    """A copy of one core source, to edit."""
    core = tmp_path / "core"
    core.mkdir()
    (core / "cycle.py").write_bytes((CORE / "cycle.py").read_bytes())
    return core


@pytest.fixture(autouse=True)
def not_forced_pure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALLOT_PURE_CORE", raising=False)


def test_a_build_of_the_current_sources_is_used(tmp_path: Path, sources: Path) -> None:
    write_build(tmp_path / "build", sources)
    assert compiled_core.check(tmp_path / "build", sources) == "compiled"


def test_an_edited_source_makes_the_build_stale(tmp_path: Path, sources: Path) -> None:
    write_build(tmp_path / "build", sources)
    with (sources / "cycle.py").open("a") as f:
        f.write("\n# edited\n")
    assert compiled_core.check(tmp_path / "build", sources) == "stale"
    (sources / "cycle.py").unlink()
    assert compiled_core.check(tmp_path / "build", sources) == "stale"


@pytest.mark.parametrize(
    ("overrides", "state"),
    [
        ({"compiled": False, "reason": "no C compiler (cc)"}, "unusable"),
        ({"python": "cpython-310-final-"}, "unusable"),
        ({"sources": {}}, "unusable"),
        ({"sources": "cycle.py"}, "unusable"),
    ],
    ids=["not-compiled", "other-python", "no-sources", "bad-sources"],
)
def test_a_build_that_cannot_stand_for_the_core_is_not_used(
    tmp_path: Path, sources: Path, overrides: dict[str, object], state: str
) -> None:
    write_build(tmp_path / "build", sources, **overrides)
    assert compiled_core.check(tmp_path / "build", sources) == state


def test_no_build_or_a_broken_manifest_runs_the_source_core(tmp_path: Path, sources: Path) -> None:
    assert compiled_core.check(tmp_path / "none", sources) == "pure"
    (tmp_path / compiled_core.MANIFEST).write_text("{not json")
    assert compiled_core.check(tmp_path, sources) == "pure"


def test_allot_pure_core_wins_over_a_current_build(
    tmp_path: Path, sources: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_build(tmp_path / "build", sources)
    monkeypatch.setenv("ALLOT_PURE_CORE", "1")
    assert compiled_core.check(tmp_path / "build", sources) == "pure"


def test_this_process_runs_the_build_make_made() -> None:
    """Under ``make test`` the first pass runs the compiled modules (when this machine
    could compile them) and the second the sources: each pass tests what it says."""
    root = compiled_core.build_dir()
    manifest = root / compiled_core.MANIFEST
    built = manifest.exists() and json.loads(manifest.read_text()).get("compiled") is True
    if FORCED_PURE or not built:
        assert compiled_core.STATE != "compiled"
        assert allot.core.cycle.__file__.endswith(".py")
    else:
        assert compiled_core.STATE == "compiled", "the build is stale: make core"
        assert not allot.core.cycle.__file__.endswith(".py")
        assert Path(allot.core.cycle.__file__).is_relative_to(root)


def test_a_build_stands_for_every_core_source_not_only_the_compiled_ones() -> None:
    """mypyc compiles a module against the types of those it imports: an edit of a module
    it does not compile (``model``, ``policy``) must make the build stale too."""
    path = compiled_core.build_dir() / compiled_core.MANIFEST
    assert path.exists(), "no build: make core (make test makes one)"
    manifest = json.loads(path.read_text())
    if manifest["compiled"] is not True:  # a machine without a compiler: it says why
        assert manifest["reason"]
        return
    assert set(manifest["sources"]) == {p.name for p in CORE.glob("*.py")}
