"""python -m build_tools.overlay: build an overlay wheel (see build_tools/overlay/__init__.py)."""
from __future__ import annotations

import argparse
import sys

from ..errors import LmsError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m build_tools.overlay",
        description="Patched PyTorch wheel in minutes: the official wheel of TAG with libc10_cuda.so "
                    "rebuilt from TREE (ABI-checked), patched torch/*.py copied, local version +lmsN.")
    ap.add_argument("tag", help="supported tag, e.g. v2.6.0")
    ap.add_argument("tree", help="patched PyTorch tree (git checkout containing the tag)")
    ap.add_argument("--dist", default="dist", help="output folder (default: dist)")
    ap.add_argument("--python", default=sys.executable, help="interpreter the wheel is for (default: this one)")
    ap.add_argument("--base", help="git ref the tree is diffed against (default: the tag)")
    ap.add_argument("--wheel", dest="wheel_requirement", help="official wheel to start from (default: profile)")
    ap.add_argument("--wheel-cache", help="download cache (default: .cache/wheels)")
    ap.add_argument("--work-dir", help="scratch/incremental build folder (default: build/overlay)")
    ap.add_argument("--launcher", default="auto", help="compiler cache: auto|ccache|sccache|none")
    ap.add_argument("-j", "--jobs", type=int, help="parallel compile jobs")
    ap.add_argument("--plan-only", action="store_true", help="print what would be rebuilt/copied and stop")
    a = ap.parse_args(argv)
    try:
        if a.plan_only:
            from ..catalog import framework, profile
            from .plan import plan_overlay
            profile(framework("pytorch"), a.tag)
            p = plan_overlay(a.tree, a.base or a.tag, a.tag)
            print(p.describe())
            for s, f in p.changes:
                print(f"  {s} {f}")
            return 0
        from .build import build_overlay
        r = build_overlay(a.tag, a.tree, a.dist, python=a.python, base=a.base,
                          wheel_requirement=a.wheel_requirement, wheel_cache=a.wheel_cache,
                          work_dir=a.work_dir, launcher=a.launcher, jobs=a.jobs)
        print(r.wheel)
        return 0
    except LmsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
