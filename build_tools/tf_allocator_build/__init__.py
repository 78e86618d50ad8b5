"""Standalone build of TensorFlow's BFC allocator with Large Model Support.

A full TensorFlow build (bazel, pinned dependencies, hours) is impossible on
the project's machines, so the LMS allocator is proven on its own: the patched
allocator translation units of the v2.14.1 tree are compiled against the
official ``tensorflow-cpu==2.14.1`` wheel's ``tensorflow/include/`` and linked
with its ``libtensorflow_framework.so.2`` into one gtest program holding

* TensorFlow's own BFC allocator tests
  (``tensorflow/core/common_runtime/gpu/gpu_bfc_allocator_test.cc`` of the
  tree, adapted by :func:`adapt_upstream_test` only as much as a standalone
  build needs), and
* the LMS conformance tests (``tests/conformance/tensorflow_allocator``).

Targets: ``cpu`` (host memory: memfd page backend) and ``cuda`` (CUDA VMM page
backend and GPU kernels; built here with nvcc, run on the GPU machine).
"""

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

from ..archives import extract_zip

REPO = Path(__file__).resolve().parents[2]
TF_VERSION = "2.14.1"
TAG = "v" + TF_VERSION
# tensorflow-cpu 2.14.1 publishes CPython 3.9-3.11 wheels. The running Python's is used (the
# Python check installs it into a venv made from this interpreter); any of them has the same
# headers and library, so other Pythons take the 3.11 one for the allocator build.
TF_PYTHONS = ("3.9", "3.10", "3.11")
PY_VERSION = "%d.%d" % sys.version_info[:2]
WHEEL_PY = PY_VERSION if PY_VERSION in TF_PYTHONS else "3.11"
WHEEL_GLOB = f"tensorflow_cpu-{TF_VERSION}-cp{WHEEL_PY.replace('.', '')}-cp{WHEEL_PY.replace('.', '')}-manylinux*.whl"
DEFAULT_CACHE = REPO / ".cache" / "tf_allocator"
CONFORMANCE = REPO / "tests" / "conformance" / "tensorflow_allocator"
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))

# Files of the (LMS) tree the program needs.
TREE_HEADERS = [
    "tensorflow/tsl/framework/bfc_allocator.h",
    "tensorflow/tsl/framework/bfc_chunk_handle_table.h",
    "tensorflow/tsl/framework/lms_sub_allocator.h",
    "tensorflow/core/common_runtime/gpu/gpu_bfc_allocator.h",
    "tensorflow/core/common_runtime/gpu/gpu_lms_page_backend.h",
    # the launch gate's core (patches/shared/, placed by patches/tensorflow/shared.toml): included
    # by the CUDA page backend, and by lms_cupti_search_test.cc on both targets
    "tensorflow/core/common_runtime/gpu/gpu_lms_launch_gate_core.inc",
]
TREE_SOURCES = [
    "tensorflow/tsl/framework/bfc_allocator.cc",
    "tensorflow/tsl/framework/bfc_allocator_lms.cc",
    "tensorflow/tsl/framework/bfc_chunk_handle_table.cc",
    "tensorflow/tsl/framework/lms_page_moves.cc",
    "tensorflow/tsl/framework/lms_posix_page_backend.cc",
    "tensorflow/tsl/framework/lms_settings.cc",
    "tensorflow/tsl/framework/lms_sub_allocator.cc",
    "tensorflow/core/common_runtime/gpu/gpu_bfc_allocator.cc",
]
# LMS files an older tree (a patch from before they were split out) lacks: skipped when absent, so
# that the new tests can be built against the old code to show them failing there.
OPTIONAL_TREE_SOURCES = {"tensorflow/tsl/framework/lms_page_moves.cc",
                         "tensorflow/tsl/framework/lms_settings.cc"}
TREE_CUDA_HEADERS: list[str] = []
TREE_CUDA_SOURCES = ["tensorflow/core/common_runtime/gpu/gpu_lms_page_backend.cc"]
UPSTREAM_TEST = "tensorflow/core/common_runtime/gpu/gpu_bfc_allocator_test.cc"

CXXFLAGS = [
    "-std=c++17", "-O1", "-g0", "-fPIC", "-pthread",
    "-D_GLIBCXX_USE_CXX11_ABI=1",  # the wheel is built with the new ABI
    "-DEIGEN_MAX_ALIGN_BYTES=64",
    "-Wno-deprecated-declarations", "-Wno-sign-compare", "-Wno-attributes",
]


