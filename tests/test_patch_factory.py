"""The patch factory and patch operations on real git repositories made in temporary folders."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from build_tools import catalog, gitutil
from build_tools.errors import LmsError
from build_tools.patch_factory import devtree, export
from build_tools.patch_ops.apply import apply_patch
from build_tools.patch_ops.rebase import rebase
from build_tools.upstream import parse_source
from factory_fixtures import git, make_patches_dir, make_upstream, write

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A PyTorch-shaped upstream repo, a patches/ folder for it, and a private cache."""
    upstream = make_upstream(tmp_path / "upstream")
    patches = make_patches_dir(tmp_path / "patches")
    monkeypatch.setenv("LMS_PATCHES_DIR", str(patches))
    monkeypatch.setenv("LMS_CACHE_DIR", str(tmp_path / "cache"))
    fw = catalog.framework("pytorch")
    return {"tmp": tmp_path, "upstream": upstream, "patches": patches, "fw": fw,
            "source": parse_source(fw, str(upstream))}


def run_cli(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "build_tools", *args], cwd=REPO, env=env,
                          capture_output=True, text=True)


def test_export_writes_a_dep3_patch_that_git_am_applies(world):
    prof = catalog.profile(world["fw"], "v2.6.0")
    path = export.export(prof, world["source"])
    text = path.read_text()
    assert path.name == "pytorch_v2.6.0_large_model_support.patch"
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "From: LMS Build Tools <lms-build-tools@users.noreply.github.com>" in text
    assert "Subject: [PATCH] Large Model Support (LMS 0.1.0) for PyTorch v2.6.0" in text
    for field in ("Description:", "Origin: vendor, LMS build tools 0.1.0", "Forwarded: not-needed",
                  "Upstream-Tag: pytorch v2.6.0", "Last-Update: 2026-11-22",
                  "Edit-Series: 0001-Call-the-LMS-hook-when-allocating.patch"):
        assert field in text
    applied = apply_patch(world["fw"], "v2.6.0", world["source"], path, world["tmp"] / "applied")
    tree = applied.worktree
    assert "lms::alloc_or_spill(size)" in (tree / "c10/cuda/CUDACachingAllocator.cpp").read_text()
    assert (tree / "c10/cuda/CUDALargeModelSupport.cpp").read_text().startswith("// LMS (test source)")
    assert (tree / "torch/cuda/lms.py").exists()
    assert applied.files == 3
    assert git(tree, "status", "--porcelain") == ""


def test_export_is_byte_identical_across_runs_and_caches(world, monkeypatch):
    prof = catalog.profile(world["fw"], "v2.6.0")
    first = export.render(prof, world["source"])
    second = export.render(prof, world["source"])
    monkeypatch.setenv("LMS_CACHE_DIR", str(world["tmp"] / "another-cache"))
    third = export.render(prof, parse_source(world["fw"], str(world["upstream"])))
    assert first == second == third
    # the user's own git configuration must not leak into the bytes
    home = world["tmp"] / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[format]\n\tsignature = hello\n\tnumbered = true\n[diff]\n\tnoprefix = true\n")
    monkeypatch.setenv("HOME", str(home))
    assert export.render(prof, world["source"]) == first


def test_check_mode_fails_on_stale_patch_and_passes_after_export(world):
    prof = catalog.profile(world["fw"], "v2.6.0")
    env = {"LMS_PATCHES_DIR": str(world["patches"]), "LMS_CACHE_DIR": str(world["tmp"] / "cache")}
    src = ["--source", str(world["upstream"])]
    missing = run_cli("export", "pytorch", "v2.6.0", "--check", *src, env_extra=env)
    assert missing.returncode == 2 and "is missing" in missing.stderr
    assert run_cli("export", "pytorch", "v2.6.0", *src, env_extra=env).returncode == 0
    ok = run_cli("export", "pytorch", "v2.6.0", "--check", *src, env_extra=env)
    assert ok.returncode == 0, ok.stderr
    before = prof.patch_file.read_bytes()
    (world["patches"] / "pytorch/src/torch/cuda/lms.py").write_text("def set_enabled_lms(on):\n    return on\n")
    stale = run_cli("export", "pytorch", "v2.6.0", "--check", *src, env_extra=env)
    assert stale.returncode == 2
    assert "pytorch_v2.6.0_large_model_support.patch is stale" in stale.stderr
    assert "-+    return bool(on)" in stale.stderr and "++    return on" in stale.stderr
    assert prof.patch_file.read_bytes() == before, "check mode must not write"


