"""The developer loop over a tag's edit series (in the spirit of Electron's patches/ workflow).

dev-tree:   worktree at the tag, the edit series applied as commits, the LMS source files (src/, shared/,
            <tag>/src/: catalog.source_map) symlinked in place
save-edits: the commits after the tag (minus those source files) -> patches/<fw>/<tag>/NNNN-*.patch
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .. import catalog, gitutil
from ..catalog import TagProfile
from ..errors import LmsError
from ..progress import info, step
from ..upstream import Source
from .compose import compose_tree

__all__ = ["make_dev_tree", "save_edits"]

SERIES_FORMAT = ["format-patch", "--full-index", "--no-signature", "--zero-commit", "--no-renames",
                 "--no-color", "--stat=80", "--diff-algorithm=myers", "--src-prefix=a/", "--dst-prefix=b/",
                 "--no-notes"]


def make_dev_tree(prof: TagProfile, source: Source, dest: Path) -> Path:
    step(f"dev tree for {prof.framework.title} {prof.tag} at {dest}")
    wt = compose_tree(prof, source, dest, dev=True)
    info(f"commit upstream-file edits there, then: python -m build_tools save-edits {prof.framework.name} "
         f"{prof.tag} --dest {dest}")
    return wt


def save_edits(prof: TagProfile, worktree: Path) -> list[Path]:
    """Replace the tag's edit series by the commits tag..HEAD of `worktree`, leaving out LMS source files."""
    worktree = Path(worktree).resolve()
    if not gitutil.run(worktree, "rev-parse", "--git-dir", check=False).ok:
        raise LmsError(f"{worktree} is not a git worktree", hint="make one with `python -m build_tools dev-tree`")
    dirty = gitutil.run(worktree, "status", "--porcelain", "--untracked-files=no").out.strip()
    if dirty:
        raise LmsError(f"{worktree} has uncommitted changes to upstream files:\n{dirty}",
                       hint="commit them (one commit per logical edit) and run save-edits again")
    excludes = [f":(exclude){rel}" for rel in catalog.source_map(prof.framework, prof.tag)]
    tmp = Path(tempfile.mkdtemp(prefix="series-", dir=prof.dir))
    try:
        gitutil.run(worktree, *SERIES_FORMAT, "-o", str(tmp), f"{prof.tag}..HEAD", "--", ".", *excludes)
        new = sorted(tmp.glob("*.patch"))
        for old in prof.edit_series:
            old.unlink()
        for p in new:
            os.replace(p, prof.dir / p.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    saved = prof.edit_series
    info(f"{len(saved)} edit patch(es) in {prof.dir}")
    return saved
