"""CUDA headers for compiling CUDA host code (c10/cuda, TensorFlow's GPU wiring) without a CUDA toolkit.

`make setup` installs NVIDIA's PyPI wheels into the venv (pyproject's `test` extra):
  nvidia/cuda_runtime/  include/cuda.h, cuda_runtime_api.h, ...; lib/libcudart.so.12
  nvidia/cuda_nvcc/     include/crt/host_defines.h, host_config.h (cuda_runtime_api.h includes them)
  nvidia/nvml_dev/      include/nvml.h (c10/cuda/driver_api.h includes it)
:func:`find` prefers those to a toolkit ($CUDA_HOME, /usr/local/cuda), so what a compile check
compiles against is what setup installed, not whatever the machine happens to have.
"""
from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path


@dataclass
class CudaHeaders:
    home: Path              # include/cuda.h + lib*/libcudart.so* (build_tools.c10_build's cuda_home)
    includes: list          # every folder to pass with -I, home/include first
    origin: str             # where they came from, for messages

    def flags(self) -> list[str]:
        return [f"-I{p}" for p in self.includes]


def _site_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    out = [Path(paths["purelib"]), Path(paths["platlib"])]
    out += [Path(p) for p in sys.path if p.endswith("site-packages")]
    return list(dict.fromkeys(out))


def from_wheels() -> CudaHeaders | None:
    """The NVIDIA wheels installed in the running interpreter's environment, if any."""
    for site in _site_dirs():
        nv = site / "nvidia"
        rt = nv / "cuda_runtime"
        if (rt / "include" / "cuda.h").is_file():
            extra = [nv / sub / "include" for sub in ("cuda_nvcc", "nvml_dev") if (nv / sub / "include").is_dir()]
            return CudaHeaders(rt, [rt / "include", *extra], f"NVIDIA's PyPI wheels in {nv}")
    return None


def from_toolkit() -> CudaHeaders | None:
    for cand in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if cand and (Path(cand) / "include" / "cuda.h").is_file():
            home = Path(cand)
            return CudaHeaders(home, [home / "include"], f"the CUDA toolkit in {home}")
    return None


def find() -> CudaHeaders | None:
    return from_wheels() or from_toolkit()
