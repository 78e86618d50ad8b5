"""The make front checks what a user types before any shell sees it (real `make` calls): a shell
command in TORCH= is refused and runs nothing, paths with spaces and quotes reach the tools as one
argument, and `make clean` cleans the project's build/ and dist/, not the caller's folder."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def make(*args, cwd=ROOT, env_extra=None, makefile=None):
    import os
    env = {**os.environ, **(env_extra or {})}
    cmd = ["make", "--no-print-directory"] + (["-f", str(makefile)] if makefile else []) + list(args)
    # PY names the running interpreter, so that make does not try to (re)make the virtualenv
    return subprocess.run(cmd + [f"PY={sys.executable}"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)


@pytest.mark.parametrize("value", ["v2.6.0; touch injected", "v2.6.0; touch injected #",
                                   "v2.6.0 && touch injected", "$(shell touch injected)", "`touch injected`"])
def test_a_shell_command_in_torch_is_refused_and_runs_nothing(value, tmp_path):
    r = make("build", f"TORCH={value}", "DRY_RUN=1", env_extra={"LMS_CACHE_DIR": str(tmp_path)})
    assert r.returncode != 0, r.stdout
    assert "TORCH" in r.stdout and ("not a release tag" in r.stdout or "must not contain" in r.stdout), r.stdout
    assert not (ROOT / "injected").exists()
    assert "build_tools" not in r.stdout  # refused before the tools (or any shell) ran


@pytest.mark.parametrize("var,value", [("MODE", "overlay;id"), ("JOBS", "2;id"), ("TF", "v2.14.1 x"),
                                       ("PATCH_SHA256", "abc;id"), ("SOURCE", "$(shell id)"),
                                       ("TREE_ONLY", "$(shell touch injected)")])
def test_other_variables_are_checked(var, value, tmp_path):
    r = make("build", "TORCH=v2.6.0", f"{var}={value}", "DRY_RUN=1", env_extra={"LMS_CACHE_DIR": str(tmp_path)})
    assert r.returncode != 0 and var in r.stdout, r.stdout
    assert not (ROOT / "injected").exists()


def test_the_interpreter_name_reaches_the_shell_quoted(tmp_path):
    """`make help` prints PYTHON inside a shell line: a double quote in it ends no string and
    runs nothing."""
    evil = '"; touch injected; echo "'
    r = make("help", f"PYTHON=python3{evil}", cwd=tmp_path, makefile=ROOT / "Makefile")
    assert r.returncode == 0, r.stdout
    assert f"python3{evil} -m build_tools --help" in r.stdout, r.stdout
    assert not (tmp_path / "injected").exists() and not (ROOT / "injected").exists()


def _make_raw(*args, cwd):
    """`make` with exactly these arguments (make() above adds its own PY)."""
    return subprocess.run(["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), *args], cwd=cwd,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


def test_the_interpreters_reach_the_shell_quoted(tmp_path):
    """PY (the tools' interpreter) and PYTHON (the conformance run's) are one shell word each: a
    command in them is a name that does not exist, and runs nothing."""
    r = _make_raw("tags", "PY=python3; touch injected;", cwd=tmp_path)
    assert r.returncode != 0, r.stdout
    r = _make_raw("conformance", "PYTHON=python3; touch injected;", cwd=tmp_path)
    assert r.returncode != 0, r.stdout
    assert not (tmp_path / "injected").exists() and not (ROOT / "injected").exists()


@pytest.mark.parametrize("var", ["PYTHON", "VENV", "PY", "PYTEST_ARGS"])
def test_a_dollar_in_the_interpreter_variables_is_refused(var, tmp_path):
    r = _make_raw("help", f"{var}=$(shell touch injected)", cwd=tmp_path)
    assert r.returncode != 0 and f"{var} must not contain" in r.stdout, r.stdout
    assert not (tmp_path / "injected").exists() and not (ROOT / "injected").exists()


def test_pytest_args_reach_pytest_and_not_the_shell(tmp_path):
    """PYTEST_ARGS of `make conformance` arrive as pytest's arguments (through PYTEST_ADDOPTS),
    split as a shell would split them, and a shell command in them runs nothing."""
    probe = tmp_path / "tests" / "conformance"
    probe.mkdir(parents=True)
    (probe / "test_probe.py").write_text("import pytest\n\n\n@pytest.mark.gpu\ndef test_probe():\n    pass\n")
    r = _make_raw("conformance", f"PYTHON={sys.executable}", "PYTEST_ARGS=-k 'probe and not other'", cwd=tmp_path)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout
    r = _make_raw("conformance", f"PYTHON={sys.executable}", "PYTEST_ARGS=-k 'nothing or absent'", cwd=tmp_path)
    assert r.returncode != 0 and "1 deselected" in r.stdout, r.stdout
    r = _make_raw("conformance", f"PYTHON={sys.executable}", "PYTEST_ARGS=-p no:x; touch injected", cwd=tmp_path)
    assert r.returncode != 0, r.stdout
    assert not (tmp_path / "injected").exists() and not (ROOT / "injected").exists()


def test_a_patch_path_with_spaces_and_quotes_works(tmp_path):
    d = tmp_path / "my dir's"
    d.mkdir()
    patch = d / "lms fix.patch"
    patch.write_text("diff --git a/c10/cuda/x.h b/c10/cuda/x.h\nnew file mode 100644\n--- /dev/null\n"
                     "+++ b/c10/cuda/x.h\n@@ -0,0 +1 @@\n+// x\n")
    r = make("build", "TORCH=v2.6.0", "MODE=overlay", "DRY_RUN=1", f"PATCH={patch}",
             env_extra={"LMS_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stdout
    assert "lms fix" in r.stdout and "Steps:" in r.stdout


def test_clean_cleans_the_project_not_the_callers_folder(tmp_path):
    proj, caller = tmp_path / "proj", tmp_path / "caller"
    for d in (proj / "build", proj / "dist", caller / "build", caller / "dist"):
        d.mkdir(parents=True)
    shutil.copy(ROOT / "Makefile", proj / "Makefile")
    r = make("clean", cwd=caller, makefile=proj / "Makefile")
    assert r.returncode == 0, r.stdout
    assert not (proj / "build").exists() and not (proj / "dist").exists()
    assert (caller / "build").is_dir() and (caller / "dist").is_dir()
