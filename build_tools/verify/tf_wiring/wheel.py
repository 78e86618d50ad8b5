"""The official ``tensorflow`` GPU wheel of the release (the profile's): headers, CUDA headers and exported symbols.

The wiring check compiles the patch's C++ files against what the wheel ships under
``tensorflow/include/`` (TensorFlow's own headers, its generated ``*.pb.h``, absl, Eigen,
protobuf 3.21.9, pybind11, Python and numpy headers, and the CUDA 11.8 headers the wheel was
built with under ``third_party/gpus/cuda/include``), then resolves the objects' undefined
symbols against the dynamic symbol tables of the wheel's libraries.

Invariant: everything is derived from the one wheel file in the cache; a folder is only used
when its ``.complete`` marker names that wheel, so an interrupted extraction is redone.  The
large libraries are not kept: only their defined dynamic symbols, as text.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ...archives import extract_zip
from ...errors import LmsError
from ...wheels import check_pin, fetch_wheel
from ..tf_release import REPO, log_to, tf_profile, wheel_pythons

__all__ = ["DEFAULT_CACHE", "WHEEL_LIBS", "cuda_version", "ensure", "log", "uses_cxx11_abi", "wheel_file",
           "wheel_pins", "wheel_symbols"]

# A release's wheels for its CPythons have identical headers and libraries; the newest Python's is used
# whatever Python runs the check (its Python.h is the one pybind needs).
DEFAULT_CACHE = REPO / ".cache" / "tf_wiring"

# The libraries whose exported symbols a patched object may use: the framework (tsl, core
# framework, CUDA driver stubs), the rest of TensorFlow's C++ runtime (GPU runtime, eager), and
# the Python extension library every _pywrap_* module links.
WHEEL_LIBS = [
    "tensorflow/libtensorflow_framework.so.2",
    "tensorflow/libtensorflow_cc.so.2",
    "tensorflow/python/_pywrap_tensorflow_internal.so",
]


log = log_to("tf_wiring")


def wheel_pins(tag: str | None = None) -> dict[str, str]:
    """{official wheel file name: sha256} of patches/tensorflow/<tag>/profile.toml."""
    return tf_profile(tag).wheel_sha256


def wheel_file(cache: Path, tag: str | None = None) -> Path:
    """The GPU wheel (~490 MB) in ``cache``, downloaded once with pip and checked against the
    profile's pinned sha256 on every call (the tools' one wheel downloader)."""
    prof = tf_profile(tag)
    return fetch_wheel(f"tensorflow=={prof.version}", python_version=wheel_pythons(prof)[-1], cache_dir=cache,
                       pins=prof.wheel_sha256, progress=log)


def _dynamic_symbols(lib: Path) -> list[str]:
    """Defined dynamic symbols of ``lib`` (version suffixes dropped)."""
    r = subprocess.run(["nm", "-D", "--defined-only", str(lib)], stdout=subprocess.PIPE,
                       text=True, check=True)
    return sorted({line.split()[-1].split("@")[0] for line in r.stdout.splitlines()
                   if len(line.split()) >= 3})


def ensure(cache: Path = DEFAULT_CACHE, wheel: Path | None = None, tag: str | None = None) -> Path:
    """Folder with the wheel's ``tensorflow/include`` and ``symbols/<lib>.txt``; made once. A wheel the
    caller names is checked against the profile's pins as a downloaded one is."""
    if wheel:
        check_pin(wheel, wheel_pins(tag), discard=False, progress=log)
    else:
        wheel = wheel_file(cache, tag)
    out = cache / f"gpu-wheel-{tf_profile(tag).version}"
    marker = out / ".complete"
    if marker.exists() and marker.read_text().strip() == wheel.name:
        return out
    if out.exists():
        shutil.rmtree(out)
    log(f"extracting headers and symbol tables from {wheel.name}")
    extract_zip(wheel, out, select=lambda n: n if n.startswith("tensorflow/include/") or n in WHEEL_LIBS else None)
    (out / "symbols").mkdir()
    for rel in WHEEL_LIBS:
        lib = out / rel
        (out / "symbols" / (lib.name + ".txt")).write_text("\n".join(_dynamic_symbols(lib)) + "\n")
        lib.unlink()  # 1 GB for libtensorflow_cc.so.2: only its symbol table is needed
    marker.write_text(wheel.name + "\n")
    return out


def wheel_symbols(wheel_dir: Path) -> dict[str, set[str]]:
    """{library name: its defined dynamic symbols}."""
    return {p.name[:-4]: set(p.read_text().split()) for p in sorted((wheel_dir / "symbols").glob("*.txt"))}


def uses_cxx11_abi(wheel_dir: Path) -> bool:
    """Whether the wheel was built with libstdc++'s new ABI (its std::string symbols say so)."""
    syms = (wheel_dir / "symbols" / "libtensorflow_framework.so.2.txt").read_text()
    return "B5cxx11" in syms or "__cxx11" in syms


def cuda_version(include: Path) -> int:
    """CUDA_VERSION of the CUDA headers under ``include`` (cuda.h), e.g. 11080."""
    for line in (include / "cuda.h").read_text(errors="replace").splitlines():
        if line.startswith("#define CUDA_VERSION "):
            return int(line.split()[2])
    raise LmsError(f"no CUDA_VERSION in {include / 'cuda.h'}")
