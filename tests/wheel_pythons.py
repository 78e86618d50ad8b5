"""Which Python runs a test that needs an old framework's official wheel.

torch 1.13.1 and tensorflow-cpu 2.14.1 publish CPython wheels up to 3.11 only, so on a machine whose
Python is newer (Debian 13: 3.13) the tests that install them run under another interpreter that has
a wheel: this one when it qualifies, else the newest `python3.X` on PATH that does (with venv and
pip). Where the machine has none, the test skips with the reason NO_WHEEL says,
"no <framework> <version> wheel for Python 3.x": the one kind of skip besides `gpu` (conftest's
summary counts them apart). A missing interpreter is never a failure: the test cannot mean anything
there. Nothing is downloaded to get one (no CPython is published on PyPI or Debian 13's archive).
"""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

# CPython versions (3.10 and up: the project's own floor) with an official manylinux x86-64 wheel
# on PyPI: torch 1.13.1 (cp37-cp311), tensorflow-cpu 2.14.1 and tensorflow 2.14.1 (cp39-cp311).
WHEEL_PYTHONS = {
    ("torch", "1.13.1"): ("3.10", "3.11"),
    ("tensorflow-cpu", "2.14.1"): ("3.10", "3.11"),
    ("tensorflow", "2.14.1"): ("3.10", "3.11"),
}
RUNNING = "%d.%d" % sys.version_info[:2]
# the skip reason's pattern (tests/conftest.py sorts skips by it)
NO_WHEEL_PATTERN = r"^no \S+ \S+ wheel for Python \d+\.\d+$"


def no_wheel(framework: str, version: str, python: str | None = None) -> str:
    return f"no {framework} {version} wheel for Python {python or RUNNING}"


def _usable(exe: str, version: str) -> bool:
    r = subprocess.run([exe, "-c", "import sys, venv, ensurepip; print('%d.%d' % sys.version_info[:2])"],
                       capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip() == version


def find_python(framework: str, version: str, path: str | None = None) -> str | None:
    """An interpreter that framework==version has a wheel for: this one, else python3.X on PATH
    (newest first), else None."""
    versions = WHEEL_PYTHONS[(framework, version)]
    if RUNNING in versions:
        return sys.executable
    for v in reversed(versions):
        exe = shutil.which(f"python{v}", path=path)
        if exe and _usable(exe, v):
            return exe
    return None


def python_for(framework: str, version: str) -> str:
    """find_python's interpreter, or skip the test with the no-wheel reason."""
    exe = find_python(framework, version)
    if exe is None:
        pytest.skip(no_wheel(framework, version))
    return exe