def test_apply_that_fails_names_file_and_hunk_and_leaves_nothing(world):
    prof = catalog.profile(world["fw"], "v2.6.0")
    patch = export.export(prof, world["source"])
    dest = world["tmp"] / "onto-2.7"
    with pytest.raises(LmsError) as err:
        apply_patch(world["fw"], "v2.7.0", world["source"], patch, dest)
    msg = str(err.value)
    assert "c10/cuda/CUDACachingAllocator.cpp: hunk 1 of 1 `@@ -2,7 +2,7 @@`" in msg
    assert "does not apply" in msg
    assert not dest.exists()
    assert "onto-2.7" not in git(world["source"].repo, "worktree", "list")


def test_apply_refuses_a_non_empty_destination(world):
    patch = export.export(catalog.profile(world["fw"], "v2.6.0"), world["source"])
    dest = world["tmp"] / "busy"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(LmsError, match="not empty"):
        apply_patch(world["fw"], "v2.6.0", world["source"], patch, dest)
    assert (dest / "keep.txt").read_text() == "mine"


def test_rebase_reports_conflicts_file_by_file(world):
    export.export(catalog.profile(world["fw"], "v2.6.0"), world["source"])
    report = rebase(world["fw"], "v2.7.0", world["source"], world["source"], world["tmp"] / "rb",
                    from_tag="v2.6.0")
    assert not report.clean
    status = dict(report.files)
    assert status["c10/cuda/CUDACachingAllocator.cpp"].startswith("CONFLICT (1 region")
    assert status["c10/cuda/CUDALargeModelSupport.cpp"] == "merged cleanly"
    text = (report.worktree / "c10/cuda/CUDACachingAllocator.cpp").read_text()
    assert "<<<<<<<" in text and "raw_alloc_v2(size, stream)" in text and "lms::alloc_or_spill" in text


def test_rebase_onto_a_compatible_tag_is_clean(world):
    export.export(catalog.profile(world["fw"], "v2.6.0"), world["source"])
    report = rebase(world["fw"], "v2.6.1", world["source"], world["source"], world["tmp"] / "rb")
    assert report.clean and report.from_tag == "v2.6.0"
    assert "lms::alloc_or_spill" in (report.worktree / "c10/cuda/CUDACachingAllocator.cpp").read_text()


def test_rebase_cli_exits_3_with_conflict_table(world):
    env = {"LMS_PATCHES_DIR": str(world["patches"]), "LMS_CACHE_DIR": str(world["tmp"] / "cache")}
    src = ["--source", str(world["upstream"])]
    assert run_cli("export", "pytorch", "v2.6.0", *src, env_extra=env).returncode == 0
    r = run_cli("rebase", "pytorch", "--onto", "v2.7.0", "--from", "v2.6.0", "--dest",
                str(world["tmp"] / "rb"), *src, env_extra=env)
    assert r.returncode == 3, r.stderr
    assert "c10/cuda/CUDACachingAllocator.cpp" in r.stdout and "CONFLICT" in r.stdout


def test_dev_tree_and_save_edits_round_trip(world):
    prof = catalog.profile(world["fw"], "v2.6.0")
    first = export.render(prof, world["source"])
    dev = devtree.make_dev_tree(prof, world["source"], world["tmp"] / "dev")
    assert (dev / "c10/cuda/CUDALargeModelSupport.cpp").is_symlink()
    # saving normalises the hand-made series (index lines); saving again gives the same bytes back
    devtree.save_edits(prof, dev)
    series_before = {p.name: p.read_bytes() for p in prof.edit_series}
    assert b"index " in series_before["0001-Call-the-LMS-hook-when-allocating.patch"]
    devtree.save_edits(prof, dev)
    assert {p.name: p.read_bytes() for p in prof.edit_series} == series_before
    # a new edit of an upstream file becomes 0002-*.patch and part of the exported patch
    init = dev / "torch/cuda/__init__.py"
    init.write_text(init.read_text() + "from .lms import set_enabled_lms  # noqa: F401\n")
    gitutil.run(dev, "commit", "-qam", "Export the LMS API from torch.cuda",
                env=gitutil.identity("2026-11-22T00:00:00+00:00"))
    saved = devtree.save_edits(prof, dev)
    assert [p.name for p in saved] == ["0001-Call-the-LMS-hook-when-allocating.patch",
                                       "0002-Export-the-LMS-API-from-torch.cuda.patch"]
    assert "CUDALargeModelSupport" not in saved[1].read_text(), "src/ files never enter the edit series"
    second = export.render(prof, world["source"])
    assert second != first and b"+from .lms import set_enabled_lms" in second


