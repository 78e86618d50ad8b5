"""ABI check of a rebuilt shared library against the official one (libabigail's `abidiff`).

The overlay build (build_tools/overlay) swaps `torch/lib/libc10_cuda.so` of an official wheel for one
compiled from the patched tree. That is only safe when every other library of the wheel still finds
what it was linked against. This module decides that, from abidiff's exit status and report:

Exit status of abidiff is a bit field (libabigail's `abidiff_status`):
  1 ABIDIFF_ERROR, 2 ABIDIFF_USAGE_ERROR: the tool failed -> the check fails (nothing was verified);
  4 ABIDIFF_ABI_CHANGE: something changed (additions alone set it too);
  8 ABIDIFF_ABI_INCOMPATIBLE_CHANGE: something was removed / changed incompatibly.
Bits tell *that* something changed; the report says *what*, so both are parsed (:class:`Abidiff`).

Policy (:func:`check_library`): only additions are allowed.
  * Functions / variables described by debug info: 0 removed, 0 changed (any type or layout change of
    a parameter, return value or variable - abidiff's "Changed" - fails).
  * ELF symbols not described by debug info (the official wheel has no DWARF, so for it abidiff can
    only compare symbol tables): 0 removed, except *toolchain artefacts*: vague-linkage copies of
    libstdc++ templates (namespace std / __gnu_cxx), C++ runtime entry points (operator new/delete,
    __cxa_*), `_init`/`_fini` - symbols that a different compiler version emits or omits for the SAME
    source. A toolchain artefact is tolerated only when
      (a) it is also missing from a rebuild of the UNPATCHED tree with the same toolchain (`baseline`),
          i.e. the patch did not cause it, and
      (b) no other library of the wheel imports it, or each importer still finds it in its own
          NEEDED closure inside the wheel or in the system libstdc++ that the wheel's platform tag
          guarantees (`providers`).
    Any other removal (a c10 symbol, a C symbol, ...) fails.
  * Types: a second abidiff between the unpatched and the patched rebuild, both with -g, compares
    class layouts and signatures of everything exported (the official binary has no DWARF, so this
    is the only way layouts can be checked): 0 removed, 0 changed.

CLI: ``python -m build_tools.abi OLD.so NEW.so [--baseline PRISTINE.so] [--types-old A.so --types-new B.so]``.
"""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path
from typing import Iterable

from ..errors import LmsError
from ..tools import find_tool

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

# Symbols a compiler/libstdc++ version change may add or drop for identical sources (see module doc).
_TOOLCHAIN = re.compile(
    r"^(_ZN?K?St|_ZNSt|_ZNKSt|_ZSt|_ZN9__gnu_cxx|_ZNK9__gnu_cxx|_ZTVNSt|_ZTINSt|_ZTSNSt|_ZTVSt|_ZTISt|"
    r"_ZTSSt|_ZTVN9__gnu_cxx|_ZTIN9__gnu_cxx|_ZTSN9__gnu_cxx|_ZGVZNSt|_ZGVNSt|_Znw|_Zna|_Zdl|_Zda|"
    r"__cxa_|__gxx_|_init$|_fini$)")


class AbiError(LmsError):
    """The rebuilt library is not a drop-in replacement (message lists why)."""


def is_toolchain_symbol(sym: str) -> bool:
    return bool(_TOOLCHAIN.match(sym))


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


# --------------------------------------------------------------------------------------------------
# ELF facts (binutils' readelf; present wherever gcc is)