def log(msg: str) -> None:
    print(f"[tf_allocator_build] {msg}", flush=True)


def lms_sources(tag: str = TAG) -> dict[str, Path]:
    """The LMS files the exported patch adds, by upstream path -> file in patches/: the layers of
    ``catalog.source_map`` (patches/tensorflow/src/, the patches/shared/ files that
    patches/tensorflow/shared.toml places, patches/tensorflow/<tag>/src/)."""
    from .. import catalog
    return catalog.source_map(catalog.framework("tensorflow"), tag)


# --------------------------------------------------------------------------
# The wheel.
def wheel_pins() -> dict[str, str]:
    """{official wheel file name: sha256} of patches/tensorflow/<TAG>/profile.toml."""
    from .. import catalog
    return catalog.profile(catalog.framework("tensorflow"), TAG).wheel_sha256


def wheel_file(cache: Path, py_version: str = WHEEL_PY) -> Path:
    """The tensorflow-cpu wheel for CPython ``py_version`` (default WHEEL_PY) in ``cache``
    (downloaded once with pip, whatever Python runs this: the tools' one wheel downloader, which
    checks it against the profile's pinned sha256 on every call, cached or not)."""
    from ..wheels import fetch_wheel
    return fetch_wheel(f"tensorflow-cpu=={TF_VERSION}", python_version=py_version, cache_dir=cache,
                       pins=wheel_pins(), progress=log)


def ensure_wheel(cache: Path, wheel: Path | None = None) -> Path:
    """Returns a folder holding the wheel's ``include/`` and
    ``libtensorflow_framework.so.2`` (downloaded once with pip, cached). A wheel the caller
    names is checked against the profile's pins as a downloaded one is (and left alone if it
    does not match)."""
    out = cache / f"wheel-{TF_VERSION}"
    marker = out / ".complete"
    if marker.exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    if wheel:
        from ..wheels import check_pin
        check_pin(wheel, wheel_pins(), discard=False, progress=log)
    else:
        wheel = wheel_file(cache)
    log(f"extracting headers and libtensorflow_framework.so.2 from {wheel.name}")
    if out.exists():
        shutil.rmtree(out)
    extract_zip(wheel, out, select=lambda n: n if n.startswith("tensorflow/include/")
                or n == "tensorflow/libtensorflow_framework.so.2" else None)
    marker.write_text(wheel.name + "\n")
    return out


# --------------------------------------------------------------------------
# The upstream test, adapted.
def _cut(text: str, start: str, end: str, replacement: str) -> str:
    i = text.find(start)
    j = text.find(end, i + 1)
    if i < 0 or j < 0:
        raise SystemExit(f"upstream test: anchor not found: {start!r} .. {end!r}")
    return text[:i] + replacement + text[j:]


def adapt_upstream_test(text: str) -> str:
    """The only changes made to TensorFlow's gpu_bfc_allocator_test.cc:

    1. StreamExecutor/GPU-device includes and ``using`` lines are dropped (they
       need the GPU runtime of a full build); ``lms_test_support.h`` is added.
    2. The two sub-allocator factories (``CreateVirtualMemorySubAllocator`` =
       GpuVirtualMemAllocator, ``CreateGPUMemAllocator`` = DeviceMemAllocator)
       are replaced by the standalone equivalents: the page-mapped LMS
       sub-allocator with LMS off (contiguous, coalescing, like
       GpuVirtualMemAllocator) and a plain non-coalescing allocator (mmap on
       the CPU, cuMemAlloc on the GPU).
    3. The BM_* benchmarks are dropped (they need google-benchmark).
    Every TEST/TEST_P/TEST_F body is compiled unchanged; the file is compiled
    with GOOGLE_CUDA=1 and CUDA_VERSION=12000 so the VMM tests are included.
    """
    drop_lines = [
        '#include "tensorflow/compiler/xla/stream_executor/device_id_utils.h"',
        '#include "tensorflow/compiler/xla/stream_executor/gpu/gpu_driver.h"',
        '#include "tensorflow/compiler/xla/stream_executor/gpu/gpu_init.h"',
        '#include "tensorflow/compiler/xla/stream_executor/stream_executor.h"',
        '#include "tensorflow/core/common_runtime/device/device_mem_allocator.h"',
        '#include "tensorflow/core/common_runtime/gpu/gpu_virtual_mem_allocator.h"',
        '#include "tensorflow/tsl/platform/test_benchmark.h"',
        "using stream_executor::DeviceIdUtil;",
        "using stream_executor::GPUMachineManager;",
        "using tensorflow::DeviceMemAllocator;",
    ]
    for line in drop_lines:
        if text.count(line + "\n") != 1:
            raise SystemExit(f"upstream test: expected line not found once: {line}")
        text = text.replace(line + "\n", "")
    text = text.replace(
        '#include "tensorflow/core/common_runtime/gpu/gpu_bfc_allocator.h"\n',
        '#include "tensorflow/core/common_runtime/gpu/gpu_bfc_allocator.h"\n'
        '#include "lms_test_support.h"  // standalone sub-allocators\n', 1)
    text = _cut(
        text,
        "#if CUDA_VERSION >= 10020\nstd::unique_ptr<SubAllocator> CreateVirtualMemorySubAllocator(",
        "std::unique_ptr<SubAllocator> CreateSubAllocator(",
        "// [standalone build] sub-allocators from lms_test_support.h\n"
        "std::unique_ptr<SubAllocator> CreateVirtualMemorySubAllocator(\n"
        "    size_t virtual_address_space_size = 1ull << 32) {\n"
        "  return lms_test::VmmSubAllocator(virtual_address_space_size);\n"
        "}\n\n"
        "std::unique_ptr<SubAllocator> CreateGPUMemAllocator(size_t s) {\n"
        "  return lms_test::PlainSubAllocator(s);\n"
        "}\n\n")
    text = _cut(
        text, "static void BM_Allocation(",
        "}  // namespace\n\nclass GPUBFCAllocatorPrivateMethodsTest",
        "// [standalone build] BM_* benchmarks dropped (google-benchmark).\n\n")
    return text


