"""GPU tests of the eviction net's edges: its host budget from the first byte, a pluggable
allocator, a tensor written on a side stream, an in-place change after the saved
tensor's Python object is gone.  Run on the GPU machine:
python -m pytest -m gpu tests/conformance/lms_swap/test_lms_swap_net_hazards.py
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.gpu_requirements import missing

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]
MiB = 1 << 20


@pytest.fixture
def cuda_only():
    if not torch.cuda.is_available():
        missing("CUDA not available")


def _last_json(p):
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_first_step_that_needs_2x_stays_under_a_small_host_limit(cuda_only):
    """The net has its host budget when it is armed: a first step that needs 2x what fits,
    under a host limit far below what it would move, trains or ends in an out-of-memory
    error, and the host bytes the net and the pool held never went over the limit."""
    torch.cuda.empty_cache()
    limit_mb = 2048
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
               PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB=str(limit_mb))
    p = subprocess.run([sys.executable, str(HERE / "forecast_wrong.py"), "first2x"], env=env,
                       capture_output=True, text=True, timeout=600)
    out = _last_json(p)
    st = out["stats"]
    assert out["result"] in ("trained", "oom"), out
    if out["result"] == "trained":
        assert out["bitwise_equal"], out
    assert st["guard.active"] == 1, st
    assert 0 < st["guard.host_peak"] <= limit_mb * MiB, st


@pytest.mark.parametrize("layers,trains", [(16, True), (40, False)], ids=["within", "over"])
def test_torture_a_first_step_at_2x_under_a_16_gib_host_limit(cuda_only, layers, trains):
    """A first step that needs twice what fits, under a 16 GiB host limit: with half its
    saved tensors (8 GiB) within the limit it trains bit for bit; with them over it (20 GiB)
    it ends in LMSHostMemoryError.  Either way the host memory the process touched (the
    kernel's resident-set peak) grew by no more than the limit and 1 GiB of the process's
    own, and the process was not killed."""
    torch.cuda.empty_cache()
    limit_mb = 16384
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
               PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB=str(limit_mb))
    p = subprocess.run([sys.executable, str(HERE / "host_limit_torture.py"), str(layers)], env=env,
                       capture_output=True, text=True, timeout=600)
    out = _last_json(p)  # exit status 0: neither a crash nor the kernel's OOM killer
    print(json.dumps({k: v for k, v in out.items() if k != "error"}))
    st = out["stats"]
    assert st["guard.active"] == 1, st
    assert st["guard.host_peak"] <= limit_mb * MiB, st
    assert out["rss_added_gib"] <= limit_mb / 1024 + 1, out
    if trains:
        assert out["result"] == "trained" and out["bitwise_equal"], out
    else:
        assert out["result"] == "LMSHostMemoryError", out
        assert "PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB" in out["error"], out


PLUGGABLE_C = r"""
#include <cuda_runtime_api.h>
#include <sys/types.h>
extern "C" {
void* lms_test_malloc(ssize_t size, int device, cudaStream_t stream) {
  void* p = nullptr;
  if (cudaMalloc(&p, size) != cudaSuccess) return nullptr;
  return p;
}
void lms_test_free(void* ptr, ssize_t size, int device, cudaStream_t stream) { cudaFree(ptr); }
}
"""

PLUGGABLE_PY = r"""
import json, sys, warnings
import torch
so = sys.argv[1]
alloc = torch.cuda.memory.CUDAPluggableAllocator(so, "lms_test_malloc", "lms_test_free")
torch.cuda.memory.change_current_allocator(alloc)
sys.path.insert(0, sys.argv[2])
from swap_package import import_lms_swap
lms = import_lms_swap()

def run(ctx):
    torch.manual_seed(0)
    x = torch.randn(2048, 2048, device="cuda", requires_grad=True)
    with ctx:
        y = ((x * 2).sin() @ x).cos().sum()
    y.backward()
    return y.detach().cpu(), x.grad.cpu()

import contextlib
ref = run(contextlib.nullcontext())
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    sw = lms.ActivationSwapper()
    got = [run(sw) for _ in range(3)]
msgs = [str(x.message) for x in w if "eviction net" in str(x.message)]
print(json.dumps({"equal": all(torch.equal(a, b) for g in got for a, b in zip(g, ref)),
                  "warnings": msgs, "active": sw.stats()["guard.active"],
                  "backend": torch.cuda.get_allocator_backend()}))
"""


def test_a_pluggable_allocator_leaves_the_net_off_with_one_warning(cuda_only, tmp_path):
    """Under CUDAPluggableAllocator the net must not redirect anything: training goes on
    (same gradients as stock), with one warning, and the net is inactive."""
    if shutil.which("g++") is None:
        missing("no g++")
    from torch.utils.cpp_extension import CUDA_HOME, include_paths
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from swap_package import import_lms_swap  # the checkout's package, or the installed one
    lms_swap = import_lms_swap()
    inc = lms_swap.guard.cuda_include_dirs()
    src = tmp_path / "alloc.cpp"
    src.write_text(PLUGGABLE_C)
    so = tmp_path / "alloc.so"
    libdirs = [f"-L{d}" for d in (os.path.join(CUDA_HOME or "/usr/local/cuda", "lib64"),)]
    cudart = [str(p) for p in pathlib.Path(torch.__file__).parent.parent.glob("nvidia/*/lib/libcudart.so*")]
    link = [cudart[0]] if cudart else [*libdirs, "-lcudart"]
    subprocess.run(["g++", "-shared", "-fPIC", *[f"-I{d}" for d in inc], str(src), "-o", str(so), *link],
                   check=True)
    script = tmp_path / "run.py"
    script.write_text(PLUGGABLE_PY)
    p = subprocess.run([sys.executable, str(script), str(so), str(pathlib.Path(__file__).resolve().parent)],
                       capture_output=True, text=True, timeout=600)
    out = _last_json(p)
    assert out["equal"], out
    assert out["active"] == 0, out
    assert len(out["warnings"]) == 1 and "native caching allocator" in out["warnings"][0], out


def test_the_nets_copy_waits_for_a_tensor_written_on_a_side_stream(lms_swap, cuda_only):
    """A kept tensor written on a side stream behind a long kernel and registered there
    (as the pack hook does under ``torch.cuda.stream(side)``) is evicted from the main
    stream: the copy must wait for the write, not read the bytes the memory held before."""
    g = lms_swap.load_guard(required=True)
    was_armed = g.armed()
    g.set_host_budget(-1, 0, 0)
    g.arm(True)
    try:
        n = 256 * MiB
        dev = torch.cuda.current_device()
        side = torch.cuda.Stream()
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            old = torch.full((n,), 3, dtype=torch.uint8, device="cuda")
            del old  # its block, holding 3s, is what the next allocation on `side` gets
            torch.cuda._sleep(int(3e9))  # about 2 s of a busy side stream
            x = torch.full((n,), 7, dtype=torch.uint8, device="cuda")
            s = g.Slot(x)
        x.record_stream(torch.cuda.current_stream())  # (the eviction frees it from here)
        del x
        freed = g.evict(dev, n)  # on the main stream, which never waited for `side`
        assert freed == n and s.evicted, g.stats()
        host = s.host_bytes()
        assert int((host != 7).sum()) == 0, "the net copied before the side stream wrote"
    finally:
        torch.cuda.synchronize()
        g.arm(was_armed)


def test_inplace_on_the_base_after_the_saved_view_is_gone_raises_as_stock(lms_swap, cuda_only):
    def run(ctx):
        torch.manual_seed(0)
        w = torch.randn(1 << 20, device="cuda", requires_grad=True)
        base = torch.randn(2 << 20, device="cuda")
        with ctx:
            v = base[: 1 << 20]
            out = (v * w).sum()
            del v
        base.add_(1.0)
        out.backward()

    import contextlib
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        run(contextlib.nullcontext())
    sw = lms_swap.ActivationSwapper(policy="always", size_threshold=0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        run(sw)
    assert sw.stats()["swap.out_count"] >= 1
