"""`make build` of any tag: with a patch the user brings (PATCH=<file or URL>), or, for a tag no patch ships
for (the seeds' v2.1.0 / v1.4.0), starting from the nearest shipped patch rebased onto it.

No tree of the seeds' tags is reachable here: their dry-run plans are checked, and the paths those plans
run (the user's patch through `git am` into the build tree; the rebase written as a patch) run on the
trees that are: PyTorch v2.6.0 from Debian, and small real git repositories.
"""
from __future__ import annotations

import functools
import hashlib
import http.server
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from build_tools import catalog, gitutil
from build_tools.builders import common
from build_tools.errors import LmsError
from build_tools.patch_factory import export
from build_tools.patch_ops.apply import apply_patch
from build_tools.patch_ops.rebase import rebase_to_patch
from build_tools.patch_ops.user_patch import resolve
from build_tools.upstream import parse_source
from factory_fixtures import git, make_patches_dir, make_upstream, write

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "patches" / "pytorch_v2.6.0_large_model_support.patch"


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args, f"PY={sys.executable}"], cwd=REPO,
                          capture_output=True, text=True)


def _build_dirs() -> list[Path]:
    return sorted((REPO / "build").glob("*")) if (REPO / "build").exists() else []


# ---- the seeds' tags: plans a user can follow -----------------------------------------------------------

def test_seed_tag_without_a_patch_plans_the_nearest_patch_rebased():
    before = _build_dirs()
    r = make("build", "TF=v2.1.0", "DRY_RUN=1")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for expected in ("rebase the shipped v2.14.1 patch onto v2.1.0 with `git am -3`",
                     "file-by-file report of what is left",
                     "fetch --depth=1 https://github.com/tensorflow/tensorflow +refs/tags/v2.1.0:refs/tags/v2.1.0",
                     "rebase tensorflow --onto v2.1.0 --from v2.14.1",
                     "format-patch --stdout v2.1.0..HEAD",
                     "am /", "tensorflow_v2.1.0_rebased_from_v2.14.1.patch",
                     "has no profile of its own", "are v2.14.1's", "local version 2.1.0+lms1",
                     "Toolchain:", "bazel"):
        assert expected in out, expected
    assert _build_dirs() == before, "a dry run does nothing"


def test_seed_tag_with_the_users_patch_plans_that_patch(tmp_path):
    mine = tmp_path / "pytorch_v1.4.0_lms.patch"
    mine.write_bytes(SHIPPED.read_bytes())
    r = make("build", "TORCH=v1.4.0", f"PATCH={mine}", "DRY_RUN=1")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for expected in (f"am {mine}", "fetch --depth=1 https://github.com/pytorch/pytorch +refs/tags/v1.4.0",
                     "PYTORCH_BUILD_VERSION=1.4.0+lms1", "setup.py bdist_wheel",
                     "PyTorch v1.4.0 has no profile of its own", "are v1.13.1's, the nearest supported tag",
                     f"the patch applied is {mine}"):
        assert expected in out, expected
    assert "rebase" not in out


def test_bad_patch_arguments_are_refused_clearly(tmp_path):
    r = make("build", "TORCH=v1.4.0", f"PATCH={tmp_path / 'missing.patch'}", "DRY_RUN=1")
    assert r.returncode != 0 and "missing.patch not found" in r.stderr
    (tmp_path / "notes.txt").write_text("my notes, not a diff\n")
    r = make("build", "TORCH=v1.4.0", f"PATCH={tmp_path / 'notes.txt'}", "DRY_RUN=1")
    assert r.returncode != 0 and "holds no diff: it is not a patch" in r.stderr
    r = make("build", "TORCH=v1.4.0", "MODE=overlay", f"PATCH={SHIPPED}", "DRY_RUN=1")
    assert r.returncode != 0 and "overlay build needs the official wheel of a supported tag" in r.stderr
    assert "MODE=full PATCH=" in r.stderr


# ---- the user's patch through the build's own apply step, on the real tree --------------------------------

def _plain_diff(mbox: str) -> str:
    """The diff part of a one-commit `git format-patch` file (what `git diff` would print)."""
    body = mbox[mbox.index("diff --git "):]
    return body[:body.rindex("\n-- \n") + 1] if "\n-- \n" in body else body


@pytest.fixture
def v260(upstream_repo, upstream_source):
    upstream_repo("pytorch", "v2.6.0")
    return catalog.framework("pytorch"), upstream_source("pytorch")


def test_users_plain_diff_builds_through_the_same_apply_step(v260, tmp_path):
    fw, source = v260
    plain = tmp_path / "lms.diff"
    plain.write_text(_plain_diff(SHIPPED.read_text()))
    patch = resolve(str(plain))
    assert patch != plain and patch.read_text().startswith("From 0000000")
    prof = catalog.profile_with_patch(fw, "v2.6.0", patch)
    assert prof.patch_file == patch and prof.borrowed_from is None
    tree = tmp_path / "build" / "src"
    common.prepare_tree(prof, source, tree)
    assert "set_enabled_lms" in (tree / "torch/cuda/__init__.py").read_text()
    assert git(tree, "status", "--porcelain") == ""
    gitutil.remove_worktree(source.repo, tree)


