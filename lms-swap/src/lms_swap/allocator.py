"""Allocator-level LMS on stock PyTorch: the patched build's LMS core as a pluggable CUDA
allocator (``torch.cuda.memory.CUDAPluggableAllocator``): the wheel's compiled library where it
carries one (``make lms-swap``), else compiled at first use.

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

import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, Dict, Optional, Tuple

import torch

from . import allocator_build, device_memory, prebuilt
from .allocator_build import build
from .environment import use_allocator_lms

__all__ = ["enable", "enabled", "memory_stats", "lms_stats", "build", "refusal"]

_state: Dict[str, Any] = {}
_lock = threading.Lock()


def _prebuilt() -> Tuple[Any, str]:
    """The wheel's compiled allocator where this install has one that loads, else None and why
    it is compiled here instead."""
    why = prebuilt.absence_reason("allocator")
    try:
        mod = prebuilt.load("allocator")
    except Exception as e:  # present but unloadable: compile instead, and say why
        mod, why = None, f"the prebuilt allocator does not load ({type(e).__name__}: {e})"
    return mod, why


def refusal() -> Optional[str]:
    """Why the pluggable allocator cannot be built or used with this torch, or None.  With the
    wheel's compiled allocator nothing needs compiling, so no header is asked for."""
    return allocator_build.torch_refusal() or (
        None if _prebuilt()[0] is not None else allocator_build.toolchain_refusal())


def _module() -> Any:
    """The wheel's compiled allocator, else :func:`build` once per process, saying before a
    compile why it compiles and that it takes a while, and after it how long it took (nothing
    is said where the compiled library is reused)."""
    with _lock:
        if "module" not in _state:
            reason = allocator_build.torch_refusal()
            if reason:
                raise RuntimeError(f"the LMS pluggable allocator cannot be used: {reason}")
            mod, why = _prebuilt()
            if mod is None:
                folder, cached = allocator_build.cached()
                t0 = time.monotonic()
                if not cached:
                    print(f"LMS pluggable allocator: compiling it for torch {torch.__version__} "
                          f"because {why}; this takes one to three minutes, once: later runs "
                          f"reuse {folder}", file=sys.stderr, flush=True)
                mod = build()
                if not cached:
                    print(f"LMS pluggable allocator: compiled in {time.monotonic() - t0:.0f} s",
                          file=sys.stderr, flush=True)
            _state["module"] = mod
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
    allocations; and what its own mapping cost since the process began: device bytes mapped
    and unmapped (``map_bytes``, ``unmap_bytes``, page moves not among them), the driver
    calls' time (``map_ns``, ``unmap_ns``) and the device synchronizations its releases of
    free memory waited on (``release_syncs``, ``release_sync_ns``)."""
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
