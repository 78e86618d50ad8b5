"""ELF facts of a shared library (binutils' readelf; present wherever gcc is)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from .abidiff import AbiError

__all__ = ["dynamic_section", "dynamic_symbols", "required_versions"]


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
