"""Running libabigail's `abidiff` and reading its exit bits and report (see build_tools/abi/__init__.py)."""
from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path
from typing import Iterable

from ..errors import LmsError
from ..tools import find_tool

__all__ = ["AbiError", "Abidiff", "BIT_ABI_CHANGE", "BIT_ERROR", "BIT_INCOMPATIBLE", "BIT_USAGE_ERROR",
           "parse_report", "require_abidiff", "run_abidiff"]

BIT_ERROR = 1
BIT_USAGE_ERROR = 2
BIT_ABI_CHANGE = 4
BIT_INCOMPATIBLE = 8

# with --suppressions abidiff writes "0 Removed (1 filtered out), 0 Changed (30 filtered out), ..."
_FILTERED = r"(?: \((\d+) filtered(?: out)?\))?"
_SUMMARY = re.compile(
    r"^(Functions|Variables) changes summary: (\d+) Removed" + _FILTERED + ", "
    r"(\d+) Changed" + _FILTERED + r", (\d+) Added", re.M)
_SYM_SUMMARY = re.compile(
    r"^(Function|Variable) symbols changes summary: (\d+) Removed" + _FILTERED + r", (\d+) Added", re.M)
_LIST_HEADER = re.compile(
    r"^(\d+) (Removed|Added|Changed) (function|variable)( symbol)?s?( not referenced by debug info)?:$")

_CHANGED_HEADER = re.compile(r"^\d+ (function|variable)s? with .*changes?:$")


class AbiError(LmsError):
    """The rebuilt library is not a drop-in replacement (message lists why)."""


def require_abidiff() -> str:
    exe = find_tool("abidiff")
    if not exe:
        raise AbiError("abidiff not found: the ABI check needs libabigail's abidiff",
                       hint="apt-get install -y abigail-tools")
    return exe


@dataclasses.dataclass
class Abidiff:
    """One abidiff run: exit bits, counts and symbol lists parsed from its report."""
    old: str
    new: str
    exit_code: int
    report: str
    functions: dict            # {"removed": n, "changed": n, "added": n} (debug-info level)
    variables: dict
    function_symbols: dict     # {"removed": n, "added": n} (ELF symbols without debug info)
    variable_symbols: dict
    removed_symbols: list      # mangled names (functions + variables, both levels)
    added_symbols: list
    changed: list              # text of the "Changed" entries (first line of each)

    @property
    def bits(self) -> list[str]:
        names = {BIT_ERROR: "ERROR", BIT_USAGE_ERROR: "USAGE_ERROR", BIT_ABI_CHANGE: "ABI_CHANGE",
                 BIT_INCOMPATIBLE: "ABI_INCOMPATIBLE_CHANGE"}
        return [n for b, n in names.items() if self.exit_code & b]

    @property
    def tool_failed(self) -> bool:
        return bool(self.exit_code & (BIT_ERROR | BIT_USAGE_ERROR))

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["bits"] = self.bits
        d.pop("report")
        return d


def _entry_symbol(line: str) -> str | None:
    """`  [D] 'function void f(int)'    {_Z1fi}` or `  [D] _Z1fi, aliases ...` -> mangled name."""
    s = line.strip()
    if not s.startswith("["):
        return None
    m = re.search(r"\{([^}]+)\}\s*$", s)
    if m:
        return m.group(1).split(",")[0].strip()
    body = s.split("]", 1)[1].strip()
    if body.startswith("'"):
        # no linkage name shown (C function): 'function int g()' -> g
        m = re.search(r"([A-Za-z_][A-Za-z0-9_:]*)\s*\(", body)
        return m.group(1) if m else body
    return body.split(",")[0].split()[0]


def parse_report(report: str) -> dict:
    out = {"functions": {"removed": 0, "changed": 0, "added": 0},
           "variables": {"removed": 0, "changed": 0, "added": 0},
           "function_symbols": {"removed": 0, "added": 0},
           "variable_symbols": {"removed": 0, "added": 0},
           "removed_symbols": [], "added_symbols": [], "changed": []}
    for m in _SUMMARY.finditer(report):
        key = "functions" if m.group(1) == "Functions" else "variables"
        out[key] = {"removed": int(m.group(2)), "changed": int(m.group(4)), "added": int(m.group(6))}
    for m in _SYM_SUMMARY.finditer(report):
        key = "function_symbols" if m.group(1) == "Function" else "variable_symbols"
        out[key] = {"removed": int(m.group(2)), "added": int(m.group(4))}
    section = None
    for line in report.splitlines():
        h = _LIST_HEADER.match(line.strip())
        if h:
            section = h.group(2).lower()
            continue
        if _CHANGED_HEADER.match(line.strip()):
            section = "changed"
            continue
        if not line.strip():
            continue
        if section in ("removed", "added") and line.startswith("  ["):
            sym = _entry_symbol(line)
            if sym:
                out[f"{section}_symbols"].append(sym)
        elif section == "changed" and line.startswith("  ["):
            out["changed"].append(line.strip())
        elif not line.startswith(" "):
            section = None
    return out


def run_abidiff(old: Path | str, new: Path | str, *, extra_args: Iterable[str] = ()) -> Abidiff:
    exe = require_abidiff()
    cmd = [exe, "--no-show-locs", *extra_args, str(old), str(new)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    parsed = parse_report(proc.stdout)
    return Abidiff(old=str(old), new=str(new), exit_code=proc.returncode, report=proc.stdout, **parsed)
