"""The layers of build_tools, lowest first, and its import graph as the sources state it.

A *part* is a subpackage (``upstream``, ``patch_factory``, ...) or a module at the top of the
package (``errors``, ``catalog``, ...; the package's own ``__init__`` is the part ``build_tools``).
A part may import parts of its own layer or of a lower one, never of a higher one, and no two
parts import each other, directly or around a loop. tests/test_layers.py holds the code to this;
``python -m build_tools.layers`` draws the graph.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

__all__ = ["LAYERS", "PACKAGE", "cycles", "draw", "import_graph", "layer_of", "upward_imports"]

PACKAGE = Path(__file__).resolve().parent

# Lowest first: (name, parts). The one place the order is declared.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("build_tools", "errors", "progress", "tools", "toolchain", "catalog", "gitutil", "fetch",
              "archives", "atomic", "wheels", "cuda_headers", "cudahome", "patchfile", "buildlock",
              "layers")),
    ("trees and compilers", ("upstream", "abi", "c10_build")),
    ("patches", ("patch_factory", "patch_ops")),
    ("framework builders", ("overlay", "builders")),
    # lms_swap_wheel builds the lms-swap wheel and packages it with packagers/
    ("packagers", ("packagers", "lms_swap_wheel")),
    ("verify", ("verify",)),
    ("command line", ("cli", "__main__")),
)


def layer_of(part: str) -> int | None:
    """The index of the layer that declares `part` (None: no layer does)."""
    for i, (_, parts) in enumerate(LAYERS):
        if part in parts:
            return i
    return None


def _part(module: tuple[str, ...]) -> str:
    """The part a module path under build_tools/ belongs to: ("overlay", "build") -> "overlay"."""
    return module[0] if module else "build_tools"


def _imported(tree: ast.AST, module: tuple[str, ...], is_package: bool, root: Path) -> set[tuple[str, ...]]:
    """Every build_tools module (as a path under the package) that `tree` imports, at any depth
    (imports inside functions count)."""
    here = module if is_package else module[:-1]
    out: set[tuple[str, ...]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "build_tools":
                    out.add(tuple(parts[1:]))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
                target = base + tuple(node.module.split(".")) if node.module else base
            elif node.module and node.module.split(".")[0] == "build_tools":
                target = tuple(node.module.split(".")[1:])
            else:
                continue
            # `from . import catalog` imports the module catalog; `from . import LMS_BUILD` a name of
            # the package (its __init__)
            for alias in node.names:
                if (root.joinpath(*target, alias.name + ".py").is_file()
                        or root.joinpath(*target, alias.name, "__init__.py").is_file()):
                    out.add(target + (alias.name,))
                else:
                    out.add(target)
    return out


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{part: the other parts it imports}, read from the sources with ast."""
    graph: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).with_suffix("").parts
        is_package = rel[-1] == "__init__"
        module = rel[:-1] if is_package else rel
        part = _part(module)
        edges = graph.setdefault(part, set())
        tree = ast.parse(path.read_text(), str(path))
        for target in _imported(tree, module, is_package, package):
            other = _part(target)
            if other != part:
                edges.add(other)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one part (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) where the imported part sits in a higher layer, or either is in none."""
    out = []
    for part, edges in sorted(graph.items()):
        for other in sorted(edges):
            a, b = layer_of(part), layer_of(other)
            if a is None or b is None or b > a:
                out.append((part, other))
    return out


def draw(graph: dict[str, set[str]]) -> str:
    """The graph by layer, highest first; an arrow to a higher layer (or an undeclared part) is
    marked UP, a part in an import cycle CYCLE."""
    in_cycle = {p for group in cycles(graph) for p in group}
    up = set(upward_imports(graph))
    rows: list[tuple[str, list[str]]] = [(name, [p for p in parts if p in graph]) for name, parts in LAYERS]
    undeclared = sorted(p for p in graph if layer_of(p) is None)
    if undeclared:
        rows.append(("(in no layer)", undeclared))
    out = []
    for name, parts in reversed(rows):
        out.append(f"[{name}]")
        for p in parts:
            arrows = ", ".join(o + (" (UP)" if (p, o) in up else "") for o in sorted(graph[p]))
            mark = " CYCLE" if p in in_cycle else ""
            out.append(f"  {p}{mark} -> {arrows or '-'}")
    out.append(f"cycles: {cycles(graph) or 'none'}; upward imports: {len(up)}")
    return "\n".join(out)


if __name__ == "__main__":
    print(draw(import_graph(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else PACKAGE)))