def test_save_edits_refuses_uncommitted_work(world):
    prof = catalog.profile(world["fw"], "v2.6.0")
    dev = devtree.make_dev_tree(prof, world["source"], world["tmp"] / "dev")
    (dev / "README.md").write_text("changed\n")
    with pytest.raises(LmsError, match="uncommitted changes"):
        devtree.save_edits(prof, dev)


def test_broken_edit_series_is_reported_with_its_file(world):
    prof = catalog.profile(world["fw"], "v2.6.0")
    bad = prof.edit_series[0]
    bad.write_text(bad.read_text().replace(" void* malloc_block(size_t size) {", " void* malloc_blk(size_t size) {"))
    with pytest.raises(LmsError) as err:
        export.render(prof, world["source"])
    assert "v2.6.0/0001-Call-the-LMS-hook-when-allocating.patch does not apply" in str(err.value)
    assert "c10/cuda/CUDACachingAllocator.cpp" in str(err.value)


def test_verify_prints_a_table_and_fails_on_a_broken_patch(world, capsys):
    from build_tools.patch_ops.verify import verify
    good = export.export(catalog.profile(world["fw"], "v2.6.0"), world["source"])
    rows = verify([good], lambda fw: world["source"])
    assert rows[0]["result"] == "ok" and rows[0]["files"] == "3"
    out = capsys.readouterr().out
    assert "PATCH" in out and "pytorch_v2.6.0_large_model_support.patch" in out
    broken = world["patches"] / "pytorch_v2.6.1_large_model_support.patch"
    broken.write_text(good.read_text().replace("return raw_alloc(size);", "return raw_alloc(size, 0);"))
    with pytest.raises(LmsError, match="1 of 2 patch"):
        verify([good, broken], lambda fw: world["source"])
    assert "FAILED" in capsys.readouterr().out


# ---- source layers: patches/shared/ (by <fw>/shared.toml) and <fw>/<tag>/src/ -----------------------

GATE = "// shared gate core (test)\nnamespace { int gate = 1; }\n"


def _share(patches: Path, toml: str, files: dict[str, str] | None = None) -> None:
    write(patches, "pytorch/shared.toml", toml)
    for name, text in (files or {}).items():
        write(patches, f"shared/{name}", text)


