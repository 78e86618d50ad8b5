"""The help that `make help` points at runs before `make setup`: without GitPython (a fresh
machine's python3 has none), `python3 -m build_tools --help` and `tags` answer."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WITHOUT_GIT = ("import runpy, sys; sys.modules['git'] = None; sys.argv = ['build_tools'] + "
               "sys.argv[1:]; runpy.run_module('build_tools', run_name='__main__', alter_sys=True)")


def _run(*args):
    return subprocess.run([sys.executable, "-c", WITHOUT_GIT, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_help_runs_without_gitpython():
    p = _run("--help")
    assert p.returncode == 0, p.stderr
    assert "usage: python -m build_tools" in p.stdout


def test_make_help_points_at_that_command():
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True).stdout
    assert out.strip().splitlines()[-1].endswith("-m build_tools --help")


def test_a_command_that_needs_git_says_how_to_get_it(tmp_path):
    p = _run("--cache-dir", str(tmp_path), "verify", "--source", str(tmp_path / "none.tar.gz"))
    assert p.returncode != 0
    assert "Traceback" not in p.stderr, p.stderr
