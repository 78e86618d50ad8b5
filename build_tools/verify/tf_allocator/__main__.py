"""python -m build_tools.verify.tf_allocator --help"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from ..tf_release import REPO, log_to, main_of, tf_profile
from . import CUDA_HOME, DEFAULT_CACHE, build, lms_sources, run_tests, wheel_dir

log = log_to("tf_allocator")


def run(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m build_tools.verify.tf_allocator",
        description="Build (and optionally run) the standalone test program of "
        "TensorFlow's BFC allocator with Large Model Support: the "
        "patched allocator sources of TREE compiled against the official "
        "tensorflow-cpu wheel of the same release (headers + libtensorflow_framework.so.2, "
        "downloaded once into the cache), linked with TensorFlow's own BFC "
        "allocator tests and the LMS conformance tests.")
    p.add_argument("--tree", type=Path, required=True,
                   help="TensorFlow tree of TAG with the LMS edit series applied "
                   "(e.g. the lms_tree fixture or a dev-tree worktree)")
    p.add_argument("--tag", default=None,
                   help="the TensorFlow tag whose profile (patches/tensorflow/<tag>/profile.toml) names the "
                   "release and its wheels (default: the newest supported TensorFlow tag)")
    p.add_argument("--target", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: host-memory page backend; cuda: CUDA VMM backend "
                   "(built with nvcc here, run on a GPU machine)")
    p.add_argument("--out", type=Path, default=None,
                   help="build folder (default: build/tf_allocator/<target>)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                   help=f"wheel cache (default: {DEFAULT_CACHE.relative_to(REPO)})")
    p.add_argument("--wheel", type=Path, default=None,
                   help="use this official tensorflow-cpu wheel of the release instead of downloading")
    p.add_argument("--no-overlay-src", action="store_true",
                   help="take the LMS files from TREE only, not from patches/ (patches/tensorflow/src/, "
                   "the patches/shared/ files patches/tensorflow/shared.toml places, "
                   "patches/tensorflow/<tag>/src/)")
    p.add_argument("-j", "--jobs", type=int, default=None)
    p.add_argument("--cuda-arch", default="sm_90")
    p.add_argument("--bundle", type=Path, default=None,
                   help="copy the stripped program and libtensorflow_framework.so.2 "
                   "here (e.g. .device/tf) to take to the GPU machine; for cuda also "
                   "CUDA_HOME's libcupti (the launch gate dlopens it)")
    p.add_argument("--run", action="store_true", help="run the program after building")
    p.add_argument("--gtest-filter", default=None)
    p.add_argument("--xml", type=Path, default=None, help="gtest XML report")
    a = p.parse_args(argv)
    tag = tf_profile(a.tag).tag
    binary = build(a.tree.resolve(), a.target, a.out, a.cache.resolve(), a.wheel,
                   None if a.no_overlay_src else lms_sources(tag), a.jobs, a.cuda_arch, tag)
    log(f"built {binary}")
    if a.bundle:
        a.bundle.mkdir(parents=True, exist_ok=True)
        dst = a.bundle / binary.name
        shutil.copyfile(binary, dst)
        subprocess.run(["strip", "--strip-unneeded", str(dst)], check=True)
        dst.chmod(0o755)
        so = wheel_dir(a.cache.resolve(), tag) / "tensorflow" / "libtensorflow_framework.so.2"
        shutil.copyfile(so, a.bundle / so.name)
        if a.target == "cuda":
            # The launch gate (gpu_lms_page_backend.cc) dlopens libcupti.so(.13, .12, ...): the
            # program finds this copy by its rpath ($ORIGIN) when the GPU machine's loader
            # path has none.
            found = sorted((CUDA_HOME / "lib64").glob("libcupti.so.[0-9]*"))
            real = [f for f in found if not f.is_symlink()] or found
            if real:
                soname = "libcupti.so." + real[0].name.split(".so.")[1].split(".")[0]
                shutil.copyfile(real[0].resolve(), a.bundle / soname)
            else:
                log(f"no libcupti in {CUDA_HOME / 'lib64'}: the launch gate will look for one "
                    "on the GPU machine")
        log(f"bundle in {a.bundle}: " + ", ".join(
            f"{f.name} {f.stat().st_size >> 20} MiB" for f in sorted(a.bundle.iterdir())))
    if a.run:
        return run_tests(binary, a.gtest_filter, a.xml)
    return 0


main = main_of(run)

if __name__ == "__main__":
    sys.exit(main())