def test_users_patch_that_does_not_apply_is_refused_with_its_hunk(v260, tmp_path):
    fw, source = v260
    text = SHIPPED.read_text()
    # break one context line of the first hunk that edits an upstream file
    target = "c10/cuda/CUDACachingAllocator.cpp"
    start = text.index(f"diff --git a/{target} b/{target}")
    hunk = text.index("\n@@ ", start) + 1
    ctx = text.index("\n ", hunk) + 1
    broken = text[:ctx] + " // not the upstream line\n" + text[ctx + text[ctx:].index("\n") + 1:]
    mine = tmp_path / "broken.patch"
    mine.write_text(broken)
    prof = catalog.profile_with_patch(fw, "v2.6.0", resolve(str(mine)))
    tree = tmp_path / "build" / "src"
    with pytest.raises(LmsError) as err:
        common.prepare_tree(prof, source, tree)
    msg = str(err.value)
    assert "broken.patch does not apply on PyTorch v2.6.0" in msg
    assert f"{target}: hunk 1 of " in msg and "does not apply" in msg
    assert "nothing was left behind" in msg and not tree.exists()


def test_users_patch_by_url_is_downloaded_once(tmp_path, monkeypatch):
    monkeypatch.setenv("LMS_CACHE_DIR", str(tmp_path / "cache"))
    served = tmp_path / "www"
    served.mkdir()
    (served / "lms.patch").write_bytes(SHIPPED.read_bytes())
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/lms.patch"
        with pytest.raises(LmsError, match="plain http without a sha256"):   # http needs PATCH_SHA256
            resolve(url)
        digest = hashlib.sha256(SHIPPED.read_bytes()).hexdigest()
        got = resolve(url, digest)
        assert got.read_bytes() == SHIPPED.read_bytes()
        assert got.parent.parent == tmp_path / "cache" / "patches"   # keyed by URL and hash
        (served / "lms.patch").unlink()
        assert resolve(url, digest) == got  # cached: no second download
    finally:
        httpd.shutdown()


# ---- a tag no patch ships for: the nearest shipped patch rebased, on real git repositories -----------------

@pytest.fixture
def world(tmp_path, monkeypatch):
    upstream = make_upstream(tmp_path / "upstream")
    # v2.6.5: a patch release no profile names, compatible with the v2.6.0 patch
    git(upstream, "checkout", "-q", "v2.6.1")
    write(upstream, "version.txt", "2.6.5a0\n")
    git(upstream, "commit", "-qam", "2.6.5")
    git(upstream, "tag", "v2.6.5")
    patches = make_patches_dir(tmp_path / "patches")
    monkeypatch.setenv("LMS_PATCHES_DIR", str(patches))
    monkeypatch.setenv("LMS_CACHE_DIR", str(tmp_path / "cache"))
    fw = catalog.framework("pytorch")
    source = parse_source(fw, str(upstream))
    export.export(catalog.profile(fw, "v2.6.1"), source)
    return tmp_path, fw, source


def test_rebase_onto_an_unshipped_tag_is_written_as_a_patch_that_applies(world):
    tmp, fw, source = world
    out = tmp / "rb" / "rebased.patch"
    rebase_to_patch(fw, "v2.6.5", source, "v2.6.1", tmp / "rb" / "src", out)
    applied = apply_patch(fw, "v2.6.5", source, out, tmp / "applied")
    assert "lms::alloc_or_spill" in (applied.worktree / "c10/cuda/CUDACachingAllocator.cpp").read_text()
    # a second run starts over (the folder of the first is replaced, not refused)
    rebase_to_patch(fw, "v2.6.5", source, "v2.6.1", tmp / "rb" / "src", out)


def test_rebase_with_conflicts_stops_with_what_is_left(world):
    tmp, fw, source = world
    out = tmp / "rb" / "rebased.patch"
    with pytest.raises(LmsError) as err:
        rebase_to_patch(fw, "v2.7.0", source, "v2.6.1", tmp / "rb" / "src", out)
    msg = str(err.value)
    assert "does not rebase cleanly onto PyTorch v2.7.0; what is left" in msg
    assert "c10/cuda/CUDACachingAllocator.cpp" in msg and "CONFLICT" in msg
    assert err.value.hint and "PATCH=my.patch" in err.value.hint and "git am --continue" in err.value.hint
    assert not out.exists()
    assert "<<<<<<<" in (tmp / "rb" / "src" / "c10/cuda/CUDACachingAllocator.cpp").read_text()
