"""The eviction net's locking, on CPU: lms_swap_guard.cpp in its c10-only mode, built with
the CUDA runtime calls it makes stood in for (tests/lms_swap_net/fake_cuda_harness.cpp):
while one thread's eviction copies a slot, another thread must be able to register a slot
and read the counters (nothing waits under the net's lock: not the copy, not the wait for
host room that a thread holding the GIL could stall)."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sysconfig

import pytest

import torch  # a test dependency (pyproject.toml): missing, the module fails, it does not skip

REPO = pathlib.Path(__file__).resolve().parent.parent
GUARD_DIR = REPO / "lms-swap" / "src" / "lms_swap"  # lms_swap_guard.cpp
HARNESS = REPO / "tests" / "lms_swap_net" / "fake_cuda_harness.cpp"


def _cuda_include():
    """The CUDA runtime headers' folders (NVIDIA's wheels: the runtime's, and the crt/
    headers it includes)."""
    import sys
    dirs = []
    for base in sys.path:
        for sub in ("nvidia/cuda_runtime/include", "nvidia/cuda_nvcc/include",
                    "nvidia/cu13/include", "nvidia/cu12/include"):
            d = pathlib.Path(base) / sub
            if (d / "cuda_runtime_api.h").is_file() or (d / "crt" / "host_config.h").is_file():
                dirs.append(d)
    return dirs or None


def test_nothing_waits_under_the_nets_lock(tmp_path):
    if shutil.which("g++") is None:
        pytest.fail("no g++: the README's fresh-machine prerequisites include it")
    inc = _cuda_include()
    torch_dir = pathlib.Path(torch.__file__).parent
    if inc is None or not (torch_dir / "include" / "c10" / "cuda" / "CUDACachingAllocator.h").is_file():
        pytest.fail("needs the CUDA runtime headers (NVIDIA's runtime wheel) and torch's c10/cuda headers")
    stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    # CPU wheels of torch ship c10/cuda's headers but not this generated one
    if not (torch_dir / "include" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").is_file():
        (stub / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    exe = tmp_path / "net"
    lib = torch_dir / "lib"
    cmd = ["g++", "-std=c++17", "-O1", "-pthread", f"-I{tmp_path / 'stub'}", f"-I{GUARD_DIR}",
           *[f"-I{d}" for d in inc], "-isystem", str(torch_dir / "include"), str(HARNESS), f"-L{lib}", "-lc10",
           f"-Wl,-rpath,{lib}", "-o", str(exe)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-4000:]
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert not out["blocked_while_copying"], out
    assert out["freed"] >= 4 << 20 and out["evicted"] >= 1 and out["exact"], out
