"""The eviction net (``lms_swap_guard.cpp``, shipped with this package): the kept tensors' way
out when the forecast fails.  Built once per PyTorch version with ``torch.utils.cpp_extension``."""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any, Dict, List, Optional

import torch


# the source ships inside this package when it is installed on its own (package data of the
# lms-swap distribution), next to it in a PyTorch tree (torch/cuda/lms_swap_guard.cpp)
_HERE = os.path.dirname(os.path.abspath(__file__))
GUARD_SOURCE = next((p for p in (os.path.join(_HERE, "lms_swap_guard.cpp"),
                                 os.path.join(os.path.dirname(_HERE), "lms_swap_guard.cpp"))
                     if os.path.isfile(p)), os.path.join(_HERE, "lms_swap_guard.cpp"))
_guard_state: Dict[str, Any] = {}
_guard_lock = threading.Lock()


def _cuda_include_dirs() -> List[str]:
    """Where the CUDA runtime headers are: a CUDA toolkit, else NVIDIA's wheels (the
    runtime wheel, which PyTorch's CUDA wheels depend on, has ``cuda_runtime_api.h``; the
    ``crt/`` headers it includes come with the compiler wheel, nvidia-cuda-nvcc-cu12, or
    nvidia-cuda-crt for CUDA 13)."""
    dirs = []
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:  # pragma: no cover - broken torch install
        CUDA_HOME = None
    for root in filter(None, (CUDA_HOME, os.environ.get("CUDA_HOME"))):
        dirs.append(os.path.join(root, "include"))
    for base in sys.path:
        for sub in ("nvidia/cuda_runtime/include", "nvidia/cuda_nvcc/include",
                    "nvidia/cu13/include", "nvidia/cu12/include"):
            dirs.append(os.path.join(base, sub))
    return [d for d in dict.fromkeys(dirs)
            if any(os.path.isfile(os.path.join(d, h))
                   for h in ("cuda_runtime_api.h", os.path.join("crt", "host_defines.h")))]


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


def build_guard(verbose: bool = False) -> Any:
    """Compiles (once per PyTorch version; cached in ``TORCH_EXTENSIONS_DIR``) and imports
    the eviction net.  Needs a C++ compiler, ninja, the CUDA runtime headers and a
    PyTorch with allocator trace trackers (:func:`unsupported_reason`), not a GPU; raises
    where it cannot be built.  :func:`load_guard` is what the swapper uses."""
    from torch.utils import cpp_extension
    reason = unsupported_reason()
    if reason:
        raise RuntimeError(reason)
    inc = _cuda_include_dirs()
    for header in ("cuda_runtime_api.h", os.path.join("crt", "host_defines.h")):
        if not any(os.path.isfile(os.path.join(d, header)) for d in inc):
            # NVIDIA's wheel with the crt/ headers: CUDA 12's compiler wheel, CUDA 13's own
            wheel = ("nvidia-cuda-crt" if (torch.version.cuda or "").startswith("13")
                     else "nvidia-cuda-nvcc-cu12")
            raise RuntimeError(
                f"the CUDA runtime headers are incomplete ({header} not found): install a "
                f"CUDA toolkit and set CUDA_HOME, or `pip install {wheel}` of CUDA "
                f"{torch.version.cuda}")
    return cpp_extension.load(
        name="lms_swap_guard_" + torch.__version__.replace(".", "_").replace("+", "_"),
        sources=[GUARD_SOURCE], extra_include_paths=inc,
        extra_cflags=["-O2"], verbose=verbose)


def load_guard(required: bool = False) -> Any:
    """The compiled eviction net (built once per PyTorch version with
    ``torch.utils.cpp_extension``; cached in ``TORCH_EXTENSIONS_DIR``), or None where it
    cannot be built (no C++ compiler, no CUDA headers, no CUDA): swapping then runs on
    its forecast alone, and :func:`stats` says so (``guard.active`` 0).  ``required``
    raises instead."""
    with _guard_lock:
        if "module" in _guard_state:
            mod = _guard_state["module"]
            if mod is None and required:
                raise RuntimeError(_guard_state.get("error", "LMS guard unavailable"))
            return mod
        mod, err = None, None
        try:
            reason = unsupported_reason()
            if reason:
                raise RuntimeError(reason)
            if not torch.cuda.is_available():
                raise RuntimeError("CUDA is not available")
            mod = build_guard()
        except Exception as e:  # the job goes on without the net; stats show it
            err = f"LMS activation swapping: eviction net not built ({type(e).__name__}: {e})"
            warnings.warn(err + "; a wrong forecast can then end in CUDA out of memory",
                          RuntimeWarning, stacklevel=3)
        _guard_state["module"], _guard_state["error"] = mod, err
        if mod is None and required:
            raise RuntimeError(err)
        return mod


def loaded_guard() -> Any:
    """The eviction net if :func:`load_guard` built it, else None (builds nothing)."""
    return _guard_state.get("module")


def allocator_refusal() -> Optional[str]:
    """Why the net cannot sit under this process's CUDA allocator, or None.  The net
    redirects the native caching allocator's ``allocate`` and feeds on its trace
    trackers: a pluggable allocator (``torch.cuda.memory.change_current_allocator``),
    ``cudaMallocAsync`` or any other backend has neither."""
    try:
        backend = torch.cuda.get_allocator_backend()
    except Exception as e:  # pragma: no cover - no CUDA: the net was not built either
        return f"the CUDA allocator backend is unknown ({type(e).__name__}: {e})"
    if backend != "native":
        return (f"the CUDA allocator is {backend!r}, not PyTorch's native caching allocator "
                f"(a pluggable allocator, or PYTORCH_CUDA_ALLOC_CONF=backend:...)")
    return None


def arm_guard(mod: Any, limit: int, held: int, min_available: int) -> Any:
    """Arms the net ``mod`` with its host budget (``limit`` bytes, ``held`` of them held
    by the pinned pool, ``min_available`` left to the machine) given first: the net never
    copies a byte to the host without a limit, also in a first step that needs it before
    anything was swapped.  Returns ``mod``, or None where the net cannot sit under this
    allocator (it then stays off, with one warning; swapping goes on by its forecast)."""
    with _guard_lock:
        if _guard_state.get("refused"):
            return None
        if mod.armed():
            return mod
        reason = allocator_refusal()
        if reason is None:
            mod.set_host_budget(int(limit), int(held), int(min_available))
            try:
                mod.arm(True)
            except RuntimeError as e:  # the net's own check of the allocator
                reason = str(e).splitlines()[0]
        if reason is not None:
            _guard_state["refused"] = reason
            warnings.warn(f"LMS activation swapping: eviction net off: {reason}; a wrong "
                          f"forecast can then end in CUDA out of memory",
                          RuntimeWarning, stacklevel=3)
            return None
        return mod
