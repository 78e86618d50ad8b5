"""The help that `make help` points at runs before `make setup`: without GitPython (a fresh
machine's python3 has none), `python3 -m build_tools --help`, `lms-build --help` and `tags` answer."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WITHOUT_GIT = ("import runpy, sys; sys.modules['git'] = None; sys.argv = ['build_tools'] + "
               "sys.argv[1:]; runpy.run_module('build_tools', run_name='__main__', alter_sys=True)")


def _run(*args):
    return subprocess.run([sys.executable, "-c", WITHOUT_GIT, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def _git_blocker(tmp_path: Path) -> dict:
    """An environment whose Python cannot import GitPython: a `git` package that refuses, first on
    the path."""
    (tmp_path / "git").mkdir(parents=True)
    (tmp_path / "git" / "__init__.py").write_text("raise ImportError('GitPython blocked by the test')\n")
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_help_runs_without_gitpython():
    p = _run("--help")
    assert p.returncode == 0, p.stderr
    assert "usage: python -m build_tools" in p.stdout


def test_lms_build_help_runs_without_gitpython_and_does_not_import_it(tmp_path):
    # what the console script does (pyproject.toml: lms-build = "build_tools.cli:main"), once with
    # GitPython blocked and once with it importable: --help must not load it either way
    assert 'lms-build = "build_tools.cli:main"' in (ROOT / "pyproject.toml").read_text()
    script = ("import sys; sys.argv[0] = '/somewhere/bin/lms-build'\n"
              "from build_tools.cli import main\n"
              "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
              "print('git imported:', sys.modules.get('git') is not None, 'exit:', code)\n")
    blocked = subprocess.run([sys.executable, "-c", script, "--help"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120, env=_git_blocker(tmp_path))
    assert blocked.returncode == 0, blocked.stderr
    assert blocked.stdout.startswith("usage: lms-build "), blocked.stdout[:200]
    assert "git imported: False exit: 0" in blocked.stdout
    free = subprocess.run([sys.executable, "-c", script, "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert "git imported: False exit: 0" in free.stdout, free.stdout[-300:] + free.stderr


def _pointed_at(make_args: list[str], cwd: Path) -> str:
    out = subprocess.run(["make", "-s", *make_args, "help", f"PYTHON={sys.executable}"], cwd=cwd,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_make_help_points_at_a_command_that_runs_without_gitpython(tmp_path):
    # the last line of `make help` is a command: run it as printed, from the project root and from
    # another folder (`make -f`), with GitPython unimportable
    env = _git_blocker(tmp_path / "blocker")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for make_args, cwd in (([], ROOT), (["-f", str(ROOT / "Makefile")], elsewhere)):
        cmd = _pointed_at(make_args, cwd)
        assert cmd.endswith("-m build_tools --help"), cmd
        p = subprocess.run(["sh", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (cmd, p.stderr)
        assert p.stdout.startswith("usage: python -m build_tools"), (cmd, p.stdout[:200])
        assert "build pytorch v2.6.0 --mode overlay" in p.stdout  # the examples, not a stub


def test_a_command_that_needs_git_says_how_to_get_it(tmp_path):
    p = _run("--cache-dir", str(tmp_path), "verify", "--source", str(tmp_path / "none.tar.gz"))
    assert p.returncode != 0
    assert "Traceback" not in p.stderr, p.stderr
