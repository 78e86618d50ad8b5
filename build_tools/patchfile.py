"""Reading `git format-patch` files: which files and hunks they touch, and naming the hunk that failed."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


@dataclass
class FileDiff:
    path: str
    new: bool = False
    deleted: bool = False
    hunks: list[str] = field(default_factory=list)   # the @@ header lines
    added: int = 0
    removed: int = 0
    git: bool = False   # from a `diff --git` section (else a plain unified diff)


def parse(text: str) -> list[FileDiff]:
    """The files a patch touches: `git diff` sections (`diff --git`), and plain unified diffs
    (`diff -ru`, `diff -u`: a `--- ` line followed by `+++ `, path after its first folder)."""
    files: list[FileDiff] = []
    cur: FileDiff | None = None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("diff --git "):
            m = re.match(r"diff --git a/(.*) b/(.*)$", line)
            cur = FileDiff(m.group(2) if m else line.split()[-1][2:], git=True)
            files.append(cur)
        elif (line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
              and not (cur is not None and cur.git)):
            new, old = lines[i + 1][4:].split("\t")[0].strip(), line[4:].split("\t")[0].strip()
            path = new if new != "/dev/null" else old
            cur = FileDiff(path.split("/", 1)[1] if "/" in path else path,
                           new=old == "/dev/null", deleted=new == "/dev/null")
            files.append(cur)
        elif cur is None:
            continue
        elif line.startswith("new file mode"):
            cur.new = True
        elif line.startswith("deleted file mode"):
            cur.deleted = True
        elif line.startswith("@@ "):
            cur.hunks.append(line)
        elif cur.hunks and line.startswith("+") and not line.startswith("+++"):
            cur.added += 1
        elif cur.hunks and line.startswith("-") and not line.startswith("---"):
            cur.removed += 1
    return files


def touched_paths(text: str) -> list[str]:
    return [f.path for f in parse(text)]


def describe_failure(patch_text: str, git_output: str) -> str:
    """Turn git apply/am's complaint into 'file X, hunk N of M (@@ ... @@): reason' lines."""
    files = {f.path: f for f in parse(patch_text)}
    lines = []
    for m in re.finditer(r"patch failed: (.+):(\d+)", git_output):
        path, line = m.group(1), int(m.group(2))
        fd = files.get(path)
        where = f"line {line}"
        if fd:
            for i, h in enumerate(fd.hunks, 1):
                hm = HUNK_RE.match(h)
                if hm and int(hm.group(1)) == line:
                    where = f"hunk {i} of {len(fd.hunks)} `{h.strip()}`"
                    break
        lines.append(f"{path}: {where} does not apply (the upstream lines around it differ)")
    for m in re.finditer(r"error: (.+?): (does not exist in index|No such file or directory)", git_output):
        lines.append(f"{m.group(1)}: the patch edits this file but the tree does not have it")
    for m in re.finditer(r"error: (.+?): already exists in (?:index|working directory)", git_output):
        lines.append(f"{m.group(1)}: the patch adds this file but the tree already has it")
    if not lines:
        tail = [l for l in git_output.strip().splitlines() if l.strip()][-4:]
        lines = tail or ["git gave no reason"]
    return "\n".join(dict.fromkeys(lines))


def read(path: Path) -> str:
    """The patch's text; bytes that are not UTF-8 are kept as they are (surrogateescape), so that
    `write_bytes(text)` gives the same bytes back (a patch to a Latin-1 file must still apply)."""
    return path.read_bytes().decode("utf-8", "surrogateescape")


def as_bytes(text: str) -> bytes:
    """The bytes of a text from read()."""
    return text.encode("utf-8", "surrogateescape")
