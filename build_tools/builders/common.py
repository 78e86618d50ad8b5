"""What both full builds share: the patched tree in build/, and putting the wheel into dist/ whole."""
from __future__ import annotations

import hashlib
from pathlib import Path

from .. import LMS_BUILD, catalog, gitutil
from ..catalog import TagProfile
from ..errors import LmsError
from ..atomic import copy_atomic
from ..patch_ops.apply import apply_patch
from ..progress import info
from ..upstream import Source

BUILD_ROOT = catalog.REPO_ROOT / "build"
DIST = catalog.REPO_ROOT / "dist"


def local_version(prof: TagProfile) -> str:
    return f"{prof.version}+lms{LMS_BUILD}"


def build_dir(prof: TagProfile, mode: str) -> Path:
    return BUILD_ROOT / f"{prof.framework.name}-{prof.tag}-{mode}"


def tree_commands(prof: TagProfile, source: Source, tree: Path) -> list[str]:
    """What prepare_tree does, as the git commands a person would type (for --dry-run)."""
    return [*source.plan_commands(prof.tag),
            f"git -C {source.repo} worktree add --detach {tree} {prof.tag}",
            f"git -C {tree} am {prof.patch_file}"]


def prepare_tree(prof: TagProfile, source: Source, tree: Path) -> None:
    """The tag + LMS patch at `tree`; kept between runs (incremental builds) while patch and base match."""
    patch = prof.patch_file
    if not patch.is_file():
        raise LmsError(f"{patch.name} does not exist yet", hint="`make patches` exports it from the sources")
    repo, base = source.ensure(prof.tag)
    stamp = tree.parent / "tree.stamp"
    want = f"{base} {hashlib.sha256(patch.read_bytes()).hexdigest()} {source.describe()}"
    if tree.exists() and stamp.exists() and stamp.read_text() == want:
        info(f"reusing {tree} (same tag and patch)")
        return
    if tree.exists():
        gitutil.remove_worktree(repo, tree)
    stamp.unlink(missing_ok=True)
    apply_patch(prof.framework, prof.tag, source, patch, tree)
    stamp.write_text(want)


def require_third_party(tree: Path, marker: str, source: Source) -> None:
    """Debian's +dfsg tarballs strip bundled dependencies; a full build needs them."""
    if not (tree / marker).exists():
        raise LmsError(f"{tree} has no {marker}: the tree from {source.describe()} lacks the bundled "
                       "dependencies (git submodules) a full build needs",
                       hint="use the upstream git source (the default, or --source <mirror with submodules>); "
                            "or `MODE=overlay` for PyTorch, which needs only c10/")


def collect_wheel(produced: Path, pattern: str, dist: Path = DIST) -> Path:
    """Move the single built wheel matching `pattern` from `produced` into dist/ in one rename."""
    wheels = sorted(produced.glob(pattern))
    if len(wheels) != 1:
        raise LmsError(f"expected one wheel matching {pattern} in {produced}, found {len(wheels)}")
    final = dist / wheels[0].name
    copy_atomic(wheels[0], final)
    info(f"wheel: {final}")
    return final
