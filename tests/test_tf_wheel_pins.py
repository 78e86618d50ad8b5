"""The official TensorFlow wheels the TensorFlow tools use (tensorflow-cpu for the allocator build and the
stock-TF venv, tensorflow for the wiring check) are pinned in patches/tensorflow/v2.14.1/profile.toml
and checked by the one wheel downloader (build_tools/wheels.py) on every use: the real wheel
passes; a truncated or altered copy of it is refused with the file and both hashes named, and is not
kept in the cache; a download that does not match its pin never reaches the cache.

The real wheels are taken from $LMS_TF_WHEEL_CACHE / $LMS_TF_WIRING_CACHE (default: the tools' own
caches, .cache/tf_allocator and .cache/tf_wiring), downloaded there once when missing.
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from build_tools import catalog
from build_tools.verify import tf_allocator as tfa
from build_tools.errors import LmsError
from build_tools.wheels import fetch_wheel
from build_tools.verify.tf_wiring import wheel as twc

TF_CACHE = Path(os.environ.get("LMS_TF_WHEEL_CACHE", tfa.DEFAULT_CACHE))
WIRING_CACHE = Path(os.environ.get("LMS_TF_WIRING_CACHE", twc.DEFAULT_CACHE))
CPU_WHEEL = "tensorflow_cpu-2.14.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
GPU_WHEEL = "tensorflow-2.14.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"


def quiet(msg: str) -> None:
    pass


@pytest.fixture(scope="module")
def cpu_wheel() -> Path:
    """The real tensorflow-cpu 2.14.1 cp311 wheel, through the tools' own (verifying) path."""
    return tfa.wheel_file(TF_CACHE, "3.11")


def test_the_profile_pins_both_official_cp311_wheels():
    pins = catalog.profile(catalog.framework("tensorflow"), "v2.14.1").wheel_sha256
    assert {CPU_WHEEL, GPU_WHEEL} <= set(pins)
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in pins.values())
    assert tfa.wheel_pins() == twc.wheel_pins() == pins


def test_every_python_the_profile_allows_has_both_wheels_pinned():
    """A build on any Python of the profile's range starts from pinned wheels, not from the
    warning for an unlisted one."""
    from build_tools.verify.tf_release import wheel_pythons
    prof = catalog.profile(catalog.framework("tensorflow"), "v2.14.1")
    pythons = wheel_pythons(prof)
    assert pythons == ("3.9", "3.10", "3.11"), pythons
    for py in pythons:
        tag = "cp" + py.replace(".", "")
        for name in ("tensorflow_cpu", "tensorflow"):
            wheel = f"{name}-2.14.1-{tag}-{tag}-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
            assert wheel in prof.wheel_sha256, wheel


def test_the_real_cpu_wheel_matches_its_pin(cpu_wheel):
    assert cpu_wheel.name == CPU_WHEEL
    assert hashlib.sha256(cpu_wheel.read_bytes()).hexdigest() == tfa.wheel_pins()[CPU_WHEEL]
    # a second use (cached) is checked again and passes
    assert tfa.wheel_file(TF_CACHE, "3.11") == cpu_wheel


def _refused_and_gone(cache: Path, bad: Path, want: str, call) -> None:
    got = hashlib.sha256(bad.read_bytes()).hexdigest()
    with pytest.raises(LmsError) as e:
        call()
    msg = str(e.value)
    assert bad.name in msg and want in msg and got in msg, msg
    assert not bad.exists(), "a mismatching wheel stayed in the cache"
    assert not list(cache.glob("*.whl")) and not list(cache.glob(".download-*"))


