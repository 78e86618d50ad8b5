"""tests/conftest.py's skip policy: skips counted per reason in the terminal summary; with
--no-unexpected-skips (or under `make conformance`, LMS_CONFORMANCE_REPORT) a skip whose reason is not
an allowed one (gpu, no-wheel, tag) fails; under -m gpu a missing tool (gpu_requirements.missing) fails."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASES = '''
import pytest
from tests import gpu_requirements

def test_no_wheel():
    pytest.skip("no torch 1.13.1 wheel for Python 3.13")

def test_broken_setup():
    pytest.skip("something is not installed")

@pytest.mark.gpu
def test_on_gpu():
    gpu_requirements.missing("compute-sanitizer not found")

@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False
'''


def run(tmp_path, *args, env=None):
    (tmp_path / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
                                          "from tests.conftest import *  # noqa: F401,F403\n")
    (tmp_path / "test_cases.py").write_text(CASES)
    full = {**os.environ, **(env or {})}
    if not env:
        full.pop("LMS_CONFORMANCE_REPORT", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-ra", "--rootdir",
                        str(tmp_path), str(tmp_path / "test_cases.py"), *args],
                       cwd=tmp_path, env=full, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout


def test_skips_are_counted_per_reason(tmp_path):
    rc, out = run(tmp_path)
    assert rc == 0, out
    gpu = "1 gpu, " if "no CUDA GPU" in out else ""
    assert "skips: " in out and "1 no-wheel" in out and "1 other: something is not installed" in out, out
    assert "xfail" not in out.split("skips: ")[1].splitlines()[0], out
    assert gpu or "compute-sanitizer not found" in out


def test_unexpected_skips_fail_when_asked(tmp_path):
    rc, out = run(tmp_path, "--no-unexpected-skips", "-m", "not gpu")
    assert rc == 1, out
    assert "FAILED" in out and "unexpected skip (allowed: gpu, no-wheel, tag): something is not installed" in out
    assert "1 failed, 1 skipped, 1 deselected, 1 xfailed" in out, out


def test_under_make_conformance_a_missing_tool_fails(tmp_path):
    report = tmp_path / "summary.json"
    rc, out = run(tmp_path, env={"LMS_CONFORMANCE_REPORT": str(report)})
    assert rc == 1, out
    data = json.loads(report.read_text())
    assert data["skips_by_reason"].get("no-wheel") == 1 and data["counts"].get("xfailed") == 1, data
    outcomes = {t["test"].split("::")[-1]: t["outcome"] for t in data["tests"]}
    assert outcomes["test_broken_setup"] == "failed"
    # on a machine without a GPU the gpu test is skipped (allowed); on one it fails on the missing tool
    assert outcomes["test_on_gpu"] in ("skipped", "failed") and ("compute-sanitizer" in out or outcomes["test_on_gpu"] == "skipped")


def test_compute_sanitizer_is_found_on_path_or_in_a_cuda_home_else_missing(tmp_path, monkeypatch):
    import pytest
    from tests import gpu_requirements
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    tool = home / "bin" / "compute-sanitizer"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpu_requirements.compute_sanitizer(tmp_path / "none", home) == str(tool)
    with pytest.raises(pytest.skip.Exception, match="compute-sanitizer not found"):
        gpu_requirements.compute_sanitizer(tmp_path / "none")
    monkeypatch.setenv("PATH", str(home / "bin"))
    assert gpu_requirements.compute_sanitizer() == str(tool)
