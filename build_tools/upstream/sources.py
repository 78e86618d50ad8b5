"""The --source option: where a framework's tree comes from.

  (not given)              the official upstream git remote (github.com/pytorch/pytorch, ...)
  debian                   Debian's source package for the tag (see patches/<fw>/<tag>/profile.toml)
  /path/to/repo            a local git repository or mirror holding the tag
  https://.../x.git, git@host:x, file:///...   any git URL
  /path/to/x.tar.xz, https://.../x.tar.gz      a source tarball (imported once, tagged)
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .. import catalog, gitutil
from ..catalog import Framework
from ..errors import LmsError
from ..fetch import fetch, is_url
from ..progress import info, run_streamed, step
from . import debian, tarball


def cache_dir() -> Path:
    """Where downloads and imported repos live: $LMS_CACHE_DIR, else ~/.cache/lms-build-tools."""
    env = os.environ.get("LMS_CACHE_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lms-build-tools"
    return base.resolve()


GIT_URL_RE = re.compile(r"^(https?|git|ssh|file)://|^[\w.-]+@[\w.-]+:")


@dataclass(frozen=True)
class Source:
    framework: Framework
    kind: str          # "git", "tarball", "debian"
    location: str      # URL or path ("" for debian)

    def describe(self) -> str:
        return {"git": f"git {self.location}", "tarball": f"tarball {self.location}",
                "debian": "Debian source package"}[self.kind]

    @property
    def is_official(self) -> bool:
        return self.kind == "git" and self.location == self.framework.remote

    @property
    def repo(self) -> Path:
        """The cached bare repo for this source: all tarball imports of a framework share one, so
        tags from different tarballs can be rebased onto each other; Debian's imports have their own
        (a tag imported from a user's tarball is never served as Debian's); each git URL gets its own."""
        base = cache_dir() / "git" / self.framework.name
        if self.kind == "debian":
            return base / "debian.git"
        if self.kind == "tarball":
            return base / "tarballs.git"
        slug = re.sub(r"[^A-Za-z0-9]+", "-", self.location).strip("-")[-40:]
        return base / f"{slug}-{hashlib.sha1(self.location.encode()).hexdigest()[:8]}.git"

    def plan_commands(self, tag: str) -> list[str]:
        """The commands `ensure` amounts to (shown by dry runs; cached results are reused)."""
        ref = f"+refs/tags/{tag}:refs/tags/{tag}"
        if self.kind == "git":
            return [f"git init --bare {self.repo}", f"git -C {self.repo} fetch --depth=1 {self.location} {ref}"]
        if self.kind == "debian":
            deb = _debian(self.framework, tag)
            if deb is None:
                return [f"# no Debian source is known for {self.framework.title} {tag}: "
                        f"pass --source <tarball or git URL>"]
            get = (f"apt-get source --download-only --tar-only {deb.get('package')}={deb.get('version')}  "
                   f"# deb-src {deb.get('suite')} main, private apt state in {cache_dir() / 'apt'}")
        else:
            get = f"download {self.location}" if re.match(r"^https?://", self.location) else f"# tarball {self.location}"
        return [get, f"# import the tarball's tree as one commit tagged {tag} in {self.repo} (once; cached)"]

    def ensure(self, tag: str) -> tuple[Path, str]:
        """Make sure the cached repo holds `tag`; return (repo, commit)."""
        expected = _expected_version(self.framework, tag)
        if self.kind == "git":
            commit = _fetch_tag(self, tag)
            _check_version(self, tag, expected)
            return self.repo, commit
        if self.kind == "debian":
            prof = _debian(self.framework, tag)
            if not prof:
                raise LmsError(f"no Debian source is known for {self.framework.title} {tag}",
                               hint="pass --source <tarball or git URL>")
            if gitutil.has_ref(self.repo, f"refs/tags/{tag}"):
                info(f"{tag} already imported")
                return self.repo, gitutil.rev(self.repo, tag)
            path = debian.fetch_orig_tarball(prof["package"], prof["version"], prof["suite"],
                                             cache_dir() / "apt", cache_dir() / "downloads")
        else:
            loc = self.location
            path = fetch(loc, cache_dir() / "downloads") if is_url(loc) else Path(loc)
            if not path.is_file():
                raise LmsError(f"source tarball {loc} not found")
        commit = tarball.import_tarball(self.framework, path, tag, expected, self.repo, cache_dir() / "scratch")
        return self.repo, commit


def _debian(fw: Framework, tag: str) -> dict | None:
    """Where Debian has the tag's tree (known for supported tags only), or None."""
    return catalog.profile(fw, tag).debian if catalog.is_supported(fw, tag) else None


