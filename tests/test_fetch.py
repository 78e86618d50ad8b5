"""build_tools.fetch against a local HTTP server on 127.0.0.1 (it stops by itself after 30 s at most):
a body cut short is refused and not cached, a wrong hash is refused, two URLs with one file name are
cached apart, and plain http needs a sha256."""
from __future__ import annotations

import hashlib
import http.server
import threading

import pytest

from build_tools.errors import LmsError
from build_tools.fetch import fetch

FILES = {"/a/fix.patch": b"patch A\n" * 100, "/b/fix.patch": b"patch B\n" * 50}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/short/big.tar":   # promises 10000 bytes, sends 4000 and closes
            self.send_response(200)
            self.send_header("Content-Length", "10000")
            self.end_headers()
            self.wfile.write(b"x" * 4000)
            self.wfile.flush()
            self.close_connection = True
            return
        body = FILES.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    stop = threading.Timer(30, srv.shutdown)   # bounded even if the test hangs
    stop.daemon = True
    stop.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    stop.cancel()
    srv.shutdown()
    srv.server_close()


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _cached_files(cache):
    return sorted(p for p in cache.rglob("*") if p.is_file()) if cache.exists() else []


def test_truncated_body_refused_and_not_cached(server, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(LmsError, match=r"ended early: 4000 of 10000 bytes"):
        fetch(f"{server}/short/big.tar", cache, sha256=_sha(b"x" * 10000))
    assert _cached_files(cache) == []


def test_wrong_hash_refused_and_not_cached(server, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(LmsError, match="does not match its sha256"):
        fetch(f"{server}/a/fix.patch", cache, sha256=_sha(b"something else"))
    assert _cached_files(cache) == []


def test_two_urls_with_one_file_name_are_cached_apart(server, tmp_path):
    cache = tmp_path / "cache"
    a = fetch(f"{server}/a/fix.patch", cache, sha256=_sha(FILES["/a/fix.patch"]))
    b = fetch(f"{server}/b/fix.patch", cache, sha256=_sha(FILES["/b/fix.patch"]))
    assert a != b and a.name == b.name == "fix.patch"
    assert a.read_bytes() == FILES["/a/fix.patch"] and b.read_bytes() == FILES["/b/fix.patch"]
    # a second fetch is served from the cache, checked again
    assert fetch(f"{server}/a/fix.patch", cache, sha256=_sha(FILES["/a/fix.patch"])) == a
    assert len(_cached_files(cache)) == 2


def test_plain_http_needs_a_sha256(server, tmp_path):
    with pytest.raises(LmsError, match="plain http without a sha256"):
        fetch(f"{server}/a/fix.patch", tmp_path / "cache")
    with pytest.raises(LmsError, match="not a sha256"):
        fetch(f"{server}/a/fix.patch", tmp_path / "cache", sha256="abc")


def test_user_patch_url_with_patch_sha256(server, tmp_path, monkeypatch):
    """`make build PATCH=http://... PATCH_SHA256=...` reaches the fetcher with the hash."""
    from build_tools.patch_ops import user_patch
    monkeypatch.setenv("LMS_CACHE_DIR", str(tmp_path / "c"))
    body = b"diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"
    FILES["/p/plain.diff"] = body
    try:
        with pytest.raises(LmsError, match="plain http"):
            user_patch.resolve(f"{server}/p/plain.diff")
        out = user_patch.resolve(f"{server}/p/plain.diff", _sha(body))
        assert out.read_text().startswith("From 0000000")
    finally:
        del FILES["/p/plain.diff"]
