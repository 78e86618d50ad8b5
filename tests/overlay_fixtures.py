"""Shared, memoised artefacts of the overlay/install/conda tests (built once per test session).

Test modules import the fixtures they use from here; the build itself is memoised at module level,
so that several modules importing the same fixture still build the overlay wheel only once.

  overlay_build   the real overlay build of lms_tree("pytorch", "v2.6.0") into a temporary dist/
                  (downloads torch 2.6.0 for this Python once into .cache/wheels/)
  wheel_venv      a fresh venv with the overlay wheel pip-installed (dependencies downloaded once
                  into .cache/wheels/deps/ with `pip download`, then installed with --no-index)
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TAG = "v2.6.0"
DEPS_CACHE = REPO / ".cache" / "wheels" / "deps"
_memo: dict = {}
TIMINGS: dict = {}


def _record(name: str, seconds: float) -> None:
    TIMINGS[name] = round(seconds, 1)
    out = REPO / "build" / "test-timings.json"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        old = json.loads(out.read_text()) if out.exists() else {}
        old.update(TIMINGS)
        out.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")
    except OSError:
        pass


_scratch_dirs: list = []


def _cleanup() -> None:
    if os.environ.get("LMS_KEEP_TEST_BUILD"):
        return
    for d in _scratch_dirs:
        shutil.rmtree(d, ignore_errors=True)


atexit.register(_cleanup)


def _scratch() -> Path:
    """A scratch folder under build/tests/ (several GB: venv, conda prefix), removed when the test
    session ends (set LMS_KEEP_TEST_BUILD=1 to keep it)."""
    base = REPO / "build" / "tests"
    base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="overlay-", dir=base))
    _scratch_dirs.append(d)
    return d


# The overlay build runs as users run it, `<venv>/bin/python -m build_tools.overlay`, with only the
# system's PATH: the programs `make setup` put into the venv must be found without activating it.
SYSTEM_PATH = "/usr/bin:/bin"


def build_overlay_wheel(tag: str, tree: Path, timing: str, python: str | None = None):
    """(wheel, report dict, log) of `python -m build_tools.overlay <tag> <tree>` into a scratch dist/,
    run in a child process whose PATH is SYSTEM_PATH; ``python``: the interpreter the wheel is for
    (default: this one)."""
    dist = _scratch() / "dist"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "build_tools.overlay", tag, str(tree), "--dist", str(dist),
                           *(["--python", python] if python else [])],
                          cwd=REPO, env={**os.environ, "PATH": SYSTEM_PATH},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _record(timing, time.monotonic() - t0)
    assert proc.returncode == 0, f"overlay build of {tag} with PATH={SYSTEM_PATH} failed:\n{proc.stdout[-4000:]}"
    wheel = Path(proc.stdout.strip().splitlines()[-1])
    return wheel, json.loads(wheel.with_name(wheel.name + ".overlay.json").read_text()), proc.stdout


@pytest.fixture(scope="session")
def overlay_build(lms_tree):
    """(OverlayResult, tree) of the overlay build of the current LMS sources, made by the CLI in a
    child process whose PATH is SYSTEM_PATH."""
    if "build" not in _memo:
        from build_tools.overlay import OverlayResult, plan_overlay
        tree = lms_tree("pytorch", TAG)
        wheel, rep, log = build_overlay_wheel(TAG, tree, "overlay_build_s")
        report = wheel.with_name(wheel.name + ".overlay.json")
        res = OverlayResult(wheel, report, rep["version"], rep["platform_tag"], plan_overlay(tree, TAG, TAG),
                            rep["abi"], rep["timings_s"])
        _memo["build"] = (res, tree)
        _memo["build_log"] = log
    return _memo["build"]


def wheel_requirements(wheel: Path) -> list[str]:
    """Requires-Dist of a wheel (without extras), as pip requirement strings."""
    import re
    import zipfile
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    return [r.strip() for r in re.findall(r"^Requires-Dist: (.+)$", text, re.M) if "extra ==" not in r]


def _venv(path: Path, python: str | None = None) -> Path:
    subprocess.run([python or sys.executable, "-m", "venv", str(path)], check=True)
    return path / "bin" / "python"


@pytest.fixture(scope="session")
def wheel_venv(overlay_build):
    """Python of a fresh venv with the overlay wheel and its dependencies installed by pip."""
    if "venv" not in _memo:
        res, _ = overlay_build
        DEPS_CACHE.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        # dependencies (nvidia-*: ~2.4 GB) downloaded once per machine; pip reuses files already there
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(DEPS_CACHE),
                        *wheel_requirements(res.wheel)], check=True)
        t1 = time.monotonic()
        py = _venv(_scratch() / "venv")
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(DEPS_CACHE),
                        str(res.wheel)], check=True)
        t2 = time.monotonic()
        _record("pip_download_deps_s", t1 - t0)
        _record("pip_install_s", t2 - t1)
        _memo["venv"] = py
    return _memo["venv"]


def run_py(python: Path | str, code: str, env: dict | None = None) -> dict:
    """Run `code` in `python`; it must print one JSON object as its last line."""
    full = dict(os.environ)
    full.pop("PYTHONPATH", None)
    full.update(env or {})
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=full, cwd="/")
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# What the install tests run inside the installed torch (venv or conda prefix).
PROBE = r"""
import json, torch
out = {"version": torch.__version__, "file": torch.__file__, "cuda": torch.version.cuda,
       "cuda_available": torch.cuda.is_available()}
