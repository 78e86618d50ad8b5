"""Export the composed LMS commit as patches/<framework>_<tag>_large_model_support.patch, and check it."""
from __future__ import annotations

import difflib
from pathlib import Path

from .. import gitutil
from ..atomic import write_atomic
from ..catalog import TagProfile
from ..errors import LmsError
from ..progress import info, step
from ..upstream import Source, cache_dir
from .compose import compose

__all__ = ["FORMAT_PATCH", "check", "check_all", "export", "patch_of", "render"]

# Every option that could vary with the git version's defaults or the user's configuration is named.
FORMAT_PATCH = [
    "format-patch", "-1", "HEAD", "--stdout", "--full-index", "--no-signature", "--zero-commit",
    "--no-renames", "--no-color", "--no-numbered", "--subject-prefix=PATCH", "--stat=80",
    "--diff-algorithm=myers", "--src-prefix=a/", "--dst-prefix=b/", "--no-notes", "--no-binary",
]


def patch_of(worktree: Path) -> bytes:
    """The patch of a composed tree's LMS commit (HEAD), as `export` writes it."""
    return gitutil.run(worktree, *FORMAT_PATCH, binary=True).out


def render(prof: TagProfile, source: Source) -> bytes:
    """The patch bytes for the current sources on the tag (nothing is written)."""
    repo, _ = source.ensure(prof.tag)
    with gitutil.temp_worktree(repo, prof.tag, cache_dir() / "scratch") as wt:
        compose(prof, wt)
        return patch_of(wt)


def export(prof: TagProfile, source: Source) -> Path:
    data = render(prof, source)
    old = prof.patch_file.read_bytes() if prof.patch_file.exists() else None
    write_atomic(prof.patch_file, data)
    state = "unchanged" if old == data else ("updated" if old else "new")
    info(f"{prof.patch_file.name}: {len(data)} bytes, {state}")
    return prof.patch_file


def check(prof: TagProfile, source: Source) -> str | None:
    """None when the committed patch equals a fresh export; otherwise what differs."""
    step(f"checking {prof.patch_file.name}")
    if not prof.patch_file.exists():
        return f"{prof.patch_file.name} is missing"
    fresh = render(prof, source)
    committed = prof.patch_file.read_bytes()
    if fresh == committed:
        return None
    diff = difflib.unified_diff(committed.decode(errors="replace").splitlines(),
                                fresh.decode(errors="replace").splitlines(),
                                "committed", "fresh export", n=1, lineterm="")
    return "\n".join(list(diff)[:40])


def check_all(profiles: list[TagProfile], sources: dict[str, Source]) -> None:
    """Raise, naming every stale patch, unless all committed patches equal fresh exports."""
    stale = []
    for prof in profiles:
        problem = check(prof, sources[prof.framework.name])
        if problem:
            stale.append(f"{prof.patch_file.name} is stale:\n{problem}")
    if stale:
        raise LmsError("\n\n".join(stale), hint="regenerate with `make patches` and commit the result")
