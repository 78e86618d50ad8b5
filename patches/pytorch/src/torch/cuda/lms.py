r"""Large Model Support (LMS) for the CUDA caching allocator.

LMS lets the caching allocator hand out more memory than the GPU has: under pressure, pages of
allocated blocks that were allocated least recently are copied to pinned host memory and remapped
at the same virtual address (kernels keep working on them, reading over PCIe), and come back to the
GPU when room returns. It is implemented inside ``libc10_cuda`` (c10/cuda/CUDALargeModelSupport.*)
and reached from here through its C API with :mod:`ctypes`; nothing in ``torch._C`` changes.

Switch it on without code changes with ``PYTORCH_CUDA_ALLOC_CONF=lms:True`` (more keys:
``lms_limit_mb``, ``lms_size_mb``, ``lms_host_mem_limit_mb``, ``lms_host_reserve_mb``,
``lms_defrag``, ``lms_launch_gate``, ``lms_page_mb``) or from Python::

    torch.cuda.set_enabled_lms(True)
    torch.cuda.set_limit_lms(60 * 2**30)      # start reclaiming at 60 GiB of device memory
    torch.cuda.set_size_lms(1 << 20)          # blocks smaller than 1 MiB are never swapped
    torch.cuda.set_host_mem_limit_lms(200 * 2**30)
    torch.cuda.set_lms_defrag_enabled(True)

The host memory budget (``PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB``, default 80% of the host memory
available when LMS first needs it) is shared by the allocator's host pages and by activation
swapping (:mod:`torch.cuda.lms_swap`, through :func:`_host_reserve` / :func:`_host_release`).
Statistics appear in :func:`torch.cuda.memory_stats` under ``lms.`` keys.
"""
from __future__ import annotations

import ctypes
import os
from typing import Any, Dict, Optional

__all__ = [
    "is_lms_available",
    "set_enabled_lms",
    "get_enabled_lms",
    "set_limit_lms",
    "get_limit_lms",
    "set_size_lms",
    "get_size_lms",
    "set_host_mem_limit_lms",
    "get_host_mem_limit_lms",
    "set_lms_defrag_enabled",
    "get_lms_defrag_enabled",
    "lms_stats",
]

_U64 = ctypes.c_ulonglong
_lib_cache: Optional[ctypes.CDLL] = None
_lib_error: Optional[str] = None


def _library_path() -> str:
    # PYTORCH_LMS_LIBC10_CUDA: tests point this at a libc10_cuda.so built elsewhere
    override = os.environ.get("PYTORCH_LMS_LIBC10_CUDA")
    if override:
        return override
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), "lib", "libc10_cuda.so")


def _lib() -> Optional[ctypes.CDLL]:
    global _lib_cache, _lib_error
    if _lib_cache is not None or _lib_error is not None:
        return _lib_cache
    path = _library_path()
    try:
        lib = ctypes.CDLL(path)
        lib.c10_lms_abi_version
    except (OSError, AttributeError) as e:
        _lib_error = f"{path}: {e}"
        return None
    for name in ("limit", "size", "host_mem_limit"):
        getattr(lib, f"c10_lms_get_{name}").restype = _U64
        getattr(lib, f"c10_lms_set_{name}").argtypes = [_U64]
    lib.c10_lms_host_reserve.argtypes = [_U64]
    lib.c10_lms_host_release.argtypes = [_U64]
    lib.c10_lms_host_used.restype = _U64
    lib.c10_lms_stats.restype = _U64
    lib.c10_lms_stats.argtypes = [ctypes.c_int, ctypes.c_char_p, _U64]
    lib.c10_lms_parse_settings.argtypes = [ctypes.c_char_p, ctypes.c_char_p, _U64]
    lib.c10_lms_reset_peak_stats.argtypes = [ctypes.c_int]
    lib.c10_lms_reset_accumulated_stats.argtypes = [ctypes.c_int]
    if hasattr(lib, "c10_lms_host_budget_rule"):
        lib.c10_lms_host_budget_rule.argtypes = [ctypes.c_char_p, ctypes.c_char_p, _U64,
                                                 ctypes.POINTER(_U64), ctypes.c_char_p, _U64]
    _lib_cache = lib
    return lib