def test_shared_file_lands_at_each_mapped_path_and_in_the_patch(world):
    _share(world["patches"], '# upstream path = file under patches/shared/\n[files]\n'
           '"c10/cuda/impl/GateCore.inc" = "gate_core.inc"\n"c10/util/GateCoreCopy.inc" = "gate_core.inc"\n'
           '"torch/cuda/lms_common.py" = "py/common.py"\n',
           {"gate_core.inc": GATE, "py/common.py": "SHARED = True\n"})
    write(world["patches"], "tensorflow/shared.toml",
          '[files]\n"tensorflow/core/lms/gate_core.inc" = "gate_core.inc"\n')
    fw = world["fw"]
    shared = world["patches"] / "shared"
    files = catalog.source_map(fw, "v2.6.0")
    assert list(files) == sorted(files)
    assert files["c10/cuda/impl/GateCore.inc"] == files["c10/util/GateCoreCopy.inc"] == shared / "gate_core.inc"
    assert files["torch/cuda/lms_common.py"] == shared / "py/common.py"
    assert files["c10/cuda/CUDALargeModelSupport.cpp"] == \
        world["patches"] / "pytorch/src/c10/cuda/CUDALargeModelSupport.cpp"
    assert catalog.source_map(catalog.framework("tensorflow")) == \
        {"tensorflow/core/lms/gate_core.inc": shared / "gate_core.inc"}
    prof = catalog.profile(fw, "v2.6.0")
    text = export.export(prof, world["source"]).read_text()
    for rel in ("c10/cuda/impl/GateCore.inc", "c10/util/GateCoreCopy.inc", "torch/cuda/lms_common.py"):
        assert f"diff --git a/{rel} b/{rel}\nnew file mode 100644\n" in text, rel
    assert "gate_core.inc" not in text and "py/common.py" not in text, "the patch names upstream paths only"
    applied = apply_patch(fw, "v2.6.0", world["source"], prof.patch_file, world["tmp"] / "applied")
    assert (applied.worktree / "c10/util/GateCoreCopy.inc").read_text() == GATE
    assert applied.files == 6
    # a dev tree links the shared file itself (edits land in patches/shared/), and save-edits leaves it out
    dev = devtree.make_dev_tree(prof, world["source"], world["tmp"] / "dev")
    assert (dev / "c10/cuda/impl/GateCore.inc").resolve() == shared / "gate_core.inc"
    git(dev, "add", "--force", "c10/cuda/impl/GateCore.inc")
    git(dev, "commit", "-qm", "Track the linked gate by mistake")
    saved = devtree.save_edits(prof, dev)
    assert [p.name for p in saved] == ["0001-Call-the-LMS-hook-when-allocating.patch"]
    assert "GateCore" not in saved[0].read_text()


def test_tag_src_file_is_only_in_its_tag_and_replaces_the_framework_file(world):
    patches = world["patches"]
    write(patches, "pytorch/v2.6.1/src/c10/cuda/CUDALargeModelSupport.cpp", "// LMS for 2.6.1 only\n")
    write(patches, "pytorch/v2.6.1/src/c10/cuda/LMSCompat261.h", "#pragma once\n")
    # names the tag folder's own files use, under src/: upstream files there, nothing else
    write(patches, "pytorch/v2.6.1/src/profile.toml", "[upstream]\nversion = \"9.9.9\"\n")
    write(patches, "pytorch/v2.6.1/src/0002-not-an-edit.patch", "not an edit\n")
    fw = world["fw"]
    assert catalog.supported_tags(fw) == ["v2.6.0", "v2.6.1"]
    later = catalog.profile(fw, "v2.6.1")
    assert later.version == "2.6.1"
    assert [p.name for p in later.edit_series] == ["0001-Call-the-LMS-hook-when-allocating.patch"]
    assert "c10/cuda/LMSCompat261.h" not in catalog.source_map(fw)
    assert catalog.source_map(fw, "v2.6.1")["c10/cuda/CUDALargeModelSupport.cpp"] == \
        patches / "pytorch/v2.6.1/src/c10/cuda/CUDALargeModelSupport.cpp"
    old = export.export(catalog.profile(fw, "v2.6.0"), world["source"]).read_text()
    new = export.export(later, world["source"]).read_text()
    assert "LMSCompat261.h" not in old and "diff --git a/c10/cuda/LMSCompat261.h" in new
    assert "+// LMS (test source)" in old and "+// LMS (test source)" not in new
    assert "+// LMS for 2.6.1 only" in new and "+// LMS for 2.6.1 only" not in old
    assert "diff --git a/profile.toml b/profile.toml" in new


def test_a_folder_outside_patches_lands_under_its_upstream_folder_once(world):
    """[folders] places every file of a folder of the repository (the installable activation-swapping
    package) under an upstream folder; a file [repo_files] places elsewhere lands only there."""
    root = world["patches"].parent
    write(root, "pkg/src/mod/__init__.py", "X = 1\n")
    write(root, "pkg/src/mod/sub/part.py", "Y = 2\n")
    write(root, "pkg/src/mod/net.cpp", "// net\n")
    write(root, "pkg/src/mod/__pycache__/part.cpython-311.pyc", "cache")
    _share(world["patches"], '[files]\n"c10/cuda/impl/GateCore.inc" = "gate_core.inc"\n'
           '[repo_files]\n"torch/cuda/mod_net.cpp" = "pkg/src/mod/net.cpp"\n'
           '[folders]\n"torch/cuda/mod" = "pkg/src/mod"\n', {"gate_core.inc": GATE})
    files = catalog.source_map(world["fw"], "v2.6.0")
    placed = {rel: path for rel, path in files.items() if rel.startswith("torch/cuda/mod")}
    assert placed == {"torch/cuda/mod/__init__.py": root / "pkg/src/mod/__init__.py",
                      "torch/cuda/mod/sub/part.py": root / "pkg/src/mod/sub/part.py",
                      "torch/cuda/mod_net.cpp": root / "pkg/src/mod/net.cpp"}
    text = export.export(catalog.profile(world["fw"], "v2.6.0"), world["source"]).read_text()
    for rel in placed:
        assert f"diff --git a/{rel} b/{rel}\nnew file mode 100644\n" in text, rel
    assert "pkg/src" not in text


