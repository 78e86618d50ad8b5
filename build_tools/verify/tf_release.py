"""The TensorFlow release the harnesses check, read from its profile (patches/tensorflow/<tag>/profile.toml).

The harnesses compile against official wheels of that release: its version, the Pythons those wheels
exist for and their pinned sha256s are the profile's, never restated here.
"""
from __future__ import annotations

import sys
from typing import Callable, Optional

from .. import catalog
from ..catalog import TagProfile
from ..errors import LmsError
from ..toolchain import in_range

__all__ = ["REPO", "log_to", "main_of", "tf_profile", "wheel_pythons"]

REPO = catalog.REPO_ROOT


def tf_profile(tag: str | None = None) -> TagProfile:
    """The profile of TensorFlow `tag`; without one, the newest supported TensorFlow tag's."""
    fw = catalog.framework("tensorflow")
    if tag is None:
        tags = catalog.supported_tags(fw)
        if not tags:
            raise LmsError("no TensorFlow tag is supported (no patches/tensorflow/<tag>/profile.toml)")
        tag = tags[-1]
    return catalog.profile(fw, tag)


def wheel_pythons(prof: TagProfile) -> tuple[str, ...]:
    """The CPython versions ("3.9", ...) the profile's [build.full] python range allows: those the
    release's official wheels are published for."""
    spec = prof.build("full").get("python")
    if not spec:
        raise LmsError(f"{prof.dir / 'profile.toml'} has no [build.full] python range")
    return tuple(f"3.{minor}" for minor in range(0, 40) if in_range(f"3.{minor}", spec))


def log_to(prefix: str):
    """A progress printer whose lines start with [prefix]."""
    def log(msg: str) -> None:
        print(f"[{prefix}] {msg}", flush=True)
    return log


def main_of(run: Callable[[Optional[list]], int]) -> Callable[[Optional[list]], int]:
    """A harness's command-line entry: ``run(argv)``, with an LmsError printed as one line
    and exit status 2 instead of a traceback."""
    def main(argv: Optional[list] = None) -> int:
        try:
            return run(argv)
        except LmsError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return main