def _need() -> ctypes.CDLL:
    lib = _lib()
    if lib is None:
        raise RuntimeError(
            "Large Model Support is not available: this torch's libc10_cuda.so has no LMS "
            f"entry points ({_lib_error}). Install a PyTorch build with the LMS patch.")
    return lib


def is_lms_available() -> bool:
    r"""True when this PyTorch's CUDA allocator was built with Large Model Support."""
    lib = _lib()
    return lib is not None and bool(lib.c10_lms_supported())


def _device_index(device) -> int:
    if isinstance(device, int):
        return device
    import torch
    if device is None and not torch.cuda.is_initialized():
        return 0
    from ._utils import _get_device_index
    return _get_device_index(device, optional=True)


def _swap_module():
    try:
        from . import lms_swap  # activation swapping; optional
    except ImportError:
        return None
    return lms_swap


def set_enabled_lms(enable: bool) -> None:
    r"""Enable or disable Large Model Support (off by default).

    Enabling makes new allocations use expandable (VMM-mapped) segments, which LMS needs.
    Also switches activation swapping (:mod:`torch.cuda.lms_swap`) on or off where present.
    """
    _need().c10_lms_set_enabled(1 if enable else 0)
    swap = _swap_module()
    if swap is not None:
        if enable and hasattr(swap, "enable"):
            swap.enable()
        elif not enable and hasattr(swap, "disable"):
            swap.disable()


def get_enabled_lms() -> bool:
    r"""Whether Large Model Support is enabled."""
    lib = _lib()
    return bool(lib is not None and lib.c10_lms_get_enabled())


def set_limit_lms(limit: int) -> None:
    r"""Device bytes at which LMS starts reclaiming (swapping out); 0 (default) means the whole GPU."""
    if limit < 0:
        raise ValueError("limit must be >= 0")
    _need().c10_lms_set_limit(int(limit))


def get_limit_lms() -> int:
    return int(_need().c10_lms_get_limit())


def set_size_lms(size: int) -> None:
    r"""Smallest allocated block (bytes) whose pages LMS may swap out (default 1 MiB)."""
    if size < 0:
        raise ValueError("size must be >= 0")
    _need().c10_lms_set_size(int(size))


def get_size_lms() -> int:
    return int(_need().c10_lms_get_size())


def set_host_mem_limit_lms(limit: int) -> None:
    r"""Host memory budget (bytes) for swap space; default from ``PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB``
    or 80% of the host memory available when LMS first needs it. Shared with activation swapping."""
    if limit < 0:
        raise ValueError("limit must be >= 0")
    _need().c10_lms_set_host_mem_limit(int(limit))


def get_host_mem_limit_lms() -> int:
    return int(_need().c10_lms_get_host_mem_limit())


def set_lms_defrag_enabled(enable: bool) -> None:
    r"""Let LMS release free pages of partly used segments and remap them where needed before it
    swaps anything (default on). Off: only completely free segments are released."""
    _need().c10_lms_set_defrag(1 if enable else 0)


def get_lms_defrag_enabled() -> bool:
    return bool(_need().c10_lms_get_defrag())


def _host_reserve(nbytes: int) -> bool:
    r"""Charge ``nbytes`` to the LMS host budget; False (nothing charged) when it would pass the limit."""
    lib = _lib()
    if lib is None:
        return True  # no LMS build: no shared budget to respect
    return bool(lib.c10_lms_host_reserve(int(nbytes)))


def _host_release(nbytes: int) -> None:
    r"""Give back ``nbytes`` charged with :func:`_host_reserve`."""
    lib = _lib()
    if lib is not None:
        lib.c10_lms_host_release(int(nbytes))


def _host_used() -> int:
    lib = _lib()
    return int(lib.c10_lms_host_used()) if lib is not None else 0


