"""The eviction net compiled into the wheel (``_lms_swap_guard.*.so``), the pluggable allocator
compiled beside it where the build could (``_lms_pluggable_allocator.*.so``), and their record
(``_net_build.json``: the torch they were compiled against, and whether the allocator is there).  A wheel built with the net is made
for one torch (its version ``0.1.0+torch2.11.0.cu130``); under any other torch the package
refuses to import, with what to install instead, because a C++ extension is bound to the torch
headers it was compiled with.  ``LMS_SWAP_IGNORE_PREBUILT=1`` imports it anyway, without the
prebuilt modules (which are then compiled at first use, as in a source install).

A pure-Python install (no record) is never refused.  ``lms-swap/setup.py`` loads this file on
its own at build time, so it imports nothing of this package."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Optional

import torch

__all__ = ["absence_reason", "build_record", "check_at_import", "load", "local_version_tag",
           "record", "refusal"]

_HERE = os.path.dirname(os.path.abspath(__file__))
RECORD_FILE = os.path.join(_HERE, "_net_build.json")
MODULE = "_lms_swap_guard"
ENV_IGNORE = "LMS_SWAP_IGNORE_PREBUILT"


def local_version_tag(torch_version: str, torch_cuda: Optional[str]) -> str:
    """The wheel's local version for a torch: ``torch2.11.0.cu130`` (CUDA 13.0), ``torch2.13.0.cpu``."""
    public = torch_version.split("+")[0]
    flavour = "cu" + torch_cuda.replace(".", "") if torch_cuda else "cpu"
    return f"torch{public}.{flavour}"


def build_record(cuda_headers: Optional[str], allocator: Optional[str] = None,
                 allocator_absent: Optional[str] = None) -> Dict[str, Any]:
    """What the wheel records of the build it came from (written by setup.py); ``cuda_headers``:
    the ``major.minor`` of the CUDA runtime headers the net was compiled with; ``allocator``: the
    pluggable allocator's module compiled beside it, or None with why (``allocator_absent``)."""
    rec = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "cuda_headers": cuda_headers, "cxx11_abi": bool(torch.compiled_with_cxx11_abi()),
           "python": "%d.%d" % sys.version_info[:2], "module": MODULE, "allocator": allocator}
    if allocator is None:
        rec["allocator_absent"] = allocator_absent or "not compiled into this wheel"
    return rec


def ignored() -> bool:
    return os.environ.get(ENV_IGNORE, "").strip().lower() in ("1", "yes", "true")


def record() -> Optional[Dict[str, Any]]:
    """The record of the prebuilt net in this install, or None (a pure-Python install)."""
    if not os.path.isfile(RECORD_FILE):
        return None
    with open(RECORD_FILE, encoding="utf-8") as f:
        return json.load(f)


def refusal(rec: Dict[str, Any]) -> Optional[str]:
    """Why the net of record ``rec`` cannot run under this process's torch, or None.  The torch
    release must be the one it was compiled against; under a CUDA torch, the CUDA major of the
    headers it was compiled with must be that torch's (the runtime's ABI holds within a major)."""
    built, running = rec.get("torch", ""), torch.__version__
    if built.split("+")[0] != running.split("+")[0]:
        return f"it was built for torch {built}, and this is torch {running}"
    headers, cuda = rec.get("cuda_headers"), torch.version.cuda
    if cuda and headers and headers.split(".")[0] != cuda.split(".")[0]:
        return (f"its eviction net was compiled with CUDA {headers} headers, and this torch "
                f"({running}) runs CUDA {cuda}")
    return None


def check_at_import() -> None:
    """Refuses (ImportError) an install whose prebuilt net was built for another torch."""
    rec = record()
    if rec is None or ignored():
        return
    why = refusal(rec)
    if why:
        raise ImportError(
            f"lms_swap cannot be used here: {why}.  Install the lms-swap wheel built for this "
            f"torch (`python -m build_tools lms-swap` or `make lms-swap` with it), or the source "
            f"package (`pip install ./lms-swap`: the eviction net is then compiled at first use); "
            f"{ENV_IGNORE}=1 imports this one without its prebuilt net")


def _module_name(what: str, rec: Dict[str, Any]) -> Optional[str]:
    if what == "net":
        return MODULE
    if what == "allocator":
        return rec.get("allocator")
    raise ValueError(f"no prebuilt {what!r}: the net or the allocator")


def load(what: str = "net") -> Any:
    """The prebuilt module of ``what`` (the eviction net, or the pluggable ``allocator``), or
    None where this install has none (or it is ignored).  Raises where it is present but does
    not load."""
    rec = record()
    name = _module_name(what, rec) if rec is not None and not ignored() else None
    if name is None:
        return None
    import importlib
    return importlib.import_module(f"{__package__}.{name}")


def absence_reason(what: str = "net") -> str:
    """Why ``what`` must be compiled at first use here (for the message that says so)."""
    rec = record()
    if ignored() and rec is not None:
        return f"{ENV_IGNORE} is set"
    if rec is not None and _module_name(what, rec) is None:
        return (f"this lms_swap wheel was built without a prebuilt {what} "
                f"({rec.get('allocator_absent', 'its build predates it')})")
    return (f"this lms_swap install carries no prebuilt {what} "
            f"(a source or pure-Python install)")
