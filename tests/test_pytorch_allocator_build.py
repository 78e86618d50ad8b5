"""CI (CPU) checks of PyTorch LMS in c10/cuda.

* the patched c10 + c10/cuda of the real v2.6.0 tree (lms_tree fixture) compile with
  build_tools.c10_build (CUDA headers: NVIDIA's PyPI wheels that `make setup` installs, see
  build_tools.cuda_headers);
* libc10_cuda.so's ABI only grows: abidiff against a pristine build and the exported symbol sets;
* settings strings, the host budget and the Python API (torch/cuda/lms.py) work through the real
  built libraries without a GPU (libcuda is only dlopen'ed when memory is mapped);
* the upstream Python files export the API and merge the lms.* statistics.
GPU behaviour is covered by tests/conformance/pytorch_allocator (pytest -m gpu).
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _need(tool: str) -> str:
    from build_tools.tools import find_tool
    exe = find_tool(tool)
    if not exe:
        pytest.fail(f"{tool} not found in the venv or on PATH: `make setup` installs it")
    return exe


@pytest.fixture(scope="module")
def builds(lms_tree, upstream_tree, tmp_path_factory):
    from build_tools import cuda_headers
    from build_tools.c10_build import build_c10, find_fmt_include
    cuda = cuda_headers.find()
    if cuda is None:
        pytest.fail("no CUDA headers: `make setup` installs NVIDIA's header wheels (pyproject's test extra)")
    for tool in ("cmake", "ninja"):
        _need(tool)
    if find_fmt_include() is None:
        pytest.fail("no fmt headers: `make setup` installs libfmt-dev (as root)")
    tree = lms_tree("pytorch", "v2.6.0")
    pristine = upstream_tree("pytorch", "v2.6.0")
    out = tmp_path_factory.mktemp("c10b")
    from build_tools.tools import find_tool
    launcher = "ccache" if find_tool("ccache") else None
    lms = build_c10(tree, out / "lms", cuda_home=cuda.home, build_type="RelWithDebInfo",
                    cxx_compiler_launcher=launcher)
    up = build_c10(pristine, out / "pristine", cuda_home=cuda.home, targets=("c10_cuda",),
                   c10_library=lms.libraries["c10"], build_type="RelWithDebInfo", cxx_compiler_launcher=launcher)
    return dict(tree=tree, lms=lms, up=up, out=out, cuda=cuda)


STD_WEAK = re.compile(r"^_Z(Z|GV|GVZ|T[VIS])?N?K?St")  # std:: template instantiations (vague linkage)


def _dynsyms(lib: Path, drop_std: bool = False) -> set:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], check=True, capture_output=True, text=True).stdout
    syms = {line.split()[-1] for line in out.splitlines() if line.strip()}
    return {s for s in syms if not STD_WEAK.match(s)} if drop_std else syms


def test_patched_c10_and_c10_cuda_compile(builds):
    libs = builds["lms"].libraries
    assert libs["c10"].is_file() and libs["c10_cuda"].is_file()
    syms = _dynsyms(libs["c10_cuda"])
    for name in ("c10_lms_set_enabled", "c10_lms_stats", "c10_lms_host_reserve", "c10_lms_parse_settings"):
        assert name in syms


def test_c10_cuda_abi_only_grows(builds):
    old, new = builds["up"].libraries["c10_cuda"], builds["lms"].libraries["c10_cuda"]
    removed = _dynsyms(old, drop_std=True) - _dynsyms(new, drop_std=True)
    assert not removed, f"symbols removed from libc10_cuda.so: {sorted(removed)[:20]}"
    _need("abidiff")
    from build_tools.abi import only_grows_problems, run_abidiff
    # exit bit 4 alone is set by additions AND by a changed function, variable or type (a struct
    # layout change), so the report decides: additions only, nothing removed or changed but std::
    # template instances. (No suppression file: abi_suppressions.txt's std:: rules also hide a c10
    # method whose class changed through a std:: member, see tests/test_abi_check.py.)
    d = run_abidiff(old, new)
    problems = only_grows_problems(d)
    assert not problems, "\n".join(problems) + "\n" + d.report[-4000:]


def _run_py(code: str, builds, **env) -> dict:
    d = builds["lms"].build_dir
    e = dict(os.environ, **env)
    e.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(d)], capture_output=True, text=True, env=e,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


C_API = """
import ctypes, json, os, sys
d = sys.argv[1]
ctypes.CDLL(os.path.join(d, "libc10.so"), mode=ctypes.RTLD_GLOBAL)
L = ctypes.CDLL(os.path.join(d, "libc10_cuda.so"))
U = ctypes.c_ulonglong
for n in ("limit", "size", "host_mem_limit"):
    getattr(L, "c10_lms_get_" + n).restype = U
    getattr(L, "c10_lms_set_" + n).argtypes = [U]
