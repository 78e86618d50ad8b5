"""A corpus of malicious archives, built here with tarfile/zipfile, against every unpacker of the build
tools: the source tarball import (upstream/tarball.py), the CUDA header wheels (cudahome.py) and
the conda staging of a wheel (packagers/conda.py). Each one must be refused with a message naming the
archive and the member, and nothing may appear outside the extraction folder.

Each case first checks the places outside, so that on code without the guard the failure says what
escaped (`ESCAPED: ...`)."""
from __future__ import annotations

import io
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from build_tools.errors import LmsError

try:  # absent from code before the shared extractor: the member-count case then runs unbounded
    from build_tools import archives
except ImportError:
    archives = None


def _tar(path: Path, members: list) -> Path:
    """members: (name, kind, linkname, data)"""
    with tarfile.open(path, "w") as t:
        for name, kind, link, data in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, link, 0o644
            if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
                info.devmajor, info.devminor = 1, 3
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            t.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return path


F, SYM, HARD = tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE


def tar_cases(outside: Path) -> dict:
    """name -> (members, the paths outside that an escape would create or change)."""
    secret = outside / "secret"
    return {
        # `top/l1` -> `.`, then `top/l1/l2` -> `../..`: read as text from its own folder (top/l1) the
        # second stays inside; on the disk it is top/l2 and points two folders up, out of the tree
        "symlink-chain-through-linked-folder": (
            [("top/f", F, "", b"ok"), ("top/l1", SYM, ".", b""), ("top/l1/l2", SYM, "../..", b""),
             ("top/l1/l2/evil", F, "", b"pwned")], [outside / "evil"]),
        "hardlink-through-linked-folder-then-overwrite": (
            [("top/l1", SYM, ".", b""), ("top/l1/l2", SYM, "../..", b""),
             ("top/h", HARD, "top/l1/l2/secret", b""), ("top/h", F, "", b"pwned")], [secret]),
        # `top/l` -> `d/..` while d does not exist yet (it resolves to top/), then `top/d` -> `..`
        # (the extraction folder itself): now top/l is the folder's parent
        "symlink-bound-late-through-a-later-link": (
            [("top/l", SYM, "d/..", b""), ("top/d", SYM, "..", b""), ("top/l/evil", F, "", b"pwned")],
            [outside / "evil"]),
        "symlink-absolute-then-write-through": (
            [("top/l", SYM, str(outside), b""), ("top/l/evil", F, "", b"pwned")], [outside / "evil"]),
        "dotdot-name": ([("top/../../evil", F, "", b"pwned")], [outside / "evil"]),
        "absolute-name": ([(str(outside / "evil"), F, "", b"pwned")], [outside / "evil"]),
        "hardlink-dotdot": ([("top/h", HARD, "../secret", b""), ("top/h", F, "", b"pwned")], [secret]),
        "device-file": ([("top/null", tarfile.CHRTYPE, "", b"")], []),
        "too-many-members": ([(f"top/m{i}", F, "", b"") for i in range(60)], []),
    }


def _outside_state(paths):
    return {p: (p.read_bytes() if p.is_file() else None) for p in paths}


# the tarfile-filters variant exists only where this Python's tarfile has filters (3.11.4+, 3.12+;
# Debian 12's 3.11.2 has none): not a skip, a variant this Python does not have
FILTER_VARIANTS = [True, False] if hasattr(tarfile, "data_filter") else [False]


@pytest.mark.parametrize("case", list(tar_cases(Path("/x"))))
@pytest.mark.parametrize("filters", FILTER_VARIANTS,
                         ids=["tarfile-filters", "no-tarfile-filters"][-len(FILTER_VARIANTS):])
def test_tarball_corpus_refused(tmp_path, monkeypatch, case, filters):
    from build_tools.upstream.tarball import extract
    if not filters:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    if archives is not None:
        monkeypatch.setattr(archives, "MAX_MEMBERS", 50)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    members, watched = tar_cases(outside)[case]
    tb = _tar(tmp_path / f"{case}.tar", members)
    before = _outside_state(watched)
    into = outside / "work"   # `top/../..` and the link chains land in `outside`
    into.mkdir()
    try:
        extract(tb, into)
        err = None
    except LmsError as e:
        err = e
    after = _outside_state(watched)
    assert after == before, f"ESCAPED: {case}: {[(str(p), after[p]) for p in watched if after[p] != before[p]]}"
    written = sorted(str(p.relative_to(into)) for p in into.rglob("*"))
    assert err is not None, f"NOT REFUSED: {case}: extracted {len(written)} entries: {written[:6]}"
    assert tb.name in str(err) and "member" in str(err), str(err)


