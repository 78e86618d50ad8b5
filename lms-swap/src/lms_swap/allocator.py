"""Allocator-level LMS on stock PyTorch: the patched build's LMS core as a pluggable CUDA
allocator (``torch.cuda.memory.CUDAPluggableAllocator``), compiled at first use.

Where activation swapping moves what autograd saves, this moves any block: when the GPU is
full, pages of the least recently allocated blocks go to pinned host memory at the same
address (kernels then reach them over PCIe) and come back when memory is freed.  Use::

    import lms_swap.allocator
    lms_swap.allocator.enable()        # before the first CUDA allocation of the process
    ...                                # train as usual
    lms_swap.allocator.lms_stats()     # what moved

It follows PyTorch's ``expandable_segments`` setting (``PYTORCH_CUDA_ALLOC_CONF`` or
``PYTORCH_ALLOC_CONF``): on, large requests grow one address range per stream, mapped in
PyTorch's own 20 MiB pages, and free pages are unmapped on release, as the native allocator
does with that setting; off, each large request gets a segment of its own (of 64 MiB pages
on a card of 16 GiB or more, cut to the request), as the native allocator's default does.
``lms_page_mb`` sets the page for both.

Limits of the pluggable interface, against the patched build: ``torch.cuda.memory_allocated``
and the other caching-allocator statistics raise (PyTorch asks them of its native allocator
only; :func:`memory_stats` gives this allocator's); it must be installed before anything is
allocated on a GPU; CUDA graphs' private pools and IPC sharing are not served; the eviction
net of activation swapping stays off under it (it attaches to the native allocator).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import allocator_sources, device_memory
from .environment import use_allocator_lms
from .net_toolchain import (cached_build, cpu_only_reason, cuda_include_dirs,
                            libstdcxx_link_flags, missing_cuda_headers, nvml_include_dirs)

__all__ = ["enable", "enabled", "memory_stats", "lms_stats", "build", "refusal"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_state: Dict[str, Any] = {}
_lock = threading.Lock()


def _extension_name() -> str:
    return "lms_pluggable_allocator_" + torch.__version__.replace(".", "_").replace("+", "_")


def refusal() -> Optional[str]:
    """Why the pluggable allocator cannot be built or used with this torch, or None."""
    if hasattr(torch.cuda, "set_enabled_lms"):
        return ("this PyTorch has LMS in its own caching allocator (the patched build): use "
                "torch.cuda.set_enabled_lms(True) instead")
    if not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        return f"torch {torch.__version__} has no pluggable CUDA allocators (PyTorch >= 2.0)"
    if cpu_only_reason():
        return (f"torch {torch.__version__} is a CPU-only build: the pluggable allocator is "
                f"compiled against a CUDA build of torch")
    return missing_cuda_headers(cuda_include_dirs()) or (
        None if nvml_include_dirs() else
        "nvml.h is missing (PyTorch's c10/cuda/driver_api.h includes it): install a CUDA toolkit "
        "and set CUDA_HOME, or `pip install nvidia-nvml-dev-cu12`")


def sources(tree: str) -> List[str]:
    """The translation units of the library: the allocator's own, then the core's in ``tree``."""
    own = sorted(f for f in os.listdir(_HERE)
                 if f.startswith("lms_pluggable_") and f.endswith(".cpp"))
    return [os.path.join(_HERE, f) for f in own] + allocator_sources.core_sources(tree)


def compile_flags(tree: str) -> Tuple[List[str], List[str], List[str]]:
    """Include paths, compile and link flags of the library (:func:`build` and the compile
    check of the tests)."""
    includes = [tree] + cuda_include_dirs() + nvml_include_dirs()
    # the core's driver code is compiled only where upstream's build defines this
    cflags = ["-O2", "-DPYTORCH_C10_DRIVER_API_SUPPORTED=1"]
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    ldflags = [f"-l{n}" for n in ("c10_cuda", "torch_cuda")
               if os.path.isfile(os.path.join(lib, f"lib{n}.so"))] + libstdcxx_link_flags()
    return includes, cflags, ldflags


def build(verbose: bool = False) -> Any:
    """Compiles (once per PyTorch version, cached in ``TORCH_EXTENSIONS_DIR``) and imports
    the allocator.  Needs a C++ compiler, ninja and the CUDA runtime headers, not a GPU."""
    from torch.utils import cpp_extension
    reason = refusal()
    if reason:
        raise RuntimeError(f"the LMS pluggable allocator cannot be built: {reason}")
    folder, _ = cached_build(_extension_name())
    tree = allocator_sources.core_tree(_HERE, os.path.join(folder, "core"))
    includes, cflags, ldflags = compile_flags(tree)
    return cpp_extension.load(name=_extension_name(), sources=sources(tree),
                              extra_include_paths=includes, extra_cflags=cflags,
                              extra_ldflags=ldflags, verbose=verbose)


def _module() -> Any:
    """:func:`build` once per process, saying before a compile that it takes a while and after
    it how long it took (nothing is said where the compiled library is reused)."""
    with _lock:
        if "module" not in _state:
            folder, cached = cached_build(_extension_name())
            t0 = time.monotonic()
            if not cached:
                print(f"LMS pluggable allocator: compiling it for torch {torch.__version__}; "
                      f"this takes one to three minutes, once: later runs reuse {folder}",
                      file=sys.stderr, flush=True)
            _state["module"] = build()
            if not cached:
                print(f"LMS pluggable allocator: compiled in {time.monotonic() - t0:.0f} s",
                      file=sys.stderr, flush=True)
        return _state["module"]


def enable(settings: Optional[str] = None) -> None:
    """Makes the LMS allocator PyTorch's CUDA allocator, with LMS on.  Call it before the
    process allocates anything on a GPU (PyTorch refuses to change allocators after that).

    ``settings``: the allocator LMS settings of the patched build, comma-separated
    (``"lms_limit_mb:40960,lms_defrag:True"``; the host budget follows
    ``PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB`` as there).  A bad setting raises ValueError
    naming it."""
    with _lock:
        if _state.get("installed"):
            if settings:
                _configure(_state["module"], settings)
            return
    mod = _module()
    if settings:
        _configure(mod, settings)
    mod.set_enabled(True)
    try:
        mod.install()
    except RuntimeError as e:
        raise RuntimeError(
            f"the LMS pluggable allocator could not be installed: {e}. Call "
            "lms_swap.allocator.enable() before anything is allocated on a GPU") from e
    # activation swapping reads this allocator's own counts, not the driver's (which
    # count its cache as in use, so the swapper would see a full device at every step);
    # its allocated bytes include pages LMS moved to host, so the swapper keeps the whole
    # allocation within the card and the page moves stay a net
    device_memory.use_counters(mod.device_counts)
    # and its running peak, which the eviction net keeps under the native allocator: with
    # it, activation swapping measures each backward's own peak.  Bounded by the program's
    # peak instead, a checkpointed Llama at 1.5x kept a margin its first steps set: it
    # swapped every saved tensor, 55 GB each way a step against 18 without this allocator,
    # and prefetched none of them back
    device_memory.use_peak_meter(SimpleNamespace(mark_peak=mod.mark_peak,
                                                 peak_growth=mod.peak_growth,
                                                 released=mod.released))
    # one host budget for both layers, as on the patched build (two, each of 80% of the
    # host, could together take more than the machine has); and its LMS limit
    use_allocator_lms(SimpleNamespace(_host_reserve=mod.host_reserve,
                                      _host_release=mod.host_release,
                                      get_limit_lms=mod.limit))
    _state["installed"] = True


def _configure(mod: Any, settings: str) -> None:
    try:
        mod.configure(settings)
    except RuntimeError as e:
        raise ValueError(f"lms_swap.allocator settings {settings!r}: {e}") from None


def enabled() -> bool:
    """Whether this process's CUDA allocator is the LMS allocator."""
    return bool(_state.get("installed"))