def _readelf(args: list[str], path: Path) -> str:
    proc = subprocess.run(["readelf", "-W", *args, str(path)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise AbiError(f"readelf {' '.join(args)} {path} failed: {proc.stderr.strip()}")
    return proc.stdout


def dynamic_section(path: Path) -> dict:
    """NEEDED / SONAME / RPATH / RUNPATH of an ELF file."""
    out: dict = {"needed": [], "soname": None, "rpath": None, "runpath": None}
    for line in _readelf(["-d"], path).splitlines():
        m = re.search(r"\((NEEDED|SONAME|RPATH|RUNPATH)\)\s+\S.*?\[(.*)\]", line)
        if m:
            key = m.group(1).lower()
            if key == "needed":
                out["needed"].append(m.group(2))
            else:
                out[key] = m.group(2)
    return out


def dynamic_symbols(path: Path, *, defined: bool) -> dict[str, str]:
    """Exported (defined=True) or imported (defined=False) dynamic symbols -> version ('' if none)."""
    syms: dict[str, str] = {}
    for line in _readelf(["--dyn-syms"], path).splitlines():
        parts = line.split()
        if len(parts) < 8 or not parts[0].rstrip(":").isdigit():
            continue
        ndx, name = parts[6], parts[7]
        if parts[4] == "LOCAL" or not name:
            continue
        is_def = ndx != "UND"
        if is_def != defined:
            continue
        base, _, ver = name.partition("@")
        syms[base] = ver.lstrip("@")
    return syms


def required_versions(path: Path) -> dict[str, list[str]]:
    """Symbol versions the library needs from other objects: {"GLIBC": [...], "GLIBCXX": [...], ...}."""
    out: dict[str, set] = {}
    text = _readelf(["-V"], path)
    part = text.split("Version needs section", 1)
    if len(part) < 2:
        return {}
    for m in re.finditer(r"Name: ([A-Z]+)_([0-9A-Za-z_.]+)\s+Flags", part[1]):
        out.setdefault(m.group(1), set()).add(m.group(2))
    return {k: sorted(v, key=_vkey) for k, v in out.items()}


def _vkey(v: str):
    return [int(x) if x.isdigit() else -1 for x in re.split(r"[._]", v)]


# --------------------------------------------------------------------------------------------------
# the decision

@dataclasses.dataclass
class AbiReport:
    ok: bool
    problems: list                 # why it is not a drop-in replacement (empty when ok)
    tolerated: list                # toolchain artefacts accepted, with the reason
    added: list                    # symbols the new library adds
    symbols: dict                  # Abidiff.to_json() official -> new
    baseline: dict | None          # Abidiff.to_json() official -> unpatched rebuild
    types: dict | None             # Abidiff.to_json() unpatched(-g) -> patched(-g)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        lines = [f"ABI check: {'PASS' if self.ok else 'FAIL'} "
                 f"({len(self.added)} added symbols, {len(self.tolerated)} toolchain artefacts tolerated)"]
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)


def check_library(official: Path, rebuilt: Path, *, baseline: Path | None = None,
                  types_old: Path | None = None, types_new: Path | None = None,
                  importers: dict[str, set] | None = None,
                  providers: dict[str, set] | None = None,
                  system_provided: set | None = None) -> AbiReport:
    """Decide whether `rebuilt` can replace `official` (policy in the module docstring).

    baseline: the UNPATCHED tree rebuilt with the same toolchain (stripped like `rebuilt`);
      removals that also happen there are toolchain artefacts, not the patch's doing.
    types_old/types_new: unpatched/patched rebuilds WITH debug info, for the type/layout check.
    importers: {library name: symbols it imports} for the other libraries that load this one.
    providers: {library name: symbols still available to it} (its NEEDED closure in the wheel,
      without the replaced library).
    system_provided: symbols the platform's libstdc++/libgcc guarantee (see overlay.platform).
    """
    problems: list[str] = []
    tolerated: list[dict] = []
    sym = run_abidiff(official, rebuilt)
    if sym.tool_failed:
        problems.append(f"abidiff {official} {rebuilt} failed (exit {sym.exit_code}: {', '.join(sym.bits)}):\n"
                        + sym.report[-2000:])
    base = run_abidiff(official, baseline) if baseline else None
    if base is not None and base.tool_failed:
        problems.append(f"abidiff on the baseline failed (exit {base.exit_code}): {base.report[-2000:]}")
    baseline_removed = set(base.removed_symbols) if base else set()
    if base is not None:
        bad_base = sorted(s for s in baseline_removed if not is_toolchain_symbol(s))
        if bad_base:
            problems.append(
                f"the UNPATCHED rebuild already lacks {len(bad_base)} non-toolchain symbol(s) of the official "
                f"library, so this toolchain/flag set does not reproduce it: " + ", ".join(bad_base[:10]))
    for kind in ("functions", "variables"):
        if sym.__dict__[kind]["changed"]:
            problems.append(f"{sym.__dict__[kind]['changed']} {kind} changed: " + "; ".join(sym.changed[:5]))
    importers = importers or {}
    providers = providers or {}
    system_provided = system_provided or set()
    for s in sym.removed_symbols:
        if not is_toolchain_symbol(s):
            problems.append(f"removed symbol {s}")
            continue
        if baseline is not None and s not in baseline_removed:
            problems.append(f"removed symbol {s}: a toolchain symbol, but the unpatched rebuild still has it, "
                            f"so the patch removed it")
            continue
        users = sorted(lib for lib, imp in importers.items() if s in imp)
        unresolved = [lib for lib in users if s not in providers.get(lib, set()) and s not in system_provided]
        if unresolved:
            problems.append(f"removed symbol {s} is imported by {', '.join(unresolved)}, and nothing else they "
                            f"load provides it")
            continue
        why = "toolchain artefact" + (" also missing from the unpatched rebuild" if baseline else "")
        if users:
            where = sorted({("another library they load" if s in providers.get(lib, set())
                             else "the libstdc++/libgcc that the platform tag guarantees") for lib in users})
            why += f"; imported by {', '.join(users)}, which still find it in {' and '.join(where)}"
        else:
            why += "; imported by no library of the wheel"
        tolerated.append({"symbol": s, "why": why})
    types = None
    if types_old is not None and types_new is not None:
        types = run_abidiff(types_old, types_new)
        t_problems, t_tolerated = growth_problems(types)
        problems += [f"type check (unpatched -> patched, with debug info): {p}" for p in t_problems]
        tolerated += [dict(t, why="type check: " + t["why"]) for t in t_tolerated]
    return AbiReport(ok=not problems, problems=problems, tolerated=tolerated,
                     added=sorted(sym.added_symbols), symbols=sym.to_json(),
                     baseline=base.to_json() if base else None, types=types.to_json() if types else None)


