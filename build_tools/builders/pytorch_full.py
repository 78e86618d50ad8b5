"""Full PyTorch build: the patched tree through PyTorch's own `setup.py bdist_wheel`."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ..catalog import TagProfile
from ..upstream import Source
from .. import toolchain
from . import common
from .plan import Plan, Step


def plan(prof: TagProfile, source: Source, *, jobs: int | None = None, python: str = sys.executable,
         dist: Path = common.DIST) -> Plan:
    full = prof.build("full")
    bdir = common.build_dir(prof, "full")
    tree = bdir / "src"
    env = {k: str(v) for k, v in full.get("env", {}).items()}
    env.update({
        "MAX_JOBS": str(jobs or os.cpu_count() or 1),
        "PYTORCH_BUILD_VERSION": common.local_version(prof),   # the wheel's version: 2.6.0+lms1
        "PYTORCH_BUILD_NUMBER": "1",
    })
    launcher = toolchain.compiler_launcher()
    if launcher:
        for lang in ("C", "CXX", "CUDA"):
            env[f"CMAKE_{lang}_COMPILER_LAUNCHER"] = launcher
        if launcher == "ccache":   # hits across build folders and compiler reinstalls
            env.update(CCACHE_BASEDIR=str(tree), CCACHE_COMPILERCHECK="content")
        else:                      # PyTorch's CMake turns ccache on by itself when it finds one
            env["USE_CCACHE"] = "0"
    home = toolchain.cuda_home()
    if home and env.get("USE_CUDA") == "1":
        env["CUDA_HOME"] = str(home)
    checks = [toolchain.python_check(full.get("python", ">=3.9"), python)]
    if env.get("USE_CUDA") == "1":
        checks.append(toolchain.nvcc_check(full.get("cuda", ">=11.8")))
        if env.get("USE_CUDNN") == "1":
            checks.append(toolchain.cudnn_check())
    checks += [
        toolchain.tool_check("gcc", "9.4", why="(PyTorch needs a C++17 compiler)"),
        toolchain.tool_check("cmake", "3.18"),
        toolchain.tool_check("ninja", "1.10", why="(`make setup` installs it into the virtualenv)"),
    ]
    steps = [
        Step(common.tree_title(prof, source, tree), action=lambda: common.prepare_tree(prof, source, tree),
             shows=common.tree_commands(prof, source, tree), tree=True),
    ]
    if source.kind == "git":
        steps.append(Step("fetch the tag's git submodules (third_party/)",
                          ["git", "submodule", "update", "--init", "--recursive", "--depth=1", "--jobs=8"], cwd=tree))
    steps += [
        Step("check the bundled dependencies are there",
             action=lambda: common.require_third_party(tree, "third_party/pybind11/CMakeLists.txt", source)),
        Step("install PyTorch's Python build requirements",
             [python, "-m", "pip", "install", "-r", "requirements.txt"], cwd=tree),
        Step("build the wheel with PyTorch's own setup.py", [python, "setup.py", "bdist_wheel"], cwd=tree, env=env),
        Step(f"move the wheel into {dist}",
             action=lambda: common.collect_wheel(tree / "dist", f"torch-{common.local_version(prof)}-*.whl", dist)),
    ]
    return Plan(f"full build of {prof.framework.title} {prof.tag} + LMS -> torch {common.local_version(prof)}",
                steps, checks, bdir / "build.log")
