"""Compile the scheduling core's hot modules with mypyc (``make core``; ``make install``).

The core's source stays pure Python (``allot.core``: standard library only). mypyc turns
the same files into C extension modules, which decide identically (the golden reports are
byte-identical on either core: ``make test`` checks both) with a fraction of the CPU
(docs/decisions/0056-compiled-core.md). Where no C compiler, Python headers or mypyc are
found, nothing is built and every process runs the source core, only slower.

Output: ``<venv>/allot-native/`` (``allot.compiled_core.build_dir()``) holds the extension
modules and ``manifest.json``, which records the SHA-256 of every core source, compiled
or not: mypyc compiles a module against the types of those it imports, so the build stands
for the whole core as it was. A process uses the build only while each of those sources is
unchanged (``allot.compiled_core``): an edited core file is never shadowed by a stale
build, and ``make`` rebuilds it.

Compiled: the modules a cycle and a fold run (``COMPILED``). Not compiled: those whose
classes are subclassed outside the core (``policy``'s orderings by the simulator's
baselines, ``errors`` by the SDK; interpreted classes cannot subclass compiled ones), the
value types that cross process boundaries or reject bad input by field (``model``,
``decisions``: mypyc's frozen classes do not unpickle, and its argument checks raise a bare
``TypeError`` before ``__post_init__`` names the field; ``running``'s ``Running``, which
neither crosses a process boundary nor validates input, is compiled), and the rest, which
no cycle runs.

Run: ``.venv/bin/python tools/build_core.py [--out DIR]``; exit status 0 also when nothing
could be compiled (the manifest and the printed line say why).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from allot import compiled_core

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "shared" / "allot" / "core"
COMPILED = (
    "cycle.py",
    "fold.py",
    "heap_order.py",
    "placement.py",
    "preemption.py",
    "queue_view.py",
    "reasons.py",
    "reservations.py",
    "running.py",
    "state.py",
    "victims.py",
)


def why_not() -> str | None:
    """Why this machine cannot compile the core; None when it can."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        return f"no Python headers ({headers})"
    if importlib.util.find_spec("mypyc") is None:
        return "no mypyc (it comes with the dev tools: pip install -e '.[dev]')"
    return None


def build(out: Path) -> dict[str, object]:
    """Compile ``COMPILED`` into ``out``; the manifest to write there."""
    manifest: dict[str, object] = {"python": compiled_core.python_tag(), "compiled": False}
    reason = why_not()
    if reason is not None:
        return {**manifest, "reason": reason}
    with tempfile.TemporaryDirectory(prefix="allot-core-build-") as tmp:
        work = Path(tmp)
        package = work / "allot" / "core"
        package.mkdir(parents=True)
        (work / "allot" / "__init__.py").write_text("")
        for source in CORE.glob("*.py"):  # the others too: mypyc type-checks the imports
            shutil.copy2(source, package / source.name)
        # The digests are of the copies: exactly what was compiled, and compiled against.
        digests = {p.name: compiled_core.digest(p) for p in sorted(package.glob("*.py"))}
        started = time.perf_counter()
        run = subprocess.run(
            [sys.executable, "-m", "mypyc", *(f"allot/core/{name}" for name in COMPILED)],
            cwd=work,
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode != 0:
            return {**manifest, "reason": "mypyc failed: " + (run.stdout + run.stderr)[-2000:]}
        if out.exists():
            shutil.rmtree(out)
        (out / "allot" / "core").mkdir(parents=True)
        for lib in work.glob("*.so"):  # the group's shared library: a top-level module
            shutil.copy2(lib, out / lib.name)
        for ext in package.glob("*.so"):
            shutil.copy2(ext, out / "allot" / "core" / ext.name)
        build_s = round(time.perf_counter() - started, 1)
    return {**manifest, "compiled": True, "sources": digests, "build_s": build_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=compiled_core.build_dir(), help="folder")
    args = parser.parse_args(argv)
    manifest = build(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / compiled_core.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if manifest["compiled"]:
        print(f"compiled core: {len(COMPILED)} modules in {manifest['build_s']} s -> {args.out}")
    else:
        print(f"compiled core: not built ({manifest['reason']}); the source core runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
