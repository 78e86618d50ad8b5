"""Finding the tools a full build needs, and saying exactly what to install when one is missing."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .tools import find_tool


@dataclass
class Check:
    name: str
    ok: bool
    found: str        # what was found (path + version) or "not found"
    fix: str = ""     # what to do when not ok

    def line(self) -> str:
        mark = "ok " if self.ok else "MISSING" if self.found == "not found" else "WRONG"
        return f"{mark:7} {self.name}: {self.found}" + ("" if self.ok else f"\n          -> {self.fix}")


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def in_range(version: str, spec: str) -> bool:
    """'12.4' in '>=11.8,<12.9' (the simple comparisons profile.toml uses)."""
    v = version_tuple(version)
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = re.match(r"(>=|<=|==|<|>)\s*([\d.]+)", part)
        if not m:
            raise ValueError(f"bad version range {spec!r}")
        op, bound = m.group(1), version_tuple(m.group(2))
        n = max(len(v), len(bound))
        a, b = v + (0,) * (n - len(v)), bound + (0,) * (n - len(bound))
        if not {">=": a >= b, "<=": a <= b, "==": a == b, "<": a < b, ">": a > b}[op]:
            return False
    return True


def _output(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return (r.stdout + r.stderr).strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def python_version(python: str = sys.executable) -> str:
    """'3.11' for the interpreter `python`."""
    return _output([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])


def python_check(spec: str, python: str = sys.executable) -> Check:
    ver = _output([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"])
    ok = bool(ver) and in_range(ver, spec)
    return Check("python", ok, f"{python} {ver}" if ver else "not found",
                 f"use a Python {spec} (e.g. `PYTHON=python3.11 make build ...`)")


def cuda_home() -> Path | None:
    for cand in [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]:
        if cand and Path(cand, "bin", "nvcc").exists():
            return Path(cand)
    if Path("/usr/local/cuda/bin/nvcc").exists():
        return Path("/usr/local/cuda")
    nvcc = find_tool("nvcc")
    if nvcc and Path(nvcc).resolve().parent.parent.joinpath("include", "cuda.h").exists():
        return Path(nvcc).resolve().parent.parent
    return None


def nvcc_check(spec: str) -> Check:
    home = cuda_home()
    if not home:
        return Check(f"nvcc (CUDA toolkit) {spec}", False, "not found",
                     f"install a CUDA toolkit {spec} and set CUDA_HOME (or put nvcc on PATH)")
    out = _output([str(home / "bin" / "nvcc"), "--version"])
    m = re.search(r"release (\d+\.\d+)", out)
    ver = m.group(1) if m else "?"
    return Check(f"nvcc (CUDA toolkit) {spec}", bool(m) and in_range(ver, spec), f"{home}/bin/nvcc {ver}",
                 f"this tag builds with CUDA {spec}: install one and point CUDA_HOME at it")


def cudnn_check() -> Check:
    dirs = [os.environ.get("CUDNN_INCLUDE_DIR"), os.environ.get("CUDNN_ROOT") and os.path.join(os.environ["CUDNN_ROOT"], "include")]
    home = cuda_home()
    if home:
        dirs.append(str(home / "include"))
    dirs += ["/usr/include", "/usr/include/x86_64-linux-gnu"]
    dirs += [str(p) for p in Path(sys.prefix).glob("lib/python3*/site-packages/nvidia/cudnn/include")]
    for d in filter(None, dirs):
        for name in ("cudnn_version.h", "cudnn.h"):
            f = Path(d, name)
            if f.exists():
                text = f.read_text(errors="replace")
                parts = [re.search(rf"#define CUDNN_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCHLEVEL")]
                ver = ".".join(m.group(1) for m in parts if m) or "?"
                return Check("cuDNN", True, f"{f} {ver}")
    return Check("cuDNN", False, "not found",
                 "install cuDNN (e.g. `pip install nvidia-cudnn-cu12` or NVIDIA's packages) and set CUDNN_INCLUDE_DIR/CUDNN_LIB_DIR")


def tool_check(name: str, minimum: str | None = None, *, why: str = "", cmd: list[str] | None = None,
               exact: str | None = None) -> Check:
    path = find_tool(name)
    if not path:
        need = f" {exact}" if exact else (f" >= {minimum}" if minimum else "")
        return Check(name, False, "not found", f"install {name}{need}{(' ' + why) if why else ''}")
    out = _output(cmd or [path, "--version"])
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", out)
    ver = m.group(1) if m else "?"
    ok = True
    if exact:
        ok = ver == exact
    elif minimum and m:
        ok = version_tuple(ver) >= version_tuple(minimum)
    return Check(name, ok, f"{path} {ver}",
                 f"{name} {exact or '>= ' + str(minimum)} is needed{(' ' + why) if why else ''}")


def compiler_launcher(choice: str | None = "auto") -> str | None:
    """ccache or sccache, handed to CMake (CMAKE_<LANG>_COMPILER_LAUNCHER) by both PyTorch build modes.

    'auto': $LMS_COMPILER_LAUNCHER if set, else whichever of sccache/ccache is installed; 'none'
    disables; a name forces that tool (an error if it is not installed).
    """
    from .errors import LmsError
    if choice == "auto":
        choice = os.environ.get("LMS_COMPILER_LAUNCHER") or "auto"
    if choice in ("none", "", None):
        return None
    if choice == "auto":
        for tool in ("sccache", "ccache"):
            if find_tool(tool):
                return tool
        return None
    if not find_tool(choice):
        raise LmsError(f"compiler launcher {choice!r} not found",
                       hint="apt-get install -y ccache, or LMS_COMPILER_LAUNCHER=none")
    return choice
