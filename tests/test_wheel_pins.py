"""The one wheel downloader checks pinned sha256s on every use (cached or fresh), and the profiles pin
the official wheels the overlay build starts from."""
from __future__ import annotations

import hashlib
import re
import sys

import pytest

from build_tools import catalog
from build_tools.errors import LmsError
from build_tools.cudahome import HEADER_WHEEL_SHA256, HEADER_WHEELS
from build_tools.wheels import fetch_wheel


def test_a_cached_wheel_that_does_not_match_its_pin_is_deleted_and_refused(tmp_path):
    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    whl.write_bytes(b"not the pinned wheel")
    good = hashlib.sha256(whl.read_bytes()).hexdigest()
    assert fetch_wheel("demo==1.0", python=sys.executable, cache_dir=tmp_path, pins={whl.name: good},
                       progress=lambda m: None) == whl
    with pytest.raises(LmsError, match="does not match its pinned sha256"):
        fetch_wheel("demo==1.0", python=sys.executable, cache_dir=tmp_path, pins={whl.name: "0" * 64},
                    progress=lambda m: None)
    assert not whl.exists()


@pytest.mark.parametrize("tag", ["v2.6.0", "v1.13.1"])
def test_profiles_pin_their_official_cp311_wheel(tag):
    ocfg = catalog.profile(catalog.framework("pytorch"), tag).build("overlay")
    version = ocfg["wheel"].split("==")[1]
    pins = ocfg["wheel_sha256"]
    assert f"torch-{version}-cp311-cp311-manylinux1_x86_64.whl" in pins
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in pins.values())


def test_every_cuda_header_wheel_is_pinned():
    for reqs in HEADER_WHEELS.values():
        for r in reqs:
            name, version = r.split("==")
            assert any(f.startswith(f"{name.replace('-', '_')}-{version}-") for f in HEADER_WHEEL_SHA256), r
