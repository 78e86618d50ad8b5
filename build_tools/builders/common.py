"""What the builds share: the patched tree in build/, and putting the wheel into dist/ whole.

The tree of a tag's own profile is composed from the LMS sources (patch_factory.compose: the route the
exported patch, the checks and dev trees take), so an edit under patches/ reaches the wheel without an
export; a committed patch that differs from the sources is reported, and the sources win. A patch the
user brings (--patch) or a rebase writes has no sources: it is `git am`-ed.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from .. import LMS_BUILD, catalog, gitutil
from ..atomic import copy_atomic
from ..catalog import TagProfile
from ..errors import LmsError
from ..patch_factory.compose import compose_tree, sources_digest
from ..patch_factory.export import patch_of
from ..patch_ops.apply import apply_patch
from ..progress import info, warn
from ..upstream import Source

__all__ = ["BUILD_ROOT", "DIST", "build_dir", "collect_wheel", "local_version", "patch_state", "prepare_tree",
           "require_third_party", "tree_commands", "tree_title"]

BUILD_ROOT = catalog.REPO_ROOT / "build"
DIST = catalog.REPO_ROOT / "dist"


def local_version(prof: TagProfile) -> str:
    return f"{prof.version}+lms{LMS_BUILD}"


def build_dir(prof: TagProfile, mode: str) -> Path:
    return BUILD_ROOT / f"{prof.framework.name}-{prof.tag}-{mode}"


def composed(prof: TagProfile) -> bool:
    """Whether the build tree of `prof` is composed from the sources (else its patch is `git am`-ed)."""
    return prof.patch_override is None


def tree_title(prof: TagProfile, source: Source, tree: Path) -> str:
    """The title of the step that prepares the tree (one wording for every build)."""
    get = f"get {prof.framework.title} {prof.tag} from {source.describe()} and"
    if composed(prof):
        return (f"{get} compose the LMS change from the sources in patches/ (the commit "
                f"{prof.patch_file.name} holds; a stale patch is reported) into {tree}")
    return f"{get} `git am` {prof.patch_file.name} into {tree}"


def tree_commands(prof: TagProfile, source: Source, tree: Path) -> list[str]:
    """What prepare_tree does, as the commands a person would type (for --dry-run)."""
    add = [*source.plan_commands(prof.tag), f"git -C {source.repo} worktree add --detach {tree} {prof.tag}"]
    if not composed(prof):
        return [*add, f"git -C {tree} am {prof.patch_file}"]
    fw = prof.framework
    edits = [f"git -C {tree} apply --index {p}" for p in prof.edit_series]
    n = len(catalog.source_map(fw, prof.tag))
    return [*add, *edits,
            f"# copy the {n} LMS source files (patches/{fw.name}/src, patches/{fw.name}/{prof.tag}/src, "
            f"patches/{fw.name}/shared.toml's placements) to their paths in {tree}; git add them",
            f"git -C {tree} commit  # pinned author, date and message: `git -C {tree} format-patch -1 --stdout` "
            f"equals {prof.patch_file} when that is current"]


def patch_state(prof: TagProfile, tree: Path) -> str | None:
    """None when the committed patch equals the composed tree's commit; else what is wrong with it."""
    if not prof.patch_file.is_file():
        return f"{prof.patch_file.name} does not exist"
    if prof.patch_file.read_bytes() != patch_of(tree):
        return f"{prof.patch_file.name} is stale: it differs from the LMS sources"
    return None


def prepare_tree(prof: TagProfile, source: Source, tree: Path) -> None:
    """The tag + LMS at `tree`; kept between runs (incremental builds) while base and inputs match."""
    repo, base = source.ensure(prof.tag)
    if composed(prof):
        inputs = f"sources {sources_digest(prof)}"
    else:
        patch = prof.patch_file
        if not patch.is_file():
            raise LmsError(f"patch {patch} not found")
        inputs = f"patch {hashlib.sha256(patch.read_bytes()).hexdigest()}"
    stamp = tree.parent / "tree.stamp"
    want = f"{base} {inputs} {source.describe()}"
    if tree.exists() and stamp.exists() and stamp.read_text() == want:
        info(f"reusing {tree} (same tag and {inputs.split()[0]})")
        return
    if tree.exists():
        gitutil.remove_worktree(repo, tree)
    stamp.unlink(missing_ok=True)
    if composed(prof):
        compose_tree(prof, source, tree)
        problem = patch_state(prof, tree)
        if problem:
            warn(f"{problem}; this build uses the sources. `make patches` writes the patch from them "
                 f"(commit it, so that `git am` users get what this wheel has)")
        else:
            info(f"{prof.patch_file.name} is current: the tree holds its commit")
    else:
        apply_patch(prof.framework, prof.tag, source, prof.patch_file, tree)
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
