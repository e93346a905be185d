"""Fail when packages of ``allot`` import each other in a circle.

import-linter's layers contract orders the top-level packages; this check covers every
depth (``allot.services.agent`` and ``allot.services.dashboard`` too): modules are grouped
by the package that holds them and any strongly connected group of two or more packages is
a cycle. Run by ``make lint``; exit status 1 names each cycle and one import on it."""

from __future__ import annotations

import grimp


def package_graph(graph: grimp.ImportGraph) -> dict[str, dict[str, tuple[str, str]]]:
    """package -> {imported package: one (importer, imported) module pair}."""

    def package(module: str) -> str:
        return module if graph.find_children(module) else module.rpartition(".")[0]

    edges: dict[str, dict[str, tuple[str, str]]] = {}
    for importer in graph.modules:
        if not importer.startswith("allot"):
            continue
        for imported in graph.find_modules_directly_imported_by(importer):
            if not imported.startswith("allot"):
                continue
            a, b = package(importer), package(imported)
            if a != b:
                edges.setdefault(a, {}).setdefault(b, (importer, imported))
    return edges


def cycles(edges: dict[str, dict[str, tuple[str, str]]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one package."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    edges = package_graph(grimp.build_graph("allot"))
    found = cycles(edges)
    for group in found:
        print("import cycle between packages: " + ", ".join(group))
        for a in group:
            for b, (importer, imported) in sorted(edges.get(a, {}).items()):
                if b in group:
                    print(f"  {importer} imports {imported}")
    if not found:
        print(f"no import cycle between the {len(edges)} importing packages of allot")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
