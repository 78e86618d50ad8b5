"""A `.conda` package made directly from a built wheel, a local channel, and a py-rattler install.

Neither conda nor conda-build can be installed here (not on PyPI or Debian), so the tested
"conda install" path is:

  wheel_to_conda()   wheel -> <subdir>/<name>-<version>-<build>.conda with conda-package-handling:
                     site-packages files (+ console scripts in bin/ with the conda prefix placeholder),
                     info/index.json, paths.json, files, has_prefix, about.json, run_exports.json,
                     info/recipe/wheel.json (provenance);
  index_channel()    repodata.json for the channel with py-rattler's indexer (rattler.index.index_fs);
  install()          py-rattler: the channel is read through rattler's Gateway, the record of our
                     package is taken from it, and rattler.install() links it into a fresh prefix.

Dependencies: `depends` is what a conda user expects on conda-forge (python + python_abi, __glibc
for the wheel's manylinux level, the CUDA 12 runtime libraries under their conda-forge names,
cuda-version, and the Python deps of the wheel). No conda channel is reachable from here, so
`solve()` with only the local channel cannot satisfy them; it is run to show the exact unsatisfied
specs (`solve_report`), and `install()` links the package with `no_deps=True` (only our record).
Importing then uses the host Python with the prefix's site-packages on sys.path, and the CUDA
libraries of the pip nvidia-* packages (see tests/test_conda_package.py). In a real conda env the
CUDA libraries come from conda-forge into $PREFIX/lib and conda-forge's python (DT_RPATH
$ORIGIN/../lib) lets torch's libraries find them there.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

from .. import LMS_VERSION
from ..archives import extract_zip
from ..errors import LmsError

PREFIX_PLACEHOLDER = "/opt/anaconda1anaconda2anaconda3"

# pip distribution -> conda-forge package. nvidia-* runtime wheels keep ABI within a major version,
# so they map to ">=pinned,<next major"; everything else keeps the wheel's own constraint.
CONDA_NAMES = {
    "nvidia-cuda-nvrtc-cu12": "cuda-nvrtc", "nvidia-cuda-runtime-cu12": "cuda-cudart",
    "nvidia-cuda-cupti-cu12": "cuda-cupti", "nvidia-cudnn-cu12": "cudnn",
    "nvidia-cublas-cu12": "libcublas", "nvidia-cufft-cu12": "libcufft",
    "nvidia-curand-cu12": "libcurand", "nvidia-cusolver-cu12": "libcusolver",
    "nvidia-cusparse-cu12": "libcusparse", "nvidia-cusparselt-cu12": "libcusparselt",
    "nvidia-nccl-cu12": "nccl", "torch": "pytorch", "nvidia-nvtx-cu12": "cuda-nvtx", "nvidia-nvjitlink-cu12": "libnvjitlink",
    "typing-extensions": "typing_extensions", "opt-einsum": "opt_einsum",
}


class CondaPackError(LmsError):
    pass


@dataclasses.dataclass
class CondaPackage:
    path: Path
    name: str
    version: str
    build: str
    subdir: str
    index: dict
    seconds: float


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _next_major(v: str) -> str:
    return f"{int(v.split('.')[0]) + 1}.0a0"


def conda_depends(requires_dist: list[str], python_version: str) -> list[str]:
    """Wheel Requires-Dist (for Linux x86_64 and `python_version`, no extras) -> conda depends."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    env = {**default_environment(), "python_version": python_version, "python_full_version": python_version + ".0",
           "platform_system": "Linux", "platform_machine": "x86_64", "sys_platform": "linux", "extra": ""}
    out = []
    for line in requires_dist:
        r = Requirement(line)
        if r.marker is not None and not r.marker.evaluate(env):
            continue
        name = CONDA_NAMES.get(r.name.lower(), r.name.lower())
        specs = list(r.specifier)
        if r.name.lower().startswith("nvidia-") and len(specs) == 1 and specs[0].operator == "==":
            v = specs[0].version
            out.append(f"{name} >={v},<{_next_major(v)}")
        elif specs:
            out.append(f"{name} " + ",".join(
                (s.version if s.operator == "==" else f"{s.operator}{s.version}") for s in specs))
        else:
            out.append(name)
    return out


def _wheel_meta(zf: zipfile.ZipFile) -> tuple[str, str, str, list[str], str | None]:
    di = next(n.split("/")[0] for n in zf.namelist() if n.split("/")[0].endswith(".dist-info"))
    meta = zf.read(f"{di}/METADATA").decode()
    name = re.search(r"^Name: (.+)$", meta, re.M).group(1).strip()
    version = re.search(r"^Version: (.+)$", meta, re.M).group(1).strip()
    reqs = re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
    ep = zf.read(f"{di}/entry_points.txt").decode() if f"{di}/entry_points.txt" in zf.namelist() else None
    return di, name, version, reqs, ep