stats = torch.cuda.memory_stats()
out["memory_stats_type"] = type(stats).__name__
out["memory_stats_len"] = len(stats)
names = ["set_enabled_lms", "get_enabled_lms", "set_limit_lms", "get_limit_lms", "set_size_lms",
         "get_size_lms", "set_host_mem_limit_lms", "get_host_mem_limit_lms", "set_lms_defrag_enabled",
         "get_lms_defrag_enabled", "is_lms_available"]
out["api"] = {n: hasattr(torch.cuda, n) for n in names}
rt = {}
if all(out["api"].values()):
    c = torch.cuda
    out["lms_available"] = bool(c.is_lms_available())
    try:
        c.set_limit_lms(3 << 30); rt["limit"] = c.get_limit_lms() == (3 << 30)
        c.set_size_lms(1 << 20); rt["size"] = c.get_size_lms() == (1 << 20)
        c.set_host_mem_limit_lms(5 << 30); rt["host_mem_limit"] = c.get_host_mem_limit_lms() == (5 << 30)
        c.set_lms_defrag_enabled(True); rt["defrag_on"] = c.get_lms_defrag_enabled() is True
        c.set_lms_defrag_enabled(False); rt["defrag_off"] = c.get_lms_defrag_enabled() is False
        c.set_enabled_lms(True); rt["enabled_on"] = c.get_enabled_lms() is True
        c.set_enabled_lms(False); rt["enabled_off"] = c.get_enabled_lms() is False
    except Exception as e:  # reported, the test decides
        rt["error"] = f"{type(e).__name__}: {e}"
    out["stats_after"] = len(torch.cuda.memory_stats())
    # Without a GPU memory_stats() returns {} before the LMS merge runs. Call it with the CUDA
    # side stood in (initialized, a given raw dict) to see the patched memory.py merge the real
    # libc10_cuda's lms.* statistics into it: the host limit just set must come back.
    import torch.cuda.memory as _mem
    _saved = (_mem.is_initialized, torch._C._cuda_memoryStats)
    try:
        _mem.is_initialized = lambda: True
        torch._C._cuda_memoryStats = lambda d: {"allocated_bytes": {"all": {"current": 12345}}}
        merged = torch.cuda.memory_stats(0)
        out["merged_stats"] = {k: v for k, v in merged.items()
                               if k.startswith("lms.") or k == "allocated_bytes.all.current"}
    except Exception as e:
        out["merged_stats"] = {"error": f"{type(e).__name__}: {e}"}
    finally:
        _mem.is_initialized, torch._C._cuda_memoryStats = _saved
out["roundtrip"] = rt
print(json.dumps(out))
"""
