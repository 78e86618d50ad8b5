"""The tools on the real upstream trees: Debian's release tarballs of PyTorch v2.6.0 and TensorFlow v2.14.1.

These download (once, cached) and import the trees, so they need the Debian archive; CI has it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from build_tools import catalog, gitutil
from build_tools.upstream import cache_dir, debian, parse_source

REPO = Path(__file__).resolve().parent.parent
TREES = [("pytorch", "v2.6.0", "c10/cuda/CUDACachingAllocator.cpp"),
         ("pytorch", "v1.13.1", "c10/cuda/CUDACachingAllocator.cpp"),
         ("tensorflow", "v2.14.1", "tensorflow/tsl/framework/bfc_allocator.cc")]


def tools(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "build_tools", *args], cwd=cwd, capture_output=True, text=True)


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args, f"PY={sys.executable}"], cwd=REPO,
                          capture_output=True, text=True)


@pytest.mark.parametrize("framework,tag,allocator", TREES)
def test_debian_tree_is_imported_and_tagged(upstream_repo, framework, tag, allocator):
    repo, commit = upstream_repo(framework, tag)
    assert gitutil.rev(repo, tag) == commit
    files = gitutil.run(repo, "ls-tree", "-r", "--name-only", tag).out.splitlines()
    assert len(files) > 10000, "a whole release tree, not a sample"
    assert allocator in files
    fw = catalog.framework(framework)
    assert fw.version_file in files
    msg = gitutil.run(repo, "log", "-1", "--format=%B", tag).out
    assert "orig.tar" in msg and "sha256 " in msg


def debian_tarball(framework: str, tag: str) -> Path:
    """The orig tarball (downloaded once into the cache) behind `--source debian`."""
    deb = catalog.profile(catalog.framework(framework), tag).debian
    return debian.fetch_orig_tarball(deb["package"], deb["version"], deb["suite"],
                                     cache_dir() / "apt", cache_dir() / "downloads")


def test_tarball_import_is_deterministic(upstream_repo, tmp_path, monkeypatch):
    """The same tarball gives the same commit in a fresh cache: imports are reproducible."""
    _, commit = upstream_repo("pytorch", "v2.6.0")
    tarball = debian_tarball("pytorch", "v2.6.0")
    monkeypatch.setenv("LMS_CACHE_DIR", str(tmp_path / "fresh-cache"))
    fw = catalog.framework("pytorch")
    _, again = parse_source(fw, str(tarball)).ensure("v2.6.0")
    assert again == commit


def test_wrong_tag_for_the_tarball_is_refused(upstream_repo, tmp_path):
    tarball = debian_tarball("pytorch", "v2.6.0")
    env = dict(os.environ, LMS_CACHE_DIR=str(tmp_path / "c"))
    r = subprocess.run([sys.executable, "-m", "build_tools", "fetch", "pytorch", "v2.7.0", "--source", str(tarball)],
                       cwd=REPO, capture_output=True, text=True, env=env)
    assert r.returncode == 2
    assert "holds PyTorch 2.6.0, not 2.7.0" in r.stderr
    assert "Traceback" not in r.stderr


def test_upstream_trees_fixture_checks_out_the_tag(upstream_tree):
    tree = upstream_tree("pytorch", "v2.6.0")
    assert (tree / "version.txt").read_text().startswith("2.6.0")
    assert (tree / "c10/cuda/CUDACachingAllocator.cpp").is_file()


def test_committed_patches_match_a_fresh_export_on_the_real_trees(upstream_repo):
    """Regenerating gives identical bytes (a stale or hand-edited patch fails here)."""
    for fw_name, tag, _ in TREES:
        upstream_repo(fw_name, tag)
    r = tools("export", "--check", "--source", "debian")
    assert r.returncode == 0, r.stdout + r.stderr


def test_verify_applies_every_committed_patch_on_the_real_trees(upstream_repo):
    for fw_name, tag, _ in TREES:
        upstream_repo(fw_name, tag)
    r = tools("verify", "--source", "debian")
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    patches = catalog.committed_patches()
    if not patches:
        assert "no committed patches" in r.stdout
    for p in patches:
        line = next(l for l in r.stdout.splitlines() if l.startswith(p.name))
        assert line.rstrip().endswith("ok"), line


def test_a_full_pytorch_build_ships_every_lms_file_that_is_not_python(lms_tree):
    """setup.py packages torch/**/*.py by itself; any other file the LMS sources add under
    torch/ (the eviction net's C++ source, compiled on first use) must be matched by a
    pattern of the patched setup.py's torch_package_data, or a full build's wheel lacks it."""
    import fnmatch
    import re
    tree = lms_tree("pytorch", "v2.6.0")
    setup = (tree / "setup.py").read_text()
    block = re.search(r"\n    torch_package_data = \[\n(.*?)\n    \]\n", setup, re.S)
    assert block, "torch_package_data not found in setup.py"
    patterns = re.findall(r'^\s*"([^"]+)",', block.group(1), re.M)
    extra = [rel[len("torch/"):] for rel in catalog.source_map(catalog.framework("pytorch"), "v2.6.0")
             if rel.startswith("torch/") and not rel.endswith(".py")]
    assert "cuda/lms_swap_guard.cpp" in extra
    for rel in extra:
        assert (tree / "torch" / rel).is_file(), rel
        assert any(fnmatch.fnmatch(rel, pat) for pat in patterns), \
            f"torch/{rel} is not in setup.py's torch_package_data"


# ---- the make front ---------------------------------------------------------------------------------

def test_make_build_unknown_tag_lists_the_supported_ones():
    r = make("build", "TORCH=v9.9.9")
    assert r.returncode != 0
    assert "PyTorch v9.9.9 is not supported" in r.stderr
    assert "Supported PyTorch tags: " + ", ".join(catalog.supported_tags(catalog.framework("pytorch"))) in r.stderr


def test_make_build_seed_tag_without_its_toolchain_stops_before_doing_anything():
    """The seed tag's plan (tests/test_build_any_tag.py) checks the toolchain before its first step."""
    r = make("build", "TF=v2.1.0")
    if "toolchain for this build is incomplete" not in r.stderr:
        pytest.skip("this machine has a TensorFlow build toolchain")
    assert r.returncode != 0
    assert not (REPO / "build" / "tensorflow-v2.1.0-rebase").exists()


def test_make_build_without_a_framework_says_what_to_do():
    r = make("build")
    assert r.returncode != 0 and "make build TORCH=<tag>" in r.stdout


def test_make_dry_run_pytorch_prints_the_real_upstream_plan():
    bdir = REPO / "build" / "pytorch-v2.6.0-full"
    before = sorted(bdir.rglob("*")) if bdir.exists() else None   # a real build may have left one
    r = make("build", "TORCH=v2.6.0", "DRY_RUN=1")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for expected in ("fetch --depth=1 https://github.com/pytorch/pytorch +refs/tags/v2.6.0:refs/tags/v2.6.0",
                     "git submodule update --init --recursive",
                     "apply --index", "compose the LMS change from the sources",
                     "pytorch_v2.6.0_large_model_support.patch",
                     "-m pip install -r requirements.txt",
                     "setup.py bdist_wheel", "PYTORCH_BUILD_VERSION=2.6.0+lms1", "TORCH_CUDA_ARCH_LIST=",
                     "USE_CUDA=1", "MAX_JOBS=", "Toolchain:", "nvcc (CUDA toolkit)", "cuDNN"):
        assert expected in out, expected
    assert (sorted(bdir.rglob("*")) if bdir.exists() else None) == before, "a dry run does nothing"


def test_make_dry_run_tensorflow_prints_the_pinned_bazel_plan(upstream_repo):
    upstream_repo("tensorflow", "v2.14.1")
    r = make("build", "TF=v2.14.1", "DRY_RUN=1", "SOURCE=debian")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for expected in ("apt-get source --download-only --tar-only tensorflow=", "configure.py",
                     "USE_BAZEL_VERSION=6.1.0", "build --config=opt --config=cuda",
                     "//tensorflow/tools/pip_package:build_pip_package",
                     "bazel-bin/tensorflow/tools/pip_package/build_pip_package",
                     "TF_NEED_CUDA=1", "local version 2.14.1+lms1"):
        assert expected in out, expected


def test_rebase_of_the_real_patch_onto_an_older_release_reports_file_by_file(upstream_repo, tmp_path):
    """How a user starts from another shipped tag's patch: the v2.6.0 patch onto PyTorch 1.13.1 (Debian
    bookworm's tree, imported from its orig tarball; v1.13.1 ships a patch of its own now, so the v2.6.0
    one is named with --from), with `git am -3`; the report names every file of the patch."""
    patch = catalog.profile(catalog.framework("pytorch"), "v2.6.0").patch_file
    if not patch.exists():
        pytest.skip("the PyTorch v2.6.0 patch is not exported yet")
    upstream_repo("pytorch", "v2.6.0")
    old = debian.fetch_orig_tarball("pytorch", "1.13.1+dfsg-4", "bookworm", cache_dir() / "apt", cache_dir() / "downloads")
    dest = tmp_path / "pt-1.13"
    r = tools("rebase", "pytorch", "--onto", "v1.13.1", "--from", "v2.6.0", "--source", str(old), "--from-source", "debian",
              "--dest", str(dest))
    print(r.stdout, r.stderr[-3000:])
    assert r.returncode in (0, 3), r.stderr
    assert "rebase of the v2.6.0 patch onto v1.13.1" in r.stdout
    from build_tools import patchfile
    for path in patchfile.touched_paths(patch.read_text()):
        assert path in r.stdout, path
    assert dest.is_dir() and (dest / "version.txt").read_text().startswith("1.13.")
