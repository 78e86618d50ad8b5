"""The tree the wiring check compiles when none is given: composed from this checkout's sources."""
from __future__ import annotations

import os
from pathlib import Path

from ... import catalog, gitutil
from ...patch_factory.compose import compose_tree
from ...upstream import parse_source
from ..tf_release import REPO, tf_profile

__all__ = ["lms_tree"]


def lms_tree(source: str = "debian", where: Path | None = None, tag: str | None = None) -> Path:
    """A worktree of the tag with the LMS change composed from this checkout's sources (the one route
    every tree takes: patch_factory.compose), at `where` (default build/tf_wiring/tree), made afresh."""
    os.environ.setdefault("LMS_CACHE_DIR", str(REPO / ".cache" / "build-tools"))
    prof = tf_profile(tag)
    src = parse_source(catalog.framework("tensorflow"), source)
    wt = where or (REPO / "build" / "tf_wiring" / "tree")
    if wt.exists():
        repo, _ = src.ensure(prof.tag)
        gitutil.remove_worktree(repo, wt)
    return compose_tree(prof, src, wt)