def test_a_truncated_cpu_wheel_in_the_cache_is_refused_and_deleted(cpu_wheel, tmp_path):
    bad = tmp_path / CPU_WHEEL
    with cpu_wheel.open("rb") as f:
        bad.write_bytes(f.read(cpu_wheel.stat().st_size // 3))
    _refused_and_gone(tmp_path, bad, tfa.wheel_pins()[CPU_WHEEL], lambda: tfa.wheel_file(tmp_path, "3.11"))
    assert not (tmp_path / "wheel-2.14.1").exists()


def test_an_altered_cpu_wheel_of_full_size_is_refused_and_deleted(cpu_wheel, tmp_path):
    bad = tmp_path / CPU_WHEEL
    shutil.copyfile(cpu_wheel, bad)
    with bad.open("r+b") as f:  # one byte in the middle: same size, same name, another file
        f.seek(bad.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    # ensure_wheel (the allocator build's entry) goes through the same check before extracting
    _refused_and_gone(tmp_path, bad, tfa.wheel_pins()[CPU_WHEEL], lambda: tfa.ensure_wheel(tmp_path))
    assert not (tmp_path / "wheel-2.14.1").exists()


def test_a_truncated_gpu_wheel_in_the_wiring_cache_is_refused_and_deleted(tmp_path):
    """The wiring check's GPU wheel is checked by the same code (a truncated copy of the real one when
    it is cached here, else of the cpu wheel under the GPU wheel's name: the pin refuses either)."""
    real = WIRING_CACHE / GPU_WHEEL
    src = real if real.is_file() else tfa.wheel_file(TF_CACHE, "3.11")
    bad = tmp_path / GPU_WHEEL
    with src.open("rb") as f:
        bad.write_bytes(f.read(1 << 20))
    _refused_and_gone(tmp_path, bad, twc.wheel_pins()[GPU_WHEEL], lambda: twc.wheel_file(tmp_path))


def test_a_wheel_named_by_the_caller_is_checked_and_left_alone(cpu_wheel, tmp_path):
    """--wheel of the allocator build / the wiring check: a mismatch is refused, the user's file kept."""
    mine = tmp_path / "mine" / CPU_WHEEL
    mine.parent.mkdir()
    with cpu_wheel.open("rb") as f:
        mine.write_bytes(f.read(1 << 20))
    cache = tmp_path / "cache"
    with pytest.raises(LmsError, match=r"does not match its pinned sha256.*it was not used"):
        tfa.ensure_wheel(cache, mine)
    assert mine.is_file() and not (cache / "wheel-2.14.1").exists()
    gpu = mine.with_name(GPU_WHEEL)
    mine.rename(gpu)
    with pytest.raises(LmsError, match=re.escape(twc.wheel_pins()[GPU_WHEEL])):
        twc.ensure(cache, gpu)
    assert gpu.is_file() and not (cache / "gpu-wheel-2.14.1").exists()


def _demo_wheel(folder: Path, body: bytes) -> Path:
    """A minimal valid wheel demo-1.0 that pip can download from a local folder."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "demo-1.0-py3-none-any.whl"
    files = {"demo.py": body,
             "demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
             "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                         b"Tag: py3-none-any\n"}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},"
                     f"{len(d)}\n" for n, d in files.items()) + "demo-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr("demo-1.0.dist-info/RECORD", record)
    return path


def test_a_download_that_does_not_match_its_pin_never_reaches_the_cache(tmp_path, monkeypatch):
    """Real pip, from a local index folder: the wheel is staged inside the cache, checked, and only then
    renamed into it; a mismatch leaves neither the wheel nor the staging folder behind."""
    index = tmp_path / "index"
    served = _demo_wheel(index, b"x = 1\n")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    cache = tmp_path / "cache"
    with pytest.raises(LmsError, match=r"does not match its pinned sha256 \(expected 0{64}, got [0-9a-f]{64}\)"):
        fetch_wheel("demo==1.0", python=sys.executable, cache_dir=cache, pins={served.name: "0" * 64},
                    progress=quiet)
    assert list(cache.iterdir()) == []
    good = hashlib.sha256(served.read_bytes()).hexdigest()
    got = fetch_wheel("demo==1.0", python=sys.executable, cache_dir=cache, pins={served.name: good},
                      progress=quiet)
    assert got == cache / served.name and [p.name for p in cache.iterdir()] == [served.name]
