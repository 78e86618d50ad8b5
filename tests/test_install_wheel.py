"""pip install of the overlay wheel into a fresh venv (CPU): import, version, LMS API, memory_stats."""
from __future__ import annotations

import json

import pytest

from tests.overlay_fixtures import PROBE, TIMINGS, overlay_build, run_py, wheel_venv  # noqa: F401


@pytest.fixture(scope="module")
def probe(wheel_venv):
    return run_py(wheel_venv, PROBE)


def test_import_and_local_version(probe, wheel_venv):
    assert probe["version"] == "2.6.0+lms1"
    assert probe["file"].startswith(str(wheel_venv.parent.parent)), probe["file"]
    assert probe["cuda"] == "12.4"
    print("install timings:", json.dumps(TIMINGS))


def test_memory_stats_still_works(probe):
    assert probe["memory_stats_type"] in ("OrderedDict", "dict")


def test_lms_api_present_and_roundtrips(probe, overlay_build):
    res, _ = overlay_build
    assert "torch/cuda/lms.py" in res.plan.python_files, res.plan.python_files  # the LMS API's module
    missing = [n for n, ok in probe["api"].items() if not ok]
    assert not missing, f"torch.cuda lacks {missing}"
    assert probe["lms_available"] is True, "torch.cuda.is_lms_available() is False with the rebuilt libc10_cuda.so"
    rt = probe["roundtrip"]
    assert "error" not in rt, rt["error"]
    assert rt and all(rt.values()), rt
    # memory_stats() merges the lms.* statistics of the rebuilt libc10_cuda into the raw dict
    m = probe["merged_stats"]
    assert "error" not in m, m
    assert m.get("allocated_bytes.all.current") == 12345, m      # the raw statistics are kept
    for k in ("lms.swap_out_bytes", "lms.swap_in_bytes", "lms.host_bytes.current",
              "lms.host_budget.limit"):
        assert k in m, (k, sorted(m))
    assert m["lms.host_budget.limit"] == 5 << 30, m           # set_host_mem_limit_lms above
    assert m["lms.swap_out_bytes"] == 0 and m["lms.host_bytes.current"] == 0, m


def test_pip_sees_the_installed_distribution(wheel_venv):
    out = run_py(wheel_venv, "import json, importlib.metadata as m; print(json.dumps({'v': m.version('torch')}))")
    assert out["v"] == "2.6.0+lms1"


def test_the_eviction_net_compiles_and_imports_against_the_installed_build(wheel_venv, tmp_path):
    """torch.cuda.lms_swap compiles its eviction net (lms_swap_guard.cpp) on first use; here
    it is built for real against the installed patched torch 2.6.0 (its headers, its C++ ABI;
    CUDA 12.4 headers from the CUDA home the overlay build makes of NVIDIA's wheels) and
    imported, without a GPU. Its behaviour is tested on a GPU (tests/conformance/lms_swap/test_lms_swap_guard.py)."""
    import os
    import sys
    from pathlib import Path

    from build_tools.cudahome import cuda_home
    venv_bin = Path(__file__).resolve().parent.parent / ".venv" / "bin"   # ninja: `make setup`
    home = cuda_home("12.4", python=sys.executable)   # the overlay build's, from NVIDIA's wheels
    code = r"""
import json
from torch.cuda import lms_swap
m = lms_swap.build_guard()
print(json.dumps({"names": sorted(n for n in dir(m) if not n.startswith("_")),
                  "armed": m.armed(), "evicted": m.evicted_bytes()}))
"""
    out = run_py(wheel_venv, code, env={"TORCH_EXTENSIONS_DIR": str(tmp_path), "CUDA_HOME": str(home),
                                        "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"})
    assert {"Slot", "arm", "evict", "mark_peak", "peak_growth", "released", "stats",
            "set_host_budget", "evicted_bytes"} <= set(out["names"]), out["names"]
    assert out["armed"] is False and out["evicted"] == 0


def test_the_wheel_ships_the_eviction_net_compiled_and_it_loads_without_a_compiler(overlay_build, wheel_venv,
                                                                                    tmp_path):
    """The overlay wheel carries the net compiled for itself (torch/cuda/lms_swap/_lms_swap_guard*.so
    and its record), and the installed build loads it with no compiler, ninja or CUDA headers to
    be found (PATH=/usr/bin:/bin, where there is no ninja), and compiles nothing (its extensions
    folder stays empty)."""
    import zipfile

    res, _ = overlay_build
    with zipfile.ZipFile(res.wheel) as zf:
        names = zf.namelist()
        record = json.loads(zf.read("torch/cuda/lms_swap/_net_build.json"))
    assert [n for n in names if n.startswith("torch/cuda/lms_swap/_lms_swap_guard.") and n.endswith(".so")]
    assert record["torch"] == res.version and record["torch_cuda"] == "12.4", record
    assert record["cuda_headers"].split(".")[0] == "12" and record["cxx11_abi"] is False, record
    code = r"""
import json, os
from torch.cuda import lms_swap
from torch.cuda.lms_swap import guard, prebuilt
m = guard._load_net()
print(json.dumps({"file": m.__file__, "refusal": prebuilt.refusal(prebuilt.record()),
                  "names": sorted(n for n in dir(m) if not n.startswith("_")),
                  "armed": m.armed(), "built": os.listdir(os.environ["TORCH_EXTENSIONS_DIR"])}))
"""
    env = {"PATH": "/usr/bin:/bin", "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    out = run_py(wheel_venv, code, env=env)
    assert out["file"].startswith(str(wheel_venv.parent.parent)) and "/torch/cuda/lms_swap/" in out["file"], out
    assert out["refusal"] is None and out["built"] == [], out
    assert {"Slot", "arm", "evict", "stats", "set_host_budget"} <= set(out["names"]), out["names"]
    assert out["armed"] is False
