"""Debian source packages as a source of upstream trees (`--source debian`).

Debian's `orig` tarballs are the upstream release trees (minus non-free parts: `+dfsg`). We fetch them
with apt-get under a private apt configuration kept in the cache, so the system's apt state is not
touched and no root is needed. The mirror is the one the system already uses for Debian packages
(or $LMS_DEBIAN_MIRROR).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from ..errors import LmsError
from ..progress import info, step
from ..tools import find_tool

KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


def system_mirror() -> str:
    """The Debian archive URI from the system's apt sources (deb822 or one-line), or $LMS_DEBIAN_MIRROR."""
    env = os.environ.get("LMS_DEBIAN_MIRROR")
    if env:
        return env.rstrip("/")
    candidates = []
    for f in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            text = f.read_text()
        except OSError:
            continue
        candidates += re.findall(r"^URIs:\s*(\S+)", text, re.MULTILINE)
        candidates += re.findall(r"^deb(?:-src)?\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.MULTILINE)
    for uri in candidates:
        if re.search(r"/debian/?$", uri):
            return uri.rstrip("/")
    raise LmsError("no Debian archive is configured in /etc/apt (needed for --source debian)",
                   hint="set LMS_DEBIAN_MIRROR to a Debian mirror URI, or pass --source <tarball or git URL>")


def upstream_version(debian_version: str) -> str:
    """2.6.0+dfsg-7 -> 2.6.0+dfsg (strip the Debian revision and any epoch)."""
    v = debian_version.split(":", 1)[-1]
    return v.rsplit("-", 1)[0] if "-" in v else v


class Apt:
    """apt-get/apt-cache with a private state directory holding only deb-src entries."""

    def __init__(self, state: Path, suites: list[str]):
        self.state = state
        self.suites = suites
        (state / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (state / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        (state / "parts").mkdir(exist_ok=True)
        signed = f" [signed-by={KEYRING}]" if KEYRING.exists() else ""
        lines = [f"deb-src{signed} {system_mirror()} {s} main" for s in suites]
        (state / "sources.list").write_text("\n".join(lines) + "\n")

    def _opts(self) -> list[str]:
        s = self.state
        opts = [f"-oDir::Etc::SourceList={s / 'sources.list'}", f"-oDir::Etc::SourceParts={s / 'parts'}",
                f"-oDir::State::Lists={s / 'lists'}", f"-oDir::Cache={s / 'cache'}",
                "-oDebug::NoLocking=1", "-oAPT::Get::List-Cleanup=0"]
        if os.geteuid() == 0:
            opts.append("-oAPT::Sandbox::User=root")
        return opts

    def run(self, tool: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        exe = find_tool(tool)
        if not exe:
            raise LmsError(f"{tool} not found: --source debian needs Debian's apt tools",
                           hint="on a non-Debian machine pass --source <tarball path or URL> instead")
        return subprocess.run([exe, *self._opts(), *args], cwd=cwd, text=True, capture_output=True)

    def update(self) -> None:
        step(f"apt-get update (deb-src {' '.join(self.suites)})")
        r = self.run("apt-get", "-q", "update")
        if r.returncode != 0:
            raise LmsError(f"apt-get update failed:\n{r.stderr.strip()[-2000:]}")

    def source_versions(self, package: str) -> list[str]:
        r = self.run("apt-cache", "showsrc", package)
        return re.findall(r"^Version:\s*(\S+)", r.stdout, re.MULTILINE)


def fetch_orig_tarball(package: str, version: str, suite: str, state: Path, downloads: Path) -> Path:
    """Download <package>_<upstream>.orig.tar.* for `version` (any Debian revision of the same upstream
    version will do: they share the orig tarball) into `downloads`, and return its path."""
    up = upstream_version(version)
    downloads.mkdir(parents=True, exist_ok=True)
    found = sorted(downloads.glob(f"{package}_{up}.orig.tar.*"))
    if found:
        info(f"cached: {found[0]}")
        return found[0]
    suites = [suite] + [s for s in ("trixie", "sid") if s != suite]
    apt = Apt(state, suites)
    apt.update()
    versions = apt.source_versions(package)
    same_upstream = [v for v in versions if upstream_version(v) == up]
    if not same_upstream:
        raise LmsError(f"Debian has no source package {package} {up} (it lists: {', '.join(versions) or 'none'})",
                       hint="pass --source <tarball or git URL> for this tag")
    pick = version if version in same_upstream else same_upstream[0]
    step(f"apt-get source --download-only --tar-only {package}={pick}")
    work = downloads / f".apt-{package}-{os.getpid()}"
    work.mkdir(exist_ok=True)
    try:
        r = apt.run("apt-get", "-q", "source", "--download-only", "--tar-only", f"{package}={pick}", cwd=work)
        tars = sorted(work.glob(f"{package}_{up}.orig.tar.*"))
        if not tars:
            raise LmsError(f"apt-get source did not deliver {package}_{up}.orig.tar.*:\n{(r.stdout + r.stderr).strip()[-2000:]}")
        final = downloads / tars[0].name
        os.replace(tars[0], final)  # apt checked its hash against the signed index
        info(f"downloaded {final.name} ({final.stat().st_size / 2**20:.1f} MiB)")
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)
