"""Overlay planning on the real v2.6.0 tree, and wrong inputs: clear messages, nothing in dist/."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from build_tools.errors import LmsError
from build_tools.overlay import OverlayRefused, WheelNotFound, build_overlay, plan_overlay

REPO = Path(__file__).resolve().parent.parent
TAG = "v2.6.0"


@pytest.fixture(scope="module")
def _worktree(upstream_repo, tmp_path_factory):
    from build_tools import gitutil
    repo, _ = upstream_repo("pytorch", TAG)
    wt = gitutil.add_worktree(repo, tmp_path_factory.mktemp("overlay-errors") / "tree", TAG)
    yield wt
    gitutil.remove_worktree(repo, wt)


@pytest.fixture
def scratch_tree(_worktree):
    """A private worktree of the real Debian v2.6.0 tree that a test may edit (reset to the tag
    before each test: one checkout for the module instead of one per test)."""
    from build_tools import gitutil
    gitutil.run(_worktree, "reset", "-q", "--hard", TAG)
    gitutil.run(_worktree, "clean", "-qfdx")
    return _worktree


def _edit(tree: Path, rel: str, text: str = "// lms test edit\n") -> None:
    p = tree / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text((p.read_text() if p.exists() else "") + text)


def test_plan_c10_cuda_and_python(scratch_tree):
    _edit(scratch_tree, "c10/cuda/CUDACachingAllocator.cpp")
    _edit(scratch_tree, "c10/cuda/NewLms.h", "#pragma once\n")
    _edit(scratch_tree, "torch/cuda/lms_test_only.py", "X = 1\n")
    _edit(scratch_tree, "test/test_cuda.py", "# test\n")
    plan = plan_overlay(scratch_tree, TAG)
    assert plan.rebuild == ["c10_cuda"]
    assert plan.python_files == ["torch/cuda/lms_test_only.py"]
    assert plan.headers == ["c10/cuda/NewLms.h"]
    assert plan.ignored == ["test/test_cuda.py"]


def test_plan_committed_changes_count(scratch_tree):
    from build_tools import gitutil
    _edit(scratch_tree, "c10/util/Logging.cpp")
    gitutil.run(scratch_tree, "add", "-A")
    gitutil.run(scratch_tree, "commit", "-q", "-m", "edit", env=gitutil.identity("2026-01-01T00:00:00+00:00"))
    plan = plan_overlay(scratch_tree, TAG)
    assert plan.rebuild == ["c10", "c10_cuda"]   # a c10 change rebuilds libc10 and what links it


def test_c10_change_outside_cuda_is_refused_without_static_cpuinfo(scratch_tree, tmp_path):
    """libc10.so would have to be rebuilt; the official one links cpuinfo statically, and only a
    shared libcpuinfo exists here (Debian), so the build stops before compiling anything."""
    import glob
    if glob.glob("/usr/lib/*/libcpuinfo.a"):
        pytest.skip("a static libcpuinfo.a is installed: libc10.so can be rebuilt on this machine")
    _edit(scratch_tree, "c10/util/Logging.cpp")
    from build_tools.overlay import OverlayError
    with pytest.raises(OverlayError) as e:
        build_overlay(TAG, scratch_tree, tmp_path / "dist", wheel_cache=tmp_path / "empty-cache")
    assert "libc10.so must be rebuilt" in str(e.value) and "MODE=full" in str(e.value)
    assert not (tmp_path / "empty-cache").exists()   # refused before downloading anything
    assert not (tmp_path / "dist").exists()


def _edit_package_data(tree: Path, entry: str) -> None:
    p = tree / "setup.py"
    text = p.read_text()
    anchor = '        "cuda/*.pyi",\n'
    assert text.count(anchor) == 1
    p.write_text(text.replace(anchor, anchor + entry))


def test_setup_py_adding_package_data_the_overlay_copies_is_no_obstacle(scratch_tree):
    _edit_package_data(scratch_tree, '        # a source compiled at run time and its headers\n'
                                     '        "cuda/lms_x.cpp",\n        "cuda/lms_x_*.h",\n')
    _edit(scratch_tree, "torch/cuda/lms_x.cpp", '// compiled on first use\n#include "lms_x_part.h"\n')
    _edit(scratch_tree, "torch/cuda/lms_x_part.h", "#pragma once\n")
    plan = plan_overlay(scratch_tree, TAG)
    assert plan.ignored == ["setup.py"] and plan.python_files == ["torch/cuda/lms_x.cpp",
                                                                  "torch/cuda/lms_x_part.h"]


@pytest.mark.parametrize("edit", [
    '        "lib/*.so",\n',                                 # files the overlay does not copy
    None,                                                    # an edit outside the list
])
def test_other_setup_py_edits_are_refused(scratch_tree, edit):
    if edit:
        _edit_package_data(scratch_tree, edit)
    else:
        _edit(scratch_tree, "setup.py", "# build something else\n")
    with pytest.raises(OverlayRefused, match="setup.py"):
        plan_overlay(scratch_tree, TAG)


def test_patch_needing_full_build_is_refused(scratch_tree, tmp_path):
    _edit(scratch_tree, "c10/cuda/CUDACachingAllocator.cpp")
    _edit(scratch_tree, "aten/src/ATen/native/Copy.cpp")
    _edit(scratch_tree, "torch/csrc/cuda/Module.cpp")
    dist = tmp_path / "dist"
    with pytest.raises(OverlayRefused) as e:
        build_overlay(TAG, scratch_tree, dist)
    msg = str(e.value)
    assert "aten/src/ATen/native/Copy.cpp" in msg and "torch/csrc/cuda/Module.cpp" in msg
    assert "make build TORCH=v2.6.0 MODE=full" in msg
    assert not dist.exists() or not any(dist.iterdir())


def test_unknown_tag(scratch_tree, tmp_path):
    dist = tmp_path / "dist"
    with pytest.raises(LmsError) as e:
        build_overlay("v9.9.9", scratch_tree, dist)
    assert "v9.9.9 is not supported" in str(e.value) and "v2.6.0" in str(e.value)
    assert not dist.exists()


def test_no_official_wheel_for_this_python(scratch_tree, tmp_path):
    """torch 1.4.0 (the last release IBM LMS covered) published no cp311 wheel: pip finds nothing and the build says so."""
    _edit(scratch_tree, "c10/cuda/CUDACachingAllocator.cpp")
    dist = tmp_path / "dist"
    with pytest.raises(WheelNotFound) as e:
        build_overlay(TAG, scratch_tree, dist, wheel_requirement="torch==1.4.0",
                      wheel_cache=tmp_path / "cache")
    msg = str(e.value)
    assert "no official wheel torch==1.4.0 for Python 3." in msg and "MODE=full" in msg
    assert not dist.exists() or not any(dist.iterdir())


def test_cli_errors_exit_2(scratch_tree, tmp_path):
    _edit(scratch_tree, "aten/src/ATen/native/Copy.cpp")
    r = subprocess.run([sys.executable, "-m", "build_tools.overlay", TAG, str(scratch_tree), "--dist",
                        str(tmp_path / "dist")], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and "MODE=full" in r.stderr
    r = subprocess.run([sys.executable, "-m", "build_tools.overlay", "--help"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0 and "--plan-only" in r.stdout


def test_abi_break_in_the_real_tree_is_refused(scratch_tree, tmp_path):
    """A deliberately ABI-breaking edit of the real c10/cuda (an exported function's signature
    changes) compiles fine, but the overlay build refuses it and leaves dist/ empty."""
    src = scratch_tree / "c10/cuda/CUDAMiscFunctions.cpp"
    hdr = scratch_tree / "c10/cuda/CUDAMiscFunctions.h"
    assert "get_cuda_check_suffix() noexcept" in hdr.read_text()
    for p in (src, hdr):
        p.write_text(p.read_text().replace("get_cuda_check_suffix() noexcept", "get_cuda_check_suffix(int verbose = 0) noexcept"))
    src.write_text(src.read_text().replace("get_cuda_check_suffix(int verbose = 0) noexcept", "get_cuda_check_suffix(int verbose) noexcept"))
    dist = tmp_path / "dist"
    from build_tools.abi import AbiError
    with pytest.raises(AbiError) as e:
        build_overlay(TAG, scratch_tree, dist, work_dir=tmp_path / "work")
    assert "_ZN3c104cuda21get_cuda_check_suffixEv" in str(e.value)
    assert not dist.exists() or not any(dist.iterdir())


def test_struct_layout_change_in_the_real_tree_is_refused(scratch_tree, tmp_path):
    """A member added in the middle of an exported c10/cuda struct (CUDAKernelLaunchInfo, returned
    by CUDAKernelLaunchRegistry::snapshot()) removes no symbol: abidiff sets only its "changed"
    bit (4), and reports the functions whose types changed. The type check refuses it."""
    hdr = scratch_tree / "c10/cuda/CUDADeviceAssertionHost.h"
    text = hdr.read_text()
    anchor = "  /// Device the kernel was launched on\n  int device;\n"
    assert anchor in text
    hdr.write_text(text.replace(anchor, anchor + "  uint64_t lms_test_member;\n"))
    dist = tmp_path / "dist"
    from build_tools.abi import AbiError
    with pytest.raises(AbiError) as e:
        build_overlay(TAG, scratch_tree, dist, work_dir=tmp_path / "work")
    msg = str(e.value)
    assert "type check" in msg and "changed" in msg and "CUDAKernelLaunch" in msg, msg
    assert not dist.exists() or not any(dist.iterdir())
