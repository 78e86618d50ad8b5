"""Two real builds started at once in one checkout, with different patches (PATCH=), share the build
folder build/pytorch-v2.6.0-overlay/: the second waits for the first under the folder's lock and says
who holds it, instead of replacing the tree under the first; each run writes its own log; each ends
with the tree of its own patch, and the tree left is the second's.

The builds are the CLI's (`python -m build_tools build ... --tree-only`, what `make build` calls,
stopped once the patched tree is made): the real Debian source of PyTorch v2.6.0 from the cache
($LMS_CACHE_DIR), real `git worktree add` and `git am`. The checkout is a copy of this one's files
in a temporary folder, so that the test never touches this checkout's build/.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from build_tools import catalog, gitutil
from build_tools.upstream import parse_source

ROOT = Path(__file__).resolve().parents[1]
TAG = "v2.6.0"
# the source of the real trees, as tests/conftest.py's test_source says
SOURCE = os.environ.get("LMS_TEST_SOURCE_PYTORCH", os.environ.get("LMS_TEST_SOURCE", "debian"))


def _mark(name: str) -> str:
    """One more `git format-patch` mail: adds the file LMS_BUILD_<name> at the tree's root."""
    return (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
            f"From: LMS tests <tests@example.invalid>\nDate: Mon, 1 Jan 2024 00:00:00 +0000\n"
            f"Subject: [PATCH] mark build {name}\n\n---\n LMS_BUILD_{name} | 1 +\n"
            f" 1 file changed, 1 insertion(+)\n create mode 100644 LMS_BUILD_{name}\n\n"
            f"diff --git a/LMS_BUILD_{name} b/LMS_BUILD_{name}\nnew file mode 100644\n"
            f"--- /dev/null\n+++ b/LMS_BUILD_{name}\n@@ -0,0 +1 @@\n+{name}\n-- \n2.39.2\n\n")


def _copy_checkout(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           stdout=subprocess.PIPE).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture
def checkout(tmp_path):
    co = _copy_checkout(tmp_path / "checkout")
    yield co
    tree = co / "build" / f"pytorch-{TAG}-overlay" / "src"
    if tree.exists():  # the worktree is registered in the cached repo: unregister it
        repo, _ = parse_source(catalog.framework("pytorch"), SOURCE).ensure(TAG)
        gitutil.remove_worktree(repo, tree)


def test_two_builds_with_different_patches_at_once_do_not_clobber_each_other(checkout, tmp_path):
    shipped = (ROOT / "patches" / f"pytorch_{TAG}_large_model_support.patch").read_text()
    patches = {}
    for name in "AB":
        patches[name] = tmp_path / f"pytorch_{TAG}_{name}.patch"
        patches[name].write_text(shipped + _mark(name))
    folder = checkout / "build" / f"pytorch-{TAG}-overlay"
    lock = folder.with_name(folder.name + ".lock")

    def start(name):
        return subprocess.Popen(
            [sys.executable, "-m", "build_tools", "build", "pytorch", TAG, "--mode", "overlay",
             "--source", SOURCE, "--patch", str(patches[name]), "--tree-only"],
            cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))

    first = start("A")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and first.poll() is None:  # until A holds the build folder
        if lock.is_file() and f"pid {first.pid}," in lock.read_text():
            break
        time.sleep(0.05)
    assert first.poll() is None, first.communicate()
    second = start("B")
    out_a, err_a = first.communicate(timeout=900)
    out_b, err_b = second.communicate(timeout=900)
    assert first.returncode == 0, err_a[-3000:]
    assert second.returncode == 0, err_b[-3000:]

    # B waited for A, and said for whom
    assert f"waiting for {folder}: another build holds it (pid {first.pid}," in err_b, err_b[-3000:]
    assert "waiting for" not in err_a
    assert f"got {folder} after" in err_b
    # A made its tree (its own patch applied) before B touched the folder; B then made its own
    tree = folder / "src"
    assert (tree / "LMS_BUILD_B").read_text() == "B\n"
    assert not (tree / "LMS_BUILD_A").exists()
    assert (tree / "c10" / "cuda" / "CUDACachingAllocator.cpp").is_file()
    head = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%s"], check=True,
                          stdout=subprocess.PIPE, text=True).stdout.strip()
    assert head == "mark build B"
    # one log per run, each naming its own run; build.log names the latest (B's)
    logs = sorted((folder / "logs").glob("*.log"))
    assert len(logs) == 2
    assert {p.name.rsplit("-", 1)[1] for p in logs} == {f"{first.pid}.log", f"{second.pid}.log"}
    assert (folder / "build.log").resolve().name.endswith(f"-{second.pid}.log")
    assert all("(tree only)" in p.read_text() for p in logs)


def test_make_tree_only_plans_the_tree_step_alone():
    """TREE_ONLY=1 reaches the CLI: the plan ends at the patched tree and checks no toolchain."""
    r = subprocess.run(["make", "--no-print-directory", "build", f"TORCH={TAG}", "MODE=overlay", "DRY_RUN=1",
                        "TREE_ONLY=1", f"PY={sys.executable}"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "(tree only)" in r.stdout and "--tree-only" in r.stdout + r.stderr
    steps = [line for line in r.stdout.splitlines() if line.lstrip().startswith("[")]
    assert len(steps) == 1 and "compose the LMS change from the sources" in steps[0], r.stdout