def _host_budget_rule(limit_mb: Optional[str], local_world_size: Optional[str],
                      host_bytes: int) -> Optional[int]:
    r"""The host budget's default, by the allocator's own rule (``c10_lms_host_budget_rule``), for
    these values of ``PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB`` and ``LOCAL_WORLD_SIZE`` (None: unset) on a
    host of ``host_bytes``: the limit in MiB when it is set, else 80% of ``host_bytes`` divided by
    the local world size. ValueError for a limit that is not a finite number >= 0. None where this
    libc10_cuda has no such rule (lms_swap then applies its own copy)."""
    lib = _lib()
    if lib is None or not hasattr(lib, "c10_lms_host_budget_rule"):
        return None
    out = _U64(0)
    err = ctypes.create_string_buffer(1024)
    enc = lambda v: None if v is None else v.encode("utf-8", "surrogateescape")
    if lib.c10_lms_host_budget_rule(enc(limit_mb), enc(local_world_size), int(host_bytes),
                                    ctypes.byref(out), err, 1024) != 0:
        raise ValueError(err.value.decode(errors="replace"))
    return int(out.value)


def _parse_settings(settings: str) -> None:
    r"""Apply a settings string holding only LMS keys (``lms:True,lms_limit_mb:1024``)."""
    err = ctypes.create_string_buffer(4096)
    if _need().c10_lms_parse_settings(settings.encode(), err, 4096) != 0:
        raise RuntimeError(err.value.decode(errors="replace"))


def _raw_stats(device: int) -> Dict[str, int]:
    lib = _need()
    n = lib.c10_lms_stats(device, None, 0)
    buf = ctypes.create_string_buffer(int(n) + 1)
    lib.c10_lms_stats(device, buf, int(n) + 1)
    out: Dict[str, int] = {}
    for line in buf.value.decode().splitlines():
        k, _, v = line.partition("=")
        out[k] = int(v)
    return out


def lms_stats(device=None) -> Dict[str, int]:
    r"""Flat LMS statistics of ``device`` (keys as in ``memory_stats()`` without the ``lms.`` prefix).

    swap_out_bytes / swap_out_count, swap_in_bytes / swap_in_count: pages moved to host and back;
    host_bytes.current / .peak: this GPU's pages living in host memory; host_budget.*: the shared
    host budget (limit, used incl. pooled handles and activation swapping, peak);
    reclaim_events; alloc_served.{free_list,new_device_memory,defrag,lms_reclaim}: where
    allocations made with LMS on were served from; swap_out_time_ns / swap_in_time_ns;
    limit_spills / limit_spill_bytes: requests that mapped past the LMS limit, and the bytes
    moved out after the fact to get back under it (0 expected: each is a synchronous spill);
    reserve_reclaims: requests that moved pages out so that the device memory kept free for
    allocations outside the allocator (kernels the driver loads, library handles; 1/64 of the
    card, at least 256 MiB) stays free;
    launch_gate.*: active (1: other threads' launches and copies wait while live pages move),
    inactive_reason (1 no CUPTI library, 2 another CUPTI client such as a profiler, 3 CUPTI
    refused, 4 ``lms_launch_gate:False``), closes, close_wait_ns, calls_held.
    """
    return _raw_stats(_device_index(device))


def _nested(flat: Dict[str, int]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in flat.items():
        parts = k.split(".")
        d = out
        for p in parts[:-1]:
            nxt = d.setdefault(p, {})
            if not isinstance(nxt, dict):  # a key that is both a value and a prefix: keep the value
                nxt = d[p] = {"value": nxt}
            d = nxt
        d[parts[-1]] = v
    return out


def _merge_memory_stats(stats: Dict[str, Any], device: int) -> Dict[str, Any]:
    # called by torch.cuda.memory_stats_as_nested_dict
    if _lib() is None or not isinstance(stats, dict):
        return stats
    stats["lms"] = _nested(_raw_stats(device))
    return stats


def _reset_peak_stats(device: int) -> None:
    lib = _lib()
    if lib is not None:
        lib.c10_lms_reset_peak_stats(device)


def _reset_accumulated_stats(device: int) -> None:
    lib = _lib()
    if lib is not None:
        lib.c10_lms_reset_accumulated_stats(device)
