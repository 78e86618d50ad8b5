"""The lines between lms_swap's modules: a module shows its public names (``__all__``) and
keeps its leading-underscore names to itself.  No module of the package imports a private
name of another (``from .x import _y``, ``from lms_swap.x import _y``, ``from . import _y``)
or reaches one through a sibling module it imported (``x._y``); dunder names are exempt."""
from __future__ import annotations

import ast
import pathlib
import sys
from typing import Iterable, List, Optional

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SRC = REPO / "lms-swap" / "src" / "lms_swap"
PACKAGE = "lms_swap"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _target(node: ast.ImportFrom) -> Optional[str]:
    """The package module an import reads from ('' for the package itself), None where it
    reads from elsewhere."""
    mod = node.module or ""
    if node.level == 1:
        return mod
    if node.level == 0 and (mod == PACKAGE or mod.startswith(PACKAGE + ".")):
        return mod[len(PACKAGE) + 1:]
    return None


def crossings(source: str, module: str, siblings: Iterable[str]) -> List[str]:
    """Each private name of another module of the package that ``source`` (the text of
    module ``module``) imports or reaches through an imported sibling module."""
    siblings = set(siblings)
    tree = ast.parse(source)
    found: List[str] = []
    aliases = {}  # local name -> sibling module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _target(node)
            if target is None:
                continue
            for a in node.names:
                if target == "" and a.name in siblings:
                    aliases[a.asname or a.name] = a.name
                if _private(a.name) and target != module:
                    found.append(f"{module}:{node.lineno}: from {'.' * node.level}{node.module or ''} "
                                 f"import {a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == PACKAGE and len(parts) == 2 and parts[1] in siblings and a.asname:
                    aliases[a.asname] = parts[1]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and aliases[node.value.id] != module
                and _private(node.attr)):
            found.append(f"{module}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def _modules() -> List[pathlib.Path]:
    return sorted(SRC.glob("*.py"))


def test_the_package_has_its_modules():
    names = {p.stem for p in _modules()}
    assert {"__init__", "swapper", "state", "policy", "environment", "pinned"} <= names, (SRC, names)


def test_no_module_imports_a_private_name_of_another():
    siblings = {p.stem for p in _modules()}
    found = []
    for p in _modules():
        found += crossings(p.read_text(), p.stem, siblings)
    assert not found, "private names crossing module lines in lms_swap:\n" + "\n".join(found)


@pytest.mark.parametrize("source, expected", [
    ("from .state import _DevState\n", 1),
    ("from .state import DevState as _DevState\n", 0),          # a public name, privately named
    ("from lms_swap.pinned import _releaser, map_host\n", 1),
    ("from lms_swap import _host_total\n", 1),
    ("from . import _hidden\n", 1),
    ("from . import policy\nx = policy._dense_span\n", 1),
    ("import lms_swap.policy as p\nx = p._dense_span\n", 1),
    ("from .state import __doc__\n", 0),                       # dunder names are exempt
    ("from ._vendored import thing\n", 0),                     # the module name is not the name
    ("from torch._C import _autograd\n", 0),                   # not this package
    ("from .swapper import _x\n", 0),                          # its own module
])
def test_the_checker_sees_each_form(source, expected):
    assert len(crossings(source, "swapper", {"state", "pinned", "policy", "swapper"})) == expected


if __name__ == "__main__":  # python tests/test_lms_swap_module_lines.py [SRC]: list what crosses
    src = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else SRC
    mods = sorted(src.glob("*.py"))
    out = [c for p in mods for c in crossings(p.read_text(), p.stem, {m.stem for m in mods})]
    print("\n".join(out) or "none")
    sys.exit(1 if out else 0)
