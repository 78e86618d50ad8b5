"""Which lms_swap the GPU tests (and the worker scripts they start) import: this checkout's
lms-swap/src by default, installed or not; with LMS_SWAP_TEST_INSTALLED=1 the package installed
in the environment (a built wheel's, in site-packages or on PYTHONPATH), the checkout's folder then
kept off sys.path so that the suite proves the installed package."""
from __future__ import annotations

import os
import pathlib
import sys

SRC = str(pathlib.Path(__file__).resolve().parents[3] / "lms-swap" / "src")
ENV = "LMS_SWAP_TEST_INSTALLED"


def installed_only() -> bool:
    return os.environ.get(ENV, "") == "1"


def put_on_path() -> None:
    """sys.path as the run asks: the checkout's package first, or never."""
    if installed_only():
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != SRC]
    elif SRC not in sys.path[:1]:
        sys.path.insert(0, SRC)


def import_lms_swap():
    put_on_path()
    import lms_swap
    if installed_only() and os.path.abspath(lms_swap.__file__).startswith(SRC + os.sep):
        raise RuntimeError(f"{ENV}=1, but lms_swap came from the checkout ({lms_swap.__file__})")
    return lms_swap
