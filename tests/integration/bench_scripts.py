"""Load a script of ``bench/`` by path (``bench`` is not a package) for a test to drive."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(script: str) -> ModuleType:
    """``bench/<script>.py`` as the module ``allot_bench_<script>``; its imports of sibling
    scripts resolve as when it is run (``bench`` first on ``sys.path``)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"allot_bench_{script}", BENCH / f"{script}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while building
    spec.loader.exec_module(module)
    return module
