"""The lms-swap wheel (activation swapping, lms-swap/) with its eviction net (and, where that torch
allows, the pluggable allocator) compiled for the torch of a given interpreter, and its conda package.

The wheel is built from a copy of lms-swap/ (nothing is written into the checkout) with
`python -m pip wheel --no-build-isolation`, run by the interpreter whose torch the net is compiled
against: the net is a C++ extension, so the wheel is made for that torch alone (version
0.1.0+torch2.11.0.cu130, `torch==2.11.0`; see lms-swap/setup.py). Without the net (`net=False`) it is
the pure-Python wheel, which compiles the net at first use.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .catalog import REPO_ROOT
from .errors import LmsError
from .tools import find_tool

PACKAGE = REPO_ROOT / "lms-swap"
WORK = REPO_ROOT / "build" / "lms-swap"
RECORD = "lms_swap/_net_build.json"


@dataclasses.dataclass
class SwapWheel:
    path: Path            # the wheel in dist/
    version: str          # 0.1.0+torch2.11.0.cu130, or 0.1.0 (pure Python)
    record: dict | None   # the torch the net was compiled against (None: no net inside)


def _publish(src: Path, dst: Path) -> None:
    """`dst` whole or not at all. (Imports nothing of the overlay build, whose GitPython a GPU
    machine running this lacks.)"""
    dst.parent.mkdir(parents=True, exist_ok=True)
    part = dst.with_name(f".{dst.name}.partial")
    try:
        shutil.copyfile(src, part)
        os.replace(part, dst)
    finally:
        part.unlink(missing_ok=True)


def _env(net: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["LMS_SWAP_BUILD_NET"] = "1" if net else "0"
    ninja = find_tool("ninja")  # the virtualenv's (make setup), where the building python has none
    if ninja:
        env["PATH"] = os.pathsep.join([str(Path(ninja).parent), env.get("PATH", "/usr/bin:/bin")])
    return env


def _copy_core(work: Path) -> None:
    """The LMS core's files from patches/ into `work` at their paths in this repository, so that the
    copy of lms-swap/ in it lies in a checkout as setup.py looks for one, and stages the core into the
    wheel (lms_swap/allocator_core/) for the pluggable allocator: the copy alone would build a wheel
    whose allocator cannot be compiled. The list is lms-swap's own (allocator_sources.CORE_FILES),
    read from its file: that module imports nothing."""
    spec = importlib.util.spec_from_file_location(
        "_lms_swap_wheel_allocator_sources", PACKAGE / "src" / "lms_swap" / "allocator_sources.py")
    sources = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sources)
    for source in sources.CORE_FILES.values():
        dst = work / source
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_ROOT / source, dst)


def read_wheel(wheel: Path) -> SwapWheel:
    """The version and net record of an lms-swap wheel; refuses one whose parts disagree."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        di = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        version = re.search(r"^Version: (.+)$", zf.read(f"{di}/METADATA").decode(), re.M).group(1).strip()
        record = json.loads(zf.read(RECORD)) if RECORD in names else None
    nets = [n for n in names if re.fullmatch(r"lms_swap/_lms_swap_guard\..*so", n)]
    if (record is None) != (not nets) or ((record is None) != ("+" not in version)):
        raise LmsError(f"{wheel.name}: the net ({nets or 'none'}), its record ({RECORD if record else 'none'}) "
                       f"and the version {version} disagree")
    allocators = [n for n in names if re.fullmatch(r"lms_swap/_lms_pluggable_allocator\..*so", n)]
    if bool(allocators) != bool((record or {}).get("allocator")):
        raise LmsError(f"{wheel.name}: the compiled pluggable allocator ({allocators or 'none'}) and the "
                       f"record's allocator ({(record or {}).get('allocator')}) disagree")
    return SwapWheel(Path(wheel), version, record)


def build(python: str = sys.executable, dist: Path = REPO_ROOT / "dist", *, net: bool = True,
          progress=print) -> SwapWheel:
    """Build the lms-swap wheel for `python`'s torch into `dist` (see the module doc)."""
    probe = subprocess.run([python, "-c", "import torch, setuptools; print(torch.__version__)"],
                           capture_output=True, text=True)
    if net and probe.returncode != 0:
        raise LmsError(f"{python} cannot import torch and setuptools: {probe.stderr.strip()[-500:]}",
                       hint="name the interpreter of the torch to build for (--python / TORCH_PYTHON=)")
    WORK.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="wheel-", dir=WORK))
    try:
        src = work / "lms-swap"
        shutil.copytree(PACKAGE, src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info",
                                                                    "build", "_net_build.json", "*.so"))
        _copy_core(work)
        what = f"with its eviction net compiled for torch {probe.stdout.strip()}" if net else "pure Python"
        progress(f"building the lms-swap wheel ({what}) with {python} ...")
        r = subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            str(src), "-w", str(work / "out")], env=_env(net), cwd=work,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            said = [ln.strip() for ln in r.stdout.splitlines() if "cannot compile the eviction net" in ln]
            raise LmsError(said[0] if said else f"building the lms-swap wheel failed:\n{r.stdout[-4000:]}")
        [wheel] = (work / "out").glob("lms_swap-*.whl")
        built = read_wheel(wheel)
        if net != (built.record is not None):
            raise LmsError(f"{wheel.name}: asked for {'a' if net else 'no'} net, the wheel has "
                           f"{'one' if built.record else 'none'}")
        if built.record and built.record.get("allocator"):
            progress("lms-swap wheel: the pluggable allocator is compiled in too")
        elif built.record:
            progress(f"lms-swap wheel: the pluggable allocator is not compiled in "
                     f"({built.record.get('allocator_absent')}); it compiles at first use")
        final = Path(dist).resolve() / wheel.name
        _publish(wheel, final)
        progress(f"lms-swap wheel: {final}")
        return dataclasses.replace(built, path=final)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def to_conda(wheel: Path, channel: Path, progress=print):
    """The conda package of an lms-swap wheel in `channel` (indexed), made by the packager of the
    patched PyTorch wheel. Its build string names the torch the net was compiled for."""
    from .packagers import conda
    built = read_wheel(wheel)
    rec = built.record
    py = re.search(r"-cp(\d)(\d+)-", Path(wheel).name)
    py = f"{py.group(1)}.{py.group(2)}" if py else "%d.%d" % sys.version_info[:2]
    variant = f"py{py.replace('.', '')}"  # pure Python: any torch >= 2.4
    if rec:
        flavour = "cu" + rec["torch_cuda"].replace(".", "") if rec["torch_cuda"] else "cpu"
        variant = f"torch{rec['torch'].split('+')[0].replace('.', '')}_{flavour}_py{py.replace('.', '')}"
    pkg = conda.wheel_to_conda(
        Path(wheel), Path(channel), name="lms-swap", python_version=py, variant=variant,
        cuda=(rec or {}).get("torch_cuda"), license="Apache-2.0", run_exports={},
        about={"license": "Apache-2.0",
               "summary": "LMS activation swapping for stock PyTorch"
                          + (f" (eviction net compiled for torch {rec['torch']})" if rec else ""),
               "extra": {"wheel": Path(wheel).name, "wheel_version": built.version,
                         "net_build": rec}},
        progress=progress)
    conda.index_channel(Path(channel))
    return pkg