# ---- wheels ---------------------------------------------------------------------------------------

def _zip(path: Path, members: dict) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(zipfile.ZipInfo(name), data)
    return path


def _header_wheel_cases(outside: Path) -> dict:
    return {
        "double-slash-becomes-absolute": f"nvidia/cuda_runtime/include/{outside}/evil.h",
        "dotdot": "nvidia/cuda_runtime/include/../../../outside/evil.h",
    }


@pytest.mark.parametrize("case", list(_header_wheel_cases(Path("/x"))))
def test_cuda_header_wheel_corpus_refused(tmp_path, monkeypatch, case):
    from build_tools import cudahome
    outside = tmp_path / "outside"
    outside.mkdir()
    name = _header_wheel_cases(outside)[case]
    bad = _zip(tmp_path / "nvidia_cuda_runtime_cu12-12.4.127-py3-none-manylinux2014_x86_64.whl",
               {"nvidia/cuda_runtime/include/cuda.h": b"//", name: b"pwned"})
    monkeypatch.setattr(cudahome, "fetch_wheel", lambda req, **kw: bad)
    root = tmp_path / "root"   # the temporary home is root/.cuda-home-*/, so ../../../outside is `outside`
    try:
        cudahome.cuda_home("12.4", python=sys.executable, root=root, progress=lambda m: None)
        err = None
    except LmsError as e:
        err = e
    escaped = sorted(str(p) for p in outside.rglob("*"))
    assert not escaped, f"ESCAPED: {case}: {escaped}"
    assert err is not None and bad.name in str(err) and "member" in str(err), str(err)


def _wheel(path: Path, extra: dict) -> Path:
    di = "demo-1.0.dist-info"
    return _zip(path, {"demo/__init__.py": b"", f"{di}/METADATA": b"Name: demo\nVersion: 1.0\n",
                       f"{di}/WHEEL": b"Tag: py3-none-any\n", f"{di}/RECORD": b"", **extra})


@pytest.mark.parametrize("member", ["../../../../../evil.txt", "demo/../../../../../../evil.txt"])
def test_conda_staging_corpus_refused(tmp_path, member):
    import conda_package_handling  # noqa: F401  (a dependency of the tools: missing, this fails)
    from build_tools.packagers.conda import wheel_to_conda
    outside = tmp_path / "outside"
    channel = outside / "channel"
    channel.mkdir(parents=True)
    whl = _wheel(tmp_path / "demo-1.0-py3-none-any.whl", {member: b"pwned"})
    try:
        wheel_to_conda(whl, channel, name="demo", python_version="3.11", progress=lambda m: None)
        err = None
    except LmsError as e:
        err = e
    escaped = sorted(str(p) for p in tmp_path.rglob("evil.txt"))
    assert not escaped, f"ESCAPED: {member}: {escaped}"
    assert err is not None and whl.name in str(err) and "member" in str(err), str(err)
    assert not list(channel.rglob("*.conda"))


def test_safe_archives_still_unpack(tmp_path):
    """Links inside the tree, set-id bits dropped, a wheel's files in place."""
    from build_tools.archives import extract_zip
    from build_tools.upstream.tarball import extract
    tb = _tar(tmp_path / "ok.tar", [("top/tool.sh", F, "", b"x"), ("top/docs/readme", SYM, "../tool.sh", b""),
                                     ("top/hard", HARD, "top/tool.sh", b"")])
    root = extract(tb, tmp_path / "out")
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == ["docs", "docs/readme", "hard", "tool.sh"]
    assert (root / "docs" / "readme").read_bytes() == b"x"
    whl = _wheel(tmp_path / "demo-1.0-py3-none-any.whl", {})
    got = extract_zip(whl, tmp_path / "w")
    assert (tmp_path / "w" / "demo" / "__init__.py") in got
