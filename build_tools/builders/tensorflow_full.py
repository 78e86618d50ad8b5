"""Full TensorFlow build: `configure` + bazel `build_pip_package`, with the bazel version the tag pins."""
from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from .. import LMS_BUILD, gitutil
from ..errors import LmsError
from ..catalog import TagProfile
from ..upstream import Source, cache_dir
from .. import toolchain
from . import common
from .plan import Plan, Step


def pinned_bazel(source: Source, tag: str, tree: Path) -> str | None:
    """The tag's .bazelversion, from the prepared tree or the cached repo (no download for a dry run)."""
    f = tree / ".bazelversion"
    if f.exists():
        return f.read_text().split()[0]
    if gitutil.has_ref(source.repo, f"refs/tags/{tag}"):
        r = gitutil.run(source.repo, "show", f"{tag}:.bazelversion", check=False)
        if r.ok and r.out.split():
            return r.out.split()[0]
    return None


def bazel_check(version: str | None) -> tuple[toolchain.Check, str]:
    """bazelisk (which fetches the pinned bazel itself) or a bazel of exactly the pinned version."""
    want = version or "(the version in .bazelversion)"
    bazelisk = toolchain.tool_check("bazelisk")
    if bazelisk.ok:
        return bazelisk, "bazelisk"
    bazel = toolchain.tool_check("bazel", exact=version, why=f"(TensorFlow pins bazel {want} in .bazelversion)")
    if bazel.found == "not found":
        bazel.fix = (f"install bazelisk (https://github.com/bazelbuild/bazelisk/releases; it runs bazel {want} "
                     f"for you) or bazel {want} itself")
    return bazel, "bazel"


def plan(prof: TagProfile, source: Source, *, jobs: int | None = None, python: str = sys.executable,
         dist: Path = common.DIST) -> Plan:
    full = prof.build("full")
    bdir = common.build_dir(prof, "full")
    tree = bdir / "src"
    bazel_version = pinned_bazel(source, prof.tag, tree)
    bazel, bazel_cmd = bazel_check(bazel_version)
    env = {k: str(v) for k, v in full.get("env", {}).items()}
    env.update({"PYTHON_BIN_PATH": python, "PYTHON_LIB_PATH": sysconfig.get_paths()["purelib"],
                "TF_SET_ANDROID_WORKSPACE": "0", "CC_OPT_FLAGS": "-Wno-sign-compare"})
    if bazel_version:
        env["USE_BAZEL_VERSION"] = bazel_version      # read by bazelisk
    checks = [toolchain.python_check(full.get("python", ">=3.9"), python), bazel]
    notes = []
    if env.get("TF_NEED_CUDA") == "1":
        if "cuda" not in full:
            raise LmsError(f"{prof.dir / 'profile.toml'}: a CUDA build needs [build.full] cuda (the CUDA range)")
        notes.append(f"CUDA {full['cuda']} (the profile's range): the LMS page backend is compiled against the "
                     f"lowest and the highest CUDA headers it allows by tests/test_tf_cuda_range.py")
        nvcc = toolchain.nvcc_check(full["cuda"])
        checks += [nvcc, toolchain.cudnn_check()]
        home = toolchain.cuda_home()
        if home:
            env["CUDA_TOOLKIT_PATH"] = str(home)
            env["TF_CUDA_PATHS"] = str(home)
    if env.get("TF_NEED_CLANG") == "1":
        checks.append(toolchain.tool_check("clang", "16", why="(TensorFlow 2.14 CUDA builds use clang 16)"))
    wheel_dir = bdir / "wheel"
    bazel_args = [bazel_cmd, "build", *full.get("bazel_config", []),
                  f"--disk_cache={cache_dir() / 'bazel-disk-cache'}",     # bazel's compiler cache
                  f"--repository_cache={cache_dir() / 'bazel-repo-cache'}",  # downloaded dependencies
                  f"--jobs={jobs or os.cpu_count() or 1}", *full.get("bazel_targets", [])]
    steps = [
        Step(common.tree_title(prof, source, tree), action=lambda: common.prepare_tree(prof, source, tree),
             shows=common.tree_commands(prof, source, tree), tree=True),
        Step("configure the build without prompts (answers come from the environment)",
             [python, "configure.py"], cwd=tree, env=env),
        Step(f"bazel build (bazel {bazel_version or 'as pinned'})", bazel_args, cwd=tree, env=env),
        Step("package the wheel", ["bazel-bin/tensorflow/tools/pip_package/build_pip_package", str(wheel_dir)],
             cwd=tree, env=env),
        Step(f"give the wheel the local version {common.local_version(prof)} and move it into {dist}",
             action=lambda: _retag_and_collect(prof, wheel_dir, dist)),
    ]
    return Plan(f"full build of {prof.framework.title} {prof.tag} + LMS -> tensorflow {common.local_version(prof)}",
                steps, checks, bdir / "build.log", notes)


def set_local_version(wheel: Path, local: str, out_dir: Path) -> Path:
    """A copy of `wheel` in `out_dir` whose version carries `+<local>` (file name, dist-info, METADATA)."""
    import re
    from ..overlay.wheelzip import rewrite_wheel
    name, version, rest = wheel.name.split("-", 2)
    new_version = f"{version}+{local}"

    def metadata(data: bytes) -> bytes:
        return re.sub(rb"^Version: .*$", f"Version: {new_version}".encode(), data, count=1, flags=re.MULTILINE)

    out = out_dir / f"{name}-{new_version}-{rest}"
    rewrite_wheel(wheel, out, old_dist_info=f"{name}-{version}.dist-info",
                  new_dist_info=f"{name}-{new_version}.dist-info",
                  transform={f"{name}-{version}.dist-info/METADATA": metadata})
    return out


def _retag_and_collect(prof: TagProfile, wheel_dir: Path, dist: Path) -> None:
    wheels = sorted(wheel_dir.glob(f"tensorflow*-{prof.version}-*.whl"))
    if len(wheels) != 1:
        raise LmsError(f"expected one TensorFlow {prof.version} wheel in {wheel_dir}, found {len(wheels)}")
    out = wheel_dir / "lms"
    out.mkdir(exist_ok=True)
    set_local_version(wheels[0], f"lms{LMS_BUILD}", out)
    common.collect_wheel(out, "tensorflow*.whl", dist)
