"""Fetching official wheels from PyPI with pip, cached under <repo>/.cache/wheels/.

The wheel is chosen for the *target* interpreter (`python`), not for the one running the tools: pip is
run as `<python> -m pip download`, and a cached file is reused only when its tags are among that
interpreter's supported tags (asked from pip's own vendored `packaging`).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from ..catalog import REPO_ROOT
from ..errors import LmsError

DEFAULT_CACHE = REPO_ROOT / ".cache" / "wheels"


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


def python_version(python: str) -> str:
    out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    return out


def _split_req(requirement: str) -> tuple[str, str]:
    m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;]+)\s*", requirement)
    if not m:
        raise LmsError(f"wheel requirement {requirement!r} must pin one version: name==X.Y.Z")
    return m.group(1), m.group(2)


def cached_wheel(requirement: str, python: str, cache_dir: Path = DEFAULT_CACHE) -> Path | None:
    name, version = _split_req(requirement)
    want = canonicalize_name(name)
    accepted = interpreter_tags(python)
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


def fetch_wheel(requirement: str, *, python: str, cache_dir: Path = DEFAULT_CACHE,
                progress=print) -> Path:
    """Path of the wheel `name==version` for `python`, downloading it once into `cache_dir`."""
    hit = cached_wheel(requirement, python, cache_dir)
    if hit:
        progress(f"  wheel (cached): {hit}")
        return hit
    cache_dir.mkdir(parents=True, exist_ok=True)
    progress(f"  downloading {requirement} for {python} (Python {python_version(python)}) into {cache_dir} ...")
    cmd = [python, "-m", "pip", "download", requirement, "--no-deps", "--only-binary=:all:",
           "--progress-bar", "off", "-d", str(cache_dir)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if proc.returncode != 0:
        name, version = _split_req(requirement)
        avail = re.search(r"\(from versions: ([^)]*)\)", proc.stdout)
        raise WheelNotFound(
            f"no official wheel {requirement} for Python {python_version(python)} on this platform "
            f"(pip download failed).\n  pip said: "
            + "\n  ".join(line for line in proc.stdout.splitlines() if "ERROR" in line)[-800:]
            + (f"\n  versions pip can see for this interpreter: {avail.group(1)}" if avail else ""),
            hint=(f"use a Python for which {name} {version} publishes wheels, or the full source build "
                  f"(`make build TORCH=<tag> MODE=full`)"))
    hit = cached_wheel(requirement, python, cache_dir)
    if not hit:
        raise WheelNotFound(f"pip download of {requirement} succeeded but no matching wheel is in {cache_dir}:\n"
                            + proc.stdout[-1500:])
    progress(f"  wheel: {hit} ({hit.stat().st_size / 1e6:.0f} MB)")
    return hit