# --------------------------------------------------------------------------
# Compilation.
def _run(cmd: list[str], cwd: Path | None = None) -> None:
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.stdout.write(r.stdout[-20000:])
        raise SystemExit(f"command failed ({r.returncode}): {' '.join(cmd[:3])} ... {cmd[-1]}")


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


def _compile(job: tuple[list[str], Path, Path]) -> str:
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


def build(tree: Path, target: str = "cpu", out: Path | None = None,
          cache: Path = DEFAULT_CACHE, wheel: Path | None = None,
          overlay_src: Mapping[str, Path] | None = None, jobs: int | None = None,
          cuda_arch: str = "sm_90") -> Path:
    """Builds the test program; returns its path. ``overlay_src`` (upstream path -> file, e.g.
    :func:`lms_sources`) gives the LMS files to take instead of the tree's; None: the tree's own
    (a tree the change was applied or composed into)."""
    if target not in ("cpu", "cuda"):
        raise SystemExit(f"unknown target {target}")
    wheel_dir = ensure_wheel(cache, wheel)
    include = wheel_dir / "tensorflow" / "include"
    so_dir = wheel_dir / "tensorflow"
    out = (out or (REPO / "build" / "tf_allocator" / target)).resolve()
    overlay = out / "overlay"
    objdir = out / "obj"
    if overlay.exists():
        shutil.rmtree(overlay)
    overlay.mkdir(parents=True)
    objdir.mkdir(parents=True, exist_ok=True)

    def tree_file(rel: str) -> Path:
        # With overlay_src, the LMS files come from patches/ (what the exported patch adds); the
        # upstream files the edit series changes always come from the tree.
        if overlay_src is not None and rel in overlay_src:
            return overlay_src[rel]
        if (tree / rel).exists():
            return tree / rel
        raise SystemExit(f"{rel}: not in {tree}" + (" nor among the LMS sources of patches/"
                                                    if overlay_src is not None else ""))

    sources: list[Path] = []
    cuda_files = TREE_CUDA_HEADERS + TREE_CUDA_SOURCES if target == "cuda" else []
    for rel in TREE_HEADERS + TREE_SOURCES + cuda_files:
        if (rel in OPTIONAL_TREE_SOURCES and not (overlay_src and rel in overlay_src)
                and not (tree / rel).exists()):
            continue
        dst = overlay / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tree_file(rel), dst)
        if rel.endswith(".cc"):
            sources.append(dst)
    upstream = tree / UPSTREAM_TEST
    adapted = overlay / "upstream_gpu_bfc_allocator_test.cc"
    adapted.write_text(adapt_upstream_test(upstream.read_text()))
    if target == "cuda":
        cuda_inc = overlay / "third_party" / "gpus" / "cuda" / "include"
        cuda_inc.parent.mkdir(parents=True, exist_ok=True)
        cuda_inc.symlink_to(CUDA_HOME / "include")

    cxx = os.environ.get("CXX", "g++")
    common = CXXFLAGS + [f"-I{overlay}", f"-I{CONFORMANCE}", f"-I{include}"]
    if target == "cuda":
        common += ["-DGOOGLE_CUDA=1", f"-I{CUDA_HOME / 'include'}"]
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
        for msg in pool.map(_compile, jobs_list):
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


