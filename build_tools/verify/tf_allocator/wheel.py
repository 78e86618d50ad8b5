"""The official tensorflow-cpu wheel of the release: headers and libtensorflow_framework.so.2.

Fetched by the tools' one wheel downloader (build_tools.wheels), checked against the profile's pins."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from ...archives import extract_zip
from ...catalog import TagProfile
from ...wheels import check_pin, fetch_wheel
from ..tf_release import REPO, log_to, tf_profile, wheel_pythons

__all__ = ["DEFAULT_CACHE", "ensure_wheel", "wheel_dir", "wheel_file", "wheel_pins", "wheel_python"]

DEFAULT_CACHE = REPO / ".cache" / "tf_allocator"
log = log_to("tf_allocator")


def wheel_python(prof: TagProfile) -> str:
    """The CPython whose wheel the allocator build takes: the running one where the release has a
    wheel for it, else the newest it has (every one has the same headers and library)."""
    running = "%d.%d" % sys.version_info[:2]
    pythons = wheel_pythons(prof)
    return running if running in pythons else pythons[-1]


def wheel_pins(tag: str | None = None) -> dict[str, str]:
    """{official wheel file name: sha256} of the profile (patches/tensorflow/<tag>/profile.toml)."""
    return tf_profile(tag).wheel_sha256


def wheel_file(cache: Path, py_version: str | None = None, tag: str | None = None) -> Path:
    """The tensorflow-cpu wheel for CPython ``py_version`` (default :func:`wheel_python`) in ``cache``
    (downloaded once with pip, whatever Python runs this: the tools' one wheel downloader, which
    checks it against the profile's pinned sha256 on every call, cached or not)."""
    prof = tf_profile(tag)
    return fetch_wheel(f"tensorflow-cpu=={prof.version}", python_version=py_version or wheel_python(prof),
                       cache_dir=cache, pins=prof.wheel_sha256, progress=log)


def wheel_dir(cache: Path, tag: str | None = None) -> Path:
    """Where :func:`ensure_wheel` extracts the wheel in ``cache``."""
    return cache / f"wheel-{tf_profile(tag).version}"


def ensure_wheel(cache: Path, wheel: Path | None = None, tag: str | None = None) -> Path:
    """Returns a folder holding the wheel's ``include/`` and
    ``libtensorflow_framework.so.2`` (downloaded once with pip, cached). A wheel the caller
    names is checked against the profile's pins as a downloaded one is (and left alone if it
    does not match)."""
    out = wheel_dir(cache, tag)
    marker = out / ".complete"
    if marker.exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    if wheel:
        check_pin(wheel, wheel_pins(tag), discard=False, progress=log)
    else:
        wheel = wheel_file(cache, tag=tag)
    log(f"extracting headers and libtensorflow_framework.so.2 from {wheel.name}")
    if out.exists():
        shutil.rmtree(out)
    extract_zip(wheel, out, select=lambda n: n if n.startswith("tensorflow/include/")
                or n == "tensorflow/libtensorflow_framework.so.2" else None)
    marker.write_text(wheel.name + "\n")
    return out
