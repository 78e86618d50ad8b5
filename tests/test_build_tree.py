"""The tree a build compiles is composed from the LMS sources (the route the exported patch takes): an
edit under patches/ reaches the build without an export, and the build says when the committed patch
differs from the sources. Real Debian tree of TensorFlow v2.14.1, real git; the patches/ folder is a
copy ($LMS_PATCHES_DIR), so that this checkout's is never edited."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from build_tools import catalog, gitutil
from build_tools.builders import common

ROOT = Path(__file__).resolve().parents[1]
TAG = "v2.14.1"
EDITED = "tensorflow/tsl/framework/lms_settings.cc"


@pytest.fixture
def tf_build(upstream_repo, upstream_source, tmp_path, monkeypatch):
    upstream_repo("tensorflow", TAG)
    patches = tmp_path / "patches"
    shutil.copytree(ROOT / "patches", patches)
    monkeypatch.setenv("LMS_PATCHES_DIR", str(patches))
    source = upstream_source("tensorflow")
    tree = tmp_path / "build" / "src"
    yield catalog.profile(catalog.framework("tensorflow"), TAG), source, tree, patches
    if tree.exists():
        gitutil.remove_worktree(source.repo, tree)


def test_a_build_tree_is_composed_from_the_sources_and_a_stale_patch_is_said(tf_build, capfd):
    prof, source, tree, patches = tf_build
    common.prepare_tree(prof, source, tree)
    assert f"{prof.patch_file.name} is current" in capfd.readouterr().err
    assert common.patch_state(prof, tree) is None

    src = patches / "tensorflow" / "src" / EDITED
    src.write_text(src.read_text() + "// an edit not yet exported\n")
    common.prepare_tree(prof, source, tree)
    err = capfd.readouterr().err
    assert f"{prof.patch_file.name} is stale: it differs from the LMS sources; this build uses the sources" in err
    assert (tree / EDITED).read_text().endswith("// an edit not yet exported\n")
    assert gitutil.run(tree, "status", "--porcelain").out.strip() == ""

    common.prepare_tree(prof, source, tree)   # same sources: the tree is kept
    assert "reusing" in capfd.readouterr().err


def test_the_dry_run_shows_the_composition(tf_build):
    prof, source, tree, _ = tf_build
    shown = "\n".join(common.tree_commands(prof, source, tree))
    assert "compose the LMS change from the sources" in common.tree_title(prof, source, tree)
    for edit in prof.edit_series:
        assert f"git -C {tree} apply --index {edit}" in shown
    assert " am " not in shown
