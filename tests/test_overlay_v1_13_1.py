"""The second shipped PyTorch tag end to end on CPU: the overlay build of v1.13.1 (the Debian tree with
the current LMS sources composed on top) against the official torch==1.13.1 wheel (CUDA 11.7 headers
from NVIDIA's PyPI wheels), its ABI check, pip install into a fresh venv, import and the LMS API.

The v2.6.0 build is covered in depth by test_overlay_build.py / test_install_wheel.py; this module
checks what the second tag could break: the per-tag sources compile against 1.13.1's allocator, the
rebuilt libc10_cuda loads the wheel's own CUDA runtime, and torch.cuda's LMS API works there.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.overlay_fixtures import (DEPS_CACHE, PROBE, _record, _scratch, _venv, build_overlay_wheel, run_py,
                                    wheel_requirements)

REPO = Path(__file__).resolve().parent.parent
TAG = "v1.13.1"
_memo: dict = {}


@pytest.fixture(scope="module")
def build113(lms_tree):
    """(wheel, report dict, build log) of `python -m build_tools.overlay v1.13.1 <tree>`."""
    if "build" not in _memo:
        _memo["build"] = build_overlay_wheel(TAG, lms_tree("pytorch", TAG), "overlay_build_v1.13.1_s")
    return _memo["build"]


@pytest.fixture(scope="module")
def venv113(build113):
    wheel = build113[0]
    DEPS_CACHE.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(DEPS_CACHE),
                    *wheel_requirements(wheel)], check=True)
    py = _venv(_scratch() / "venv113")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(DEPS_CACHE),
                    str(wheel)], check=True)
    _record("pip_install_v1.13.1_s", time.monotonic() - t0)
    return py


def test_wheel_and_abi_report(build113):
    wheel, rep, log = build113
    assert wheel.name.startswith("torch-1.13.1+lms1-cp"), wheel.name
    assert rep["version"] == "1.13.1+lms1"
    assert rep["abi"]["c10_cuda"]["ok"] is True, rep["abi"]["c10_cuda"]["problems"]
    assert "ABI check: PASS" in log


def test_rebuilt_library_loads_the_wheels_own_cuda_runtime(build113):
    """torch 1.13.1 links the runtime into libc10_cuda statically and ships a hashed shared copy that
    its other libraries load; the rebuilt libc10_cuda must load that copy, not a system libcudart."""
    from build_tools.abi import dynamic_section
    wheel = build113[0]
    with zipfile.ZipFile(wheel) as zf:
        bundled = [Path(n).name for n in zf.namelist() if n.startswith("torch/lib/libcudart-")]
        lib = _scratch() / "libc10_cuda.so"
        lib.write_bytes(zf.read("torch/lib/libc10_cuda.so"))
    needed = dynamic_section(lib)["needed"]
    cudart = [n for n in needed if n.startswith("libcudart")]
    assert bundled and cudart == bundled[:1], (needed, bundled)


def test_installed_wheel_imports_with_the_lms_api(venv113):
    probe = run_py(venv113, PROBE)
    assert probe["version"] == "1.13.1+lms1"
    assert probe["cuda"] == "11.7"
    missing = [n for n, ok in probe["api"].items() if not ok]
    assert not missing, f"torch.cuda lacks {missing}"
    assert probe["lms_available"] is True
    rt = probe["roundtrip"]
    assert "error" not in rt, rt["error"]
    assert rt and all(rt.values()), rt


def test_lms_settings_through_the_v1_13_1_allocator_config(venv113):
    """PYTORCH_CUDA_ALLOC_CONF keys reach LMS through 1.13.1's own parser; a bad LMS key is refused
    with the list of LMS keys."""
    code = r"""
import json, torch
torch.cuda.memory._set_allocator_settings("lms:True,lms_limit_mb:1024,max_split_size_mb:64")
out = {"enabled": torch.cuda.get_enabled_lms(), "limit": torch.cuda.get_limit_lms()}
try:
    torch.cuda.memory._set_allocator_settings("lms_bogus:1")
    out["bad"] = None
except RuntimeError as e:
    out["bad"] = str(e)
print(json.dumps(out))
"""
    r = run_py(venv113, code)
    assert r["enabled"] is True and r["limit"] == 1024 << 20, r
    assert r["bad"] and "lms_bogus" in r["bad"] and "lms_limit_mb" in r["bad"], r
