"""python -m build_tools.verify.tf_wiring --help"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..tf_release import REPO, main_of
from .check import PATCH, TAG, check
from .tree import lms_tree
from .wheel import DEFAULT_CACHE


def run(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m build_tools.verify.tf_wiring",
        description=f"Compile every C++ file the TensorFlow {TAG} LMS patch adds or edits (and "
                    "config.pb.cc from the patched config.proto) into object files with "
                    f"TensorFlow's GPU build flags, against the official tensorflow {TAG[1:]} GPU "
                    "wheel's headers; resolve the objects' undefined symbols against the wheel's "
                    "libraries; check the BUILD edits, the API golden files and the pybind names. "
                    "Prints a report; exits 1 when anything fails.")
    p.add_argument("--tree", type=Path,
                   help=f"a TensorFlow {TAG} tree with the LMS change applied (default: compose "
                        "one from this checkout's sources into build/tf_wiring/tree)")
    p.add_argument("--upstream", type=Path,
                   help=f"the stock {TAG} tree, whose edited files are compiled to take their "
                        "definitions out of the wheel's symbols (default: the tag in the tree's "
                        "git history; without either that step is skipped, with a note)")
    p.add_argument("--source", default="debian",
                   help="where the upstream tree comes from when --tree is not given (any "
                        "`python -m build_tools` --source value; default: debian)")
    p.add_argument("--out", type=Path, default=REPO / "build" / "tf_wiring",
                   help="work folder: regenerated protos, overlay, objects (default: %(default)s)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                   help="where the GPU wheel and its extracted headers are kept (default: %(default)s)")
    p.add_argument("--patch", type=Path, default=PATCH,
                   help="the exported patch naming the files to check (default: %(default)s)")
    p.add_argument("--jobs", "-j", type=int, default=2, help="parallel compilations (default: 2)")
    p.add_argument("--no-other-cuda", action="store_true",
                   help="skip compiling the GPU files again against CUDA 12 and CUDA 13 headers")
    a = p.parse_args(argv)
    tree = a.tree or lms_tree(a.source, a.out / "tree")
    report = check(tree, out=a.out, cache=a.cache, patch=a.patch, jobs=a.jobs,
                   other_cuda=not a.no_other_cuda, upstream=a.upstream)
    print(report.text())
    return 0 if report.ok else 1


main = main_of(run)

if __name__ == "__main__":
    sys.exit(main())
