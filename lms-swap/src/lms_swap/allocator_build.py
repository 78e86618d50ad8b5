"""How the pluggable LMS allocator's library is made: what making and using it needs, its
translation units and flags, and the two ways to have it: compiled into a wheel
(``_lms_pluggable_allocator``, made by ``lms-swap/setup.py`` beside the eviction net) or compiled
at first use with ``torch.utils.cpp_extension`` (cached in ``TORCH_EXTENSIONS_DIR``).

Imports torch and the package's build modules only, which import nothing else of it:
``setup.py`` loads this file at build time without importing the package.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple

import torch

from . import allocator_sources
from .net_toolchain import (cached_build, cpu_only_reason, cuda_include_dirs,
                            libstdcxx_link_flags, missing_cuda_headers, nvml_include_dirs)

__all__ = ["PREBUILT_MODULE", "build", "cached", "compile_flags", "sources", "toolchain_refusal",
           "torch_refusal"]

_HERE = os.path.dirname(os.path.abspath(__file__))

# the allocator's module inside a wheel that carries it compiled (lms_swap/<this>.*.so)
PREBUILT_MODULE = "_lms_pluggable_allocator"


def _extension_name() -> str:
    return "lms_pluggable_allocator_" + torch.__version__.replace(".", "_").replace("+", "_")


def torch_refusal() -> Optional[str]:
    """Why this torch cannot run the pluggable allocator at all, or None."""
    if hasattr(torch.cuda, "set_enabled_lms"):
        return ("this PyTorch has LMS in its own caching allocator (the patched build): use "
                "torch.cuda.set_enabled_lms(True) instead")
    if not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        return f"torch {torch.__version__} has no pluggable CUDA allocators (PyTorch >= 2.0)"
    if cpu_only_reason():
        return (f"torch {torch.__version__} is a CPU-only build: the pluggable allocator is "
                f"compiled against a CUDA build of torch")
    return None


def toolchain_refusal() -> Optional[str]:
    """Why the allocator cannot be compiled here (headers it includes that are missing), or
    None.  Besides these it needs a C++ compiler and ninja, which the compile itself asks for."""
    return missing_cuda_headers(cuda_include_dirs()) or (
        None if nvml_include_dirs() else
        "nvml.h is missing (PyTorch's c10/cuda/driver_api.h includes it): install a CUDA toolkit "
        "and set CUDA_HOME, or `pip install nvidia-nvml-dev-cu12`")


def sources(tree: str, package_dir: str = _HERE) -> List[str]:
    """The translation units of the library: the allocator's own in ``package_dir``, then the
    core's in ``tree`` (:func:`allocator_sources.core_tree`)."""
    own = sorted(f for f in os.listdir(package_dir)
                 if f.startswith("lms_pluggable_") and f.endswith(".cpp"))
    return [os.path.join(package_dir, f) for f in own] + allocator_sources.core_sources(tree)


def compile_flags(tree: str) -> Tuple[List[str], List[str], List[str]]:
    """Include paths, compile and link flags of the library (compiled at first use, compiled
    into a wheel, and the tests' compile check)."""
    includes = [tree] + cuda_include_dirs() + nvml_include_dirs()
    # the core's driver code is compiled only where upstream's build defines this
    cflags = ["-O2", "-DPYTORCH_C10_DRIVER_API_SUPPORTED=1"]
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    ldflags = [f"-l{n}" for n in ("c10_cuda", "torch_cuda")
               if os.path.isfile(os.path.join(lib, f"lib{n}.so"))] + libstdcxx_link_flags()
    return includes, cflags, ldflags


def cached() -> Tuple[str, bool]:
    """``(folder, cached)``: where :func:`build` compiles and whether it is compiled there."""
    return cached_build(_extension_name())


def build(verbose: bool = False) -> Any:
    """Compiles (once per PyTorch version, cached in ``TORCH_EXTENSIONS_DIR``) and imports
    the allocator.  Needs a C++ compiler, ninja and the CUDA runtime headers, not a GPU."""
    from torch.utils import cpp_extension
    reason = torch_refusal() or toolchain_refusal()
    if reason:
        raise RuntimeError(f"the LMS pluggable allocator cannot be built: {reason}")
    folder, _ = cached()
    tree = allocator_sources.core_tree(_HERE, os.path.join(folder, "core"))
    includes, cflags, ldflags = compile_flags(tree)
    return cpp_extension.load(name=_extension_name(), sources=sources(tree),
                              extra_include_paths=includes, extra_cflags=cflags,
                              extra_ldflags=ldflags, verbose=verbose)
