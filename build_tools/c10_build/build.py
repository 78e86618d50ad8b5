"""build_c10: libc10.so / libc10_cuda.so of a PyTorch tree with CMake + ninja (modes: build_tools/c10_build)."""
from __future__ import annotations

import dataclasses
import glob
import os
import pathlib
from typing import Sequence

from ..progress import run_streamed, step
from ..tools import find_tool, interpreter_bin
from .inputs import C10BuildError, find_cudart, find_fmt_include, find_nvml_include, needs_nvml

__all__ = ["C10BuildResult", "build_c10"]

HERE = pathlib.Path(__file__).resolve().parent


@dataclasses.dataclass
class C10BuildResult:
    build_dir: pathlib.Path
    libraries: dict            # target name -> path of the built .so
    tests: list                # paths of built gtest binaries (tests=True)
    fmt_include: pathlib.Path | None
    cuda_include: pathlib.Path
    log: pathlib.Path          # full CMake + ninja output


def build_c10(
    tree: os.PathLike,
    build_dir: os.PathLike,
    *,
    cuda_home: os.PathLike = "/usr/local/cuda",
    targets: Sequence[str] = ("c10", "c10_cuda"),
    wheel_root: os.PathLike | None = None,
    cxx11_abi: int | None = None,
    extra_flags: Sequence[str] = (),
    fmt_include: os.PathLike | None = None,
    cpuinfo: tuple | None = None,
    nvml_include: os.PathLike | None = None,
    tests: bool = False,
    gtest_root: os.PathLike | None = None,
    jobs: int | None = None,
    build_type: str = "Release",
    cxx_compiler_launcher: str | None = None,
    c10_library: os.PathLike | None = None,
    defines: Sequence[str] = (),
    quiet: bool = True,
) -> C10BuildResult:
    """Configure and build c10 libraries of ``tree`` in ``build_dir``; return what was built.

    Args:
      tree: PyTorch source tree (the patched one), must contain ``c10/cuda/CUDACachingAllocator.cpp``.
      build_dir: CMake binary dir (created; reused incrementally on a second call).
      cuda_home: CUDA headers + libcudart (see module docstring).
      targets: subset of ("c10", "c10_cuda"). In wheel mode only "c10_cuda" is allowed.
      wheel_root: the ``torch/`` folder of an unpacked official wheel -> wheel mode: headers from
        ``wheel_root/include``, link against ``wheel_root/lib/libc10.so``.
      cxx11_abi: 0/1 for ``-D_GLIBCXX_USE_CXX11_ABI`` (must match the wheel; torch 2.6.0 wheels: 0).
      extra_flags: added to CMAKE_CXX_FLAGS (e.g. the wheel's own ``-O2 -fno-omit-frame-pointer``).
      fmt_include: directory holding ``fmt/format.h``; default: wheel include (wheel mode) or
        :func:`find_fmt_include`.
      cpuinfo: (include_dir, library) for c10's thread_pool.cpp; default Debian libcpuinfo-dev.
      nvml_include: directory holding nvml.h (default: see :func:`find_nvml_include`).
      tests: also build upstream's ``c10/cuda/test`` gtest binaries (needs nvcc and gtest).
      gtest_root: googletest source dir or install prefix (default: find_package(GTest)).
      jobs: ninja -j (default: CPU count).
      quiet: show ninja's progress every few seconds (stderr); False: every line of it.
      cxx_compiler_launcher: e.g. "ccache" or "sccache" (compiler caching).
      c10_library: tree mode with targets=("c10_cuda",): link against this already built libc10.so
        (e.g. to build a pristine libc10_cuda.so next to a patched one for an ABI comparison).
      defines: preprocessor definitions for every target incl. the gtests (C++ and CUDA), e.g.
        ("USE_CUDA",) turns on CUDA device-side assertions (TORCH_USE_CUDA_DSA). Official wheels
        compile c10_cuda WITHOUT USE_CUDA (CUDAKernelLaunchRegistry's layout depends on it), so
        the overlay build must not pass it.
    Raises:
      C10BuildError with the tail of the build log when configuring or compiling fails.
    """
    tree = pathlib.Path(tree).resolve()
    build_dir = pathlib.Path(build_dir).resolve()
    cuda_home = pathlib.Path(cuda_home).resolve()
    targets = tuple(targets)
    unknown = set(targets) - {"c10", "c10_cuda"}
    if unknown or not targets:
        raise C10BuildError(f"targets must be a non-empty subset of ('c10', 'c10_cuda'), got {targets}")
    if not (tree / "c10" / "cuda" / "CUDACachingAllocator.cpp").is_file():
        raise C10BuildError(f"{tree} is not a PyTorch tree (no c10/cuda/CUDACachingAllocator.cpp)")
    cmake, ninja = find_tool("cmake"), find_tool("ninja")
    for tool, exe in (("cmake", cmake), ("ninja", ninja)):
        if not exe:
            raise C10BuildError(f"{tool} not found in {interpreter_bin()} or on PATH "
                                "(`make setup` installs it into the virtualenv)")

    defs = {
        "C10_TREE": str(tree),
        "LMS_BUILD_C10": "ON" if "c10" in targets else "OFF",
        "LMS_BUILD_C10_CUDA": "ON" if "c10_cuda" in targets else "OFF",
        "LMS_BUILD_C10_CUDA_TESTS": "ON" if tests else "OFF",
        "CMAKE_BUILD_TYPE": build_type,
        # CMake looks for ninja on PATH only; the one setup installed may be in the venv's bin/.
        "CMAKE_MAKE_PROGRAM": ninja,
    }
    if c10_library is not None and wheel_root is None:
        if "c10" in targets:
            raise C10BuildError("c10_library= is for building c10_cuda alone (targets=('c10_cuda',))")
        defs["LMS_C10_LIBRARY"] = str(pathlib.Path(c10_library).resolve())
    elif "c10" not in targets and wheel_root is None:
        raise C10BuildError("building c10_cuda alone needs wheel_root= or c10_library=")
    if wheel_root is not None:
        wheel_root = pathlib.Path(wheel_root).resolve()
        if "c10" in targets:
            raise C10BuildError("wheel mode rebuilds c10_cuda only; libc10.so comes from the wheel")
        inc, lib = wheel_root / "include", wheel_root / "lib" / "libc10.so"
        if not (inc / "c10" / "macros" / "cmake_macros.h").is_file() or not lib.is_file():
            raise C10BuildError(f"{wheel_root} is not an unpacked torch wheel (include/c10, lib/libc10.so)")
        defs["LMS_WHEEL_INCLUDE"] = str(inc)
        defs["LMS_C10_LIBRARY"] = str(lib)
        if fmt_include is None and (inc / "fmt" / "format.h").is_file():
            fmt_include = inc
    if fmt_include is None:
        fmt_include = find_fmt_include()
    if fmt_include is None:
        raise C10BuildError("no fmt headers: apt-get install libfmt-dev, or pass fmt_include=<dir with fmt/format.h>")
    fmt_include = pathlib.Path(fmt_include)
    if fmt_include != pathlib.Path("/usr/include"):
        defs["LMS_FMT_INCLUDE"] = str(fmt_include)
    if "c10" in targets:
        if cpuinfo is None:
            lib = next(iter(sorted(glob.glob("/usr/lib/*/libcpuinfo.so*"))), None)
            if not lib or not pathlib.Path("/usr/include/cpuinfo.h").is_file():
                raise C10BuildError("c10 needs cpuinfo: apt-get install libcpuinfo-dev or pass cpuinfo=(include, lib)")
            cpuinfo = ("/usr/include", lib)
        defs["LMS_CPUINFO_INCLUDE"], defs["LMS_CPUINFO_LIBRARY"] = map(str, cpuinfo)
    if "c10_cuda" in targets:
        cuda_inc = cuda_home / "include"
        if not (cuda_inc / "cuda.h").is_file() or not (cuda_inc / "cuda_runtime_api.h").is_file():
            raise C10BuildError(f"{cuda_inc} lacks cuda.h / cuda_runtime_api.h")
        incs = [cuda_inc]
        if needs_nvml(tree):
            nvml = find_nvml_include(cuda_home, nvml_include)
            incs += [nvml] if nvml != cuda_inc else []
        # PyPI's nvidia-cuda-runtime-cu12 keeps crt/host_defines.h in nvidia-cuda-nvcc-cu12's include/
        crt = cuda_home.parent / "cuda_nvcc" / "include"
        if not (cuda_inc / "crt" / "host_defines.h").is_file():
            if not (crt / "crt" / "host_defines.h").is_file():
                raise C10BuildError(f"{cuda_inc} lacks crt/host_defines.h (unpack nvidia-cuda-nvcc-cu12 next to it)")
            incs.append(crt)
        defs["LMS_CUDA_INCLUDE"] = ";".join(map(str, incs))
        defs["LMS_CUDART_LIBRARY"] = str(find_cudart(cuda_home))
        if tests:
            nvcc = cuda_home / "bin" / "nvcc"
            if nvcc.exists():
                defs["CMAKE_CUDA_COMPILER"] = str(nvcc)
            defs.setdefault("CMAKE_CUDA_ARCHITECTURES", "native")
    if gtest_root:
        defs["LMS_GTEST_ROOT"] = str(gtest_root)
    if cxx11_abi is not None:
        defs["LMS_CXX11_ABI"] = str(int(cxx11_abi))
    if defines:
        defs["LMS_DEFINES"] = ";".join(defines)
    if extra_flags:
        defs["CMAKE_CXX_FLAGS"] = " ".join(extra_flags)
    if cxx_compiler_launcher:
        launcher = find_tool(cxx_compiler_launcher)
        if not launcher:
            raise C10BuildError(f"compiler launcher {cxx_compiler_launcher!r} not found")
        defs["CMAKE_CXX_COMPILER_LAUNCHER"] = launcher

    build_dir.mkdir(parents=True, exist_ok=True)
    log = build_dir / "c10_build.log"
    cfg = [cmake, "-G", "Ninja", "-S", str(HERE), "-B", str(build_dir)] + [f"-D{k}={v}" for k, v in defs.items()]
    bld = [cmake, "--build", str(build_dir), "--", f"-j{jobs or os.cpu_count() or 2}"]
    step(f"compiling {' and '.join(f'lib{t}.so' for t in targets)} of {tree} (CMake + ninja; log {log})")
    with open(log, "w") as fh:
        for cmd, label in ((cfg, "cmake configure"), (bld, "c10 compile")):
            fh.write("$ " + " ".join(cmd) + "\n")
            fh.flush()
            # ninja's "[n/total] ..." lines are passed through while it compiles (every one unless quiet)
            proc = run_streamed(cmd, label, log=fh, every=None if quiet else 0)
            if proc.returncode != 0:
                tail = "\n".join(proc.output.splitlines()[-60:])
                raise C10BuildError(f"cmake {cmd[1]} failed (rc={proc.returncode}); log {log}:\n{tail}")
    libs = {t: build_dir / f"lib{t}.so" for t in targets}
    for t, p in libs.items():
        if not p.is_file():
            raise C10BuildError(f"build finished but {p} is missing")
    # only this tree's tests (CMakeLists.txt: one c10_cuda_<name> per c10/cuda/test/impl source): a
    # build dir reused for another tree still holds that tree's binaries
    test_dir = tree / "c10" / "cuda" / "test" / "impl"
    names = {f"c10_cuda_{src.stem}" for src in test_dir.glob("*") if src.suffix in (".cu", ".cpp")}
    test_bins = sorted(p for p in build_dir.glob("c10_cuda_*")
                       if p.name in names and p.is_file() and os.access(p, os.X_OK))
    return C10BuildResult(build_dir, libs, test_bins, fmt_include, cuda_home / "include", log)