L.c10_lms_host_reserve.argtypes = [U]; L.c10_lms_host_release.argtypes = [U]; L.c10_lms_host_used.restype = U
L.c10_lms_parse_settings.argtypes = [ctypes.c_char_p, ctypes.c_char_p, U]
L.c10_lms_stats.restype = U; L.c10_lms_stats.argtypes = [ctypes.c_int, ctypes.c_char_p, U]
err = ctypes.create_string_buffer(4096)
r = {"defaults": [L.c10_lms_get_enabled(), L.c10_lms_get_limit(), L.c10_lms_get_size(), L.c10_lms_get_defrag()],
     "env_host_limit": L.c10_lms_get_host_mem_limit()}
r["ok_rc"] = L.c10_lms_parse_settings(b"lms:True,lms_limit_mb:1024,lms_size_mb:0.5,lms_defrag:False,lms_host_mem_limit_mb:64,lms_host_reserve_mb:256", err, 4096)
r["after"] = [L.c10_lms_get_enabled(), L.c10_lms_get_limit(), L.c10_lms_get_size(), L.c10_lms_get_defrag(),
              L.c10_lms_get_host_mem_limit()]
r["bad_key_rc"] = L.c10_lms_parse_settings(b"lms_bogus:1", err, 4096); r["bad_key_err"] = err.value.decode()
r["bad_val_rc"] = L.c10_lms_parse_settings(b"lms:maybe", err, 4096); r["bad_val_err"] = err.value.decode()
r["page_ok_rc"] = [L.c10_lms_parse_settings(s, err, 4096) for s in (b"lms_page_mb:64", b"lms_page_mb:0")]
r["page_bad"] = []
for s in (b"lms_page_mb:21", b"lms_page_mb:0.5", b"lms_page_mb:2048"):
    r["page_bad"].append([L.c10_lms_parse_settings(s, err, 4096), err.value.decode()])
