"""The CUDA range a TensorFlow profile builds with, and the LMS page backend compiled against its ends.

The profile's [build.full] cuda range is the one statement of which CUDA a TensorFlow build of the tag
uses (the full build checks nvcc against it). The page backend compiles LMS out below the CUDA version
of its guard (`#if CUDA_VERSION < N`: host-NUMA VMM pages need it), so the range's lower bound must be
that version, and the backend must compile, with LMS in, against the lowest and the highest CUDA
headers the range allows (NVIDIA's header wheels, build_tools.cudahome).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from ..catalog import TagProfile
from ..cudahome import HEADER_WHEELS, cuda_home
from ..errors import LmsError
from ..toolchain import in_range, version_tuple
from .tf_allocator.program import compile_flags, stage_tree
from .tf_allocator.wheel import DEFAULT_CACHE, ensure_wheel
from .tf_release import log_to

__all__ = ["PAGE_BACKEND", "compile_page_backend", "cuda_range", "lms_floor", "range_ends"]

PAGE_BACKEND = "tensorflow/core/common_runtime/gpu/gpu_lms_page_backend.cc"
log = log_to("tf_cuda_range")


def cuda_range(prof: TagProfile) -> str:
    """The profile's [build.full] cuda range, e.g. ">=12.2,<12.3"."""
    spec = prof.build("full").get("cuda")
    if not spec:
        raise LmsError(f"{prof.dir / 'profile.toml'} has no [build.full] cuda range")
    return spec


def lms_floor(page_backend: str) -> str:
    """The CUDA version ("12.2") below which the page backend's text compiles LMS out."""
    found = set(re.findall(r"^#if CUDA_VERSION < (\d+)\s*$", page_backend, re.M))
    if len(found) != 1:
        raise LmsError(f"{PAGE_BACKEND}: expected one `#if CUDA_VERSION < N` guard, found {sorted(found) or 'none'}")
    n = int(found.pop())
    return f"{n // 1000}.{n % 1000 // 10}"


def range_ends(prof: TagProfile) -> list[str]:
    """The lowest and the highest CUDA version ("12.2") of the range that header wheels are known for
    (one entry when they are the same). The lowest must be the range's lower bound."""
    spec = cuda_range(prof)
    known = sorted((v for v in HEADER_WHEELS if in_range(v, spec)), key=version_tuple)
    low = re.search(r">=\s*([\d.]+)", spec)
    if not low or not known or version_tuple(known[0]) != version_tuple(low.group(1)):
        raise LmsError(f"no CUDA header wheels for the lower bound of {spec} "
                       f"(known: {', '.join(sorted(HEADER_WHEELS))})",
                       hint="add them to build_tools/cudahome.py HEADER_WHEELS")
    return sorted({known[0], known[-1]}, key=version_tuple)


def compile_page_backend(tree: Path, cuda: str, out: Path, *, cache: Path = DEFAULT_CACHE,
                         overlay_src: Mapping[str, Path] | None = None, tag: str | None = None) -> Path:
    """The page backend of ``tree`` (its LMS files from ``overlay_src`` when given) compiled against
    the CUDA ``cuda`` headers of NVIDIA's wheels and the release's tensorflow-cpu headers; the object."""
    home = cuda_home(cuda, python=sys.executable, progress=log)
    include = ensure_wheel(cache, tag=tag) / "tensorflow" / "include"
    overlay = out / "overlay"
    stage_tree(tree, overlay, home / "include", overlay_src)
    obj = out / "gpu_lms_page_backend.o"
    cmd = [os.environ.get("CXX", "g++"), *compile_flags(overlay, include, home / "include"),
           "-c", str(overlay / PAGE_BACKEND), "-o", str(obj)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise LmsError(f"{PAGE_BACKEND} does not compile against CUDA {cuda} headers ({home}):\n"
                       + r.stdout[-4000:])
    return obj
