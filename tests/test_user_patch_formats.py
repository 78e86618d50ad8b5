"""What `PATCH=` accepts besides `git format-patch` output: `diff -ru` output (as documented) and
patches with bytes that are not UTF-8, kept byte for byte; and the CLI's one-line OSError message."""
from __future__ import annotations

import errno
import os
import subprocess

import pytest

from build_tools import cli, patchfile
from build_tools.patch_ops.user_patch import resolve


def _diff_ru(tmp_path, old: bytes, new: bytes) -> bytes:
    for side, data in (("a", old), ("b", new)):
        (tmp_path / side / "src").mkdir(parents=True)
        (tmp_path / side / "src" / "f.txt").write_bytes(data)
    (tmp_path / "b" / "src" / "added.txt").write_bytes(b"new\n")
    r = subprocess.run(["diff", "-ruN", "a", "b"], cwd=tmp_path, stdout=subprocess.PIPE)
    assert r.returncode == 1
    return r.stdout


def test_diff_ru_output_is_accepted_and_applies(tmp_path, monkeypatch):
    monkeypatch.setenv("LMS_CACHE_DIR", str(tmp_path / "cache"))
    old, new = b"caf\xe9 latin-1\nline 2\n", b"caf\xe9 latin-1\nline 2 changed \xff\n"
    patch = tmp_path / "user.diff"
    patch.write_bytes(_diff_ru(tmp_path / "d", old, new))
    assert sorted(f.path for f in patchfile.parse(patchfile.read(patch))) == ["src/added.txt", "src/f.txt"]
    mbox = resolve(str(patch))
    assert patch.read_bytes() in mbox.read_bytes()   # the user's bytes, not replacement characters
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "f.txt").write_bytes(old)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "base"], check=True)
    subprocess.run(git + ["am", "-q", str(mbox)], check=True)
    assert (repo / "src" / "f.txt").read_bytes() == new
    assert (repo / "src" / "added.txt").read_bytes() == b"new\n"


def test_an_os_error_at_the_cli_is_one_line_naming_file_and_cause(monkeypatch, capsys):
    def full(args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/work/build/x.whl")
    monkeypatch.setattr(cli, "cmd_tags", full)
    assert cli.main(["tags"]) == 2
    err = capsys.readouterr().err
    assert err == "error: /work/build/x.whl: No space left on device\n"