def _expected_version(fw: Framework, tag: str) -> str:
    try:
        return catalog.profile(fw, tag).version
    except LmsError:
        return catalog.version_of_tag(tag)  # an unsupported tag (rebase onto it): the tag says


def _fetch_tag(src: Source, tag: str) -> str:
    repo = src.repo
    gitutil.init_bare(repo)
    ref = f"refs/tags/{tag}"
    if gitutil.has_ref(repo, ref):
        info(f"{tag} already fetched from {src.location}")
        return gitutil.rev(repo, tag)
    step(f"fetching {tag} from {src.location}")
    local = Path(src.location).expanduser()
    args = ["fetch", "--no-tags", "--progress"]
    if not local.exists():
        args.append("--depth=1")  # a release tree, not its history: minutes instead of an hour
    # git's own progress (objects counted, received, resolved) is passed through while it runs;
    # the user's git configuration applies (proxies, mirrors), messages in English for the checks below
    r = run_streamed(["git", "-C", str(repo), *args, str(src.location), f"+{ref}:{ref}"], f"git fetch {tag}",
                     env={**os.environ, "LC_ALL": "C", "LANGUAGE": "C"})
    if not r.ok:
        err = r.output.replace("\r", "\n").strip().splitlines()
        if any("couldn't find remote ref" in l or "not our ref" in l for l in err):
            raise LmsError(f"{src.location} has no tag {tag}",
                           hint="check the tag name (tags look like v2.6.0), or pass --source with a tree that has it")
        raise LmsError(f"could not fetch {tag} from {src.location}:\n  " + "\n  ".join(err[-6:]),
                       hint="no network to that host? pass --source with a local mirror, git URL or tarball")
    return gitutil.rev(repo, tag)


def _check_version(src: Source, tag: str, expected: str) -> None:
    fw = src.framework
    shown = gitutil.run(src.repo, "show", f"{tag}:{fw.version_file}", check=False)
    if not shown.ok:
        raise LmsError(f"{tag} from {src.location} is not a {fw.title} tree ({fw.version_file} is missing)")
    m = re.search(fw.version_pattern, shown.out, re.MULTILINE)
    if not fw.matches(m.group(1) if m else None, expected):
        raise LmsError(f"{tag} from {src.location} holds {fw.title} {m.group(1) if m else '?'}, not {expected}")


def parse_source(fw: Framework, spec: str | None) -> Source:
    """Turn the user's --source value into a Source (see the module docstring)."""
    if spec is None or spec == "" or spec == "upstream":
        return Source(fw, "git", fw.remote)
    if spec == "debian":
        return Source(fw, "debian", "")
    if tarball.is_tarball_name(spec):
        if re.match(r"^https?://", spec):
            return Source(fw, "tarball", spec)
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise LmsError(f"source tarball {spec} not found")
        return Source(fw, "tarball", str(path))
    if GIT_URL_RE.match(spec):
        return Source(fw, "git", spec)
    path = Path(spec).expanduser().resolve()
    if path.is_dir():
        if not gitutil.run(path, "rev-parse", "--git-dir", check=False).ok:
            raise LmsError(f"{spec} is a folder but not a git repository",
                           hint="pass a git repo/mirror, a git URL, a source tarball, or `debian`")
        return Source(fw, "git", str(path))
    raise LmsError(f"--source {spec!r} is neither a git repository, a git URL, a tarball nor `debian`")
