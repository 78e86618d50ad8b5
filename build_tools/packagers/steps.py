"""Packaging steps added to a build's Plan: they take the wheel a builder's steps left in plan.outputs."""
from __future__ import annotations

import sys
from pathlib import Path

from .. import toolchain
from ..builders.plan import Plan, Step
from ..errors import LmsError

__all__ = ["conda_step"]


def conda_step(plan: Plan, dist: Path, wheel_glob: str, *, python: str = sys.executable) -> Step:
    """The .conda of the wheel the plan builds (plan.outputs["wheel"]), into the local channel
    dist/conda, indexed. `wheel_glob` names that wheel in the dry-run's command."""
    channel = dist / "conda"
    pyver = toolchain.python_version(python)

    def conda() -> None:
        from . import conda as conda_pkg
        wheel = plan.outputs.get("wheel")
        if wheel is None:
            raise LmsError(f"{plan.title}: no wheel was built to package")
        pkg = conda_pkg.wheel_to_conda(wheel, channel, python_version=pyver)
        conda_pkg.index_channel(channel, pkg.subdir)

    return Step(f"conda package from the wheel into the local channel {channel} (indexed)", action=conda,
                shows=[f"{sys.executable} -m build_tools.packagers conda {dist}/{wheel_glob} "
                       f"--channel {channel} --python-version {pyver}"])
