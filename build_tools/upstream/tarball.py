"""Source tarballs: unpack safely, import once into a cached git repo under a tag (downloads: build_tools.fetch)."""
from __future__ import annotations

import shutil
import tarfile
import tempfile
from pathlib import Path

from .. import gitutil
from ..catalog import Framework
from ..archives import extract_tar
from ..errors import LmsError
from ..fetch import file_sha256
from ..progress import Counter, info, step

TARBALL_SUFFIXES = (".tar.xz", ".tar.gz", ".tgz", ".tar.bz2", ".tar.zst", ".tar")
# Imports are commits like any other; pinning their metadata makes the same tarball give the same commit.
IMPORT_DATE = "2000-01-01T00:00:00+00:00"
IMPORT_NAME = "LMS tarball import"


def is_tarball_name(name: str) -> bool:
    return name.lower().endswith(TARBALL_SUFFIXES)


def extract(tarball: Path, into: Path) -> Path:
    """Extract and return the tree root (the tarball's single top folder, if it has one).

    Unpacked by build_tools.archives: a member that would land outside `into` refuses the tarball."""
    step(f"extracting {tarball.name}")
    c = Counter("files", unit="")
    try:
        extract_tar(tarball, into, progress=c.add)
    except (tarfile.TarError, EOFError) as e:
        raise LmsError(f"{tarball} is not a readable tarball: {e}") from None
    except OSError as e:
        raise LmsError(f"could not extract {tarball} into {into}: "
                       f"{e.strerror or e}{f' ({e.filename})' if e.filename else ''}") from None
    c.done()
    entries = [p for p in into.iterdir()]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else into


def import_tarball(fw: Framework, tarball: Path, tag: str, expected_version: str, repo: Path, scratch: Path) -> str:
    """Import `tarball` as one commit tagged `tag` in the bare `repo`; return the commit.

    A tag already imported from the same tarball (same sha256) is reused; from a different one, refused.
    """
    digest = file_sha256(tarball)
    gitutil.init_bare(repo)
    if gitutil.has_ref(repo, f"refs/tags/{tag}"):
        msg = gitutil.run(repo, "log", "-1", "--format=%B", f"refs/tags/{tag}").out
        if digest in msg:
            info(f"{tag} already imported from {tarball.name}")
            return gitutil.rev(repo, tag)
        raise LmsError(f"{tag} is already imported in {repo} from a different source tarball",
                       hint=f"remove {repo} (or pass --cache-dir elsewhere) to import this one instead")
    scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="import-", dir=scratch))
    try:
        root = extract(tarball, work)
        found = fw.tree_version(root)
        if found is None:
            raise LmsError(f"{tarball.name} does not look like a {fw.title} tree: {fw.version_file} is missing")
        if not fw.matches(found, expected_version):
            raise LmsError(f"{tarball.name} holds {fw.title} {found}, not {expected_version} (tag {tag})",
                           hint=f"pass the tarball of {fw.title} {expected_version}, or the tag v{found}")
        step(f"importing into {repo} as {tag}")
        index = work / "index"
        env = {"GIT_INDEX_FILE": str(index), "GIT_WORK_TREE": str(root), "GIT_DIR": str(repo)}
        env.update(gitutil.identity(IMPORT_DATE, IMPORT_NAME))
        gitutil.run(repo, "-c", "core.autocrlf=false", "add", "--all", "--force", ".", env=env)
        tree = gitutil.run(repo, "write-tree", env=env).out.strip()
        message = (f"Import {fw.title} {tag} from {tarball.name}\n\n"
                   f"sha256 {digest}\n"
                   f"Imported by the LMS build tools; the tarball's content, byte for byte.\n")
        commit = gitutil.run(repo, "commit-tree", tree, "-m", message, env=env).out.strip()
        gitutil.run(repo, "tag", tag, commit)
        n = gitutil.run(repo, "ls-tree", "-r", "--name-only", tree).out.count("\n") + 1
        info(f"{tag} = {commit[:12]} ({n} files)")
        return commit
    finally:
        shutil.rmtree(work, ignore_errors=True)
