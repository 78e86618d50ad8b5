"""The decision: is a rebuilt library a drop-in replacement of the official one (policy: build_tools/abi/__init__.py)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .abidiff import BIT_ABI_CHANGE, BIT_INCOMPATIBLE, Abidiff, run_abidiff
from .symbols import entry_name, is_std_entry, is_std_symbol, is_toolchain_symbol

__all__ = ["AbiReport", "check_library", "growth_problems", "only_grows_problems", "write_report"]


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
