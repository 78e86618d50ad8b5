"""The .conda package made from the overlay wheel: metadata, local channel index (py-rattler),
install into a fresh prefix with py-rattler, and import from that prefix.

No conda channel is reachable here, so the package's dependencies (python, CUDA libraries from
conda-forge) cannot be installed into the prefix: the test installs our package alone
(rattler.install with only its record), shows that a full rattler.solve over the local channel
names the missing dependencies, and imports torch from the prefix with the venv's Python, whose
site-packages provides the CUDA runtime libraries (pip nvidia-* wheels)."""
from __future__ import annotations

import json
import sys
import time
import zipfile

import pytest

from tests.overlay_fixtures import PROBE, _record, _scratch, overlay_build, run_py, wheel_venv  # noqa: F401

_memo: dict = {}
# The package is made for the Python running the tests (the overlay wheel is built for it).
MAJ, MIN = sys.version_info[:2]
SITE = f"lib/python{MAJ}.{MIN}/site-packages"


@pytest.fixture(scope="module")
def conda_pkg(overlay_build):
    if "pkg" not in _memo:
        from build_tools.packagers import conda
        res, _ = overlay_build
        channel = _scratch() / "channel"
        t0 = time.monotonic()
        pkg = conda.wheel_to_conda(res.wheel, channel)
        t1 = time.monotonic()
        repodata = conda.index_channel(channel)
        _record("conda_package_s", t1 - t0)
        _memo["pkg"] = (pkg, channel, repodata)
    return _memo["pkg"]


@pytest.fixture(scope="module")
def prefix(conda_pkg):
    from build_tools.packagers import conda
    pkg, channel, _ = conda_pkg
    p = _scratch() / "prefix"
    t0 = time.monotonic()
    installed = conda.install(channel, p, f"{pkg.name} =={pkg.version} {pkg.build}", cache_dir=p.parent / "pkgs")
    _record("rattler_install_s", time.monotonic() - t0)
    assert installed == [f"pytorch 2.6.0 {pkg.build}"]
    return p


def test_conda_metadata(conda_pkg):
    pkg, _, _ = conda_pkg
    assert pkg.path.name == f"pytorch-2.6.0-{pkg.build}.conda" and pkg.build.startswith(f"lms1_cuda124_py{MAJ}{MIN}_")
    with zipfile.ZipFile(pkg.path) as z:
        names = z.namelist()
        assert "metadata.json" in names and any(n.startswith("info-") for n in names) and any(n.startswith("pkg-") for n in names)
    from conda_package_handling.api import extract
    out = pkg.path.parent / "extracted-info"
    extract(str(pkg.path), dest_dir=str(out), components="info")
    index = json.loads((out / "info/index.json").read_text())
    assert index["name"] == "pytorch" and index["version"] == "2.6.0" and index["subdir"] == "linux-64"
    deps = index["depends"]
    for want in (f"python >={MAJ}.{MIN},<{MAJ}.{MIN + 1}.0a0", f"python_abi {MAJ}.{MIN}.* *_cp{MAJ}{MIN}", "cuda-version >=12.4,<13.0a0",
                 "cuda-cudart >=12.4.127,<13.0a0", "cudnn >=9.1.0.70,<10.0a0", "sympy 1.13.1"):
        assert want in deps, (want, deps)
    assert any(d.startswith("__glibc >=2.") for d in deps)
    import rattler
    for d in deps:  # every dependency is a valid conda MatchSpec
        rattler.MatchSpec(d)
    paths = json.loads((out / "info/paths.json").read_text())
    assert paths["paths_version"] == 1
    by_path = {p["_path"]: p for p in paths["paths"]}
    lib = by_path[f"{SITE}/torch/lib/libc10_cuda.so"]
    assert len(lib["sha256"]) == 64 and lib["size_in_bytes"] > 100000
    assert by_path["bin/torchrun"]["file_mode"] == "text"
    files = (out / "info/files").read_text().split()
    assert files == sorted(by_path)
    about = json.loads((out / "info/about.json").read_text())
    assert about["license"] == "BSD-3-Clause" and "LMS" in about["summary"]
    assert json.loads((out / "info/run_exports.json").read_text())["weak"] == ["pytorch >=2.6.0,<2.7.0a0"]


def test_channel_index(conda_pkg):
    pkg, channel, repodata = conda_pkg
    data = json.loads(repodata.read_text())
    rec = data["packages.conda"][pkg.path.name]
    assert rec["name"] == "pytorch" and rec["build"] == pkg.build
    import hashlib
    h = hashlib.sha256(pkg.path.read_bytes()).hexdigest()
    assert rec["sha256"] == h
    assert (channel / "noarch" / "repodata.json").is_file()


def test_full_solve_names_the_missing_dependencies(conda_pkg):
    from build_tools.packagers import conda
    pkg, channel, _ = conda_pkg
    rep = conda.solve_report(channel, f"pytorch ==2.6.0 {pkg.build}")
    assert rep["ok"] is False
    assert "pytorch 2.6.0 would require" in rep["error"] and "no candidates were found" in rep["error"]


def test_prefix_contents(prefix, conda_pkg):
    pkg, _, _ = conda_pkg
    meta = json.loads((prefix / "conda-meta" / f"pytorch-2.6.0-{pkg.build}.json").read_text())
    assert meta["name"] == "pytorch" and meta["build"] == pkg.build
    sp = prefix / SITE
    assert (sp / "torch/lib/libc10_cuda.so").is_file()
    assert (sp / "torch-2.6.0+lms1.dist-info/INSTALLER").read_text().strip() == "conda"
    # the console script's prefix placeholder was replaced with the real prefix
    assert (prefix / "bin/torchrun").read_text().splitlines()[0] == f"#!{prefix}/bin/python"


def test_import_from_prefix(prefix, wheel_venv, overlay_build):
    sp = prefix / SITE
    probe = run_py(wheel_venv, PROBE, env={"PYTHONPATH": str(sp)})
    assert probe["file"] == str(sp / "torch/__init__.py")
    assert probe["version"] == "2.6.0+lms1"
    assert probe["memory_stats_type"] in ("OrderedDict", "dict")
    res, _ = overlay_build
    assert "torch/cuda/lms.py" in res.plan.python_files, res.plan.python_files  # the LMS API's module
    assert all(probe["api"].values()), probe["api"]
    assert "error" not in probe["roundtrip"] and probe["roundtrip"] and all(probe["roundtrip"].values()), probe["roundtrip"]
