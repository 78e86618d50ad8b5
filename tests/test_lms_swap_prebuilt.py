"""The lms-swap wheel as `python -m build_tools lms-swap` makes it, in a fresh venv that holds only the
host's stock torch (CPU): it installs, imports, enable() says plainly that a CPU-only torch has nothing
to swap, and uninstalling leaves nothing behind; its conda package installs into a prefix and imports.
A wheel whose prebuilt net was made for another torch is refused at import, and a CPU-only torch is
refused as a target for the net with the reason. (The net compiled into the wheel and loaded without a
compiler: tests/conformance/lms_swap/test_lms_swap_prebuilt_gpu.py.)"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LMS_SWAP_PATH", "LMS_SWAP_IGNORE_PREBUILT")}

PROBE = r"""
import json, sys, warnings
import torch
import lms_swap
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    lms_swap.enable()
    x = torch.randn(8, 8, requires_grad=True)
    (x.sin() * x).sum().backward()
    lms_swap.disable()
print(json.dumps({"file": lms_swap.__file__, "warnings": [str(m.message) for m in w],
                  "prebuilt": lms_swap.guard.prebuilt.record(), "grad": x.grad is not None}))
"""


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=kw.pop("env", ENV), **kw)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _probe(py, env=None):
    r = _run([str(py), "-c", PROBE], env=env or ENV, cwd="/")
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The pure-Python wheel and its conda channel, made by the build tools' command."""
    out = tmp_path_factory.mktemp("lms-swap-build")
    _run([sys.executable, "-m", "build_tools", "lms-swap", "--no-net", "--dist", str(out / "dist"),
          "--conda", str(out / "channel")], cwd=REPO, env={**ENV, "PYTHONPATH": str(REPO)})
    [whl] = (out / "dist").glob("lms_swap-*.whl")
    return whl, out / "channel"


@pytest.fixture
def fresh_venv(tmp_path):
    """A venv with nothing but the host's torch (on a .pth line after its own site-packages)."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    site = pathlib.Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
                        .stdout.strip())
    (site / "host_torch.pth").write_text(str(pathlib.Path(torch.__file__).resolve().parent.parent) + "\n")
    return py, site


def _tree(root: pathlib.Path) -> set:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_the_wheel_installs_imports_enables_on_cpu_and_uninstalls_cleanly(built, fresh_venv):
    whl, _ = built
    assert whl.name == "lms_swap-0.1.0-py3-none-any.whl"
    assert "lms_swap/prebuilt.py" in zipfile.ZipFile(whl).namelist()
    py, site = fresh_venv
    before = _tree(site)
    pip = [sys.executable, "-m", "pip", "--python", str(py)]
    _run(pip + ["install", "--no-deps", "--no-index", "-q", str(whl)])
    out = _probe(py)
    assert pathlib.Path(out["file"]).resolve() == (site / "lms_swap" / "__init__.py").resolve()
    assert out["grad"] and out["prebuilt"] is None
    if not torch.cuda.is_available():
        said = [m for m in out["warnings"] if "nothing is swapped" in m]
        assert len(said) == 1 and torch.__version__ in said[0], out["warnings"]
    _run(pip + ["uninstall", "-y", "-q", "lms-swap"])
    assert _tree(site) == before, _tree(site) - before


def test_the_wheel_carries_the_lms_core_byte_for_byte(built):
    """The pluggable allocator compiles the patched build's LMS core, which a wheel made by the build
    tools (from a copy of lms-swap/, away from patches/) must carry as setup.py stages it."""
    from lms_swap import allocator_sources
    whl, _ = built
    with zipfile.ZipFile(whl) as zf:
        names = set(zf.namelist())
        for inside, source in allocator_sources.CORE_FILES.items():
            packed = f"lms_swap/{allocator_sources.PACKAGED_CORE}/{inside}"
            assert packed in names, f"{whl.name} lacks {packed}"
            assert zf.read(packed) == (REPO / source).read_bytes(), packed


def test_the_conda_package_installs_into_a_prefix_and_imports(built, fresh_venv, tmp_path):
    from build_tools.packagers import conda
    _, channel = built
    [pkg] = (channel / "linux-64").glob("lms-swap-0.1.0-*.conda")
    prefix = tmp_path / "prefix"
    installed = conda.install(channel, prefix, "lms-swap ==0.1.0", cache_dir=tmp_path / "pkgs")
    assert installed == [f"lms-swap 0.1.0 {pkg.name[len('lms-swap-0.1.0-'):-len('.conda')]}"]
    meta = json.loads(next((prefix / "conda-meta").glob("lms-swap-0.1.0-*.json")).read_text())
    assert "pytorch >=2.4" in meta["depends"] and meta["license"] == "Apache-2.0", meta
    sp = prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    py, _ = fresh_venv
    out = _probe(py, env={**ENV, "PYTHONPATH": str(sp)})
    assert pathlib.Path(out["file"]) == sp / "lms_swap" / "__init__.py" and out["grad"]


def test_a_prebuilt_net_for_another_torch_is_refused_at_import(built, tmp_path):
    """A wheel's record names the torch its net was compiled against; under another torch the import
    fails and says what to install; LMS_SWAP_IGNORE_PREBUILT=1 imports it without the net."""
    whl, _ = built
    target = tmp_path / "target"
    with zipfile.ZipFile(whl) as zf:
        zf.extractall(target)
    other = "2.0.1+cu118"  # older than any torch lms-swap supports
    (target / "lms_swap" / "_net_build.json").write_text(json.dumps(
        {"torch": other, "torch_cuda": "11.8", "cuda_headers": "11.8"}))
    code = "import lms_swap; print(lms_swap.guard.prebuilt.load())"
    env = {**ENV, "PYTHONPATH": str(target)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert r.returncode != 0
    assert "ImportError: lms_swap cannot be used here: it was built for torch " + other in r.stderr, r.stderr
    assert f"and this is torch {torch.__version__}" in r.stderr and "pip install ./lms-swap" in r.stderr
    r = _run([sys.executable, "-c", code], env={**env, "LMS_SWAP_IGNORE_PREBUILT": "1"}, cwd="/")
    assert r.stdout.strip().splitlines()[-1] == "None"


ABSENCE = r"""
import json
import lms_swap.allocator, lms_swap.prebuilt as p
try:
    got = p.load("allocator")
