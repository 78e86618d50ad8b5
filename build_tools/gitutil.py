"""Git through GitPython, with the environment pinned where output must be reproducible."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from . import PATCH_AUTHOR_EMAIL, PATCH_AUTHOR_NAME
from .errors import LmsError

if TYPE_CHECKING:
    import git


def _git():
    """GitPython, imported when git is first needed, so that `--help` and the commands
    that need no git run without it."""
    try:
        import git
    except ImportError as e:
        raise LmsError(f"GitPython is not installed ({e}): run `make setup`, or "
                       f"`pip install GitPython`") from e
    return git

# Git configuration of the person running the tools must not change what the factory writes
# (format.signature, diff.noprefix, core.abbrev, ...), so factory commands run with none of it.
ISOLATED = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
    "TZ": "UTC",
}


def identity(date: str, name: str = PATCH_AUTHOR_NAME, email: str = PATCH_AUTHOR_EMAIL) -> dict[str, str]:
    return {
        "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email, "GIT_COMMITTER_DATE": date,
    }


class GitResult:
    def __init__(self, status: int, out, err: str):
        self.status, self.out, self.err = status, out, err

    @property
    def ok(self) -> bool:
        return self.status == 0


def run(where: Path | str, *args: str, env: dict | None = None, isolated: bool = True,
        binary: bool = False, check: bool = True, stdin: bytes | None = None) -> GitResult:
    """Run `git args...` in `where`. With check, a failure raises LmsError carrying git's stderr."""
    full_env = dict(os.environ)
    if isolated:
        full_env.update(ISOLATED)
    if env:
        full_env.update(env)
    g = _git().Git(str(where))
    status, out, err = g.execute(
        ["git", *args], with_extended_output=True, with_exceptions=False, env=full_env,
        stdout_as_string=not binary, istream=_stdin_stream(stdin), strip_newline_in_stdout=False,
    )
    if isinstance(err, bytes):
        err = err.decode(errors="replace")
    if check and status != 0:
        raise LmsError(f"git {' '.join(args[:3])} failed in {where}:\n{err.strip()}")
    return GitResult(status, out, err)


def _stdin_stream(data: bytes | None):
    if data is None:
        return None
    f = tempfile.TemporaryFile()
    f.write(data)
    f.seek(0)
    return f


def init_bare(path: Path) -> git.Repo:
    path.parent.mkdir(parents=True, exist_ok=True)
    if (path / "HEAD").exists():
        return _git().Repo(path)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
    repo = _git().Repo.init(tmp, bare=True)
    with repo.config_writer() as cw:
        cw.set_value("core", "autocrlf", "false")
        cw.set_value("gc", "auto", "0")
    os.replace(tmp, path)  # appears whole or not at all
    return _git().Repo(path)


def has_ref(repo_path: Path, ref: str) -> bool:
    if not Path(repo_path).exists():
        return False
    return run(repo_path, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False).ok


def rev(repo_path: Path, ref: str) -> str:
    return run(repo_path, "rev-parse", f"{ref}^{{commit}}").out.strip()


def add_worktree(repo_path: Path, dest: Path, ref: str) -> Path:
    """A detached worktree of `ref` at `dest` (which must not exist or be empty)."""
    dest = Path(dest).resolve()
    if dest.exists() and any(dest.iterdir()):
        raise LmsError(f"{dest} exists and is not empty", hint="name a new folder with --dest")
    if dest.exists():
        dest.rmdir()
    dest.parent.mkdir(parents=True, exist_ok=True)
    run(repo_path, "worktree", "add", "--detach", "--force", str(dest), ref)
    return dest


def remove_worktree(repo_path: Path, dest: Path) -> None:
    run(repo_path, "worktree", "remove", "--force", str(dest), check=False)
    if Path(dest).exists():
        shutil.rmtree(dest, ignore_errors=True)
    run(repo_path, "worktree", "prune", check=False)


@contextlib.contextmanager
def temp_worktree(repo_path: Path, ref: str, scratch: Path):
    """A throw-away worktree under `scratch`, removed however the block ends."""
    scratch.mkdir(parents=True, exist_ok=True)
    dest = Path(tempfile.mkdtemp(prefix="wt-", dir=scratch))
    try:
        yield add_worktree(repo_path, dest, ref)
    finally:
        remove_worktree(repo_path, dest)
