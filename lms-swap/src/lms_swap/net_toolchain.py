"""What compiling the eviction net (``lms_swap_guard.cpp``) needs besides a C++ compiler: its
files, a PyTorch whose caching allocator has trace trackers, and the CUDA runtime headers (and,
for the pluggable allocator of :mod:`.allocator`, ``nvml.h``); where a compiled extension is
cached.  Used at run time (``guard.build_guard``) and at build time (``lms-swap/setup.py`` loads
this file on its own, so it imports nothing of this package)."""

from __future__ import annotations

import os
import re
import sys
from typing import List, Optional

import torch

__all__ = ["NET_HEADERS", "NET_SOURCE", "cached_build", "cpu_only_reason", "cuda_headers_version",
           "cuda_include_dirs", "libstdcxx_link_flags", "missing_cuda_headers", "nvml_include_dirs",
           "refusal", "unsupported_reason"]

# The eviction net is one translation unit: NET_SOURCE, which includes the headers of the net's
# parts (NET_HEADERS) from its own folder.  They go where it goes: lms-swap's package data
# (pyproject.toml), torch/cuda/ in a PyTorch tree (patches/pytorch/shared.toml [repo_files]).
NET_SOURCE = "lms_swap_guard.cpp"
NET_HEADERS = ("lms_swap_guard_slot.h", "lms_swap_guard_eviction.h", "lms_swap_guard_hook.h",
               "lms_swap_guard_peak.h", "lms_swap_guard_attach.h")

# the headers the net includes from CUDA: cuda_runtime_api.h includes crt/host_defines.h
CUDA_HEADERS = ("cuda_runtime_api.h", os.path.join("crt", "host_defines.h"))


def _include_dirs(headers, wheel_folders) -> List[str]:
    """Include folders holding any of ``headers``: a CUDA toolkit's (``CUDA_HOME``), then
    those of NVIDIA's wheels (``wheel_folders`` under each ``sys.path`` entry), in order."""
    dirs = []
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:  # pragma: no cover - broken torch install
        CUDA_HOME = None
    for root in filter(None, (CUDA_HOME, os.environ.get("CUDA_HOME"))):
        dirs.append(os.path.join(root, "include"))
    for base in sys.path:
        for sub in wheel_folders:
            dirs.append(os.path.join(base, sub))
    return [d for d in dict.fromkeys(dirs)
            if any(os.path.isfile(os.path.join(d, h)) for h in headers)]


def cuda_include_dirs() -> List[str]:
    """Where the CUDA runtime headers are: a CUDA toolkit, else NVIDIA's wheels (the
    runtime wheel, which PyTorch's CUDA wheels depend on, has ``cuda_runtime_api.h``; the
    ``crt/`` headers it includes come with the compiler wheel, nvidia-cuda-nvcc-cu12, or
    nvidia-cuda-crt for CUDA 13)."""
    return _include_dirs(CUDA_HEADERS, ("nvidia/cuda_runtime/include", "nvidia/cuda_nvcc/include",
                                        "nvidia/cu13/include", "nvidia/cu12/include"))


def nvml_include_dirs() -> List[str]:
    """Where ``nvml.h`` is (PyTorch's ``c10/cuda/driver_api.h`` includes it, which the
    pluggable allocator's core does): a CUDA toolkit, else NVIDIA's wheels
    (nvidia-nvml-dev-cu12; CUDA 13's own)."""
    return _include_dirs(("nvml.h",), ("nvidia/nvml_dev/include", "nvidia/cu13/include",
                                       "nvidia/cu12/include"))


def libstdcxx_link_flags() -> List[str]:
    """Link flags that make a compiled extension use the process's shared ``libstdc++.so.6``.
    Without them, g++ 13 on the GPU machine linked a copy of libstdc++ into the extension (no
    ``libstdc++.so.6`` among its needed libraries), and that copy crashed the process the first
    time a ``std::ostringstream`` formatted a number."""
    return ["-l:libstdc++.so.6"] if sys.platform.startswith("linux") else []


def cached_build(extension: str) -> tuple:
    """``(folder, cached)``: where torch.utils.cpp_extension builds ``extension`` and whether a
    compiled module is there already (then loading it compiles nothing)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory
        folder = _get_build_directory(extension, False)
        return folder, any(n.endswith(".so") for n in os.listdir(folder))
    except Exception:  # the private helper moved, or the folder is not there yet
        return os.environ.get("TORCH_EXTENSIONS_DIR", "TORCH_EXTENSIONS_DIR"), False


def missing_cuda_headers(include_dirs: List[str]) -> Optional[str]:
    """What to install where ``include_dirs`` lack a CUDA header the net includes, or None."""
    for header in CUDA_HEADERS:
        if not any(os.path.isfile(os.path.join(d, header)) for d in include_dirs):
            # NVIDIA's wheel with the crt/ headers: CUDA 12's compiler wheel, CUDA 13's own
            wheel = ("nvidia-cuda-crt" if (torch.version.cuda or "").startswith("13")
                     else "nvidia-cuda-nvcc-cu12")
            return (f"the CUDA runtime headers are incomplete ({header} not found): install a "
                    f"CUDA toolkit and set CUDA_HOME, or `pip install {wheel}` of CUDA "
                    f"{torch.version.cuda}")
    return None


def cuda_headers_version(include_dirs: List[str]) -> Optional[str]:
    """``major.minor`` of the CUDA runtime headers the compiler sees first (CUDART_VERSION)."""
    for d in include_dirs:
        path = os.path.join(d, "cuda_runtime_api.h")
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", f.read())
            if m:
                v = int(m.group(1))
                return f"{v // 1000}.{v % 1000 // 10}"
    return None


def cpu_only_reason() -> Optional[str]:
    """Why this torch's headers cannot compile the net, where it is a CPU-only build (its
    c10/cuda headers include a CUDA configuration header that only CUDA builds ship), or None."""
    from torch.utils import cpp_extension
    config = os.path.join("c10", "cuda", "impl", "cuda_cmake_macros.h")
    if any(os.path.isfile(os.path.join(d, config)) for d in cpp_extension.include_paths()):
        return None
    return (f"torch {torch.__version__} is a CPU-only build (its headers lack {config}): the "
            f"eviction net runs under the CUDA caching allocator and is compiled against a CUDA "
            f"build of torch")


def refusal() -> Optional[str]:
    """Why the net cannot be compiled against this torch here, or None: the checks a build
    makes (``lms-swap/setup.py``), in its order."""
    return (unsupported_reason() or cpu_only_reason()
            or missing_cuda_headers(cuda_include_dirs()))


def unsupported_reason() -> Optional[str]:
    """Why this PyTorch cannot host the eviction net, or None.  The net learns of every
    allocation through the caching allocator's trace trackers
    (``attachAllocatorTraceTracker``), which PyTorch 1.x's allocator lacks: asked from the
    installed headers, so a build that back-ports them is not refused."""
    from torch.utils import cpp_extension
    for d in cpp_extension.include_paths():
        header = os.path.join(d, "c10", "cuda", "CUDACachingAllocator.h")
        if os.path.isfile(header):
            with open(header, encoding="utf-8", errors="replace") as f:
                if "attachAllocatorTraceTracker" in f.read():
                    return None
            return (f"PyTorch {torch.__version__}'s caching allocator has no trace trackers "
                    f"(attachAllocatorTraceTracker, PyTorch >= 2.1), which the eviction net "
                    f"needs; swapping runs on its forecast alone")
    return None  # no headers found: the build itself says what is missing