def memory_stats(device: Optional[int] = None) -> Dict[str, int]:
    """This allocator's bytes (``torch.cuda.memory_allocated`` does not reach a pluggable
    allocator): allocated and its peak (blocks whose pages LMS moved to host memory
    included), reserved (segments, on the device or moved to host), device reserved (their
    pages on the device) and its peak since the last reset, cached free, segments and live
    allocations."""
    s = _stats(device)
    s.pop("lms")
    return s


def lms_stats(device: Optional[int] = None) -> Dict[str, Any]:
    """The LMS counters of the core, as the patched build's ``torch.cuda.lms_stats`` names
    them (``swap_out_bytes``, ``host_bytes``, ...)."""
    out: Dict[str, Any] = {}
    for line in _stats(device)["lms"].splitlines():
        key, sep, value = line.partition("=")
        if sep:
            try:
                out[key.strip()] = int(value)
            except ValueError:
                out[key.strip()] = value.strip()
    return out


def _stats(device: Optional[int]) -> Dict[str, Any]:
    """The library's statistics of ``device`` (the current one by default): its counters and,
    under ``lms``, the core's text."""
    if not enabled():
        raise RuntimeError("the LMS pluggable allocator is not installed")
    d = torch.cuda.current_device() if device is None else int(device)
    return dict(_state["module"].memory_stats(d))
