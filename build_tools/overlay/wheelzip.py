"""Rewriting a (large) wheel: replace/add/delete members, rename the .dist-info folder, rewrite RECORD.

Unchanged members are copied as raw compressed bytes (no inflate/deflate of the 2+ GB inside a torch
wheel), so repacking takes seconds. RECORD lines of unchanged members are kept from the official
RECORD; replaced, added and transformed members get a fresh sha256 and size.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import struct
import zipfile
from pathlib import Path
from typing import Callable

from ..errors import LmsError

# Fixed timestamp for members we write, so the same inputs give the same wheel bytes.
FIXED_DATE = (2026, 11, 22, 0, 0, 0)


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _raw_member(src: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    fp = src.fp
    fp.seek(info.header_offset)
    hdr = fp.read(30)
    if hdr[:4] != b"PK\x03\x04":
        raise LmsError(f"{src.filename}: bad local header for {info.filename}")
    nlen, xlen = struct.unpack("<HH", hdr[26:30])
    fp.seek(info.header_offset + 30 + nlen + xlen)
    return fp.read(info.compress_size)


def _copy_raw(src: zipfile.ZipFile, info: zipfile.ZipInfo, dst: zipfile.ZipFile, new_name: str) -> None:
    data = _raw_member(src, info)
    zi = zipfile.ZipInfo(new_name, date_time=info.date_time)
    zi.compress_type = info.compress_type
    zi.external_attr = info.external_attr
    zi.create_system = info.create_system
    zi.CRC = info.CRC
    zi.compress_size = info.compress_size
    zi.file_size = info.file_size
    zi.flag_bits = info.flag_bits & ~0x08  # sizes are known: no data descriptor
    zi.header_offset = dst.fp.tell()
    zip64 = zi.file_size > zipfile.ZIP64_LIMIT or zi.compress_size > zipfile.ZIP64_LIMIT
    dst.fp.write(zi.FileHeader(zip64))
    dst.fp.write(data)
    dst.filelist.append(zi)
    dst.NameToInfo[zi.filename] = zi
    dst.start_dir = dst.fp.tell()
    dst._didModify = True


def _write(dst: zipfile.ZipFile, name: str, data: bytes, mode: int) -> None:
    zi = zipfile.ZipInfo(name, date_time=FIXED_DATE)
    zi.compress_type = zipfile.ZIP_DEFLATED
    zi.external_attr = (0o100000 | mode) << 16
    zi.create_system = 3
    dst.writestr(zi, data, compresslevel=6)


def rewrite_wheel(src: Path, dst: Path, *, old_dist_info: str, new_dist_info: str,
                  replace: dict[str, bytes] | None = None,
                  delete: set[str] | None = None,
                  transform: dict[str, Callable[[bytes], bytes]] | None = None) -> dict:
    """Write `dst` from `src` with the given changes; returns {"replaced": [...], "added": [...], ...}.

    replace: member -> new bytes (added when the member does not exist).
    delete: members to drop.
    transform: member -> function(old bytes) -> new bytes (member must exist).
    Names are given with the OLD dist-info folder; it is renamed to `new_dist_info` everywhere.
    """
    replace = dict(replace or {})
    delete = set(delete or ())
    transform = dict(transform or {})
    record_name = f"{old_dist_info}/RECORD"

    def rename(n: str) -> str:
        return new_dist_info + n[len(old_dist_info):] if n.startswith(old_dist_info + "/") else n

    with zipfile.ZipFile(src) as zin:
        infos = zin.infolist()
        names = {i.filename for i in infos}
        missing = [n for n in list(transform) + sorted(delete) if n not in names]
        if missing:
            raise LmsError(f"{src.name} has no member(s) {', '.join(missing)}")
        old_record = {row[0]: row for row in csv.reader(io.StringIO(zin.read(record_name).decode())) if row}
        new_record: list[list[str]] = []
        done = {"replaced": [], "added": [], "deleted": sorted(delete), "transformed": []}
        with zipfile.ZipFile(dst, "w", allowZip64=True) as zout:
            for info in infos:
                n = info.filename
                if n == record_name or n in delete:
                    continue
                nn = rename(n)
                if n in replace or n in transform:
                    data = replace.pop(n) if n in replace else transform[n](zin.read(n))
                    mode = (info.external_attr >> 16) & 0o777 or 0o644
                    _write(zout, nn, data, mode)
                    new_record.append([nn, record_hash(data), str(len(data))])
                    done["replaced" if n not in transform else "transformed"].append(n)
                else:
                    _copy_raw(zin, info, zout, nn)
                    if info.is_dir():
                        continue
                    row = old_record.get(n)
                    if row is None or not row[1]:
                        raise LmsError(f"{src.name}: {n} has no hash in RECORD")
                    new_record.append([nn, row[1], row[2]])
            for n in sorted(replace):  # members that did not exist: added
                nn = rename(n)
                data = replace[n]
                mode = 0o755 if n.endswith(".so") else 0o644
                _write(zout, nn, data, mode)
                new_record.append([nn, record_hash(data), str(len(data))])
                done["added"].append(n)
            new_record.append([rename(record_name), "", ""])
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(new_record)
            _write(zout, rename(record_name), buf.getvalue().encode(), 0o644)
    return done


def verify_record(wheel: Path, *, progress: Callable[[str], None] | None = None) -> int:
    """Check every member's sha256 and size against RECORD (and that RECORD lists every member).
    Returns the number of members checked; raises LmsError on the first mismatch."""
    with zipfile.ZipFile(wheel) as zf:
        rec_names = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
        if len(rec_names) != 1:
            raise LmsError(f"{wheel.name}: expected one RECORD, found {rec_names}")
        rows = {r[0]: r for r in csv.reader(io.StringIO(zf.read(rec_names[0]).decode())) if r}
        members = [i for i in zf.infolist() if not i.is_dir()]
        unlisted = [i.filename for i in members if i.filename not in rows]
        if unlisted:
            raise LmsError(f"{wheel.name}: members missing from RECORD: {unlisted[:5]}")
        extra = [n for n in rows if n not in {i.filename for i in members}]
        if extra:
            raise LmsError(f"{wheel.name}: RECORD lists missing members: {extra[:5]}")
        n = 0
        for info in members:
            row = rows[info.filename]
            if info.filename == rec_names[0]:
                continue
            h = hashlib.sha256()
            size = 0
            with zf.open(info) as fh:
                while chunk := fh.read(8 << 20):
                    h.update(chunk)
                    size += len(chunk)
            got = "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
            if got != row[1] or str(size) != row[2]:
                raise LmsError(f"{wheel.name}: {info.filename} does not match RECORD "
                               f"({got} {size} vs {row[1]} {row[2]})")
            n += 1
    return n
