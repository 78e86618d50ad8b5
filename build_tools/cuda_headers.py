"""CUDA headers for compiling CUDA host code (c10/cuda, TensorFlow's GPU wiring) without a CUDA toolkit.

`make setup` installs NVIDIA's PyPI wheels into the venv (pyproject's `test` extra), two sets that
live side by side:
  CUDA 12 (12.4, what the official torch 2.6.0 wheel is built with; c10/cuda compiles against it)
    nvidia/cuda_runtime/  include/cuda.h, cuda_runtime_api.h, ...; lib/libcudart.so.12
    nvidia/cuda_nvcc/     include/crt/host_defines.h, host_config.h (cuda_runtime_api.h includes them)
    nvidia/nvml_dev/      include/nvml.h (c10/cuda/driver_api.h includes it)
  CUDA 13 (13.0, what the GPU machine builds TensorFlow's LMS allocator with)
    nvidia/cu13/          include/ (cuda.h, crt/ from nvidia-cuda-crt), lib/libcudart.so.13
:func:`find` prefers those to a toolkit ($CUDA_HOME, /usr/local/cuda), so what a compile check
compiles against is what setup installed, not whatever the machine happens to have.
"""
from __future__ import annotations

import os
import re
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

    def version(self) -> tuple[int, int]:
        """(major, minor) from cuda.h's CUDA_VERSION."""
        m = re.search(r"#define CUDA_VERSION (\d+)", (self.home / "include" / "cuda.h").read_text(errors="replace"))
        v = int(m.group(1)) if m else 0
        return v // 1000, v % 1000 // 10


def _site_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    out = [Path(paths["purelib"]), Path(paths["platlib"])]
    out += [Path(p) for p in sys.path if p.endswith("site-packages")]
    return list(dict.fromkeys(out))


def from_wheels(major: int = 12) -> CudaHeaders | None:
    """The NVIDIA wheels of CUDA `major` installed in the running interpreter's environment, if any."""
    for site in _site_dirs():
        nv = site / "nvidia"
        if major == 12:
            home, extra = nv / "cuda_runtime", [nv / sub / "include" for sub in ("cuda_nvcc", "nvml_dev")]
        else:
            home, extra = nv / f"cu{major}", []
        if (home / "include" / "cuda.h").is_file():
            found = CudaHeaders(home, [home / "include", *[e for e in extra if e.is_dir()]],
                                f"NVIDIA's PyPI wheels in {nv}")
            if found.version()[0] == major:
                return found
    return None


def from_toolkit(major: int | None = None) -> CudaHeaders | None:
    for cand in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if cand and (Path(cand) / "include" / "cuda.h").is_file():
            home = Path(cand)
            found = CudaHeaders(home, [home / "include"], f"the CUDA toolkit in {home}")
            if major is None or found.version()[0] == major:
                return found
    return None


def find(major: int = 12) -> CudaHeaders | None:
    """Headers of CUDA `major`: setup's wheels first, then a toolkit of that major version."""
    return from_wheels(major) or from_toolkit(major)