def _console_scripts(ep_text: str | None) -> dict[str, str]:
    out, section = {}, None
    for line in (ep_text or "").splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]").strip()
        elif section == "console_scripts" and "=" in line:
            k, v = (x.strip() for x in line.split("=", 1))
            out[k] = v
    return out


def wheel_to_conda(wheel: Path, out_dir: Path, *, name: str = "pytorch", python_version: str | None = None,
                   subdir: str = "linux-64", build_number: int = 0, glibc: str | None = None,
                   cuda: str | None = None, compression_level: int = 3, variant: str | None = None,
                   license: str = "BSD-3-Clause", about: dict | None = None, run_exports: dict | None = None,
                   progress=print) -> CondaPackage:
    """Make `<out_dir>/<subdir>/<name>-<version>-<build>.conda` from `wheel` (see module doc).

    The conda version is the wheel's public version (2.6.0); the local part (+lms1) goes into the
    build string (lms1_cuda124_py311_0), the conda convention for variants of one version.
    glibc: minimum glibc from the wheel's manylinux tag (-> depends "__glibc >=X").
    python_version: default: the wheel's own CPython tag (cp310 -> 3.10), else this Python's.
    variant: the build string before its number, where the default above does not fit (another
    package than PyTorch); license, about (about.json) and run_exports: the package's own, where it
    is not the patched PyTorch (whose are the defaults).
    """
    from conda_package_handling import api as cph

    t0 = time.monotonic()
    wheel = Path(wheel)
    m = re.search(r"manylinux_(\d+)_(\d+)_", wheel.name)
    if glibc is None and m:
        glibc = f"{m.group(1)}.{m.group(2)}"
    if python_version is None:
        tag = re.search(r"-cp(\d)(\d+)-", wheel.name)
        python_version = f"{tag.group(1)}.{tag.group(2)}" if tag else "%d.%d" % sys.version_info[:2]
    py_nodot = python_version.replace(".", "")
    with zipfile.ZipFile(wheel) as zf:
        di, dist_name, wversion, reqs, ep = _wheel_meta(zf)
        public, _, local = wversion.partition("+")
        if cuda is None and "torch/version.py" in zf.namelist():
            mm = re.search(r"^cuda\s*(?::[^=]*)?=\s*'([0-9.]+)'", zf.read("torch/version.py").decode(), re.M)
            cuda = mm.group(1) if mm else None
        variant = variant or "_".join(x for x in (local.replace(".", "_") if local else "",
                                                  f"cuda{cuda.replace('.', '')}" if cuda else "cpu",
                                                  f"py{py_nodot}") if x)
        build = f"{variant}_{build_number}"
        depends = [f"python >={python_version},<{python_version.split('.')[0]}.{int(python_version.split('.')[1]) + 1}.0a0",
                   f"python_abi {python_version}.* *_cp{py_nodot}"]
        if glibc:
            depends.append(f"__glibc >={glibc}")
        if cuda:
            depends.append(f"cuda-version >={cuda},<{_next_major(cuda)}")
        depends += conda_depends(reqs, python_version)
        index = {
            "name": name, "version": public, "build": build, "build_number": build_number,
            "depends": sorted(set(depends)), "constrains": [], "license": license,
            "license_family": license.split("-")[0], "platform": subdir.split("-")[0], "arch": "x86_64" if subdir.endswith("64") else subdir.split("-")[1],
            "subdir": subdir, "timestamp": int(wheel.stat().st_mtime * 1000),
        }
        sp = f"lib/python{python_version}/site-packages"
        stage = Path(tempfile.mkdtemp(prefix="lms-conda-", dir=out_dir if out_dir.exists() else None))
        try:
            paths, files = [], []
            progress(f"  unpacking {wheel.name} into a conda staging prefix ...")
            def staged(info: zipfile.ZipInfo, dest: Path) -> None:
                if ".data/" in info.filename.split("/", 1)[0] + "/":
                    raise CondaPackError(f"{wheel.name}: .data/ members ({info.filename}) are not supported")
                h = hashlib.sha256()
                with dest.open("rb") as f:
                    while chunk := f.read(8 << 20):
                        h.update(chunk)
                paths.append({"_path": dest.relative_to(stage).as_posix(), "path_type": "hardlink",
                              "sha256": h.hexdigest(), "size_in_bytes": dest.stat().st_size})

            # every member under site-packages/, names checked (build_tools.archives)
            extract_zip(zf, stage, select=lambda n: f"{sp}/{n}", on_file=staged)
            installer = f"{sp}/{di}/INSTALLER"
            (stage / installer).write_text("conda\n")
            data = b"conda\n"
            paths.append({"_path": installer, "path_type": "hardlink", "sha256": _sha256(data), "size_in_bytes": len(data)})
            has_prefix = []
            for script, target in sorted(_console_scripts(ep).items()):
                mod, _, func = target.partition(":")
                text = (f"#!{PREFIX_PLACEHOLDER}/bin/python\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
                        f"from {mod} import {func.split('.')[0]}\n"
                        f"if __name__ == '__main__':\n"
                        f"    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                        f"    sys.exit({func}())\n").encode()
                rel = f"bin/{script}"
                (stage / "bin").mkdir(exist_ok=True)
                (stage / rel).write_bytes(text)
                os.chmod(stage / rel, 0o755)
                paths.append({"_path": rel, "path_type": "hardlink", "sha256": _sha256(text),
                              "size_in_bytes": len(text), "file_mode": "text",
                              "prefix_placeholder": PREFIX_PLACEHOLDER})
                has_prefix.append(f"{PREFIX_PLACEHOLDER} text {rel}")
            paths.sort(key=lambda p: p["_path"])
            files = [p["_path"] for p in paths]
            info_dir = stage / "info"
            (info_dir / "recipe").mkdir(parents=True)
            (info_dir / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
            (info_dir / "paths.json").write_text(json.dumps({"paths": paths, "paths_version": 1}, indent=2) + "\n")
            (info_dir / "files").write_text("\n".join(files) + "\n")
            if has_prefix:
                (info_dir / "has_prefix").write_text("\n".join(has_prefix) + "\n")
            about = about or {
                "home": "https://pytorch.org", "license": "BSD-3-Clause", "license_family": "BSD",
                "summary": f"PyTorch {public} with Large Model Support (LMS) in the CUDA caching allocator",
                "description": ("Official PyTorch wheel of this version with libc10_cuda.so rebuilt from the LMS "
                                "patch (ABI-checked), repackaged for conda. Enable with "
                                "torch.cuda.set_enabled_lms(True) or PYTORCH_CUDA_ALLOC_CONF=lms:True."),
                "dev_url": "https://github.com/pytorch/pytorch",
                "extra": {"lms_version": LMS_VERSION, "wheel": wheel.name, "wheel_version": wversion},
            }
            (info_dir / "about.json").write_text(json.dumps(about, indent=2, sort_keys=True) + "\n")
            # Extensions compiled against these headers need the same PyTorch minor release.
            maj, mi = public.split(".")[:2]
            if run_exports is None:
                run_exports = {"weak": [f"{name} >={public},<{maj}.{int(mi) + 1}.0a0"]}
            (info_dir / "run_exports.json").write_text(json.dumps(run_exports, indent=2) + "\n")
            (info_dir / "recipe" / "wheel.json").write_text(json.dumps(
                {"wheel": wheel.name, "dist_name": dist_name, "requires_dist": reqs}, indent=2) + "\n")
            info_files = sorted(str(p.relative_to(stage)) for p in info_dir.rglob("*") if p.is_file())
            out_sub = Path(out_dir) / subdir
            out_sub.mkdir(parents=True, exist_ok=True)
            fname = f"{name}-{public}-{build}.conda"
            progress(f"  compressing {fname} (zstd level {compression_level}, {len(files)} files) ...")
            tmp_out = Path(tempfile.mkdtemp(prefix=".conda-out-", dir=out_sub))
            try:
                cph.create(str(stage), files + info_files, fname, out_folder=str(tmp_out),
                           compression_tuple=(".tar.zst", "zstd", f"zstd:compression-level={compression_level}"))
                os.replace(tmp_out / fname, out_sub / fname)
            finally:
                shutil.rmtree(tmp_out, ignore_errors=True)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    secs = round(time.monotonic() - t0, 1)
    progress(f"  conda package: {out_sub / fname} ({(out_sub / fname).stat().st_size / 1e6:.0f} MB, {secs} s)")
    return CondaPackage(out_sub / fname, name, public, build, subdir, index, secs)


def _foreign_threads_in_python() -> list[int]:
    """Ids of threads that Python did not start (no threading.Thread) and that are executing Python code."""
    dummy = getattr(threading, "_DummyThread", ())
    ours = {t.ident for t in threading.enumerate() if not isinstance(t, dummy)}
    return [tid for tid in sys._current_frames() if tid not in ours]


def _wait_foreign_threads_out_of_python(timeout: float = 10.0) -> bool:
    """Sleep (the GIL released) until no foreign thread executes Python code; False on timeout."""
    deadline = time.monotonic() + timeout
    while _foreign_threads_in_python():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def _run_rattler(coro):
    """asyncio.run() for a py-rattler coroutine; returns only when rattler's thread is out of Python.

    Why: py-rattler (pyo3-async-runtimes) completes the asyncio future from a tokio thread with
    loop.call_soon_threadsafe(), whose self-pipe write (_write_to_self) releases the GIL. The main
    thread can then take the result, return and begin interpreter shutdown while that tokio thread
    still waits to take the GIL back. CPython before 3.14 ends such a thread with pthread_exit(), whose
    forced unwind runs Rust destructors that drop Python references without the GIL, concurrently with
    the final garbage collection: an intermittent SIGSEGV/SIGBUS at exit after all work succeeded (a
    `make build` failed so after its conda step printed "done"; core dump: method_dealloc called from
    pyo3_async_runtimes::call_soon_threadsafe on an exiting tokio thread while the main thread was in
    Py_FinalizeEx's gc). Waiting here until the thread has left Python closes that window. The thread
    keeps the GIL from the end of its last Python frame until it lets go of Python, so once no foreign
    thread has a frame it is done with Python."""
    try:
        return asyncio.run(coro)
    finally:
        _wait_foreign_threads_out_of_python()


def index_channel(channel: Path, subdir: str = "linux-64") -> Path:
    """repodata.json for `channel` with py-rattler's indexer; noarch/ is created (conda requires it)."""
    from rattler.index import index_fs
    channel = Path(channel)
    (channel / "noarch").mkdir(parents=True, exist_ok=True)
    (channel / subdir).mkdir(parents=True, exist_ok=True)
    _run_rattler(index_fs(channel, force=True, write_zst=False, write_shards=False))
    repodata = channel / subdir / "repodata.json"
    if not repodata.is_file():
        raise CondaPackError(f"indexing {channel} wrote no {repodata}")
    return repodata


def _channel_url(channel: Path) -> str:
    return Path(channel).resolve().as_uri()


def query_records(channel: Path, spec: str, subdir: str = "linux-64", cache_dir: Path | None = None):
    """Records matching `spec` in the local channel, read through rattler's Gateway (no network)."""
    import rattler

    async def go():
        gw = rattler.Gateway(cache_dir=cache_dir) if cache_dir else rattler.Gateway()
        res = await gw.query([rattler.Channel(_channel_url(channel))], [subdir, "noarch"], [spec], recursive=False)
        return [r for group in res for r in group]
    return _run_rattler(go())


def solve_report(channel: Path, spec: str, subdir: str = "linux-64", virtual_packages=None) -> dict:
    """Try a full solve with only the local channel. Returns {"ok": bool, "records"|"error": ...}."""
    import rattler

    if virtual_packages is None:
        virtual_packages = rattler.VirtualPackage.detect()  # __glibc, __unix, ... of this machine

    async def go():
        return await rattler.solve(sources=[rattler.Channel(_channel_url(channel))], specs=[spec],
                                   platforms=[subdir, "noarch"], virtual_packages=virtual_packages)
    try:
        recs = _run_rattler(go())
        return {"ok": True, "records": [f"{r.name.normalized} {r.version} {r.build}" for r in recs]}
    except Exception as e:  # rattler raises SolverError with the unsatisfiable chain
        return {"ok": False, "error": str(e)}


def install(channel: Path, prefix: Path, spec: str, *, subdir: str = "linux-64", no_deps: bool = True,
            cache_dir: Path | None = None) -> list[str]:
    """Link the package matching `spec` from the local channel into `prefix` with rattler.install.
    no_deps=True: only that record (dependencies cannot come from the local channel, see module doc).
    no_deps=False: a full rattler.solve over the local channel first (fails unless the channel holds
    every dependency). Returns the installed records as "name version build"."""
    import rattler
    if no_deps:
        recs = query_records(channel, spec, subdir, cache_dir)
        if not recs:
            raise CondaPackError(f"no package matching {spec!r} in {channel}")
        recs = [max(recs, key=lambda r: (r.version, r.build_number))]
    else:
        async def solve():
            return await rattler.solve(sources=[rattler.Channel(_channel_url(channel))], specs=[spec],
                                       platforms=[subdir, "noarch"])
        recs = _run_rattler(solve())

    async def go():
        kw = {"cache_dir": cache_dir} if cache_dir else {}
        await rattler.install(recs, target_prefix=prefix, show_progress=False, **kw)
    _run_rattler(go())
    return [f"{r.name.normalized} {r.version} {r.build}" for r in recs]