MiB = 1 << 20
r["reserve"] = [L.c10_lms_host_reserve(40 * MiB), L.c10_lms_host_reserve(40 * MiB), L.c10_lms_host_used()]
L.c10_lms_host_release(40 * MiB)
r["after_release"] = [L.c10_lms_host_used(), L.c10_lms_host_reserve(24 * MiB), L.c10_lms_host_used()]
n = L.c10_lms_stats(0, None, 0); buf = ctypes.create_string_buffer(n + 1); L.c10_lms_stats(0, buf, n + 1)
r["stats"] = dict(l.split("=") for l in buf.value.decode().splitlines())
L.c10_lms_set_enabled(0)
r["off"] = L.c10_lms_get_enabled()
print(json.dumps(r))
"""


def test_c_api_settings_and_host_budget(builds):
    r = _run_py(C_API, builds, PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB="3000")
    MiB = 1 << 20
    assert r["defaults"] == [0, 0, MiB, 1]                      # off by default
    assert r["env_host_limit"] == 3000 * MiB                    # PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB
    assert r["ok_rc"] == 0 and r["after"] == [1, 1024 * MiB, MiB // 2, 0, 64 * MiB]
    assert r["bad_key_rc"] == -1 and "lms_bogus" in r["bad_key_err"]
    assert r["bad_val_rc"] == -1 and "True/False" in r["bad_val_err"]
    assert r["page_ok_rc"] == [0, 0]                            # lms_page_mb: whole 2 MiB granules, 0 = auto
    for rc, msg in r["page_bad"]:                               # not a multiple of 2 MiB, or above 1024
        assert rc == -1 and "lms_page_mb must be a multiple of 2 MiB" in msg, msg
    assert r["reserve"] == [1, 0, 40 * MiB]                     # second 40 MiB would pass 64 MiB
    assert r["after_release"] == [0, 1, 24 * MiB]
    st = r["stats"]
    for k in ("swap_out_bytes", "swap_in_bytes", "host_bytes.current", "host_bytes.peak", "reclaim_events",
              "alloc_served.free_list", "alloc_served.new_device_memory", "alloc_served.lms_reclaim",
              "alloc_served.defrag", "swap_out_time_ns", "swap_in_time_ns", "host_budget.used",
              "host_pool.total_bytes", "host_pool.idle_bytes", "host_pool.reserve_bytes",
              "host_pool.made_ahead_bytes", "host_pool.made_on_demand_bytes", "page_bytes.large"):
        assert k in st
    assert st["host_pool.reserve_bytes"] == "0"                 # nothing asked to fill without a GPU
    assert int(st["host_budget.used"]) == 24 * MiB and r["off"] == 0


DEFAULT_HOST_LIMIT = """
import ctypes, json, os, sys
d = sys.argv[1]
ctypes.CDLL(os.path.join(d, "libc10.so"), mode=ctypes.RTLD_GLOBAL)
L = ctypes.CDLL(os.path.join(d, "libc10_cuda.so"))
L.c10_lms_get_host_mem_limit.restype = ctypes.c_ulonglong
avail = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemAvailable:"))
print(json.dumps({"limit": L.c10_lms_get_host_mem_limit(), "available": avail}))
"""


@pytest.mark.parametrize("local_world_size,share", [(None, 1), ("4", 4), ("zero", 1)])
def test_default_host_limit_is_shared_by_the_ranks_of_a_node(builds, local_world_size, share):
    """No PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB: 80% of the available host memory, divided among
    torchrun's LOCAL_WORLD_SIZE processes (an unusable value counts as one)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB", "LOCAL_WORLD_SIZE")}
    if local_world_size is not None:
        env["LOCAL_WORLD_SIZE"] = local_world_size
    d = builds["lms"].build_dir
    p = subprocess.run([sys.executable, "-c", DEFAULT_HOST_LIMIT, str(d)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    expect = r["available"] * 0.8 / share
    assert abs(r["limit"] - expect) < 0.05 * expect, r   # MemAvailable moves a little between reads


CPP_SETTINGS = r"""
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDALargeModelSupport.h>
#include <cstdio>
#include <string>
namespace A = c10::cuda::CUDACachingAllocator;
int main() {
  A::setAllocatorSettings("max_split_size_mb:64,lms:True,lms_limit_mb:100,expandable_segments:False");
  int ok = A::lms::enabled() && A::lms::limit() == 100u << 20 &&
           A::CUDAAllocatorConfig::max_split_size() == 64u << 20 && !A::CUDAAllocatorConfig::expandable_segments();
  int threw = 0;
  try { A::setAllocatorSettings("lms_bogus:1"); } catch (const c10::Error&) { threw = 1; }
  // the launch gate's switch: off says why in the stats; a bad value is refused
  A::setAllocatorSettings("lms_launch_gate:False");
  const std::string st = A::lms::stats_text(0);
  int gate_off = st.find("launch_gate.active=0\n") != std::string::npos &&
                 st.find("launch_gate.inactive_reason=4\n") != std::string::npos;
  int gate_threw = 0;
  try { A::setAllocatorSettings("lms_launch_gate:maybe"); } catch (const c10::Error&) { gate_threw = 1; }
  A::setAllocatorSettings("lms:False");
  std::printf("%d %d %d %d %d\n", ok, threw, (int)A::lms::enabled(), gate_off, gate_threw);
  return 0;
}
"""


def test_allocator_settings_string_reaches_lms(builds, tmp_path):
    b = builds["lms"]
    src = tmp_path / "s.cpp"
    src.write_text(CPP_SETTINGS)
    exe = tmp_path / "s"
    fmt = [f"-I{b.fmt_include}"] if b.fmt_include else []
    incs = builds["cuda"].flags()
    subprocess.run(["g++", "-std=c++17", "-DFMT_HEADER_ONLY=1", f"-I{builds['tree']}", f"-I{b.build_dir}/generated",
                    *incs, *fmt, str(src), f"-L{b.build_dir}", "-lc10_cuda", "-lc10",
                    f"-Wl,-rpath,{b.build_dir}", "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "1", "0", "1", "1"]


GUARD_C_API = """
import ctypes, json, os, sys
d, so = sys.argv[1], os.environ["GUARD_SO"]
ctypes.CDLL(os.path.join(d, "libc10.so"), mode=ctypes.RTLD_GLOBAL)
ctypes.CDLL(os.path.join(d, "libc10_cuda.so"), mode=ctypes.RTLD_GLOBAL)
g = ctypes.CDLL(so)
n = g.lms_guard_counters(None, 0)
buf = ctypes.create_string_buffer(n + 1)
g.lms_guard_counters(buf, n + 1)
r = dict(l.split("=") for l in buf.value.decode().splitlines())
# the net's host copies: every page resident when mapped, whatever the size (one page,
# under one thread's part, parts that do not divide the size)
g.lms_guard_unpopulated_pages.restype = ctypes.c_longlong
g.lms_guard_unpopulated_pages.argtypes = [ctypes.c_ulonglong]
r["unpopulated"] = [g.lms_guard_unpopulated_pages(n) for n in
                    (4096, 123, 63 << 20, (64 << 20) + 4096, (513 << 20) + 123)]
print(json.dumps(r))
"""


def test_eviction_net_builds_in_its_c10_only_mode_against_the_patched_allocator(builds, tmp_path):
    """lms_swap_guard.cpp with LMS_GUARD_C10_ONLY (no ATen, no Python) and the harness's C API
    over it (guard_c_api.cpp) compile and link against the patched c10/c10_cuda: the
    conformance harness runs it over the patched allocator on a GPU (tests/conformance/pytorch_allocator, test_allocator_lms_first_then_the_net)."""
    b = builds["lms"]
    guard_dir = REPO / "lms-swap" / "src" / "lms_swap"  # lms_swap_guard.cpp
    src = REPO / "tests" / "conformance" / "pytorch_allocator" / "guard_c_api.cpp"
    so = tmp_path / "guard.so"
    fmt = [f"-I{b.fmt_include}"] if b.fmt_include else []
    subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-DLMS_GUARD_C10_ONLY",
                    "-DFMT_HEADER_ONLY=1", f"-I{guard_dir}", f"-I{builds['tree']}", f"-I{b.build_dir}/generated",
                    *builds["cuda"].flags(), *fmt, str(src), f"-L{b.build_dir}", "-lc10_cuda", "-lc10",
                    f"-Wl,-rpath,{b.build_dir}", "-o", str(so)], check=True)
    r = _run_py(GUARD_C_API, builds, GUARD_SO=str(so))
    assert r["armed"] == "0" and r["ooms_caught"] == "0" and r["slots"] == "0" and "allocations_seen" in r
    assert "last_oom_allocated" in r and "last_oom_inactive_split" in r
    assert r["unpopulated"] == [0, 0, 0, 0, 0]


PY_API = """
import importlib.util, json, os, sys
d = sys.argv[1]
spec = importlib.util.spec_from_file_location("lms_mod", os.environ["LMS_PY"])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
r = {"available": m.is_lms_available(), "enabled0": m.get_enabled_lms()}
m.set_enabled_lms(True); m.set_limit_lms(5 << 30); m.set_size_lms(2 << 20); m.set_host_mem_limit_lms(1 << 30)
m.set_lms_defrag_enabled(False)
r["roundtrip"] = [m.get_enabled_lms(), m.get_limit_lms(), m.get_size_lms(), m.get_host_mem_limit_lms(),
                  m.get_lms_defrag_enabled()]
r["reserve"] = [m._host_reserve(600 << 20), m._host_reserve(600 << 20), m._host_used()]
m._host_release(600 << 20)
r["released"] = m._host_used()
merged = m._merge_memory_stats({"allocated_bytes": {}}, 0)
r["nested_keys"] = sorted(merged["lms"].keys())
r["flat"] = m.lms_stats(0)["host_budget.limit"]
m._parse_settings("lms:False")
r["enabled_end"] = m.get_enabled_lms()
print(json.dumps(r))
"""


def test_python_api_over_ctypes(builds):
    py = builds["tree"] / "torch" / "cuda" / "lms.py"
    r = _run_py(PY_API, builds, LMS_PY=str(py),
                PYTORCH_LMS_LIBC10_CUDA=str(builds["lms"].libraries["c10_cuda"]))
    assert r["available"] and not r["enabled0"]
    assert r["roundtrip"] == [True, 5 << 30, 2 << 20, 1 << 30, False]
    assert r["reserve"] == [True, False, 600 << 20] and r["released"] == 0
    assert {"swap_out_bytes", "host_bytes", "alloc_served", "host_budget"} <= set(r["nested_keys"])
    assert r["flat"] == 1 << 30 and r["enabled_end"] is False


MEMORY_STATS = """
import json, os, sys
sys.path.insert(0, os.environ["SHIM_DIR"])
import patched_memory_stats
raw = lambda device: {"allocated_bytes": {"all": {"current": 4096 + device}}, "num_ooms": 0}
memory_stats = patched_memory_stats.load(os.environ["LMS_TREE"], raw)
lms = sys.modules["_lms_tree_torch_cuda.lms"]
lms.set_host_mem_limit_lms(3 << 30)
out = dict(memory_stats(0))
out["raw_lms_stats"] = lms.lms_stats(0)
print(json.dumps(out))
"""


def test_patched_memory_stats_merges_the_lms_keys(builds):
    """The patched torch/cuda/memory.py's memory_stats() (run as written, torch stood in, over
    the built libc10_cuda): the raw statistics stay and the lms.* keys are merged in. Without a
    GPU the installed wheel's memory_stats() returns {} before the merge runs, so this is where
    CPU CI sees the merge."""
    r = _run_py(MEMORY_STATS, builds, LMS_TREE=str(builds["tree"]),
                SHIM_DIR=str(REPO / "tests" / "conformance" / "pytorch_allocator"),
                PYTORCH_LMS_LIBC10_CUDA=str(builds["lms"].libraries["c10_cuda"]))
    assert r["allocated_bytes.all.current"] == 4096 and r["num_ooms"] == 0, r
    lms = {k for k in r if k.startswith("lms.")}
    assert {"lms.swap_out_bytes", "lms.swap_in_bytes", "lms.host_bytes.current", "lms.host_budget.limit",
            "lms.alloc_served.lms_reclaim", "lms.launch_gate.active"} <= lms, sorted(r)
    assert r["lms.host_budget.limit"] == 3 << 30 and r["lms.swap_out_bytes"] == 0, r
    # every flat statistic comes back under its own key (what the GPU suite compares)
    assert {k[4:]: v for k, v in r.items() if k.startswith("lms.")} == r["raw_lms_stats"]


def test_torch_cuda_exports_and_memory_stats_merge(builds):
    tree = builds["tree"]
    init = ast.parse((tree / "torch/cuda/__init__.py").read_text())
    names = set()
    for node in ast.walk(init):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            names |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    lms = ast.parse((tree / "torch/cuda/lms.py").read_text())
    api = [f.name for f in lms.body if isinstance(f, ast.FunctionDef)]
    for fn in ("set_enabled_lms", "get_enabled_lms", "set_limit_lms", "get_limit_lms", "set_size_lms", "get_size_lms",
               "set_host_mem_limit_lms", "get_host_mem_limit_lms", "set_lms_defrag_enabled", "get_lms_defrag_enabled",
               "_host_reserve", "_host_release"):
        assert fn in api
        if not fn.startswith("_"):
            assert fn in names, f"{fn} not exported from torch.cuda"
    mem = (tree / "torch/cuda/memory.py").read_text()
    assert "_lms._merge_memory_stats(" in mem and "_lms._reset_peak_stats(device)" in mem


RULE_INPUTS = [
    # (PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB, LOCAL_WORLD_SIZE, host bytes); None: unset
    (None, None, 64 << 30), (None, "8", 64 << 30), (None, "1", 1001), (None, "0", 123456789),
    (None, "zero", 1 << 40), (None, "+4", 1 << 40), (None, " 4", 1 << 40), (None, "", 3),
    (None, "3", (1 << 53) - 1), (None, "12", 0), ("", "2", 10 << 30), ("   ", None, 10 << 30),
    ("0", "4", 10 << 30), ("64", "8", 0), ("1.5", None, 1), (" 2_048 ", "2", 1), ("1e3", None, 1),
    ("+7.25", None, 1), ("-0", None, 1), (".5", None, 1), ("5.", None, 1), ("1_000.5", None, 1),
    ("3000", "16", 1 << 40),
    # refused by both
    ("abc", None, 1), ("nan", None, 1), ("inf", None, 1), ("-inf", None, 1), ("-5", None, 1),
    ("-1e-3", None, 1), ("1e400", None, 1), ("0x10", None, 1), ("1__0", None, 1), ("_1", None, 1),
    ("1_", None, 1), ("1 0", None, 1), ("12abc", None, 1), ("nan(1)", None, 1), ("1p3", None, 1),
]

RULE = """
import ctypes, json, os, sys
d = sys.argv[1]
ctypes.CDLL(os.path.join(d, "libc10.so"), mode=ctypes.RTLD_GLOBAL)
L = ctypes.CDLL(os.path.join(d, "libc10_cuda.so"))
U = ctypes.c_ulonglong
L.c10_lms_host_budget_rule.argtypes = [ctypes.c_char_p, ctypes.c_char_p, U, ctypes.POINTER(U), ctypes.c_char_p, U]
out = []
for limit, lws, host in json.loads(os.environ["RULE_INPUTS"]):
    v, err = U(0), ctypes.create_string_buffer(1024)
    rc = L.c10_lms_host_budget_rule(None if limit is None else limit.encode(), None if lws is None else lws.encode(),
                                    host, ctypes.byref(v), err, 1024)
    out.append([rc, v.value, err.value.decode()])
print(json.dumps(out))
"""


def test_host_budget_rule_agrees_with_lms_swaps_copy(builds):
    """The host budget's rule is the allocator's (c10_lms_host_budget_rule); lms_swap keeps a copy
    for stock torch (lms_swap.environment.host_budget_rule). Both give the same budget, and refuse
    the same limits, for the same inputs."""
    from lms_swap import environment as env
    got = _run_py(RULE, builds, RULE_INPUTS=json.dumps(RULE_INPUTS))
    got = got if isinstance(got, list) else []
    assert len(got) == len(RULE_INPUTS)
    for (limit, lws, host), (rc, value, err) in zip(RULE_INPUTS, got):
        try:
            want = env.host_budget_rule(limit, lws, host)
        except ValueError as e:
            assert rc == -1, (limit, lws, host, value)
            assert "PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB" in err and "MiB" in err, err
            assert ("not finite" in err) == ("not finite" in str(e)), (err, str(e))
            assert ("negative" in err) == ("negative" in str(e)), (err, str(e))
            continue
        assert rc == 0 and value == want, (limit, lws, host, value, want)


PY_RULE = """
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("lms_mod", os.environ["LMS_PY"])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
r = {"rule": m._host_budget_rule("64", "2", 1 << 30), "default": m._host_budget_rule(None, "4", 1000)}
try:
    m._host_budget_rule("abc", None, 1)
    r["bad"] = ""
except ValueError as e:
    r["bad"] = str(e)
print(json.dumps(r))
"""


def test_torch_cuda_lms_asks_the_allocators_rule(builds):
    py = builds["tree"] / "torch" / "cuda" / "lms.py"
    r = _run_py(PY_RULE, builds, LMS_PY=str(py), PYTORCH_LMS_LIBC10_CUDA=str(builds["lms"].libraries["c10_cuda"]))
    assert r["rule"] == 64 << 20 and r["default"] == 800 // 4
    assert "PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB='abc'" in r["bad"], r
