"""What the process and the machine provide: units, the environment's settings, host
memory facts, the allocator's LMS of a patched build, and the host-memory error."""

from __future__ import annotations

import importlib
import math
import os
from typing import Any, Dict, Optional

import torch

__all__ = ["ENV_HOST_LIMIT", "ENV_THRESHOLD", "GiB", "HOST_BUDGET_ALLOCATOR", "HOST_BUDGET_LMS_SWAP",
           "KiB", "LMSHostMemoryError", "MiB", "OutOfMemoryError", "allocator_lms", "check_environment",
           "fmt", "host_available", "host_budget_default", "host_budget_rule", "host_budget_source",
           "host_mem_limit_from_env", "host_total", "local_world_size", "threshold_from_env",
           "use_allocator_lms"]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

ENV_HOST_LIMIT = "PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB"
ENV_THRESHOLD = "PYTORCH_LMS_SWAP_THRESHOLD_IN_KB"


OutOfMemoryError = (getattr(torch, "OutOfMemoryError", None)         # torch >= 2.5
                    or getattr(torch.cuda, "OutOfMemoryError", None)     # older
                    or RuntimeError)


class LMSHostMemoryError(OutOfMemoryError):
    """Raised when swap space in pinned host memory would exceed its limit (a
    ``torch.OutOfMemoryError``, so code that handles out-of-memory handles it too).
    Under ``torchrun`` the message names the rank and how many processes share the
    node's host memory."""

    def __init__(self, message: str) -> None:
        super().__init__(message + _rank_note())


def local_world_size() -> int:
    """Processes that share this node's host memory: torchrun's ``LOCAL_WORLD_SIZE``
    (1 when it is unset or not a positive integer)."""
    return _local_world_size_of(os.environ.get("LOCAL_WORLD_SIZE"))


def _rank_note() -> str:
    rank = os.environ.get("RANK")
    if rank is None:
        return ""
    return (f" (rank {rank}, local rank {os.environ.get('LOCAL_RANK', '?')} of "
            f"{local_world_size()} processes sharing this node's host memory; the limit "
            f"is per process)")


# --------------------------------------------------------------------------------------
# host memory facts
# --------------------------------------------------------------------------------------
def _meminfo() -> Dict[str, int]:
    """/proc/meminfo in bytes ({} where unavailable)."""
    out: Dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    mult = 1024 if len(parts) > 2 and parts[2] == "kB" else 1
                    out[parts[0].rstrip(":")] = int(parts[1]) * mult
    except OSError:
        pass
    return out


def host_total() -> int:
    return _meminfo().get("MemTotal", 0)


def host_available() -> Optional[int]:
    return _meminfo().get("MemAvailable")


def _env_number(name: str, unit: str, example: str) -> Optional[float]:
    """The number in environment variable ``name`` (a count of ``unit``), None when unset
    or blank; ValueError naming the variable, its value and what is accepted for anything
    else (not a number, NaN, infinite, negative)."""
    return _number(name, os.environ.get(name), unit, example)


def _number(name: str, raw: Optional[str], unit: str, example: str) -> Optional[float]:
    """``raw`` as the value of setting ``name``: None when unset or blank, else a finite
    number >= 0, or ValueError naming the setting, the value and what is accepted."""
    if raw is None or raw.strip() == "":
        return None
    accepted = f"expected a number of {unit}, finite and >= 0 (e.g. {example})"
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: {accepted}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name}={raw!r}: {accepted}; it is not finite")
    if value < 0:
        raise ValueError(f"{name}={raw!r}: {accepted}; must not be negative")
    return value


def host_mem_limit_from_env() -> Optional[int]:
    """Bytes given by ``PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB``, None when unset (0: no swap
    space at all).

    Raises ValueError, naming the variable, for a value that is not a finite,
    non-negative number.
    """
    mb = _env_number(ENV_HOST_LIMIT, "MiB", "65536")
    return None if mb is None else int(mb * MiB)


