"""The one safe way the build tools unpack archives: source tarballs, wheels (zip) and conda packages.

The tools run as root in CI and on build hosts, and what they unpack comes from the network, so an
archive is refused whole (LmsError naming the archive and the member) as soon as one member could
write or link outside the extraction folder:
  - absolute names, `..` parts, empty parts (`a//b`: in a wheel, `nvidia/x/include//etc/y` would
    otherwise become the absolute `/etc/y` when joined), NUL bytes, backslashes in zip names;
  - links (symbolic or hard) whose target, resolved on the disk as it is at that moment (through
    links extracted before: chains through a linked folder), lies outside;
  - devices, fifos and other special files;
  - more members than MAX_MEMBERS (a zip or tar bomb of tiny files).
Tar members are extracted one at a time; where tarfile has its `data` filter (3.11.4+, 3.10.12+) it
is applied to each member as well, and on every Python the real path of what was written is checked
after each member. Ownership is never restored and set-id bits are dropped.
"""
from __future__ import annotations

import copy
import os
import stat
import tarfile
import zipfile
from pathlib import Path
from typing import Callable, Iterable

from .errors import LmsError

__all__ = ["MAX_MEMBERS", "UnsafeArchive", "check_name", "extract_tar", "extract_zip", "inside"]

# The largest real archive the tools unpack (TensorFlow's source tarball) has about 32k members.
MAX_MEMBERS = 500_000


class UnsafeArchive(LmsError):
    """An archive with a member that would land outside its folder (or is not a plain file)."""


def _refuse(archive, member: str, why: str) -> UnsafeArchive:
    return UnsafeArchive(f"{archive}: refusing to unpack: member {member!r} {why}",
                         hint="the archive is damaged or malicious; nothing outside the extraction folder was written")


