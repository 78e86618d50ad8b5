"""`apply`: a worktree at the tag with the LMS patch `git am`-ed; all or nothing."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import gitutil, patchfile
from ..catalog import Framework
from ..errors import LmsError
from ..progress import info, step
from ..upstream import Source

def committer_env(worktree: Path) -> dict:
    """git am needs a committer: the user's own if configured, else a neutral one (dates left to git)."""
    has_name = gitutil.run(worktree, "config", "user.name", isolated=False, check=False).ok
    if has_name:
        return {}
    return {"GIT_COMMITTER_NAME": "LMS Build Tools user", "GIT_COMMITTER_EMAIL": "lms@localhost"}


@dataclass
class Applied:
    worktree: Path
    base: str      # the tag's commit
    head: str      # after the patch
    files: int
    added: int
    removed: int


def am(worktree: Path, patch: Path, *, three_way: bool = False) -> gitutil.GitResult:
    args = ["am", "--keep-cr"] + (["-3"] if three_way else []) + [str(patch)]
    return gitutil.run(worktree, *args, env=committer_env(worktree), isolated=False, check=False)


def apply_patch(fw: Framework, tag: str, source: Source, patch: Path, dest: Path) -> Applied:
    if not patch.is_file():
        raise LmsError(f"patch {patch} not found")
    repo, base = source.ensure(tag)
    step(f"applying {patch.name} on {fw.title} {tag} at {dest}")
    wt = gitutil.add_worktree(repo, dest, tag)
    r = am(wt, patch)
    if not r.ok:
        gitutil.run(wt, "am", "--abort", check=False)
        gitutil.remove_worktree(repo, wt)
        raise LmsError(f"{patch.name} does not apply on {fw.title} {tag} ({source.describe()}):\n  " +
                       patchfile.describe_failure(patchfile.read(patch), r.err + str(r.out)).replace("\n", "\n  ") +
                       f"\n  nothing was left behind at {dest}",
                       hint=f"for a tag the patch was not made for, try `python -m build_tools rebase {fw.name} --onto {tag}`")
    head = gitutil.rev(wt, "HEAD")
    files = patchfile.parse(patchfile.read(patch))
    info(f"applied: {wt} = {tag} + LMS ({head[:12]})")
    return Applied(wt, base, head, len(files), sum(f.added for f in files), sum(f.removed for f in files))
