"""The lms-swap wheel with its eviction net and pluggable allocator compiled in, on a GPU: built by the
build tools for this machine's torch, installed into a --target folder, and used in a process that has
no compiler and no CUDA toolkit (PATH=/usr/bin:/bin, no CUDA_HOME, CXX naming no program): the net and
the allocator are the wheel's modules, nothing is compiled (TORCH_EXTENSIONS_DIR stays empty), the net
arms under the native allocator and swapping trains bitwise like stock, and the allocator moves pages
past its limit with every byte intact. The wheel's version and record name this torch."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

from tests.gpu_requirements import missing

pytestmark = pytest.mark.gpu
REPO = pathlib.Path(__file__).resolve().parents[3]

USE_PY = r"""
import json, sys
import torch
import lms_swap
g = lms_swap.load_guard(required=True)

def run(ctx):
    torch.manual_seed(0)
    x = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    with ctx:
        y = ((x * 2).sin() @ x).cos().sum()
    y.backward()
    return y.detach().cpu(), x.grad.cpu()

import contextlib
ref = run(contextlib.nullcontext())
sw = lms_swap.ActivationSwapper(policy="always", size_threshold=0)
got = run(sw)
print(json.dumps({"net": g.__file__, "package": lms_swap.__file__, "active": sw.stats()["guard.active"],
                  "swapped": sw.stats()["swap.out_count"],
                  "bitwise": all(torch.equal(a, b) for a, b in zip(got, ref))}))
"""

# the allocator's LMS limit is 1 GiB; 24 tensors of 64 MiB (1.5 GiB) each keep a pattern of their own
ALLOCATOR_PY = r"""
import json, sys
import torch
import lms_swap.allocator
lms_swap.allocator.enable("lms_limit_mb:1024")
n = (64 << 20) // 4
def pattern(i):
    return torch.arange(n, dtype=torch.int32, device="cuda") * 7 + i * 1_000_003
ts = []
for i in range(24):
    t = torch.empty(n, dtype=torch.int32, device="cuda")
    t.copy_(pattern(i))
    ts.append(t)
torch.cuda.synchronize()
bad = [i for i, t in enumerate(ts) if not torch.equal(t, pattern(i))]
lib = sys.modules["lms_swap._lms_pluggable_allocator"].__file__
print(json.dumps({"lib": lib, "enabled": lms_swap.allocator.enabled(), "bad": bad,
                  "swap_out_bytes": lms_swap.allocator.lms_stats()["swap_out_bytes"]}))
"""


def _no_compiler_env(target, ext, tmp_path):
    """This process's environment with no compiler, no CUDA toolkit and only ``target`` on the path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "PYTHONPATH", "LMS_SWAP_IGNORE_PREBUILT")}
    env.update(PATH="/usr/bin:/bin", PYTHONPATH=str(target), TORCH_EXTENSIONS_DIR=str(ext),
               CXX=str(tmp_path / "no-compiler"), CC=str(tmp_path / "no-compiler"))
    return env


@pytest.fixture
def installed(wheel, tmp_path):
    """The wheel installed into a --target folder, an empty TORCH_EXTENSIONS_DIR and the environment
    without a compiler."""
    target = tmp_path / "target"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                    str(target), str(wheel.path)], check=True, timeout=600)
    ext = tmp_path / "torch_extensions"
    ext.mkdir()
    return target, ext, _no_compiler_env(target, ext, tmp_path)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        missing("CUDA not available")
    sys.path.insert(0, str(REPO))
    from build_tools import lms_swap_wheel
    from build_tools.errors import LmsError
    try:
        return lms_swap_wheel.build(sys.executable, tmp_path_factory.mktemp("dist"), net=True)
    except LmsError as e:
        pytest.fail(f"the lms-swap wheel with its net did not build for torch {torch.__version__}: {e}")


def test_the_wheel_is_made_for_this_torch(wheel):
    import torch
    flavour = "cu" + torch.version.cuda.replace(".", "")
    public = torch.__version__.split("+")[0]
    assert wheel.version == f"0.1.0+torch{public}.{flavour}", wheel.version
    assert wheel.record["torch"] == torch.__version__ and wheel.record["torch_cuda"] == torch.version.cuda
    assert wheel.record["cuda_headers"].split(".")[0] == torch.version.cuda.split(".")[0], wheel.record
    with zipfile.ZipFile(wheel.path) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert f"Requires-Dist: torch=={public}" in meta, meta
    assert any(n.startswith("lms_swap/_lms_swap_guard.") and n.endswith(".so") for n in names), names
    assert wheel.record["allocator"] == "_lms_pluggable_allocator", wheel.record
    assert any(n.startswith("lms_swap/_lms_pluggable_allocator.") and n.endswith(".so") for n in names), names
    from lms_swap import allocator_sources
    assert {f"lms_swap/allocator_core/{f}" for f in allocator_sources.CORE_FILES} <= set(names), names
    assert "lms_swap/lms_swap_guard.cpp" in names  # the source stays: the fallback compiles it
    headers = [p.name for p in (REPO / "lms-swap" / "src" / "lms_swap").glob("lms_swap_guard_*.h")]
    assert headers and {f"lms_swap/{h}" for h in headers} <= set(names), names  # and what it includes
    assert "-linux_x86_64.whl" in wheel.path.name, wheel.path.name


def test_the_prebuilt_net_loads_without_a_compiler_and_swaps(installed, tmp_path):
    target, ext, env = installed
    r = subprocess.run([sys.executable, "-c", USE_PY], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert pathlib.Path(out["package"]).parent == target / "lms_swap", out
    assert pathlib.Path(out["net"]).parent == target / "lms_swap", out
    assert "compiling the eviction net" not in r.stderr, r.stderr
    assert list(ext.iterdir()) == [], "something was compiled"
    assert out["active"] == 1 and out["swapped"] > 0 and out["bitwise"], out


def test_the_prebuilt_allocator_loads_without_a_compiler_and_moves_pages(installed, tmp_path):
    target, ext, env = installed
    r = subprocess.run([sys.executable, "-c", ALLOCATOR_PY], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert pathlib.Path(out["lib"]).parent == target / "lms_swap", out
    assert "compiling it" not in r.stderr, r.stderr
    assert list(ext.iterdir()) == [], "something was compiled"
    assert out["enabled"] and out["bad"] == [] and out["swap_out_bytes"] >= 512 << 20, out
