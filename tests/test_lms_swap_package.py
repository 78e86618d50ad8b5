"""Activation swapping as a package of its own (lms-swap/): its wheel installs into a fresh venv on the
host's stock PyTorch and swaps bitwise like stock on CPU, with the eviction net's source inside it; the
patch factory places the same files as torch/cuda/lms_swap/; the examples' loader finds it."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from build_tools import catalog

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / "lms-swap"
SRC = PACKAGE / "src" / "lms_swap"
# net_toolchain alone (it imports only torch), as setup.py loads it
_spec = importlib.util.spec_from_file_location("_lms_swap_test_net_toolchain", SRC / "net_toolchain.py")
_toolchain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_toolchain)
NET_SOURCE, NET_HEADERS = _toolchain.NET_SOURCE, _toolchain.NET_HEADERS
NET_FILES = (NET_SOURCE, *NET_HEADERS)  # the eviction net: one translation unit

SWAP_PY = r"""
import contextlib, importlib.metadata as md, json, os
import torch
import lms_swap

def run(ctx):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 128),
                              torch.nn.GELU(), torch.nn.Linear(128, 8))
    x = torch.randn(32, 64)
    with ctx:
        loss = net(x).pow(2).sum()
    loss.backward()
    return [loss.detach()] + [p.grad for p in net.parameters()]

ref = run(contextlib.nullcontext())
sw = lms_swap.ActivationSwapper(device_type="cpu", policy="always", size_threshold=0,
                                host_limit=1 << 28, host_min_available=0)
got = run(sw)
files = [str(f) for f in md.files("lms-swap")]
print(json.dumps({"file": lms_swap.__file__, "guard": lms_swap.GUARD_SOURCE,
                  "guard_is_file": os.path.isfile(lms_swap.GUARD_SOURCE),
                  "guard_headers": [os.path.isfile(h) for h in lms_swap.guard.GUARD_HEADERS],
                  "version": md.version("lms-swap"), "files": files,
                  "swapped": sw.stats()["swap.out_count"],
                  "bitwise": all(torch.equal(a, b) for a, b in zip(got, ref))}))
