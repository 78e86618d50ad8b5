"""The one downloader of official wheels (torch, the CUDA header wheels, tensorflow): pip, cached under
<repo>/.cache/wheels/ (or the caller's folder), checked against pinned sha256s.

The wheel is chosen for a *target*: an interpreter (`python`: pip is run as `<python> -m pip download`,
and a cached file is reused only when its tags are among that interpreter's supported tags, asked
from pip's own vendored `packaging`), or a CPython version on manylinux x86-64 (`python_version`,
whatever Python runs the tools). pip checks what it downloads against the index's hashes; `pins`
({wheel file name: sha256}, kept in the profiles and beside HEADER_WHEELS) are checked on every use,
cached or not: a wheel in the cache that does not match is deleted and refused (a wheel the caller
names outside the cache is refused and left alone), and a wheel the pins do not name is used with a
warning that gives its sha256. pip downloads into a temporary folder inside the cache; the wheel is
renamed into the cache only once it matches its pin, so an interrupted or wrong download is never kept.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from .catalog import REPO_ROOT
from .errors import LmsError
from .fetch import file_sha256
from .progress import run_streamed

__all__ = ["DEFAULT_CACHE", "WheelNotFound", "cached_wheel", "check_pin", "fetch_wheel", "interpreter_tags",
           "python_version"]

DEFAULT_CACHE = REPO_ROOT / ".cache" / "wheels"
TARGET_PLATFORMS = ("manylinux2014_x86_64", "manylinux1_x86_64")


class WheelNotFound(LmsError):
    """No wheel of that requirement exists for the target interpreter/platform."""


@lru_cache(maxsize=8)
def interpreter_tags(python: str) -> tuple[str, ...]:
    """The wheel tags `python` accepts, most specific first (as pip computes them)."""
    code = ("import json, sys\n"
            "try:\n from pip._vendor.packaging import tags\n"
            "except ImportError:\n from packaging import tags\n"
            "print(json.dumps([str(t) for t in tags.sys_tags()]))")
    proc = subprocess.run([python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise LmsError(f"cannot ask {python} for its wheel tags (needs pip): {proc.stderr.strip()[-500:]}",
                       hint="pass --python with an interpreter that has pip")
    return tuple(json.loads(proc.stdout))


def python_version_of(python: str) -> str:
    out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    return out


python_version = python_version_of  # the older name


def _split_req(requirement: str) -> tuple[str, str]:
    m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;]+)\s*", requirement)
    if not m:
        raise LmsError(f"wheel requirement {requirement!r} must pin one version: name==X.Y.Z")
    return m.group(1), m.group(2)


def _version_tags(version: str) -> tuple[str, ...]:
    """The tags pip accepts for CPython `version` on manylinux x86-64, most specific first."""
    nodot = version.replace(".", "")
    plats = [f"manylinux_2_{m}_x86_64" for m in range(17, 4, -1)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]
    out = [f"cp{nodot}-cp{nodot}-{p}" for p in plats] + [f"cp{nodot}-abi3-{p}" for p in plats]
    out += [f"py3-none-{p}" for p in plats] + [f"cp{nodot}-none-any", "py3-none-any"]
    return tuple(out)


def cached_wheel(requirement: str, python: str | None, cache_dir: Path = DEFAULT_CACHE, *,
                 version_target: str | None = None) -> Path | None:
    name, version = _split_req(requirement)
    want = canonicalize_name(name)
    accepted = _version_tags(version_target) if version_target else interpreter_tags(python)
    rank = {t: i for i, t in enumerate(accepted)}
    best: tuple[int, Path] | None = None
    if not cache_dir.is_dir():
        return None
    for f in cache_dir.glob("*.whl"):
        try:
            n, v, _b, tags = parse_wheel_filename(f.name)
        except Exception:
            continue
        if n != want or v != Version(version):
            continue
        r = min((rank[str(t)] for t in tags if str(t) in rank), default=None)
        if r is not None and (best is None or r < best[0]):
            best = (r, f)
    return best[1] if best else None


def check_pin(wheel: Path, pins: dict | None, *, discard: bool = True, progress=None) -> str | None:
    """The wheel's sha256 when `pins` names its file (None when it does not: then, with `progress`, a
    warning naming its sha256). A mismatch raises LmsError naming the file and both hashes; with
    `discard` (a file of the cache) the file is deleted first, so that it is never used again."""
    if not pins or wheel.name not in pins:
        if pins is not None and progress is not None:
            progress(f"  warning: {wheel.name} has no pinned sha256 in the profile (it has "
                     f"{file_sha256(wheel)}); pip checked it against the index only")
        return None
    want, got = pins[wheel.name].strip().lower().removeprefix("sha256:"), file_sha256(wheel)
    if got != want:
        if discard:
            wheel.unlink(missing_ok=True)
        raise LmsError(f"{wheel} does not match its pinned sha256 (expected {want}, got {got}); "
                       + ("the file was deleted" if discard else "it was not used"),
                       hint=("run again to download it afresh; if it still differs, the index or mirror "
                             "serves another file than the pin's") if discard else
                            "use the official wheel of that name (pip download), or let the tools fetch it")
    return got


def fetch_wheel(requirement: str, *, python: str | None = None, python_version: str | None = None,
                cache_dir: Path = DEFAULT_CACHE, pins: dict | None = None, progress=print) -> Path:
    """Path of the wheel `name==version` for the interpreter `python` (or for CPython `python_version`
    on manylinux x86-64), downloading it once into `cache_dir`; checked against `pins` when they name it."""
    if (python is None) == (python_version is None):
        raise ValueError("fetch_wheel needs python or python_version")
    hit = cached_wheel(requirement, python, cache_dir, version_target=python_version)
    if hit:
        check_pin(hit, pins, progress=progress)
        progress(f"  wheel (cached): {hit}")
        return hit
    cache_dir.mkdir(parents=True, exist_ok=True)
    pyver = python_version or python_version_of(python)
    progress(f"  downloading {requirement} for Python {pyver} into {cache_dir} ...")
    if python:
        cmd = [python, "-m", "pip", "download", requirement]
    else:
        cmd = [sys.executable, "-m", "pip", "download", requirement, "--python-version", python_version]
        cmd += [a for p in TARGET_PLATFORMS for a in ("--platform", p)]
    # pip writes into a folder of its own inside the cache (same file system): only a wheel that
    # matches its pin is renamed into the cache, in one step; anything else goes with the folder.
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=cache_dir))
    try:
        hit = _download(requirement, cmd + ["-d", str(staging)], python, python_version, pyver, staging)
        check_pin(hit, pins, progress=progress)
        final = cache_dir / hit.name
        os.replace(hit, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    progress(f"  wheel: {final} ({final.stat().st_size / 1e6:.0f} MB)")
    return final


def _download(requirement: str, cmd: list[str], python: str | None, python_version: str | None, pyver: str,
              staging: Path) -> Path:
    """Run `cmd` (pip download into `staging`) and return the wheel it left there."""
    cmd = cmd + ["--no-deps", "--only-binary=:all:", "--progress-bar", "off"]
    # a torch wheel is hundreds of MB: pip's lines (and a line while it is silent) show it working
    proc = run_streamed(cmd, f"pip download {requirement}",
                        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if proc.returncode != 0:
        name, version = _split_req(requirement)
        avail = re.search(r"\(from versions: ([^)]*)\)", proc.output)
        raise WheelNotFound(
            f"no official wheel {requirement} for Python {pyver} on this platform "
            f"(pip download failed).\n  pip said: "
            + "\n  ".join(line for line in proc.output.splitlines() if "ERROR" in line)[-800:]
            + (f"\n  versions pip can see for this interpreter: {avail.group(1)}" if avail else ""),
            hint=(f"use a Python for which {name} {version} publishes wheels, or the full source build "
                  f"(`make build TORCH=<tag> MODE=full`)"))
    hit = cached_wheel(requirement, python, staging, version_target=python_version)
    if not hit:
        raise WheelNotFound(f"pip download of {requirement} succeeded but left no matching wheel:\n"
                            + proc.output[-1500:])
    return hit
