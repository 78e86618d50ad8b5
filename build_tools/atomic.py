"""Placing files whole or not at all: a reader sees the old file or the new one, never part of one."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["copy_atomic", "write_atomic"]


def copy_atomic(src: Path, dst: Path) -> None:
    """Place `src` at `dst` whole or not at all (rename when possible, else copy + rename)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        src.replace(dst)
        return
    except OSError:
        pass
    part = dst.with_name(f".{dst.name}.partial")
    try:
        shutil.copyfile(src, part)
        part.replace(dst)
    finally:
        part.unlink(missing_ok=True)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path` through a temporary file beside it and one rename."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