def inside(root: Path, path: Path) -> bool:
    """Whether `path`, with every link on it resolved, lies in `root` (itself resolved)."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip("/") + "/")


def check_name(archive, name: str, *, zip_name: bool = False) -> str:
    """`name` as a clean relative path (trailing `/` and leading `./` dropped), or refused."""
    if "\0" in name:
        raise _refuse(archive, name, "has a NUL byte in its name")
    if zip_name and "\\" in name:
        raise _refuse(archive, name, "has a backslash in its name")
    if name.startswith("/"):
        raise _refuse(archive, name, "has an absolute name")
    parts = name.rstrip("/").split("/")
    while parts and parts[0] == ".":
        parts.pop(0)
    if not parts or "" in parts:
        raise _refuse(archive, name, "has an empty path part (`//`)")
    if ".." in parts:
        raise _refuse(archive, name, "has a `..` part")
    return "/".join(parts)


def _counted(archive, members: Iterable, limit: int | None):
    limit = MAX_MEMBERS if limit is None else limit
    for i, m in enumerate(members, 1):
        if i > limit:
            raise UnsafeArchive(f"{archive}: refusing to unpack: more than {limit} members",
                                hint="a real source tree or wheel has far fewer; the archive is not what it claims")
        yield m


# ---- tar -----------------------------------------------------------------------------------------

def _check_tar_member(archive, m: tarfile.TarInfo, into: Path) -> str:
    name = check_name(archive, m.name)
    if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
        raise _refuse(archive, m.name, "is a device, fifo or other special file")
    dest = into / name
    # nothing is written through a link the archive made before, wherever it leads: what such a link
    # points to differs between Pythons (3.13's data filter rewrites `d/..` to `.` when d is missing),
    # so the refusal must not depend on it
    through = into
    for part in Path(name).parts[:-1]:
        through = through / part
        if through.is_symlink():
            raise _refuse(archive, m.name, f"would be written through the link {through.relative_to(into)}")
    # where it would be written: its folder as it is on the disk now (links extracted before count)
    if not inside(into, dest.parent):
        raise _refuse(archive, m.name, "would be written through a link that leads outside")
    if os.path.lexists(dest) and not inside(into, dest):
        raise _refuse(archive, m.name, "would overwrite a link that leads outside")
    if m.issym() or m.islnk():
        if m.linkname.startswith("/") or "\0" in m.linkname:
            raise _refuse(archive, m.name, f"links to the absolute path {m.linkname!r}")
        # symbolic links resolve from their own folder, hard links from the archive root
        target = (dest.parent if m.issym() else into) / m.linkname
        if not inside(into, target):
            raise _refuse(archive, m.name, f"links to {m.linkname!r}, outside the folder")
    return name


def _plain(m: tarfile.TarInfo) -> tarfile.TarInfo:
    """A copy of the member with no owner and no set-id/sticky bits (what tar's data filter does too);
    folders stay writable by their owner so that their content can be written."""
    m = copy.copy(m)
    m.uid = m.gid = 0
    m.uname = m.gname = ""
    m.mode = (m.mode & 0o777) | (0o700 if m.isdir() else 0)
    return m


def extract_tar(tarball: Path, into: Path, *, max_members: int | None = None,
                progress: Callable[[], None] | None = None) -> None:
    """Unpack every member of `tarball` into the folder `into`, or refuse (see the module doc).

    A malformed tarball raises tarfile.TarError / EOFError, a disk problem OSError: the caller names
    them; a refused member raises UnsafeArchive. On refusal what was written stays inside `into`."""
    into = Path(into)
    into.mkdir(parents=True, exist_ok=True)
    data_filter = getattr(tarfile, "data_filter", None)
    with tarfile.open(tarball) as tf:
        for m in _counted(tarball, tf, max_members):
            name = _check_tar_member(tarball, m, into)
            m = _plain(m)
            if data_filter is not None:
                try:
                    tf.extract(m, into, set_attrs=True, numeric_owner=True, filter="data")
                except tarfile.FilterError as e:
                    raise _refuse(tarball, m.name, f"is refused by tarfile's data filter: {e}") from None
            else:
                tf.extract(m, into, set_attrs=True, numeric_owner=True)
            if not inside(into, into / name):
                # only a race or a gap in the checks above gets here: remove the link and stop
                if os.path.islink(into / name):
                    os.unlink(into / name)
                raise _refuse(tarball, m.name, "resolved outside the folder after extraction")
            if progress:
                progress()


# ---- zip (wheels, .conda containers) ------------------------------------------------------------

def extract_zip(archive: Path | zipfile.ZipFile, into: Path, *,
                select: Callable[[str], str | None] | None = None, max_members: int | None = None,
                on_file: Callable[[zipfile.ZipInfo, Path], None] | None = None) -> list[Path]:
    """Write the file members of a zip (a path or an open ZipFile) under `into`; return what was written.

    `select(name)` picks and places members: it returns the path relative to `into` to write the
    member to, or None to skip it (default: every file at its own name). Both the member's name and
    the chosen path are checked; folders are made as needed and never followed outside `into`.
    Symbolic links stored in a zip are written as plain files (as pip does). `on_file(info, path)` is
    called after each file is written (e.g. to record its hash or mode)."""
    zf = archive if isinstance(archive, zipfile.ZipFile) else zipfile.ZipFile(archive)
    label = getattr(zf, "filename", None) or str(archive)
    into = Path(into)
    into.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        for info in _counted(label, zf.infolist(), max_members):
            name = check_name(label, info.filename, zip_name=True)
            if info.is_dir():
                continue
            rel = select(name) if select else name
            if rel is None:
                continue
            rel = check_name(label, rel) if rel != name else name
            dest = into / rel
            if not inside(into, dest.parent):   # before making folders: none is made through a link
                raise _refuse(label, info.filename, "would be written through a link that leads outside")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not inside(into, dest.parent) or (os.path.lexists(dest) and not inside(into, dest)):
                raise _refuse(label, info.filename, "would be written through a link that leads outside")
            # O_NOFOLLOW: never write through a link that appeared at the destination itself
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with zf.open(info) as src, os.fdopen(fd, "wb") as out:
                while chunk := src.read(8 << 20):
                    out.write(chunk)
            mode = (info.external_attr >> 16) & 0o777
            if mode & 0o111 and not stat.S_ISLNK(info.external_attr >> 16):
                os.chmod(dest, 0o755)
            written.append(dest)
            if on_file:
                on_file(info, dest)
    finally:
        if zf is not archive:
            zf.close()
    return written
