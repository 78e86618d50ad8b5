"""What an overlay build must do for a patched tree, decided from the tree's diff against the tag.

  c10/cuda/**  (sources, headers, its CMakeLists/bazel files)  -> rebuild libc10_cuda.so
  c10/**       (other sources/headers)                          -> rebuild libc10.so (and libc10_cuda.so)
  torch/**/*.py, torch/**/*.pyi                                 -> copied into the wheel
  torch/**/*.cpp, torch/**/*.h (not torch/csrc)                 -> copied too: sources a Python
                                                                   module compiles at run time
                                                                   and the headers they include
  tests, docs, CI files (test/, docs/, benchmarks/, .github/, .ci/, c10/test/, c10/cuda/test/, *.md)
                                                                -> not part of a wheel: ignored
  setup.py, where the edit only adds entries of torch_package_data that name .py/.pyi/.cpp/.h files
                                                                -> ignored: the overlay copies those
  anything else (torch/csrc, aten, caffe2, other setup.py edits, cmake, third_party, ...) -> refused: overlay
  mode cannot rebuild it; the full build can (`make build TORCH=<tag> MODE=full`).
Changed c10 headers are also copied to torch/include/ so C++ extensions compile against them.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import re
from pathlib import Path

from .. import gitutil
from ..errors import LmsError

IGNORED = ["test/*", "docs/*", "benchmarks/*", ".github/*", ".ci/*", "c10/test/*", "c10/cuda/test/*",
           "c10/benchmark/*", "*.md", "*.rst", "CODEOWNERS", ".gitignore", "*/.gitignore"]
C10_BUILD_FILES = ["c10/CMakeLists.txt", "c10/BUILD.bazel", "c10/build.bzl", "c10/*/BUILD.bazel",
                   "c10/*/build.bzl", "c10/cuda/CMakeLists.txt", "c10/ovrsource_defs.bzl"]
SOURCE_SUFFIXES = (".cpp", ".cc", ".h", ".hpp", ".inc", ".cuh")
HEADER_SUFFIXES = (".h", ".hpp", ".inc", ".cuh")


class OverlayRefused(LmsError):
    """The patch changes something an overlay build cannot rebuild."""


@dataclasses.dataclass
class OverlayPlan:
    rebuild: list            # subset of ["c10", "c10_cuda"], in build order
    python_files: list       # torch/... .py/.pyi/.cpp/.h added or modified (copied into the wheel)
    python_deleted: list     # torch/... .py/.pyi deleted by the patch (removed from the wheel)
    headers: list            # c10/... headers added or modified (-> torch/include/c10/...)
    headers_deleted: list
    ignored: list            # changed files that are not part of a wheel
    changes: list            # every (status, path) of the diff

    def describe(self) -> str:
        parts = [f"rebuild {', '.join('lib' + r + '.so' for r in self.rebuild) or 'no library'}",
                 f"{len(self.python_files)} Python file(s) to copy, {len(self.python_deleted)} to delete",
                 f"{len(self.headers)} header(s) to update"]
        if self.ignored:
            parts.append(f"{len(self.ignored)} changed file(s) outside the wheel ignored")
        return "; ".join(parts)


def changed_files(tree: Path, base: str) -> list[tuple[str, str]]:
    """(status, path) of every file whose content differs between `base` and the tree as it is now:
    committed and uncommitted edits of tracked files, plus untracked files (not ignored)."""
    res = gitutil.run(tree, "diff", "--name-status", "--no-renames", "-z", base, "--", ".", check=False)
    if not res.ok:
        raise LmsError(f"{tree}: cannot diff against {base!r}: {res.err.strip()}",
                       hint="the tree must be a git checkout that contains the tag")
    fields = [f for f in res.out.split("\0") if f]
    out = [(fields[i], fields[i + 1]) for i in range(0, len(fields) - 1, 2)]
    untracked = gitutil.run(tree, "ls-files", "--others", "--exclude-standard", "-z").out
    out += [("A", p) for p in untracked.split("\0") if p]
    return sorted(set(out), key=lambda x: x[1])


def _match(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


PACKAGE_DATA_ENTRY = re.compile(r'''\s*(["'])[^"']+\.(py|pyi|cpp|h)\1,\s*(#.*)?''')
COMMENT_OR_BLANK = re.compile(r"\s*(#.*)?")


def _setup_py_adds_only_copied_package_data(tree: Path, base: str) -> bool:
    """Whether the edit of setup.py only adds lines to the `torch_package_data = [...]` list,
    each a pattern of .py/.pyi/.cpp/.h files or a comment: files the overlay copies into the wheel
    anyway, so the edit changes nothing an overlay build makes."""
    diff = gitutil.run(tree, "diff", "-U0", "--no-color", base, "--", "setup.py").out
    text = (tree / "setup.py").read_text(encoding="utf-8", errors="replace").splitlines()
    start = next((i for i, line in enumerate(text) if line.strip() == "torch_package_data = ["), None)
    if start is None:
        return False
    end = next((i for i in range(start + 1, len(text)) if text[i].strip() == "]"), None)
    if end is None:
        return False
    added = 0
    for line in diff.splitlines():
        if line.startswith(("diff ", "index ", "--- ", "+++ ")):
            continue
        hunk = re.match(r"@@ -\d+(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", line)
        if hunk:
            removed = int(hunk.group(1) if hunk.group(1) is not None else 1)
            first, count = int(hunk.group(2)), int(hunk.group(3) if hunk.group(3) is not None else 1)
            if removed or not (start + 1 < first and first + count - 1 <= end):  # 1-based lines
                return False
        elif line.startswith("-"):
            return False
        elif line.startswith("+"):
            body = line[1:]
            if PACKAGE_DATA_ENTRY.fullmatch(body):
                added += 1
            elif not COMMENT_OR_BLANK.fullmatch(body):
                return False
    return added > 0


def plan_overlay(tree: Path, base: str, tag_for_hint: str | None = None) -> OverlayPlan:
    changes = changed_files(Path(tree), base)
    rebuild: set[str] = set()
    py, py_del, hdr, hdr_del, ignored, refused = [], [], [], [], [], []
    for status, path in changes:
        deleted = status.startswith("D")
        if _match(path, IGNORED):
            ignored.append(path)
        elif path.startswith("c10/cuda/"):
            if path.endswith(SOURCE_SUFFIXES) or _match(path, C10_BUILD_FILES):
                rebuild.add("c10_cuda")
                if path.endswith(HEADER_SUFFIXES):
                    (hdr_del if deleted else hdr).append(path)
            else:
                refused.append((path, "a c10/cuda file that is neither C++ source nor header"))
        elif path.startswith("c10/"):
            if path.endswith(SOURCE_SUFFIXES) or _match(path, C10_BUILD_FILES):
                rebuild.update(("c10", "c10_cuda"))
                if path.endswith(HEADER_SUFFIXES):
                    (hdr_del if deleted else hdr).append(path)
            else:
                refused.append((path, "a c10 file that is neither C++ source nor header (e.g. a generated-"
                                      "header template)"))
        elif path.startswith("torch/") and path.endswith((".py", ".pyi", ".cpp", ".h")) \
                and not path.startswith("torch/csrc/"):
            (py_del if deleted else py).append(path)
        elif path == "setup.py" and not deleted and _setup_py_adds_only_copied_package_data(Path(tree), base):
            ignored.append(path)
        else:
            refused.append((path, "compiled into libraries other than libc10/libc10_cuda, or part of the "
                                  "build system"))
    if refused:
        tag = tag_for_hint or base
        listing = "\n".join(f"    {p}  ({why})" for p, why in refused[:20])
        more = f"\n    ... and {len(refused) - 20} more" if len(refused) > 20 else ""
        raise OverlayRefused(
            f"the patch changes {len(refused)} file(s) that an overlay build cannot rebuild "
            f"(it only recompiles c10/c10_cuda and copies torch/**/*.py):\n{listing}{more}",
            hint=f"build from source instead: make build TORCH={tag} MODE=full")
    order = [r for r in ("c10", "c10_cuda") if r in rebuild]
    return OverlayPlan(order, sorted(py), sorted(py_del), sorted(hdr), sorted(hdr_del), sorted(ignored), changes)
