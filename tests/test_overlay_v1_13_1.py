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
from tests.wheel_pythons import python_for

REPO = Path(__file__).resolve().parent.parent
TAG = "v1.13.1"
_memo: dict = {}


@pytest.fixture(scope="module")
def python113():
    """An interpreter torch 1.13.1 has a wheel for (3.10, 3.11): this one, else one on PATH; the
    tests skip with "no torch 1.13.1 wheel for Python 3.x" where the machine has none."""
    return python_for("torch", "1.13.1")


@pytest.fixture(scope="module")
def build113(lms_tree, python113):
    """(wheel, report dict, build log) of `python -m build_tools.overlay v1.13.1 <tree> --python ...`."""
    if "build" not in _memo:
        _memo["build"] = build_overlay_wheel(TAG, lms_tree("pytorch", TAG), "overlay_build_v1.13.1_s",
                                             python=None if python113 == sys.executable else python113)
    return _memo["build"]


@pytest.fixture(scope="module")
def venv113(build113, python113):
    wheel = build113[0]
    DEPS_CACHE.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    pyver = subprocess.run([python113, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(DEPS_CACHE),
                    "--python-version", pyver, *wheel_requirements(wheel)], check=True)
    py = _venv(_scratch() / "venv113", python113)
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


def test_activation_swapping_on_v1_13_1(venv113):
    """torch.cuda.lms_swap ships in the 1.13.1 wheel too: its eviction net needs allocator trace trackers
    that 1.13.1 lacks, so it is refused with that reason (not a compiler error) and swapping runs on its
    forecast alone; the swapping itself, run on CPU tensors with 1.13.1's autograd hooks, round-trips
    saved tensors bitwise."""
    code = r"""
import json, warnings, torch, torch.nn as nn
from torch.cuda import lms_swap
from torch.cuda.lms_swap import guard
out = {"reason": guard.unsupported_reason()}
try:
    guard.build_guard()
    out["build"] = None
except RuntimeError as e:
    out["build"] = str(e)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    out["loaded"] = guard.load_guard() is not None
    out["warned"] = [str(x.message) for x in w]

def train(ctx):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                          nn.Flatten(), nn.Linear(8 * 16 * 16, 10))
    x = torch.randn(8, 3, 16, 16).to(memory_format=torch.channels_last)
    with ctx:
        loss = model(x).square().mean()
    loss.backward()
    return [loss.detach()] + [p.grad for p in model.parameters()]

import contextlib
sw = lms_swap.ActivationSwapper(device_type="cpu", policy="always", size_threshold=4096,
                                host_limit=64 << 20, host_min_available=0)
a, b = train(contextlib.nullcontext()), train(sw)
out["equal"] = all(torch.equal(u, v) for u, v in zip(a, b))
s = sw.stats()
out["out_count"], out["in_bytes"], out["out_bytes"] = s["swap.out_count"], s["swap.in_bytes"], s["swap.out_bytes"]
print(json.dumps(out))
"""
    r = run_py(venv113, code)
    assert r["reason"] and "trace trackers" in r["reason"] and "1.13.1" in r["reason"], r
    assert r["build"] == r["reason"], r
    assert r["loaded"] is False and any("trace trackers" in w for w in r["warned"]), r
    assert r["equal"] is True, r
    assert r["out_count"] > 0 and r["in_bytes"] == r["out_bytes"] > 0, r
