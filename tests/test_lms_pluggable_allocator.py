"""The pluggable LMS allocator (lms_swap.allocator) without a GPU: its free lists', expandable
segments' and page walks' logic (C++ drivers in tests/lms_pluggable/), every translation unit compiling
against this torch's headers with the flags the run-time build uses, the core staged from
patches/ as one copy, and its refusals.  The allocator on a GPU:
tests/conformance/lms_swap/test_lms_pluggable_allocator_gpu.py."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "lms-swap" / "src" / "lms_swap"
sys.path.insert(0, str(ROOT / "lms-swap" / "src"))

torch = pytest.importorskip("torch")
from lms_swap import allocator, allocator_build, allocator_sources  # noqa: E402
from lms_swap.net_toolchain import cpu_only_reason, nvml_include_dirs  # noqa: E402

CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler")


def _headers_or_skip() -> list:
    from lms_swap.net_toolchain import cuda_include_dirs
    if not cuda_include_dirs():
        pytest.skip("no CUDA headers (make setup installs NVIDIA's header wheels)")
    return cuda_include_dirs()


def _driver_checks(tmp_path, driver: str, units, include_core: bool = False) -> list:
    """Compiles tests/lms_pluggable/<driver>.cpp with the allocator's `units` (names after
    lms_pluggable_) and runs it: its check lines, every one of them "ok" and the exit status 0
    (a compile error fails the test with the compiler's output)."""
    includes = _headers_or_skip()
    exe = tmp_path / "driver"
    core = [f"-I{ROOT / 'patches' / 'pytorch' / 'src'}"] if include_core else []
    c = subprocess.run([CXX, "-std=c++17", "-O1", "-Wall", "-Werror", f"-I{PKG}", *core,
                        *[f"-I{d}" for d in includes],
                        str(ROOT / "tests" / "lms_pluggable" / f"{driver}.cpp"),
                        *[str(PKG / f"lms_pluggable_{u}.cpp") for u in units], "-o", str(exe)],
                       capture_output=True, text=True)
    assert c.returncode == 0, c.stderr[-3000:]
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    lines = p.stdout.splitlines()
    failed = [x for x in lines if not x.startswith("ok ")]
    assert p.returncode == 0 and not failed, p.stdout + p.stderr
    return lines


@needs_cxx
def test_free_blocks_fit_cut_and_merge_per_stream(tmp_path):
    lines = _driver_checks(tmp_path, "free_blocks_driver", ("free_blocks", "block_walks"))
    assert len(lines) == 35, lines


@needs_cxx
def test_expandable_segments_keep_blocks_and_pages_in_step(tmp_path):
    """ExpandableSegments over a stand-in for the driver's pages (no GPU): 4,000 random
    allocations, frees, moves of a block's pages to the host and releases under a device
    budget (of every free page, or part way: largest_free_pages takes the largest runs' end
    pages and no page more than asked), the layout checked after each (blocks cover the
    segments, unmapped blocks are whole pages with nothing mapped, no page is mapped or
    unmapped twice or under a live block, the free lists hold the free blocks), a freed block's
    whole pages on the host go back to the host pool before it is listed, a release made for a
    request leaves the free run it grows into (what new_bytes predicts it maps is the same
    after the release as before), the bytes new_bytes predicts are what grow maps, and at the
    end nothing stays mapped."""
    lines = _driver_checks(tmp_path, "expandable_driver",
                           ("expandable", "block_walks", "free_blocks"))
    assert len(lines) == 8, lines


@needs_cxx
def test_the_pages_the_core_may_move_and_the_busiest_page(tmp_path):
    """The walks the core asks for on hand-made segments (no GPU): a device page is listed
    only when every allocated block on it is at least the floor and none waits for an event,
    with the newest allocation's clock and every stream that may use it; host pages come back
    whatever lies on them; unmapped pages and the small pool's are never listed; the busiest
    large page sums allocated bytes per page size."""
    lines = _driver_checks(tmp_path, "page_walks_driver", ("page_walks",), include_core=True)
    assert len(lines) == 11, lines


@needs_cxx
def test_every_unit_compiles_against_this_torchs_headers(tmp_path):
    """The allocator's own units and the core's, with the include paths and flags of the
    run-time build (a CPU-only torch lacks one generated header, which only says how c10_cuda
    was linked: it is supplied here)."""
    _headers_or_skip()
    if not nvml_include_dirs():
        pytest.skip("no nvml.h (make setup installs nvidia-nvml-dev-cu12)")
    from torch.utils import cpp_extension
    tree = allocator_sources.core_tree(str(PKG), str(tmp_path / "core"))
    includes, cflags, _ = allocator_build.compile_flags(tree)
    stub = tmp_path / "stub"
    if cpu_only_reason():
        (stub / "c10/cuda/impl").mkdir(parents=True)
        (stub / "c10/cuda/impl/cuda_cmake_macros.h").write_text("#define C10_CUDA_BUILD_SHARED_LIBS\n")
    import sysconfig
    std = "-std=c++20" if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 10) \
        else "-std=c++17"
    flags = [std, "-fsyntax-only", "-Wall", "-Werror", "-Wno-unused-function",
             "-DTORCH_EXTENSION_NAME=lms_pluggable_check", *cflags,
             *[f"-I{d}" for d in includes + cpp_extension.include_paths()],
             f"-I{sysconfig.get_paths()['include']}", f"-I{stub}"]
    units = allocator_build.sources(tree)
    assert [pathlib.Path(u).name for u in units[:8]] == [
        "lms_pluggable_allocator.cpp", "lms_pluggable_block_walks.cpp",
        "lms_pluggable_expandable.cpp", "lms_pluggable_free_blocks.cpp",
        "lms_pluggable_module.cpp", "lms_pluggable_page_walks.cpp",
        "lms_pluggable_pending_frees.cpp", "lms_pluggable_segments.cpp"]
    for unit in units:
        p = subprocess.run([CXX, *flags, unit], capture_output=True, text=True)
        errors = [x for x in p.stderr.splitlines() if "error" in x or
                  ("warning" in x and str(PKG) in x) or ("warning" in x and tree in x)]
        assert p.returncode == 0 and not errors, f"{unit}:\n{p.stderr[-3000:]}"


