"""`verify`: apply every committed patch to its tag in a scratch worktree and print a table."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from .. import catalog, gitutil
from ..errors import LmsError
from ..upstream import cache_dir
from .apply import apply_patch


def verify(patches: list[Path], source_for) -> list[dict]:
    """`source_for(framework)` gives the Source to use. Returns one row per patch; raises if any failed."""
    rows = []
    for patch in patches:
        fw, tag = catalog.parse_patch_name(patch)
        row = {"patch": patch.name, "tag": f"{fw.name} {tag}", "upstream": "-", "files": "-", "lines": "-",
               "result": "ok"}
        try:
            source = source_for(fw)
            scratch = cache_dir() / "scratch"
            scratch.mkdir(parents=True, exist_ok=True)
            dest = Path(tempfile.mkdtemp(prefix="verify-", dir=scratch))
            applied = apply_patch(fw, tag, source, patch, dest)
            row.update(upstream=applied.base[:12], files=str(applied.files),
                       lines=f"+{applied.added} -{applied.removed}")
            gitutil.remove_worktree(source.repo, applied.worktree)
        except LmsError as e:
            row["result"] = "FAILED: " + str(e).splitlines()[0]
            row["detail"] = str(e)
        rows.append(row)
    print_table(rows)
    failed = [r for r in rows if r["result"] != "ok"]
    if failed:
        raise LmsError(f"{len(failed)} of {len(rows)} patch(es) do not apply:\n\n" +
                       "\n\n".join(r["detail"] for r in failed))
    return rows


def print_table(rows: list[dict], out=sys.stdout) -> None:
    cols = ["patch", "tag", "upstream", "files", "lines", "result"]
    if not rows:
        print("no committed patches in patches/", file=out)
        return
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    print("  ".join(c.upper().ljust(widths[c]) for c in cols), file=out)
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in cols), file=out)
