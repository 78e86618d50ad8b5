"""The layers of build_tools (declared once, in build_tools/layers.py): the import graph read from the
sources with ast has no cycle between parts and no import from a lower layer to a higher one."""
from __future__ import annotations

from pathlib import Path

from build_tools import layers


def test_build_tools_has_no_import_cycle_and_no_upward_import():
    graph = layers.import_graph()
    drawing = layers.draw(graph)
    assert layers.cycles(graph) == [], drawing
    assert layers.upward_imports(graph) == [], drawing
    assert "verify" in graph and "builders" in graph, drawing


def test_every_part_is_declared_in_one_layer():
    declared = [p for _, parts in layers.LAYERS for p in parts]
    assert len(declared) == len(set(declared)), declared
    assert set(layers.import_graph()) <= set(declared)


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_graph_shows_a_cycle_and_an_upward_import(tmp_path):
    """A package laid out like build_tools where errors.py (base) imports the command line, and overlay/
    and builders/ import each other (one of them inside a function, as lazy imports are written)."""
    pkg = _write(tmp_path / "build_tools", {
        "__init__.py": "",
        "errors.py": "from .cli import main\n",
        "cli.py": "from . import errors\n",
        "overlay/__init__.py": "from .build import x\n",
        "overlay/build.py": "from ..builders.common import y\nx = 1\n",
        "builders/__init__.py": "",
        "builders/common.py": "def f():\n    from ..overlay import x\ny = 2\n",
    })
    graph = layers.import_graph(pkg)
    assert graph["errors"] == {"cli"} and graph["cli"] == {"errors"}
    assert graph["overlay"] == {"builders"} and graph["builders"] == {"overlay"}
    assert layers.cycles(graph) == [["builders", "overlay"], ["cli", "errors"]]
    assert ("errors", "cli") in layers.upward_imports(graph)
    drawing = layers.draw(graph)
    assert "errors CYCLE -> cli (UP)" in drawing and "builders CYCLE -> overlay" in drawing


def test_an_undeclared_part_counts_as_upward(tmp_path):
    pkg = _write(tmp_path / "build_tools", {"__init__.py": "", "newthing.py": "from . import errors\n",
                                            "errors.py": ""})
    graph = layers.import_graph(pkg)
    assert layers.upward_imports(graph) == [("newthing", "errors")]
    assert "(in no layer)" in layers.draw(graph)
