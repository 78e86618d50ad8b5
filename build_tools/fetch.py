"""The one way the build tools download a URL (source tarballs, patches): checked, then cached.

  - https only, unless a sha256 is given: then the content itself is checked and http:// will do;
  - the cache is keyed by the URL and the expected sha256 (two URLs ending in one file name are kept
    apart, and a pinned hash never gets a file fetched without it);
  - a download is written to a temporary file beside its cache entry, checked (byte count against
    Content-Length, sha256 when given), fsync'ed and renamed into place: a partial or wrong download
    is never kept;
  - a cached file with a pinned sha256 is checked again before it is used.
Wheels from the package index go through pip instead (build_tools/wheels.py), which checks
them against the index's hashes; their pins are checked there.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import re
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from .errors import LmsError
from .progress import Counter, info, step

__all__ = ["FetchError", "fetch", "file_sha256", "is_url"]


class FetchError(LmsError):
    """A download that was refused, failed, or does not match its hash."""


def is_url(spec: str) -> bool:
    return bool(re.match(r"^https?://", spec))


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _checked_sha256(sha256: str | None) -> str | None:
    if sha256 is None:
        return None
    s = sha256.strip().lower().removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-f]{64}", s):
        raise FetchError(f"{sha256!r} is not a sha256 (64 hex digits)")
    return s


def cache_path(url: str, cache: Path, sha256: str | None = None) -> Path:
    """Where `url` (expected to hash to `sha256`, if given) is kept in `cache`."""
    name = Path(url.split("?")[0].split("#")[0]).name or "download"
    key = hashlib.sha256(f"{url}\n{sha256 or ''}".encode()).hexdigest()[:16]
    return cache / key / name


def fetch(url: str, cache: Path, *, sha256: str | None = None, timeout: float = 60) -> Path:
    """The file at `url`, downloaded once into `cache` (see the module doc); raises FetchError."""
    sha256 = _checked_sha256(sha256)
    if url.startswith("http://") and not sha256:
        raise FetchError(f"refusing to download {url} over plain http without a sha256 to check it against",
                         hint="use https://, or give its sha256 (make: PATCH_SHA256=..., tools: --patch-sha256)")
    if not url.startswith(("https://", "http://")):
        raise FetchError(f"{url}: only https:// (or http:// with a sha256) URLs are downloaded")
    final = cache_path(url, cache, sha256)
    if final.is_file():
        if sha256 is None or file_sha256(final) == sha256:
            info(f"cached: {final}")
            return final
        info(f"cached {final} does not match sha256 {sha256}: fetching it again")
        final.unlink()
    final.parent.mkdir(parents=True, exist_ok=True)
    step(f"downloading {url}")
    fd, tmp = tempfile.mkstemp(prefix=final.name + ".", suffix=".part", dir=final.parent)
    try:
        h = hashlib.sha256()
        got = 0
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r, os.fdopen(fd, "wb") as out:
                length = r.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
                c = Counter("downloaded", total, unit="B")
                for chunk in iter(lambda: r.read(1 << 20), b""):
                    out.write(chunk)
                    h.update(chunk)
                    got += len(chunk)
                    c.add(len(chunk))
                c.done()
                out.flush()
                os.fsync(out.fileno())
        except (OSError, http.client.HTTPException) as e:
            why = e.reason if isinstance(e, urllib.error.URLError) else e
            raise FetchError(f"could not download {url}: {type(e).__name__}: {why}") from None
        if total is not None and got != total:
            raise FetchError(f"download of {url} ended early: {got} of {total} bytes; nothing was kept",
                             hint="run it again; a proxy or the network cut the transfer")
        if sha256 and h.hexdigest() != sha256:
            raise FetchError(f"{url} does not match its sha256: expected {sha256}, got {h.hexdigest()}; "
                             "nothing was kept", hint="check the URL and the hash you gave")
        os.replace(tmp, final)
        dfd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    info(f"sha256 {h.hexdigest()}  {final}")
    return final