# --------------------------------------------------------------------------------------
# the host budget's default
# --------------------------------------------------------------------------------------
# The rule is the patched allocator's (c10/cuda/impl/LMSHostBudget.h, reached through
# torch.cuda.lms._host_budget_rule): on a patched build lms_swap asks it. Stock torch has no
# such rule, so lms_swap keeps the copy below; tests/test_lms_swap_host_budget.py checks that
# both give the same answer for the same inputs.
HOST_BUDGET_ALLOCATOR = "allocator"   # the patched build's C++ rule is in force
HOST_BUDGET_LMS_SWAP = "lms_swap"     # stock torch: lms_swap's own copy is in force


def _local_world_size_of(raw: Optional[str]) -> int:
    return int(raw) if raw is not None and raw.isdigit() and int(raw) > 0 else 1


def host_budget_rule(limit_mb: Optional[str], local_world_size: Optional[str],
                     host_bytes: int) -> int:
    """lms_swap's copy of the host budget's default, for these values of
    ``PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB`` and ``LOCAL_WORLD_SIZE`` (None: unset) on a host
    of ``host_bytes``: the limit in MiB when it is set (not blank), else 80% of
    ``host_bytes`` divided by the local world size.  ValueError, naming the variable,
    for a limit that is not a finite number >= 0.  Used on stock torch only; a patched
    build's allocator answers instead (:func:`host_budget_default`)."""
    mb = _number(ENV_HOST_LIMIT, limit_mb, "MiB", "65536")
    if mb is not None:
        return int(mb * MiB)
    return int(host_bytes * 0.80) // _local_world_size_of(local_world_size)


def _allocator_budget_rule() -> Any:
    """The patched allocator's rule (``torch.cuda.lms._host_budget_rule``) when this torch
    has one that its libc10_cuda answers, else None."""
    lms = allocator_lms()
    rule = getattr(lms, "_host_budget_rule", None) if lms is not None else None
    if rule is None:
        return None
    try:
        return rule if rule(None, None, 0) is not None else None
    except Exception:
        return None


def host_budget_source() -> str:
    """Which copy of the host budget's rule is in force: :data:`HOST_BUDGET_ALLOCATOR`
    (a patched build: the allocator's C++ rule) or :data:`HOST_BUDGET_LMS_SWAP` (stock
    torch: :func:`host_budget_rule`)."""
    return HOST_BUDGET_ALLOCATOR if _allocator_budget_rule() is not None else HOST_BUDGET_LMS_SWAP


def host_budget_default(host_bytes: int) -> int:
    """The host budget's default under this process's environment on a host of
    ``host_bytes``, by the rule in force (:func:`host_budget_source`)."""
    args = (os.environ.get(ENV_HOST_LIMIT), os.environ.get("LOCAL_WORLD_SIZE"), int(host_bytes))
    rule = _allocator_budget_rule()
    if rule is not None:
        return int(rule(*args))
    return host_budget_rule(*args)


def threshold_from_env() -> Optional[int]:
    kb = _env_number(ENV_THRESHOLD, "KiB", "1024")
    return None if kb is None else int(kb * KiB)


def check_environment() -> None:
    """Reads every environment setting of activation swapping now, so that a bad value
    fails where swapping is set up (enable, configure, swapping) rather than at the first
    swap, many steps in.  ValueError names the variable, its value and what is accepted."""
    host_mem_limit_from_env()
    threshold_from_env()


def fmt(n: Optional[float]) -> str:
    if n is None:
        return "?"
    n = float(n)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


_pluggable_lms: Any = None  # the pluggable allocator's LMS, once it is installed


def use_allocator_lms(lms: Any) -> None:
    """Makes ``lms`` (``_host_reserve(n) -> bool``, ``_host_release(n)``, ``get_limit_lms()``)
    the allocator LMS activation swapping shares its host budget and device limit with
    where this torch has none of its own: the pluggable allocator (``lms_swap.allocator``)
    installs its own.  None takes it away."""
    global _pluggable_lms
    _pluggable_lms = lms


def allocator_lms() -> Any:
    """``torch.cuda.lms`` on a patched build, else the installed pluggable allocator's LMS
    (:func:`use_allocator_lms`), else None (never raises)."""
    mod = getattr(torch.cuda, "lms", None)
    if mod is not None and not callable(mod):
        return mod
    try:
        return importlib.import_module("torch.cuda.lms")
    except Exception:
        return _pluggable_lms