def test_files_a_folder_leaves_out_stay_out_of_the_tree(world):
    """[left_out] keeps files of a [folders] folder that the patched build has no use for (the
    pluggable allocator of the activation-swapping package) out of the tree and the patch."""
    root = world["patches"].parent
    write(root, "pkg/src/mod/__init__.py", "X = 1\n")
    write(root, "pkg/src/mod/allocator.py", "A = 1\n")
    write(root, "pkg/src/mod/plug_alloc.cpp", "// plug\n")
    write(root, "pkg/src/mod/sub/plug_x.h", "// kept: the glob is relative to the folder\n")
    _share(world["patches"], '[folders]\n"torch/cuda/mod" = "pkg/src/mod"\n'
           '[left_out]\n"pkg/src/mod" = ["allocator.py", "plug_*"]\n')
    placed = {rel for rel in catalog.source_map(world["fw"], "v2.6.0") if rel.startswith("torch/cuda/mod")}
    assert placed == {"torch/cuda/mod/__init__.py", "torch/cuda/mod/sub/plug_x.h"}
    text = export.export(catalog.profile(world["fw"], "v2.6.0"), world["source"]).read_text()
    assert "allocator.py" not in text and "plug_alloc" not in text


@pytest.mark.parametrize("toml,message", [
    ('[folders]\n"torch/cuda/mod" = "pkg/src/nothing"\n', "maps to pkg/src/nothing (from the repository's root), "
     "which is not a folder"),
    ('[repo_files]\n"torch/cuda/x.cpp" = "pkg/src/none.cpp"\n', "maps to pkg/src/none.cpp"),
    ('[folders]\n"torch/cuda/mod" = "../pkg"\n', "both sides must be relative paths"),
    ('[repo_files]\n"torch/cuda/mod/__init__.py" = "pkg/other.py"\n[folders]\n"torch/cuda/mod" = "pkg/src/mod"\n',
     "torch/cuda/mod/__init__.py is placed twice"),
    ('[folders]\n"torch/cuda/mod" = "pkg/src/mod"\n[left_out]\n"pkg/src/other" = ["x.py"]\n',
     "[left_out] 'pkg/src/other' = ['x.py']: expected a folder of [folders]"),
    ('[folders]\n"torch/cuda/mod" = "pkg/src/mod"\n[left_out]\n"pkg/src/mod" = "x.py"\n',
     "and a list of file name patterns relative to it"),
], ids=["missing-folder", "missing-file", "path-escapes", "twice", "left-out-unknown-folder",
        "left-out-not-a-list"])
def test_bad_folder_or_repo_file_is_an_error_naming_it(world, toml, message):
    root = world["patches"].parent
    write(root, "pkg/src/mod/__init__.py", "X = 1\n")
    write(root, "pkg/other.py", "Z = 3\n")
    _share(world["patches"], toml)
    with pytest.raises(LmsError) as err:
        catalog.source_map(world["fw"], "v2.6.0")
    assert message in str(err.value)


