"""CLI of build_tools.c10_build: python -m build_tools.c10_build TREE BUILD_DIR [options]."""
import argparse
import sys

from . import C10BuildError, build_c10


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m build_tools.c10_build",
        description="Build libc10.so + libc10_cuda.so from a PyTorch tree (tree mode), or only "
                    "libc10_cuda.so against an official wheel's torch/ folder (--wheel-root).")
    ap.add_argument("tree", help="PyTorch source tree (patched)")
    ap.add_argument("build_dir", help="CMake build directory")
    ap.add_argument("--cuda-home", default="/usr/local/cuda",
                    help="folder with include/cuda.h and lib(64)/libcudart.so* (default /usr/local/cuda)")
    ap.add_argument("--targets", default=None, help="comma list of c10,c10_cuda (default: both; wheel mode: c10_cuda)")
    ap.add_argument("--wheel-root", default=None, help="torch/ folder of an unpacked official wheel")
    ap.add_argument("--cxx11-abi", type=int, choices=(0, 1), default=None)
    ap.add_argument("--fmt-include", default=None, help="directory holding fmt/format.h")
    ap.add_argument("--extra-flag", action="append", default=[], help="extra CXX flag (repeatable)")
    ap.add_argument("--nvml-include", default=None, help="directory holding nvml.h")
    ap.add_argument("--c10-library", default=None, help="tree mode, --targets c10_cuda: link to this libc10.so")
    ap.add_argument("-D", "--define", action="append", default=[], help="preprocessor definition (repeatable)")
    ap.add_argument("--tests", action="store_true", help="also build upstream c10/cuda/test gtests")
    ap.add_argument("--gtest-root", default=None)
    ap.add_argument("--launcher", default=None, help="compiler launcher, e.g. ccache or sccache")
    ap.add_argument("-j", "--jobs", type=int, default=None)
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    targets = tuple(a.targets.split(",")) if a.targets else (("c10_cuda",) if a.wheel_root else ("c10", "c10_cuda"))
    try:
        r = build_c10(a.tree, a.build_dir, cuda_home=a.cuda_home, targets=targets, wheel_root=a.wheel_root,
                      cxx11_abi=a.cxx11_abi, extra_flags=a.extra_flag, fmt_include=a.fmt_include,
                      tests=a.tests, nvml_include=a.nvml_include, c10_library=a.c10_library, defines=a.define, gtest_root=a.gtest_root, jobs=a.jobs,
                      cxx_compiler_launcher=a.launcher, quiet=not a.verbose)
    except C10BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for t, p in r.libraries.items():
        print(f"{t}: {p}")
    for t in r.tests:
        print(f"test: {t}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