def run_tests(binary: Path, gtest_filter: str | None = None,
              xml: Path | None = None, env: dict | None = None) -> int:
    cmd = [str(binary)]
    if gtest_filter:
        cmd.append(f"--gtest_filter={gtest_filter}")
    if xml:
        cmd.append(f"--gtest_output=xml:{xml}")
    log("running " + " ".join(cmd))
    return subprocess.run(cmd, env={**os.environ, **(env or {})}).returncode


# The LMS tests the program holds (CONFORMANCE / lms_bfc_allocator_test.cc and
# bfc_chunk_handle_table_test.cc), every one of which must pass wherever the program runs: on the
# CPU (tests/test_tensorflow_allocator.py) and on a GPU (tests/conformance/tensorflow_allocator).
# A test dropped from the build fails both.
LMS_TESTS = (
    "AllowGrowthAndGc/LmsOversubscription.TwiceTheDeviceServedWithLmsBytesIntact/0",
    "AllowGrowthAndGc/LmsOversubscription.TwiceTheDeviceServedWithLmsBytesIntact/1",
    "AllowGrowthAndGc/LmsOversubscription.TwiceTheDeviceServedWithLmsBytesIntact/2",
    "AllowGrowthAndGc/LmsOversubscription.TwiceTheDeviceServedWithLmsBytesIntact/3",
    "LmsBfc.TwiceTheDeviceRefusedWithoutLms",
    "LmsBfc.SpilledDataUsableInPlaceAndBroughtBack",
    "LmsBfc.TouchChangesTheVictim",
    "LmsBfc.DefragRemapsFreePagesWithoutMovingTensors",
    "LmsBfc.FragmentationWithoutDefragHintsToEnableIt",
    "LmsBfc.FragmentationWithoutDefragIsServedBySpilling",
    "LmsBfc.HostLimitErrorNamesTheVariable",
    "LmsBfc.AFailedPageMoveLosesNothing",
    "LmsBfc.RandomWorkloadBytesIntact",
    "LmsBfc.BackwardFreesReturnSpilledDataInBatches",
    "HostPagesMadeAhead/LmsBandwidth.SpillAndReturnBandwidth/0",
    "HostPagesMadeAhead/LmsBandwidth.SpillAndReturnBandwidth/1",
    "LmsBfc.PageAndReserveSettings",
    "LmsBfc.SpillAtTheHostLimitWaitsForThePageBeingMade",
    "LmsBfc.HostPagesMadeAheadWithinTheHostBudget",
    "LmsBfc.PlainSubAllocatorKeepsLmsOff",
    "LmsBfc.WritersOnOtherThreadsWhilePagesMove",
    "BfcChunkHandleTable.OnlyWrittenSlotsTakeMemoryAndGrowthKeepsThem",
    "BfcChunkHandleTable.MappedWithoutReservingSwap",
    "LmsFailure.NoGateRefusesToMovePagesOfLiveTensors",
    "LmsFailure.DoubleFaultDuringAMoveSharesNoPage",
    "LmsFailure.FailedPageCreationFailsTheAllocationNotTheProcess",
    "LmsFailure.FailedSwapInReportsTheErrorAndLosesNothing",
    "LmsFailure.GarbageCollectionUnmapsInAQuietScope",
    "LmsFailure.HostMemLimitBadNegativeAndHugeValues",
    "LmsFailure.PinnedHostPagesGivenBackAfterASpike",
    "LmsLaunchGate.FindsCuptiWherePipAndTheToolkitPutIt",
)
# gtest skips the writers test where the launch gate is inactive
WRITERS_TEST = "LmsBfc.WritersOnOtherThreadsWhilePagesMove"


def gtest_results(xml: Path) -> dict:
    """{"Suite.Test": "failed" or gtest's result/status} from a --gtest_output=xml report."""
    import xml.etree.ElementTree as ET
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        out[f"{case.get('classname')}.{case.get('name')}"] = (
            "failed" if failed else case.get("result", case.get("status")))
    return out