# std:: / __gnu_cxx template instances (vague linkage; also their guard variables, local statics)
_STD_SYMBOL = re.compile(r"^_Z(Z|GV|GVZ|T[VIS])?N?K?(St|9__gnu_cxx)")


def is_std_symbol(sym: str) -> bool:
    return bool(_STD_SYMBOL.match(sym)) or is_toolchain_symbol(sym)


def entry_name(entry: str) -> str:
    """Qualified name of the function or variable of a report entry
    (`[C] 'method void std::deque<long>::f(int)' has ...` -> `std::deque<long>::f`)."""
    m = re.search(r"'(?:method|function|variable) (.*)'", entry)
    sig = m.group(1) if m else entry
    depth, i = 0, 0
    for i, ch in enumerate(sig):               # the parameter list: the first '(' outside <...>
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            break
    else:
        i = len(sig)
    head, depth, j = sig[:i], 0, i
    while j > 0:                               # back to the space that starts the name
        ch = head[j - 1]
        if ch == ">":
            depth += 1
        elif ch == "<":
            depth -= 1
        elif ch in " *&" and depth == 0:
            break
        j -= 1
    return head[j:]


def is_std_entry(entry: str) -> bool:
    return entry_name(entry).startswith(("std::", "__gnu_cxx::"))


def growth_problems(d: Abidiff) -> tuple[list[str], list[dict]]:
    """(problems, tolerated) of `d` (old -> new) where only growth is allowed: added functions,
    variables and symbols pass; anything removed or changed fails, except std:: / __gnu_cxx template
    instances (vague linkage: a compiler exports them or not, and every consumer carries its own
    copy), which are tolerated and listed.  abidiff's exit status cannot decide this alone: bit 4
    (ABI_CHANGE) is set by additions and by a changed function, variable or type alike (a struct
    layout change behind a parameter sets only bit 4), so the report's counts and entries decide.
    A count the parsed entries do not account for fails (nothing is waved through unread)."""
    problems: list[str] = []
    tolerated: list[dict] = []
    if d.tool_failed:
        problems.append(f"abidiff failed (exit {d.exit_code}: {', '.join(d.bits)}): {d.report[-1500:]}")
    n_changed = d.functions["changed"] + d.variables["changed"]
    std_changed = [e for e in d.changed if is_std_entry(e)]
    if n_changed > len(std_changed):
        other = [e for e in d.changed if not is_std_entry(e)] or ["(entries not parsed)"]
        problems.append(f"{n_changed - len(std_changed)} functions/variables changed: " + "; ".join(other[:5]))
    n_removed = (d.functions["removed"] + d.variables["removed"] + d.function_symbols["removed"]
                 + d.variable_symbols["removed"])
    std_removed = [s for s in d.removed_symbols if is_std_symbol(s)]
    if n_removed > len(std_removed):
        other = [s for s in d.removed_symbols if not is_std_symbol(s)] or ["(entries not parsed)"]
        problems.append(f"{n_removed - len(std_removed)} functions/variables/symbols removed: "
                        + ", ".join(other[:10]))
    tolerated += [{"symbol": entry_name(e), "why": "std:: template instance changed (vague linkage)"}
                  for e in std_changed[:n_changed]]
    tolerated += [{"symbol": s, "why": "std:: template instance removed (vague linkage)"}
                  for s in std_removed[:n_removed]]
    if d.exit_code & BIT_INCOMPATIBLE and not problems and not tolerated:
        problems.append(f"abidiff reports an incompatible change (exit {d.exit_code}) the report does not show: "
                        + d.report[-1500:])
    grew = any(d.__dict__[k]["added"] for k in ("functions", "variables", "function_symbols", "variable_symbols"))
    if d.exit_code & BIT_ABI_CHANGE and not problems and not tolerated and not grew:
        problems.append("abidiff reports an ABI change (bit 4) that is neither an addition nor parsed: "
                        + d.report[-1500:])
    return problems, tolerated


def only_grows_problems(d: Abidiff) -> list[str]:
    """Why `d` is more than growth (:func:`growth_problems`); [] when it only grows."""
    return growth_problems(d)[0]


def write_report(report: AbiReport, path: Path) -> None:
    path.write_text(json.dumps(report.to_json(), indent=1, sort_keys=True) + "\n")
