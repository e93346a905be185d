"""Use the mypyc-compiled scheduling core when a current build exists (``tools/build_core.py``).

``allot/__init__.py`` calls ``use()`` once, before any core module is imported. The build
(``build_dir()``: ``<sys.prefix>/allot-native``, or ``ALLOT_CORE_BUILD``) is used only when
its ``manifest.json`` says it compiled, for this interpreter (``python_tag``), the very
sources the core holds now (SHA-256 of each core source: the compiled modules were
type-checked against the others too); then its folder goes first on
``allot.core.__path__``, so the compiled modules load instead of their sources, and the
modules it does not compile load from source as always. Otherwise, or with
``ALLOT_PURE_CORE=1``, nothing changes: the pure-Python core decides the same, slower.

``STATE`` says which ran: ``compiled``, ``pure`` (asked for, or no build), ``stale`` (a
source changed since the build: ``make core`` rebuilds), ``unusable`` (the build says why
it could not compile, or was made for another interpreter).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

MANIFEST = "manifest.json"
STATE = "pure"


def build_dir() -> Path:
    where = os.environ.get("ALLOT_CORE_BUILD")
    return Path(where) if where else Path(sys.prefix) / "allot-native"


def python_tag() -> str:
    """The interpreter a build is for: implementation, version and ABI."""
    return f"{sys.implementation.cache_tag}-{sys.version_info.releaselevel}-{sys.abiflags}"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check(root: Path, core: Path) -> str:
    """``compiled`` when the build in ``root`` may stand for the sources in ``core``;
    otherwise which other ``STATE`` applies."""
    if os.environ.get("ALLOT_PURE_CORE"):
        return "pure"
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "pure"
    if not isinstance(manifest, dict) or manifest.get("compiled") is not True:
        return "unusable"
    if manifest.get("python") != python_tag():
        return "unusable"
    sources = manifest.get("sources")
    if not isinstance(sources, dict) or not sources:
        return "unusable"
    try:
        current = all(digest(core / name) == sha for name, sha in sources.items())
    except OSError:
        return "stale"
    return "compiled" if current else "stale"


def use() -> str:
    """Put a current build first on ``allot.core.__path__``; the resulting ``STATE``."""
    global STATE  # noqa: PLW0603 - set once, at import
    import allot.core  # noqa: PLC0415 - the package only, before any of its modules

    root = build_dir()
    STATE = check(root, Path(allot.core.__file__).parent)
    if STATE == "compiled":
        sys.path.append(str(root))  # the build's shared library is a top-level module
        allot.core.__path__.insert(0, str(root / "allot" / "core"))
    return STATE