def test_the_core_is_staged_from_patches_byte_for_byte(tmp_path):
    tree = allocator_sources.core_tree(str(PKG), str(tmp_path / "core"))
    for inside, source in allocator_sources.CORE_FILES.items():
        assert (pathlib.Path(tree) / inside).read_bytes() == (ROOT / source).read_bytes(), inside
    # every translation unit of the patched build's LMS core that needs no Block is compiled
    units = sorted(pathlib.Path(u).name for u in allocator_sources.core_sources(tree))
    impl = sorted(p.name for p in (ROOT / "patches/pytorch/src/c10/cuda/impl").glob("*.cpp"))
    assert units == sorted(impl + ["CUDALargeModelSupport.cpp"])


def test_without_a_checkout_or_a_staged_core_it_says_where_it_looked(tmp_path):
    pkg = tmp_path / "site" / "lms_swap"
    pkg.mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as e:
        allocator_sources.core_tree(str(pkg), str(tmp_path / "scratch"))
    assert "allocator_core" in str(e.value) and "checkout" in str(e.value)


def test_a_cpu_only_torch_is_refused_with_the_reason():
    if not cpu_only_reason():
        pytest.skip("a CUDA build of torch")
    reason = allocator.refusal()
    assert "CPU-only build" in reason and "pluggable allocator" in reason
    with pytest.raises(RuntimeError, match="cannot be built: .*CPU-only"):
        allocator.build()


def test_the_patched_build_does_not_carry_the_pluggable_allocator():
    sys.path.insert(0, str(ROOT))
    from build_tools import catalog
    placed = catalog.source_map(catalog.framework("pytorch"), "v2.6.0")
    mine = [rel for rel in placed if "pluggable" in rel or rel.endswith("/allocator.py")
            or rel.endswith("allocator_sources.py") or rel.endswith("allocator_build.py")]
    assert mine == [], mine
    assert "torch/cuda/lms_swap/swapper.py" in placed