@pytest.mark.parametrize("toml,files,message", [
    ('[files]\n"c10/cuda/CUDALargeModelSupport.cpp" = "gate_core.inc"\n', {"gate_core.inc": GATE},
     "c10/cuda/CUDALargeModelSupport.cpp is both patches/pytorch/src/c10/cuda/CUDALargeModelSupport.cpp and, "
     "by patches/pytorch/shared.toml, shared/gate_core.inc"),
    ('[files]\n"c10/cuda/impl/GateCore.inc" = "gate_cor.inc"\n', {"gate_core.inc": GATE},
     "c10/cuda/impl/GateCore.inc maps to patches/shared/gate_cor.inc, which does not exist"),
    ('[files]\n"c10/cuda/impl/GateCore.inc" = gate_core.inc\n', {"gate_core.inc": GATE},
     "pytorch/shared.toml is not valid TOML"),
    ('[file]\n"c10/cuda/impl/GateCore.inc" = "gate_core.inc"\n', {"gate_core.inc": GATE},
     "pytorch/shared.toml: expected only a [files] table"),
    ('[files]\n"../outside.inc" = "gate_core.inc"\n', {"gate_core.inc": GATE},
     "both sides must be relative paths"),
], ids=["collision", "missing-shared-file", "malformed-toml", "wrong-table", "path-escapes"])
def test_bad_shared_toml_is_an_error_naming_it(world, toml, files, message):
    _share(world["patches"], toml, files)
    with pytest.raises(LmsError) as err:
        catalog.source_map(world["fw"], "v2.6.0")
    assert message in str(err.value)
    env = {"LMS_PATCHES_DIR": str(world["patches"]), "LMS_CACHE_DIR": str(world["tmp"] / "cache")}
    r = run_cli("export", "pytorch", "v2.6.0", "--source", str(world["upstream"]), env_extra=env)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert not catalog.profile(world["fw"], "v2.6.0").patch_file.exists()


# ---- bad input --------------------------------------------------------------------------------------

def test_unknown_framework_and_bad_tags(world):
    with pytest.raises(LmsError, match="unknown framework 'caffe'"):
        catalog.framework("caffe")
    with pytest.raises(LmsError, match="not a release tag"):
        catalog.version_of_tag("latest")
    with pytest.raises(LmsError) as err:
        catalog.profile(world["fw"], "v9.9.9")
    assert "Supported PyTorch tags: v2.6.0, v2.6.1" in str(err.value)
    assert "rebase pytorch --onto v9.9.9" in str(err.value)


def test_git_source_without_the_tag(world):
    with pytest.raises(LmsError, match="has no tag v2.8.0"):
        world["source"].ensure("v2.8.0")


def test_git_source_with_the_wrong_tree(world, tmp_path):
    other = tmp_path / "not-torch"
    other.mkdir()
    git(other, "init", "-q")
    (other / "hello.txt").write_text("hi\n")
    git(other, "add", "-A")
    git(other, "commit", "-qm", "x")
    git(other, "tag", "v2.6.0")
    with pytest.raises(LmsError, match="not a PyTorch tree"):
        parse_source(world["fw"], str(other)).ensure("v2.6.0")


def test_bad_source_specs(world, tmp_path):
    with pytest.raises(LmsError, match="not found"):
        parse_source(world["fw"], str(tmp_path / "nope.tar.xz"))
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(LmsError, match="not a git repository"):
        parse_source(world["fw"], str(plain))
    with pytest.raises(LmsError, match="neither a git repository"):
        parse_source(world["fw"], str(tmp_path / "missing-folder"))


def test_tarball_of_another_version_is_refused(world, tmp_path):
    tar = tmp_path / "pytorch-v2.6.0.tar.gz"
    subprocess.run(["git", "archive", "--prefix=pytorch-v2.6.0/", "-o", str(tar), "v2.6.0"],
                   cwd=world["upstream"], check=True)
    src = parse_source(world["fw"], str(tar))
    with pytest.raises(LmsError, match="holds PyTorch 2.6.0, not 2.7.0"):
        src.ensure("v2.7.0")
    repo, commit = src.ensure("v2.6.0")
    # the same tarball imports to the same commit in a fresh cache, and a second run reuses it
    assert src.ensure("v2.6.0") == (repo, commit)
    assert gitutil.run(repo, "show", "v2.6.0:version.txt").out.strip() == "2.6.0a0"
    assert (tmp_path / "scratch").exists() is False


def test_cli_help_and_errors_exit_cleanly(world):
    r = run_cli("--help")
    assert r.returncode == 0 and "debian" in r.stdout and "rebase" in r.stdout
    r = run_cli("build", "pytorch", "v9.9.9")  # and no patch exported to start from
    assert r.returncode == 2 and "Supported PyTorch tags" in r.stderr
    assert "Traceback" not in r.stderr
