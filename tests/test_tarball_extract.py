"""Source tarball extraction keeps everything inside its folder, with and without tarfile's own
filters (Python < 3.11.4 / 3.10.12 has none: Debian 12's 3.11.2 among them)."""
from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest

from build_tools.upstream.tarball import extract


def _tarball(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as t:
        def add(name, kind=tarfile.REGTYPE, link="", data=b"x", mode=0o644):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, link, mode
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            t.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
        add("top/tool.sh", mode=0o4755)
        add("top/docs/readme", tarfile.SYMTYPE, "../tool.sh")
        add("top/abs", tarfile.SYMTYPE, "/etc/passwd")
        add("top/up", tarfile.SYMTYPE, "../../outside")
        add("top/hard", tarfile.LNKTYPE, "top/tool.sh", mode=0o4755)
        add("top/hard-out", tarfile.LNKTYPE, "../outside")
        add("../escape")
        add("/abs-file")
        add("top/fifo", tarfile.FIFOTYPE)
    return path


# Without filters everywhere; with them where this Python's tarfile has them.
CASES = [False] + ([True] if hasattr(tarfile, "data_filter") else [])


@pytest.mark.parametrize("filters", CASES, ids=lambda f: "tarfile-filters" if f else "no-tarfile-filters")
def test_only_safe_members_are_extracted(tmp_path, monkeypatch, filters):
    if not filters:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    tb = _tarball(tmp_path / "t.tar.gz")
    out = tmp_path / "out"
    out.mkdir()
    root = extract(tb, out)
    assert root == out / "top"
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert names == ["docs", "docs/readme", "hard", "tool.sh"], names
    assert (root / "docs" / "readme").read_bytes() == b"x"
    mode = (root / "tool.sh").stat().st_mode
    assert not mode & stat.S_ISUID and mode & 0o777 == 0o755
    assert not (tmp_path / "escape").exists() and not (tmp_path / "outside").exists()