"""


def test_the_wheel_installs_into_a_fresh_venv_and_swaps_bitwise_on_cpu(tmp_path):
    """Build the wheel from a copy of lms-swap/ (the folder is self-contained; nothing is written into
    the checkout), install it into a fresh venv that sees the host's torch, and train a step."""
    src = tmp_path / "lms-swap"
    shutil.copytree(PACKAGE, src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build"))
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        str(src), "-w", str(wheels)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    [whl] = wheels.glob("lms_swap-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "lms_swap/__init__.py" in names and {f"lms_swap/{n}" for n in NET_FILES} <= set(names), names
    assert {n.split("/")[0] for n in names} <= {"lms_swap", whl.name.split("-")[0] + "-" + whl.name.split("-")[1]
                                                + ".dist-info"}, names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=300)
    py = venv / "bin" / "python"
    # torch from the host: the running interpreter's (itself perhaps a venv, which --system-site-packages
    # does not reach), after the new venv's own site-packages
    site = pathlib.Path(subprocess.check_output(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True).strip())
    import torch
    (site / "host_torch.pth").write_text(str(pathlib.Path(torch.__file__).resolve().parent.parent) + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                        "-q", str(whl)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LMS_SWAP_PATH")}
    r = subprocess.run([str(py), "-c", SWAP_PY], capture_output=True, text=True, timeout=600,
                       cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    installed = site / "lms_swap"
    assert pathlib.Path(out["file"]).resolve() == (installed / "__init__.py").resolve(), out["file"]
    assert out["guard_is_file"] and pathlib.Path(out["guard"]).resolve() == \
        (installed / "lms_swap_guard.cpp").resolve(), out["guard"]
    assert out["guard_headers"] == [True] * len(NET_HEADERS), out["guard_headers"]
    assert {f"lms_swap/{n}" for n in NET_FILES} <= set(out["files"]), out["files"]
    assert out["version"] == "0.1.0"
    assert out["swapped"] > 0, "the swapper swapped nothing"
    assert out["bitwise"], "loss or gradients differ from stock"


SDIST = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"


def _core_sources():
    spec = importlib.util.spec_from_file_location("_lms_swap_test_allocator_sources",
                                                  SRC / "allocator_sources.py")
    sources = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sources)
    return sources


def test_the_sdist_carries_the_lms_core_for_the_wheel_built_from_it(tmp_path):
    """`python -m build` makes the sdist, then the wheel from the sdist unpacked away from any
    checkout: the sdist must carry the LMS core, or that wheel's pluggable allocator has no sources
    to compile. A tree with no core refuses to make an sdist, and writes none."""
    from build_tools.archives import extract_tar
    sources = _core_sources()
    checkout = tmp_path / "checkout"
    shutil.copytree(PACKAGE, checkout / "lms-swap",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build"))
    for source in sources.CORE_FILES.values():
        (checkout / source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / source, checkout / source)
    dist = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-c", SDIST, str(dist)], cwd=checkout / "lms-swap",
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    [sdist] = dist.glob("lms_swap-*.tar.gz")
    unpacked = tmp_path / "unpacked"
    extract_tar(sdist, unpacked)
    [tree] = unpacked.iterdir()
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        str(tree), "-w", str(wheels)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    [whl] = wheels.glob("lms_swap-*.whl")
    with zipfile.ZipFile(whl) as zf:
        for inside, source in sources.CORE_FILES.items():
            assert (tree / "src" / "lms_swap" / sources.PACKAGED_CORE / inside).read_bytes() == \
                (REPO / source).read_bytes(), f"the sdist's {inside}"
            assert zf.read(f"lms_swap/{sources.PACKAGED_CORE}/{inside}") == (REPO / source).read_bytes(), \
                f"the wheel's {inside}"

    alone = tmp_path / "alone"
    shutil.copytree(PACKAGE, alone, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build"))
    refused = tmp_path / "refused"
    r = subprocess.run([sys.executable, "-c", SDIST, str(refused)], cwd=alone, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode != 0 and "cannot make an sdist: no LMS core" in r.stderr, r.stdout + r.stderr
    assert not list(refused.glob("*.tar.gz")), list(refused.iterdir())


def test_the_patch_places_the_packages_files_as_torch_cuda_lms_swap():
    """One source, two placements: every file of lms-swap/src/lms_swap/ lands under torch/cuda/lms_swap/
    in the PyTorch trees, except the eviction net's source and the headers it includes, which land next
    to it, where guard.py looks in a PyTorch tree, and the pluggable allocator's files, which a patched
    build has no use for (patches/pytorch/shared.toml [left_out])."""
    files = catalog.source_map(catalog.framework("pytorch"), "v2.6.0")
    placed = {rel: path for rel, path in files.items() if rel.startswith("torch/cuda/lms_swap")}
    pluggable = ("allocator.py", "allocator_build.py", "allocator_sources.py")
    ours = sorted(p.name for p in SRC.iterdir() if p.is_file() and not p.name.endswith(".pyc")
                  and p.name not in pluggable and not p.name.startswith("lms_pluggable_"))
    assert set(NET_FILES) <= set(ours) and "__init__.py" in ours
    assert placed == {**{f"torch/cuda/lms_swap/{n}": SRC / n for n in ours if n not in NET_FILES},
                      **{f"torch/cuda/{n}": SRC / n for n in NET_FILES}}
    assert not (REPO / "patches" / "pytorch" / "src" / "torch" / "cuda" / "lms_swap").exists()
    patch = (REPO / "patches" / "pytorch_v2.6.0_large_model_support.patch").read_text()
    for rel in placed:
        assert f"diff --git a/{rel} b/{rel}\nnew file mode 100644\n" in patch, rel
    assert "lms-swap/src" not in patch, "the patch names upstream paths only"


def test_guard_source_is_found_inside_the_package_and_next_to_it(tmp_path):
    """guard.py looks for lms_swap_guard.cpp inside the package (an install of lms-swap) and next to
    it (torch/cuda/ in a PyTorch tree), and for the headers it includes beside it."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import lms_swap; "
            "print(json.dumps([lms_swap.GUARD_SOURCE, *lms_swap.guard.GUARD_HEADERS]))")
    for layout in ("installed", "torch_tree"):
        root = tmp_path / layout
        shutil.copytree(SRC, root / "lms_swap", ignore=shutil.ignore_patterns("__pycache__", *NET_FILES))
        folder = root / "lms_swap" if layout == "installed" else root
        for n in NET_FILES:
            shutil.copy2(SRC / n, folder / n)
        r = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        found = [pathlib.Path(p) for p in json.loads(r.stdout.strip().splitlines()[-1])]
        assert found == [folder / n for n in NET_FILES], (layout, r.stdout)


def test_the_nets_headers_are_the_ones_its_source_includes():
    """The eviction net is one translation unit: lms_swap_guard.cpp and the headers of its parts,
    which it includes (directly or through one another) from its own folder.  NET_HEADERS, which the
    builds and guard.py name, are exactly those, and every lms_swap_guard_*.h of the package is one;
    each is a header of the net (include guard, internal linkage) that names what it is for."""
    import re
    included, todo = [], [NET_SOURCE]
    while todo:
        for name in re.findall(r'^#include "([^"]+)"', (SRC / todo.pop()).read_text(), re.M):
            if name not in included:
                included.append(name)
                todo.append(name)
    assert sorted(included) == sorted(NET_HEADERS)
    assert sorted(p.name for p in SRC.glob("lms_swap_guard_*.h")) == sorted(NET_HEADERS)
    for name in NET_HEADERS:
        text = (SRC / name).read_text()
        assert text.startswith("#pragma once\n// "), name
        assert "namespace {" in text and "lms_swap_guard.cpp" in text.split("\n#include")[0], name


@pytest.mark.parametrize("how", ["checkout", "LMS_SWAP_PATH"])
def test_the_examples_loader_finds_the_package(tmp_path, how):
    """examples/pytorch/lms_swap_loader.py on a stock PyTorch: the installed lms_swap, else this
    checkout's folder; $LMS_SWAP_PATH names another copy."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LMS_SWAP_PATH")}
    want = SRC
    if how == "LMS_SWAP_PATH":
        want = tmp_path / "copy_of_lms_swap"
        shutil.copytree(SRC, want, ignore=shutil.ignore_patterns("__pycache__"))
        env["LMS_SWAP_PATH"] = str(want)
    else:  # an installed lms_swap comes first (`make setup` installs this checkout's, editable)
        r = subprocess.run([sys.executable, "-c", "import importlib.util as u; s = u.find_spec('lms_swap'); "
                            "print(s.origin if s else '')"], capture_output=True, text=True, timeout=300,
                           cwd=tmp_path, env=env)
        installed = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else ""
        want = pathlib.Path(installed).parent if installed else SRC
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from lms_swap_loader import load_lms_swap; "
            "m = load_lms_swap(prefer_patched=False); print(m.__name__, m.__file__, hasattr(m, 'ActivationSwapper'))")
    r = subprocess.run([sys.executable, "-c", code, str(REPO / "examples" / "pytorch")], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    name, file, has = r.stdout.strip().splitlines()[-1].split()
    assert name == "lms_swap" and has == "True"
    assert pathlib.Path(file).resolve() == (want / "__init__.py").resolve(), file
