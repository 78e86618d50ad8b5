"""Compiling and linking the allocator test program (incremental: an object is rebuilt when its
command, its source or a header it read changed)."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping

from ...errors import LmsError
from ..tf_release import REPO, log_to
from .sources import (CONFORMANCE, OPTIONAL_TREE_SOURCES, TREE_CUDA_HEADERS, TREE_CUDA_SOURCES, TREE_HEADERS,
                      TREE_SOURCES, UPSTREAM_TEST)
from .upstream_test import adapt_upstream_test
from .wheel import DEFAULT_CACHE, ensure_wheel

__all__ = ["CUDA_HOME", "CXXFLAGS", "build", "compile_flags", "compile_job", "stage_tree"]

CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
log = log_to("tf_allocator")

CXXFLAGS = [
    "-std=c++17", "-O1", "-g0", "-fPIC", "-pthread",
    "-D_GLIBCXX_USE_CXX11_ABI=1",  # the wheel is built with the new ABI
    "-DEIGEN_MAX_ALIGN_BYTES=64",
    "-Wno-deprecated-declarations", "-Wno-sign-compare", "-Wno-attributes",
]


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.stdout.write(r.stdout[-20000:])
        raise LmsError(f"command failed ({r.returncode}): {' '.join(cmd[:3])} ... {cmd[-1]}")


def _dependencies(deps: Path) -> list[Path]:
    """The headers a make-style dependency file (``-MMD -MF``) lists."""
    if not deps.exists():
        return []
    words = deps.read_text().replace("\\\n", " ").split()
    return [Path(w) for w in words[2:]]  # after "obj.o:" and the source itself


def _compile_key(cmd: list[str], src: Path, deps: Path) -> str:
    """What an object depends on: its command, its source and the headers its last
    compilation read (a changed header recompiles every object that includes it)."""
    h = hashlib.sha256((" ".join(cmd)).encode() + src.read_bytes())
    for dep in _dependencies(deps):
        h.update(str(dep).encode())
        h.update(dep.read_bytes() if dep.exists() else b"(gone)")
    return h.hexdigest()


def compile_job(job: tuple[list[str], Path, Path]) -> str:
    cmd, src, obj = job
    # nvcc's own dependency options differ; the .cu sources include no header of ours
    tracked = Path(cmd[0]).name != "nvcc"
    deps = obj.with_suffix(".d")
    stamp = obj.with_suffix(".stamp")
    if (obj.exists() and stamp.exists() and (deps.exists() or not tracked)
            and stamp.read_text() == _compile_key(cmd, src, deps)):
        return f"up to date {obj.name}"
    deps.unlink(missing_ok=True)
    _run([*cmd, "-MMD", "-MF", str(deps)] if tracked else cmd)
    stamp.write_text(_compile_key(cmd, src, deps))
    return f"compiled {src.name}"


def stage_tree(tree: Path, overlay: Path, cuda_include: Path | None,
               overlay_src: Mapping[str, Path] | None) -> list[Path]:
    """Copy the tree's files the program needs into ``overlay`` (made afresh): the LMS ones from
    ``overlay_src`` when given (upstream path -> file), the CUDA ones only with ``cuda_include``, which
    is also linked where the sources include cuda.h from (third_party/gpus/cuda/include). Returns the
    copied .cc files."""
    def tree_file(rel: str) -> Path:
        # With overlay_src, the LMS files come from patches/ (what the exported patch adds); the
        # upstream files the edit series changes always come from the tree.
        if overlay_src is not None and rel in overlay_src:
            return overlay_src[rel]
        if (tree / rel).exists():
            return tree / rel
        raise LmsError(f"{rel}: not in {tree}" + (" nor among the LMS sources of patches/"
                                                  if overlay_src is not None else ""))

    if overlay.exists():
        shutil.rmtree(overlay)
    overlay.mkdir(parents=True)
    sources: list[Path] = []
    cuda_files = TREE_CUDA_HEADERS + TREE_CUDA_SOURCES if cuda_include is not None else []
    for rel in TREE_HEADERS + TREE_SOURCES + cuda_files:
        if (rel in OPTIONAL_TREE_SOURCES and not (overlay_src and rel in overlay_src)
                and not (tree / rel).exists()):
            continue
        dst = overlay / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tree_file(rel), dst)
        if rel.endswith(".cc"):
            sources.append(dst)
    if cuda_include is not None:
        link = overlay / "third_party" / "gpus" / "cuda" / "include"
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(cuda_include)
    return sources


def compile_flags(overlay: Path, include: Path, cuda_include: Path | None) -> list[str]:
    """The compiler flags of the program's sources: the staged tree, the conformance tests, the wheel's
    headers; with ``cuda_include``, GOOGLE_CUDA and the CUDA headers."""
    flags = CXXFLAGS + [f"-I{overlay}", f"-I{CONFORMANCE}", f"-I{include}"]
    if cuda_include is not None:
        flags += ["-DGOOGLE_CUDA=1", f"-I{cuda_include}"]
    return flags


def build(tree: Path, target: str = "cpu", out: Path | None = None,
          cache: Path = DEFAULT_CACHE, wheel: Path | None = None,
          overlay_src: Mapping[str, Path] | None = None, jobs: int | None = None,
          cuda_arch: str = "sm_90", tag: str | None = None) -> Path:
    """Builds the test program; returns its path. ``overlay_src`` (upstream path -> file, e.g.
    :func:`lms_sources`) gives the LMS files to take instead of the tree's; None: the tree's own
    (a tree the change was applied or composed into)."""
    if target not in ("cpu", "cuda"):
        raise LmsError(f"unknown target {target}")
    wheel_dir = ensure_wheel(cache, wheel, tag)
    include = wheel_dir / "tensorflow" / "include"
    so_dir = wheel_dir / "tensorflow"
    out = (out or (REPO / "build" / "tf_allocator" / target)).resolve()
    overlay = out / "overlay"
    objdir = out / "obj"
    objdir.mkdir(parents=True, exist_ok=True)
    cuda_include = CUDA_HOME / "include" if target == "cuda" else None
    sources = stage_tree(tree, overlay, cuda_include, overlay_src)
    upstream = tree / UPSTREAM_TEST
    adapted = overlay / "upstream_gpu_bfc_allocator_test.cc"
    adapted.write_text(adapt_upstream_test(upstream.read_text()))
    cxx = os.environ.get("CXX", "g++")
    common = compile_flags(overlay, include, cuda_include)
    jobs_list = []
    for src in sources:
        obj = objdir / (src.stem + ".o")
        jobs_list.append(([cxx, *common, "-c", str(src), "-o", str(obj)], src, obj))
    up_flags = ["-DGOOGLE_CUDA=1", "-DCUDA_VERSION=12000"]
    obj = objdir / "upstream_gpu_bfc_allocator_test.o"
    jobs_list.append(([cxx, *common, *up_flags, "-c", str(adapted), "-o", str(obj)], adapted, obj))
    support = "lms_test_support_cuda.cc" if target == "cuda" else "lms_test_support_cpu.cc"
    for name in ("lms_bfc_allocator_test.cc", "lms_failure_test.cc", "lms_cupti_search_test.cc",
                 "bfc_chunk_handle_table_test.cc", support):
        src = CONFORMANCE / name
        obj = objdir / (src.stem + ".o")
        jobs_list.append(([cxx, *common, "-c", str(src), "-o", str(obj)], src, obj))
    if target == "cuda":
        src = CONFORMANCE / "lms_test_kernels.cu"
        obj = objdir / "lms_test_kernels.o"
        jobs_list.append(([str(CUDA_HOME / "bin" / "nvcc"), "-O2", f"-arch={cuda_arch}",
                           "-Xcompiler", "-fPIC", "-c", str(src), "-o", str(obj)], src, obj))
    jobs = jobs or os.cpu_count() or 2
    log(f"compiling {len(jobs_list)} translation units for {target} (-j{jobs}) in {out}")
    with ThreadPoolExecutor(jobs) as pool:
        for msg in pool.map(compile_job, jobs_list):
            log(msg)
    objs = [str(j[2]) for j in jobs_list]

    binary = out / "tf_lms_allocator_test"
    link = [cxx, "-o", str(binary), *objs, "-pthread",
            f"-L{so_dir}", "-l:libtensorflow_framework.so.2",
            "-Wl,-rpath,$ORIGIN", f"-Wl,-rpath,{so_dir}",
            "-Wl,--allow-shlib-undefined",
            "/usr/lib/x86_64-linux-gnu/libgtest_main.a",
            "/usr/lib/x86_64-linux-gnu/libgtest.a", "-ldl", "-lrt"]
    if target == "cuda":
        stub = _cuda_driver_stub(objs, out)
        link += [str(CUDA_HOME / "lib64" / "libcudart_static.a"), f"-L{stub.parent}", "-l:libcuda.so.1"]
    log(f"linking {binary.name}")
    _run(link)
    shutil.copyfile(upstream, out / "upstream_gpu_bfc_allocator_test.orig.cc")
    return binary


def _cuda_driver_stub(objs: list[str], out: Path) -> Path:
    """The build machine has no GPU driver: link against a stub libcuda.so.1
    exporting the driver symbols the objects use (the real one is loaded on
    the GPU machine)."""
    names: set[str] = set()
    for o in objs:
        r = subprocess.run(["nm", "-u", o], stdout=subprocess.PIPE, text=True, check=True)
        names.update(m.group(1) for m in re.finditer(r"\bU (cu[A-Z]\w*)", r.stdout))
    stub_dir = out / "cuda_stub"
    stub_dir.mkdir(exist_ok=True)
    c = stub_dir / "stub.c"
    c.write_text("".join(f"void {n}(void) {{}}\n" for n in sorted(names)))
    so = stub_dir / "libcuda.so.1"
    _run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(so), str(c)])
    return so
