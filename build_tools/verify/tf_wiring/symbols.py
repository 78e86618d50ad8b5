"""The link step short of the binary: every symbol an object needs is defined somewhere.

A Bazel build links the patch's objects into TensorFlow's shared libraries, which resolve the
rest against each other, libstdc++/libc and (for pybind modules) the Python interpreter. Here
the providers are: the patch's own objects, the wheel's libraries' exported symbols
(wheel.WHEEL_LIBS), the system's C/C++ runtime libraries and the Python the objects were compiled
for: the objects include the wheel's own Python headers (external/local_config_python, 3.11 for
TF 2.14.1), so their Python symbols are resolved against the running interpreter when it is that
version, else against the C API those headers declare (every PyAPI_FUNC/PyAPI_DATA name, which
a CPython of that version exports): never against another Python's, which has dropped or renamed
some (3.13 has no _PyThreadState_UncheckedGet).

Invariants checked:
* every strong undefined symbol (nm's ``U``) of every object has a provider; weak references
  (``w``/``v``) may stay unresolved, as the linker allows;
* no symbol is strongly defined by two of the patch's objects (a duplicate-definition link
  error), objects of one source compiled twice (CUDA header variants) counting once.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from ...errors import LmsError

# Defined by the static linker itself, never by a library.
LINKER_DEFINED = {"_GLOBAL_OFFSET_TABLE_", "__dso_handle", "_DYNAMIC", "__TMC_END__"}
SYSTEM_LIBS = ["libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1",
               "ld-linux-x86-64.so.2", "libpthread.so.0", "libdl.so.2", "librt.so.1"]
LIB_DIRS = [Path("/lib/x86_64-linux-gnu"), Path("/usr/lib/x86_64-linux-gnu"), Path("/lib64")]


def _nm(args: list[str], path: Path) -> list[list[str]]:
    r = subprocess.run(["nm", *args, str(path)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise LmsError(f"nm {' '.join(args)} {path}: {r.stderr.strip()}")
    return [l.split() for l in r.stdout.splitlines() if l.strip()]


def undefined(obj: Path) -> set[str]:
    """Strong undefined symbols of an object."""
    return {f[1] for f in _nm(["-u"], obj) if len(f) == 2 and f[0] == "U"}


def strong_defined(obj: Path) -> set[str]:
    """Global symbols the object defines for good (not weak, not COMDAT-like ``W``/``V``/``u``)."""
    return {f[2] for f in _nm(["-g", "--defined-only"], obj)
            if len(f) == 3 and f[1] in "TDBRGS"}


def all_defined(obj: Path) -> set[str]:
    return {f[2] for f in _nm(["-g", "--defined-only"], obj) if len(f) == 3}


def header_python_version(python_include: Path) -> str | None:
    """"3.11" from ``patchlevel.h`` under ``python_include``, or None."""
    try:
        text = (python_include / "patchlevel.h").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r"#define\s+PY_MAJOR_VERSION\s+(\d+).*?#define\s+PY_MINOR_VERSION\s+(\d+)", text, re.S)
    return f"{m.group(1)}.{m.group(2)}" if m else None


# PyAPI_FUNC(type) name(...), PyAPI_DATA(type) name, PyAPI_DATA(type) (*name)(...)
_PYAPI = re.compile(r"PyAPI_(?:FUNC|DATA)\s*\((?:[^()]|\([^()]*\))*\)\s*\(?\s*\*?\s*([A-Za-z_]\w*)")


def declared_python_api(python_include: Path) -> set[str]:
    """Every name the Python headers under ``python_include`` declare with PyAPI_FUNC/PyAPI_DATA:
    what a CPython of that version exports."""
    names: set[str] = set()
    for h in sorted(python_include.rglob("*.h")):
        names |= set(_PYAPI.findall(h.read_text(errors="replace")))
    return names


def running_python_symbols() -> dict[str, set[str]]:
    """{provider: defined dynamic symbols} of the running interpreter (and its libpython)."""
    out: dict[str, set[str]] = {}
    py = Path(sys.executable).resolve()
    out[f"python ({py.name})"] = {f[-1].split("@")[0] for f in _nm(["-D", "--defined-only"], py)
                                  if len(f) >= 3}
    import sysconfig
    libpy = sysconfig.get_config_var("LDLIBRARY") or ""
    libdir = Path(sysconfig.get_config_var("LIBDIR") or "/nonexistent")
    if libpy.endswith(".so") or ".so." in libpy:
        if (libdir / libpy).exists():
            out[libpy] = {f[-1].split("@")[0] for f in _nm(["-D", "--defined-only"], libdir / libpy)
                          if len(f) >= 3}
    return out


def python_symbols(python_include: Path | None) -> dict[str, set[str]]:
    """The Python provider for objects compiled against ``python_include``: the running interpreter
    where it is the headers' version (or no headers are given), else the headers' declared C API."""
    running = "%d.%d" % sys.version_info[:2]
    wanted = header_python_version(python_include) if python_include is not None else None
    if wanted is None or wanted == running:
        return running_python_symbols()
    return {f"Python {wanted} (C API declared by {python_include.name}/)": declared_python_api(python_include)}


def system_symbols(python_include: Path | None = None) -> dict[str, set[str]]:
    """{library: defined dynamic symbols} for the C/C++ runtime and the Python the objects were
    compiled for (python_symbols)."""
    out: dict[str, set[str]] = {}
    for name in SYSTEM_LIBS:
        path = next((d / name for d in LIB_DIRS if (d / name).exists()), None)
        if path is not None:
            out[name] = {f[-1].split("@")[0] for f in _nm(["-D", "--defined-only"], path) if len(f) >= 3}
    if "libstdc++.so.6" not in out or "libc.so.6" not in out:
        raise LmsError(f"libstdc++.so.6 / libc.so.6 not found in {', '.join(map(str, LIB_DIRS))}")
    out.update(python_symbols(python_include))
    return out


def demangle(names: list[str]) -> list[str]:
    if not names:
        return []
    r = subprocess.run(["c++filt"], input="\n".join(names), stdout=subprocess.PIPE, text=True)
    return r.stdout.splitlines() if r.returncode == 0 else names


def resolve(objects: dict[Path, str], providers: dict[str, set[str]]) -> dict:
    """``objects``: {object: tree path of its source}. Returns
    {"unresolved": {rel: [demangled]}, "duplicates": {symbol: [rel, rel]},
     "needed": n, "from": {provider: count}}."""
    defined_by: dict[str, set[str]] = {}
    strong_by: dict[str, set[str]] = {}
    for obj, rel in objects.items():
        for s in all_defined(obj):
            defined_by.setdefault(s, set()).add(rel)
        for s in strong_defined(obj):
            strong_by.setdefault(s, set()).add(rel)
    unresolved: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    needed = 0
    for obj, rel in objects.items():
        missing = []
        for s in sorted(undefined(obj)):
            needed += 1
            if s in defined_by:
                counts["the patch's objects"] = counts.get("the patch's objects", 0) + 1
                continue
            if s in LINKER_DEFINED:
                continue
            where = next((name for name, syms in providers.items() if s in syms), None)
            if where is None:
                missing.append(s)
            else:
                counts[where] = counts.get(where, 0) + 1
        if missing:
            unresolved.setdefault(rel, []).extend(demangle(missing))
    duplicates = {demangle([s])[0]: sorted(rels) for s, rels in strong_by.items() if len(rels) > 1}
    return {"unresolved": unresolved, "duplicates": duplicates, "needed": needed, "from": counts}