except Exception as e:
    got = type(e).__name__
print(json.dumps({"load": got if got is None or isinstance(got, str) else got.__file__,
                  "why": p.absence_reason("allocator"), "refusal": lms_swap.allocator.refusal()}))
"""


@pytest.mark.parametrize("case", ["pure", "built-without", "named-but-missing"])
def test_where_the_wheel_has_no_compiled_allocator_it_says_why(built, tmp_path, case):
    """What the allocator says before it compiles at first use: a pure-Python install carries none, a
    wheel built without it gives the build's reason, and loading from a wheel whose record names a
    module it lacks fails (the allocator then compiles, saying so); none of them turns the torch's
    own refusal into another."""
    whl, _ = built
    target = tmp_path / "target"
    with zipfile.ZipFile(whl) as zf:
        zf.extractall(target)
    rec = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_headers": None,
           "module": "_lms_swap_guard"}
    if case == "built-without":
        rec.update(allocator=None, allocator_absent="nvml.h is missing (for this test)")
    if case == "named-but-missing":
        rec.update(allocator="_lms_pluggable_allocator")
    if case != "pure":
        (target / "lms_swap" / "_net_build.json").write_text(json.dumps(rec))
    out = json.loads(_run([sys.executable, "-c", ABSENCE], env={**ENV, "PYTHONPATH": str(target)},
                          cwd="/").stdout.strip().splitlines()[-1])
    want = {"pure": "this lms_swap install carries no prebuilt allocator (a source or pure-Python install)",
            "built-without": "this lms_swap wheel was built without a prebuilt allocator (nvml.h is missing "
                             "(for this test))",
            "named-but-missing": None}[case]
    assert want is None or out["why"] == want, out
    assert out["load"] == ("ModuleNotFoundError" if case == "named-but-missing" else None), out
    if torch.version.cuda is None:
        assert "CPU-only build" in out["refusal"], out


def test_a_wheel_whose_compiled_allocator_and_record_disagree_is_refused(built, tmp_path):
    from build_tools import lms_swap_wheel
    from build_tools.errors import LmsError
    whl, _ = built
    bad = tmp_path / "lms_swap-0.1.0+torch2.11.0.cu130-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(whl) as src, zipfile.ZipFile(bad, "w") as dst:
        for n in src.namelist():
            data = src.read(n)
            if n.endswith(".dist-info/METADATA"):
                data = data.replace(b"Version: 0.1.0\n", b"Version: 0.1.0+torch2.11.0.cu130\n")
            dst.writestr(n, data)
        dst.writestr("lms_swap/_lms_swap_guard.cpython-311-x86_64-linux-gnu.so", b"")
        dst.writestr("lms_swap/_net_build.json", json.dumps({"torch": "2.11.0+cu130",
                                                             "allocator": "_lms_pluggable_allocator"}))
    with pytest.raises(LmsError, match=r"the compiled pluggable allocator \(none\) and the record's "
                                       r"allocator \(_lms_pluggable_allocator\) disagree"):
        lms_swap_wheel.read_wheel(bad)


def test_the_cli_compiles_the_net_for_this_torch_or_refuses_with_the_reason(tmp_path):
    """`python -m build_tools lms-swap` (with the net) for the torch of this interpreter: where the
    build's own checks refuse it (a CPU-only torch, incomplete CUDA headers), exit 2 with that reason
    and no wheel; else a wheel with the compiled net and its record.  Which of the two is expected
    is asked of the same checks (net_toolchain.refusal), not read from the outcome."""
    from lms_swap import net_toolchain
    reason = net_toolchain.refusal()
    r = subprocess.run([sys.executable, "-m", "build_tools", "lms-swap", "--dist", str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True, timeout=900, env={**ENV, "PYTHONPATH": str(REPO)})
    if reason is not None:
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"error: cannot compile the eviction net: {reason}" in r.stderr
        if torch.version.cuda is None:
            assert f"torch {torch.__version__} is a CPU-only build" in reason
        assert not list(tmp_path.glob("*.whl"))
        return
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    [whl] = tmp_path.glob("lms_swap-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert any(n.startswith("lms_swap/_lms_swap_guard") and n.endswith(".so") for n in names), names
    record = json.loads(zipfile.ZipFile(whl).read("lms_swap/_net_build.json"))
    assert record["torch"] == torch.__version__ and record["torch_cuda"] == torch.version.cuda, record
