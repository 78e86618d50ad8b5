"""The eviction net (``lms_swap_guard.cpp`` and the headers of its parts, shipped with this
package): the kept tensors' way out when the forecast fails.  A wheel built with the net
carries it compiled for its torch (``prebuilt``); otherwise it is compiled at first use, once
per PyTorch version, with ``torch.utils.cpp_extension``."""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from typing import Any, Dict, Optional

import torch

from . import prebuilt
from .net_toolchain import (NET_HEADERS, cached_build, cuda_include_dirs,  # noqa: F401
                            cpu_only_reason, libstdcxx_link_flags, missing_cuda_headers,
                            unsupported_reason)

__all__ = ["GUARD_HEADERS", "GUARD_SOURCE", "HOST_FULL_WORDS", "allocator_refusal", "arm_guard",
           "build_guard", "cuda_include_dirs", "load_guard", "loaded_guard", "unsupported_reason"]

# refused here, before anything else of the package runs: a prebuilt net of another torch
prebuilt.check_at_import()

# the source ships inside this package when it is installed on its own (package data of the
# lms-swap distribution), next to it in a PyTorch tree (torch/cuda/lms_swap_guard.cpp)
_HERE = os.path.dirname(os.path.abspath(__file__))
GUARD_SOURCE = next((p for p in (os.path.join(_HERE, "lms_swap_guard.cpp"),
                                 os.path.join(os.path.dirname(_HERE), "lms_swap_guard.cpp"))
                     if os.path.isfile(p)), os.path.join(_HERE, "lms_swap_guard.cpp"))
# the headers of the net's parts, which the source includes from its own folder
GUARD_HEADERS = tuple(os.path.join(os.path.dirname(GUARD_SOURCE), h) for h in NET_HEADERS)
# The words of the net's out-of-memory message (``Guard::explain`` in lms_swap_guard_eviction.h)
# where it could move no more because its host swap space was full: the swapper raises
# that error again as LMSHostMemoryError, the error of a host limit reached.
HOST_FULL_WORDS = "its host swap space was full"
_guard_state: Dict[str, Any] = {}
_guard_lock = threading.Lock()


def _extension_name() -> str:
    return "lms_swap_guard_" + torch.__version__.replace(".", "_").replace("+", "_")


def build_guard(verbose: bool = False) -> Any:
    """Compiles (once per PyTorch version; cached in ``TORCH_EXTENSIONS_DIR``) and imports
    the eviction net.  Needs a C++ compiler, ninja, the CUDA runtime headers and a
    PyTorch with allocator trace trackers (:func:`unsupported_reason`), not a GPU; raises
    where it cannot be built.  :func:`load_guard` is what the swapper uses."""
    from torch.utils import cpp_extension
    reason = unsupported_reason()
    if reason:
        raise RuntimeError(reason)
    inc = cuda_include_dirs()
    reason = missing_cuda_headers(inc) or cpu_only_reason()
    if reason:
        raise RuntimeError(reason)
    missing = [os.path.basename(h) for h in GUARD_HEADERS if not os.path.isfile(h)]
    if missing:
        raise RuntimeError(f"the eviction net's source is incomplete: {', '.join(missing)} not "
                           f"beside {GUARD_SOURCE}")
    return cpp_extension.load(name=_extension_name(), sources=[GUARD_SOURCE],
                              extra_include_paths=inc, extra_cflags=["-O2"],
                              extra_ldflags=libstdcxx_link_flags(), verbose=verbose)


def _say(text: str) -> None:
    # stderr, not a warning: it tells of a wait, and must not count among the net's warnings
    print(f"LMS activation swapping: {text}", file=sys.stderr, flush=True)


def _compile_at_first_use(why: str) -> Any:
    """:func:`build_guard`, saying beforehand why it compiles and how long that takes, and
    afterwards how long it took (nothing is said where the compiled net is reused)."""
    folder, cached = cached_build(_extension_name())
    if not cached:
        _say(f"compiling the eviction net ({os.path.basename(GUARD_SOURCE)}) for torch "
             f"{torch.__version__} because {why}; this takes one to three minutes (one C++ "
             f"translation unit against torch's headers), once: later runs reuse {folder}")
    t0 = time.monotonic()
    mod = build_guard()
    if not cached:
        _say(f"eviction net compiled in {time.monotonic() - t0:.0f} s")
    return mod


def _load_net() -> Any:
    """The prebuilt net where this install has one that loads, else the net compiled here."""
    why = prebuilt.absence_reason()
    try:
        mod = prebuilt.load()
    except Exception as e:  # present but unloadable: compile instead, and say why
        mod, why = None, f"the prebuilt net does not load ({type(e).__name__}: {e})"
    return mod if mod is not None else _compile_at_first_use(why)


def load_guard(required: bool = False) -> Any:
    """The eviction net: the wheel's prebuilt one, else compiled here (once per PyTorch
    version with ``torch.utils.cpp_extension``; cached in ``TORCH_EXTENSIONS_DIR``), or None
    where it cannot be had (no C++ compiler, no CUDA headers, no CUDA, a CUDA allocator it
    could not be armed under): swapping then runs on
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
            # nothing compiled for an allocator the net could not be armed under
            reason = allocator_refusal()
            if reason:
                raise RuntimeError(reason)
            mod = _load_net()
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
