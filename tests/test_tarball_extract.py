"""Source tarball extraction keeps everything inside its folder, with and without tarfile's own
filters (Python < 3.11.4 / 3.10.12 has none: Debian 12's 3.11.2 among them): safe members are
unpacked without set-id bits, and a tarball with any unsafe member is refused whole
(tests/test_malicious_archives.py has the corpus of attacks)."""
from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest

from build_tools.errors import LmsError
from build_tools.upstream.tarball import extract


def _tarball(path: Path, unsafe: bool = True) -> Path:
    with tarfile.open(path, "w:gz") as t:
        def add(name, kind=tarfile.REGTYPE, link="", data=b"x", mode=0o644):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, link, mode
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            t.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
        add("top/tool.sh", mode=0o4755)
        add("top/docs/readme", tarfile.SYMTYPE, "../tool.sh")
        add("top/hard", tarfile.LNKTYPE, "top/tool.sh", mode=0o4755)
        if not unsafe:
            return path
        add("top/hard-out", tarfile.LNKTYPE, "../outside")
        add("../escape")
        add("/abs-file")
        add("top/fifo", tarfile.FIFOTYPE)
        add("top/abs", tarfile.SYMTYPE, "/etc/passwd")
        add("top/up", tarfile.SYMTYPE, "../../outside")
    return path


# Without filters everywhere; with them where this Python's tarfile has them.
CASES = [False] + ([True] if hasattr(tarfile, "data_filter") else [])


@pytest.mark.parametrize("filters", CASES, ids=lambda f: "tarfile-filters" if f else "no-tarfile-filters")
def test_safe_members_are_extracted_plainly(tmp_path, monkeypatch, filters):
    if not filters:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    tb = _tarball(tmp_path / "t.tar.gz", unsafe=False)
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


@pytest.mark.parametrize("filters", CASES, ids=lambda f: "tarfile-filters" if f else "no-tarfile-filters")
def test_an_unsafe_member_refuses_the_tarball(tmp_path, monkeypatch, filters):
    if not filters:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    tb = _tarball(tmp_path / "t.tar.gz")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(LmsError, match=r"t\.tar\.gz: refusing to unpack: member 'top/hard-out' links to"):
        extract(tb, out)
    assert not (tmp_path / "escape").exists() and not (tmp_path / "outside").exists()


def test_full_disk_is_not_an_unreadable_tarball(tmp_path, monkeypatch):
    """An OSError while writing names the file and its cause, not the tarball's format."""
    import errno
    import os
    tb = _tarball(tmp_path / "t.tar.gz", unsafe=False)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "out" / "top" / "tool.sh"))
    monkeypatch.setattr(tarfile.TarFile, "extract", full)
    with pytest.raises(LmsError) as e:
        extract(tb, tmp_path / "out")
    assert "No space left on device" in str(e.value) and "tool.sh" in str(e.value)
    assert "not a readable tarball" not in str(e.value)
