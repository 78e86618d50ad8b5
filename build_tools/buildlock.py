"""One build at a time per build folder: an fcntl lock file beside the folder.

Two builds of one tag and mode in one checkout share build/<framework>-<tag>-<mode>/ (its tree, its
compile folder): the second waits for the first, saying who holds the folder, instead of deleting the
tree under it. The lock is the kernel's (flock): it goes with the process, so a killed build never
leaves a stale lock behind. The file holds the holder's pid, command and start time, for the message.
"""
from __future__ import annotations

import fcntl
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from .progress import info

__all__ = ["build_lock", "lock_path"]


def lock_path(folder: Path) -> Path:
    """The lock of `folder`: beside it, so that removing the folder leaves the lock alone."""
    return folder.with_name(folder.name + ".lock")


@contextmanager
def build_lock(folder: Path, what: str | None = None, say=info):
    """Hold `folder` for this process; wait (and say for whom) while another one holds it."""
    path = lock_path(Path(folder))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            say(f"waiting for {folder}: another build holds it ({holder})")
            t0 = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            say(f"got {folder} after {time.monotonic() - t0:.0f}s")
        me = what or " ".join(sys.argv)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, {me}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock
