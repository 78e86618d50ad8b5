"""A CUDA "home" (include/ + lib/libcudart.so*) for compiling CUDA host code, made from NVIDIA's PyPI wheels.

An official torch wheel needs the CUDA headers it was built with (torch 2.6.0: 12.4, torch 1.13.1:
11.7); no toolkit is installed on CI. NVIDIA publishes the pieces on PyPI:
  nvidia-cuda-runtime-cuXX  include/cuda.h, cuda_runtime_api.h, ... and lib/libcudart.so.XX
  nvidia-cuda-nvcc-cuXX     include/crt/*.h (host_config.h, host_defines.h: included by cuda_runtime_api.h)
  nvidia-nvml-dev-cu12      include/nvml.h (v2.6.0's c10/cuda/driver_api.h includes it; v1.13.1 has
                            no driver_api.h and needs no nvml.h)
They are unpacked once into <cache>/cuda-home/<cuda version>/ (include/ merged, lib/).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .archives import extract_zip
from .catalog import REPO_ROOT
from .errors import LmsError
from .wheels import fetch_wheel

__all__ = ["DEFAULT_ROOT", "HEADER_WHEELS", "HEADER_WHEEL_SHA256", "cuda_home", "header_wheels"]

# CUDA minor version -> the PyPI wheels whose headers match it (versions NVIDIA shipped for 12.4;
# nvcc's own patch release is .131 while the runtime's is .127).
HEADER_WHEELS = {
    "12.4": ["nvidia-cuda-runtime-cu12==12.4.127", "nvidia-cuda-nvcc-cu12==12.4.131",
             "nvidia-nvml-dev-cu12==12.4.127"],
    "12.2": ["nvidia-cuda-runtime-cu12==12.2.140", "nvidia-cuda-nvcc-cu12==12.2.140"],
    "11.7": ["nvidia-cuda-runtime-cu11==11.7.99", "nvidia-cuda-nvcc-cu11==11.7.99"],
}
# sha256 of those wheels' files on PyPI (`pip download`; 12.2's on 2026-11-26, the rest 2026-11-25),
# checked on every use. 12.2: the CUDA range of the TensorFlow v2.14.1 profile, whose page backend a test
# compiles against it.
HEADER_WHEEL_SHA256 = {
    "nvidia_cuda_runtime_cu12-12.4.127-py3-none-manylinux2014_x86_64.whl":
        "64403288fa2136ee8e467cdc9c9427e0434110899d07c779f25b5c068934faa5",
    "nvidia_cuda_nvcc_cu12-12.4.131-py3-none-manylinux2014_x86_64.whl":
        "e4c9a35435c3b0e36c6397c5696334c9ea6650e524736cbd1c5d345ea099bb04",
    "nvidia_nvml_dev_cu12-12.4.127-py3-none-manylinux2014_x86_64.whl":
        "f3d070140734992f018d46b5fc1663495898637534b94a87cec64bf12bdc584c",
    "nvidia_cuda_runtime_cu12-12.2.140-py3-none-manylinux1_x86_64.whl":
        "acb9cb7e44594a3512533497ea790d9f0b0e399abcc888584c157d1ffa080e41",
    "nvidia_cuda_nvcc_cu12-12.2.140-py3-none-manylinux1_x86_64.whl":
        "c6ff4ae7a636eb6cab7621191e19ac3779690686bbcf52c04d8b1ca2944e1e27",
    "nvidia_cuda_runtime_cu11-11.7.99-py3-none-manylinux1_x86_64.whl":
        "cc768314ae58d2641f07eac350f40f99dcb35719c4faff4bc458a7cd2b119e31",
    "nvidia_cuda_nvcc_cu11-11.7.99-py3-none-manylinux1_x86_64.whl":
        "34f6dfc39a85a5a6f57dfc5ed145a9f903c3f6520a86e7d24b548894769f5e48",
}
DEFAULT_ROOT = REPO_ROOT / ".cache" / "cuda-home"


def header_wheels(cuda: str, runtime_pin: str | None = None) -> list[str]:
    if cuda not in HEADER_WHEELS:
        raise LmsError(f"no CUDA {cuda} header wheels are known",
                       hint=f"add them to build_tools/cudahome.py HEADER_WHEELS (known: {', '.join(HEADER_WHEELS)})")
    reqs = list(HEADER_WHEELS[cuda])
    if runtime_pin:  # the exact runtime the torch wheel pins wins
        reqs = [runtime_pin if r.startswith("nvidia-cuda-runtime-") else r for r in reqs]
    return reqs


def _header_or_library(name: str) -> str | None:
    parts = name.split("/")
    if len(parts) < 4 or parts[0] != "nvidia":
        return None
    sub, rel = parts[2], "/".join(parts[3:])
    if sub == "include":
        return f"include/{rel}"
    if sub == "lib" and ".so" in rel:
        return f"lib/{rel}"
    return None


def cuda_home(cuda: str, *, python: str, runtime_pin: str | None = None, root: Path = DEFAULT_ROOT,
              wheel_cache: Path | None = None, progress=print) -> Path:
    reqs = header_wheels(cuda, runtime_pin)
    dest = root / (cuda + "-" + "-".join(r.split("==")[1] for r in reqs))
    if (dest / "include" / "cuda.h").is_file() and (dest / "lib").is_dir():
        return dest
    kw = {"cache_dir": wheel_cache} if wheel_cache else {}
    wheels = [fetch_wheel(r, python=python, progress=progress, pins=HEADER_WHEEL_SHA256, **kw) for r in reqs]
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".cuda-home-", dir=root))
    try:
        (tmp / "include").mkdir()
        (tmp / "lib").mkdir()
        for w in wheels:
            # nvidia/<component>/include/** -> include/, nvidia/<component>/lib/*.so* -> lib/
            extract_zip(w, tmp, select=_header_or_library)
        for lib in (tmp / "lib").glob("libcudart.so.*"):
            link = tmp / "lib" / "libcudart.so"
            if not link.exists():
                os.symlink(lib.name, link)
        needed = ["cuda.h", "cuda_runtime_api.h", "crt/host_config.h"]
        needed += ["nvml.h"] if any(r.startswith("nvidia-nvml-dev") for r in reqs) else []
        missing = [h for h in needed if not (tmp / "include" / h).is_file()]
        if missing:
            raise LmsError(f"CUDA header wheels {reqs} lack {', '.join(missing)}")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest
