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
