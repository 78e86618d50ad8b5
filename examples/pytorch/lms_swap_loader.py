"""Load LMS activation swapping on a patched or a stock PyTorch.

On a PyTorch built with the LMS patch the module ships as ``torch.cuda.lms_swap``.
On a stock PyTorch (>= 2.4) the same package installs on its own: ``pip install ./lms-swap``
(from this repository's root), then ``import lms_swap``.  This loader takes, in order:
``torch.cuda.lms_swap`` (when ``prefer_patched``), the installed ``lms_swap``, and else the
package's folder in this checkout (``lms-swap/src/lms_swap/``) imported as ``lms_swap``; it
uses public torch APIs only, so nothing else is needed::

    import sys; sys.path.insert(0, "examples/pytorch")     # or copy this file
    from lms_swap_loader import load_lms_swap
    lms_swap = load_lms_swap()
    lms_swap.enable()                 # or: with lms_swap.swapping(): ...

``LMS_SWAP_PATH=/path/to/lms_swap`` (the package's folder) points the loader at another
copy, before any installed one.  ``load_lms_swap(prefer_patched=False)`` skips
``torch.cuda.lms_swap`` even on a patched build (to test the code being edited).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import sys
from types import ModuleType
from typing import Optional

REPO_PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "lms-swap" / "src" / "lms_swap"
MODULE_NAME = "lms_swap"


def load_lms_swap(prefer_patched: bool = True) -> ModuleType:
    """The activation-swapping module: ``torch.cuda.lms_swap`` when the running
    PyTorch has it (and ``prefer_patched``), else the package at ``$LMS_SWAP_PATH``, the
    installed ``lms_swap`` (the lms-swap distribution), or this checkout's folder."""
    if prefer_patched:
        try:
            return importlib.import_module("torch.cuda.lms_swap")
        except ImportError:
            pass
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    if not os.environ.get("LMS_SWAP_PATH"):
        try:
            return importlib.import_module(MODULE_NAME)
        except ModuleNotFoundError as e:
            if e.name != MODULE_NAME:  # installed, but something it imports is missing
                raise
    path = pathlib.Path(os.environ.get("LMS_SWAP_PATH") or REPO_PACKAGE)
    init = path / "__init__.py"
    if not init.is_file():
        raise ImportError(f"the lms_swap package (its __init__.py) is not at {path} "
                          f"(set LMS_SWAP_PATH to its folder)")
    spec = importlib.util.spec_from_file_location(
        MODULE_NAME, init, submodule_search_locations=[str(path)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = mod  # before exec: its submodules import through it
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        for name in [n for n in sys.modules if n == MODULE_NAME or n.startswith(MODULE_NAME + ".")]:
            del sys.modules[name]
        raise
    return mod


def load_lms_allocator(settings: Optional[str] = None) -> ModuleType:
    """``lms_swap.allocator`` of the package :func:`load_lms_swap` finds (never of
    ``torch.cuda.lms_swap``: a patched build has allocator LMS in its own allocator), installed
    as PyTorch's CUDA allocator with LMS on (``settings`` as ``lms_swap.allocator.enable``
    takes them).  Call it before anything is allocated on the GPU."""
    load_lms_swap(prefer_patched=False)
    alloc = importlib.import_module(MODULE_NAME + ".allocator")
    alloc.enable(settings)
    return alloc


def _compiled(what: str, load) -> dict:
    """``{what: "ready", "s": seconds}`` after ``load()`` compiled or found compiled ``what``,
    else ``{what: "unavailable", "reason": ...}`` with the error it raised."""
    import time
    t0 = time.perf_counter()
    try:
        load()
    except Exception as e:  # noqa: BLE001  (the reason is the answer)
        return {what: "unavailable", "reason": f"{type(e).__name__}: {e}"[:500]}
    return {what: "ready", "s": round(time.perf_counter() - t0, 1)}


def compile_net() -> dict:
    """Loads the eviction net of the package :func:`load_lms_swap` finds as its first use
    does (the install's prebuilt net, else compiled here or found compiled in
    ``TORCH_EXTENSIONS_DIR``): ``{"net": "ready", "s": seconds}``, or ``{"net":
    "unavailable", "reason": ...}`` where it cannot be had (swapping then runs without it).
    A benchmark runs this once, in a process of its own, before its configurations, so
    that no configuration's time limit or first step holds the compile (45-70 s on the
    GPU machine's first use)."""
    load_lms_swap(prefer_patched=False)
    guard = importlib.import_module(MODULE_NAME + ".guard")
    return _compiled("net", lambda: guard.load_guard(required=True))


def compile_allocator() -> dict:
    """Compiles the pluggable LMS allocator of the package :func:`load_lms_swap` finds, or
    finds it compiled in ``TORCH_EXTENSIONS_DIR``, without installing it:
    ``{"allocator": "ready", "s": seconds}``, or ``{"allocator": "unavailable", "reason":
    ...}`` (its ``build`` names why it cannot be built here).  As :func:`compile_net`, for a
    benchmark to run once before its configurations (the compile took 27 s of a
    configuration's 70 s limit on a fresh GPU machine)."""
    load_lms_swap(prefer_patched=False)
    return _compiled("allocator",
                     lambda: importlib.import_module(MODULE_NAME + ".allocator").build())


if __name__ == "__main__":
    m = load_lms_swap()
    print(f"{m.__name__} from {m.__file__}")
