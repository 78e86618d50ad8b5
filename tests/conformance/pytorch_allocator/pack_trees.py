"""Pack what the allocator conformance suite needs onto a GPU machine that cannot fetch it.

The suite builds ``c10`` of a patched and of a pristine PyTorch tree (of the tree it reads ``c10/``,
see build_tools/c10_build/CMakeLists.txt, and ``torch/cuda/memory.py`` and ``lms.py``).  A GPU runner with the source (or network) lets
the ``lms_tree`` / ``upstream_tree`` fixtures make them; a machine without either gets them
from this folder:

    python tests/conformance/pytorch_allocator/pack_trees.py --dest .device/pt-alloc
    # on the GPU machine:
    LMS_PT_TREE=.device/pt-alloc/lms LMS_PT_PRISTINE=.device/pt-alloc/pristine \\
        pytest -m gpu tests/conformance/pytorch_allocator -s

``<dest>/lms`` and ``<dest>/pristine`` hold ``c10/`` of the tag with the LMS change composed
from this checkout's sources (what the exported patch produces) and without it; ``<dest>/deps``
holds the headers and library the build looks up outside the tree where this machine has them
(fmt, cpuinfo, googletest's sources: see ``LMS_PT_DEPS`` in the suite).  About 15 MB.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


# besides c10/, the files of the tree the suite reads: the memory_stats scenario runs the
# tree's own torch/cuda/memory.py and lms.py (patched_memory_stats.py)
TORCH_FILES = ("torch/cuda/memory.py", "torch/cuda/lms.py")


def _copy_c10(tree: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tree / "c10", dest / "c10", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for rel in TORCH_FILES:
        if (tree / rel).is_file():  # lms.py exists in the patched tree only
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree / rel, dest / rel)


def pack(dest: Path, tag: str, source: str) -> dict:
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("LMS_CACHE_DIR", str(REPO / ".cache" / "build-tools"))
    from build_tools import catalog, gitutil
    from build_tools.patch_factory.compose import compose as compose_lms
    from build_tools.upstream import parse_source

    fw = catalog.framework("pytorch")
    repo, _ = parse_source(fw, source).ensure(tag)
    dest.mkdir(parents=True, exist_ok=True)
    made = {}
    with tempfile.TemporaryDirectory(prefix="pt-alloc-pack-") as tmp:
        for name, compose in (("pristine", False), ("lms", True)):
            wt = gitutil.add_worktree(repo, Path(tmp) / name, tag)
            try:
                if compose:
                    compose_lms(catalog.profile(fw, tag), wt)
                _copy_c10(wt, dest / name)
            finally:
                gitutil.remove_worktree(repo, wt)
            made[name] = dest / name
    deps = dest / "deps"
    (deps / "include").mkdir(parents=True, exist_ok=True)
    (deps / "lib").mkdir(parents=True, exist_ok=True)
    if Path("/usr/include/fmt/format.h").is_file():
        shutil.copytree("/usr/include/fmt", deps / "include" / "fmt", dirs_exist_ok=True)
    if Path("/usr/include/cpuinfo.h").is_file():
        shutil.copy2("/usr/include/cpuinfo.h", deps / "include")
        for lib in sorted(Path("/usr/lib/x86_64-linux-gnu").glob("libcpuinfo.so.*")):
            shutil.copy2(lib, deps / "lib" / lib.name)
    if Path("/usr/src/googletest/CMakeLists.txt").is_file():
        shutil.copytree("/usr/src/googletest", deps / "googletest", symlinks=True,
                        dirs_exist_ok=True)
    made["deps"] = deps
    return made


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", type=Path, required=True, help="folder to write (e.g. .device/pt-alloc)")
    ap.add_argument("--tag", default="v2.6.0")
    ap.add_argument("--source", default="debian", help="where the tree comes from (build_tools --source)")
    a = ap.parse_args(argv)
    made = pack(a.dest, a.tag, a.source)
    for name, path in made.items():
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        print(f"{name:9s} {path}  {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
