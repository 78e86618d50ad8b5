"""A patch the user brings (`make build ... PATCH=<file or URL>`, `build --patch`): fetched once when it is a
URL, and checked to be something `git am` can apply before any tree is touched.

`git format-patch` output is used as it is. A plain unified diff (`git diff`, `diff -ru` with a/ b/
prefixes) is wrapped once into a one-commit mbox beside the cached downloads, so that it goes through
the same `git am` (all or nothing, failing hunks named) as the shipped patches.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from .. import patchfile
from ..errors import LmsError
from ..fetch import fetch, file_sha256, is_url
from ..upstream import cache_dir

MBOX_HEAD = re.compile(r"^From [0-9a-f]{7,40} ", re.MULTILINE)


def resolve(spec: str, sha256: str | None = None) -> Path:
    """The patch file for `spec` (a path or an https URL; http:// needs `sha256`), ready for `git am`.
    With `sha256`, the patch (downloaded or local) must have that hash."""
    if is_url(spec):
        path = fetch(spec, cache_dir() / "patches", sha256=sha256)
    else:
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise LmsError(f"PATCH {spec} not found", hint="give a patch file's path or an https URL")
        if sha256 and file_sha256(path) != sha256.strip().lower().removeprefix("sha256:"):
            raise LmsError(f"PATCH {path} does not match PATCH_SHA256 {sha256}")
    text = patchfile.read(path)
    diffs = patchfile.parse(text)
    if not diffs:
        raise LmsError(f"{path} holds no diff: it is not a patch",
                       hint="make one in your tree with `git format-patch <tag>..HEAD --stdout > lms.patch`")
    if MBOX_HEAD.match(text):
        return path
    return _as_mbox(path, text, len(diffs))


def _as_mbox(path: Path, text: str, nfiles: int) -> Path:
    """`text` (a plain diff) as a one-commit mbox in the cache, named by its content."""
    body = patchfile.as_bytes(text)   # the user's bytes as they are, UTF-8 or not
    digest = hashlib.sha256(body).hexdigest()[:16]
    out = cache_dir() / "patches" / f"{path.stem}-{digest}.mbox.patch"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        head = ("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
                "From: LMS build tools <lms@localhost>\n"
                "Date: Thu, 1 Jan 1970 00:00:00 +0000\n"
                f"Subject: [PATCH] {path.name}\n\n"
                f"Applied by the LMS build tools from the plain diff {path} ({nfiles} file(s)).\n"
                "---\n")
        tmp = out.with_suffix(".part")
        tmp.write_bytes(head.encode() + body + (b"" if body.endswith(b"\n") else b"\n"))
        tmp.replace(out)
    return out
