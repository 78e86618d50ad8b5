"""python -m build_tools.packagers: .conda from a built wheel, local channel index, rattler install."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import LmsError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m build_tools.packagers",
                                 description="Conda packages from built wheels (no conda/conda-build needed).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("conda", help="make a .conda from a wheel into a local channel and index it")
    c.add_argument("wheel")
    c.add_argument("--channel", default="dist/conda", help="local channel folder (default: dist/conda)")
    c.add_argument("--name", default="pytorch", help="conda package name (default: pytorch)")
    c.add_argument("--python-version", default=f"{sys.version_info[0]}.{sys.version_info[1]}")
    c.add_argument("--build-number", type=int, default=0)
    c.add_argument("--zstd-level", type=int, default=3)
    c.add_argument("--install-prefix", help="also link it into this prefix with py-rattler (no deps)")
    i = sub.add_parser("install", help="py-rattler install from a local channel into a prefix")
    i.add_argument("channel")
    i.add_argument("prefix")
    i.add_argument("--spec", default="pytorch")
    i.add_argument("--with-deps", action="store_true", help="solve dependencies (needs them in the channel)")
    a = ap.parse_args(argv)
    from . import conda
    try:
        if a.cmd == "conda":
            pkg = conda.wheel_to_conda(Path(a.wheel), Path(a.channel), name=a.name, python_version=a.python_version,
                                       build_number=a.build_number, compression_level=a.zstd_level)
            print(f"indexed: {conda.index_channel(Path(a.channel), pkg.subdir)}")
            rep = conda.solve_report(Path(a.channel), f"{pkg.name} =={pkg.version} {pkg.build}")
            print("full solve against the local channel only:", "ok" if rep["ok"] else "not satisfiable (expected "
                  "offline: dependencies live on conda-forge)\n  " + rep["error"].replace("\n", "\n  ")[:3000])
            if a.install_prefix:
                print(json.dumps(conda.install(Path(a.channel), Path(a.install_prefix), f"{pkg.name} =={pkg.version} {pkg.build}")))
        else:
            print(json.dumps(conda.install(Path(a.channel), Path(a.prefix), a.spec, no_deps=not a.with_deps)))
        return 0
    except LmsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
