"""python -m build_tools.abi OLD.so NEW.so: is NEW a drop-in replacement for OLD? (exit 0 yes, 1 no)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import check_library
from ..errors import LmsError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m build_tools.abi", description=__doc__)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--baseline", help="the UNPATCHED source rebuilt with the same toolchain")
    ap.add_argument("--types-old", help="unpatched rebuild with -g (type/layout check)")
    ap.add_argument("--types-new", help="patched rebuild with -g (type/layout check)")
    ap.add_argument("--json", help="write the full report here")
    a = ap.parse_args(argv)
    try:
        rep = check_library(Path(a.old), Path(a.new), baseline=Path(a.baseline) if a.baseline else None,
                            types_old=Path(a.types_old) if a.types_old else None,
                            types_new=Path(a.types_new) if a.types_new else None)
    except LmsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(rep.summary())
    for t in rep.tolerated:
        print(f"  tolerated: {t['symbol']} ({t['why']})")
    if a.json:
        Path(a.json).write_text(json.dumps(rep.to_json(), indent=1) + "\n")
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
