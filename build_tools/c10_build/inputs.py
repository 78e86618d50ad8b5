"""What a c10 build needs from outside the tree: fmt headers, nvml.h, libcudart (see build_tools/c10_build)."""
from __future__ import annotations

import glob
import os
import pathlib
import sysconfig
from typing import Iterable

__all__ = ["C10BuildError", "find_cudart", "find_fmt_include", "find_nvml_include", "needs_nvml"]


class C10BuildError(RuntimeError):
    """A build input is missing or the compiler failed (message says which)."""


def find_fmt_include(extra: Iterable[os.PathLike] = ()) -> pathlib.Path | None:
    """First directory holding fmt/format.h: ``extra``, /usr/include (libfmt-dev), an installed torch."""
    cands = [pathlib.Path(p) for p in extra] + [pathlib.Path("/usr/include")]
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        cands.append(pathlib.Path(site) / "torch" / "include")
    for c in cands:
        if (c / "fmt" / "format.h").is_file():
            return c
    return None


def find_nvml_include(cuda_home: pathlib.Path, nvml_include=None) -> pathlib.Path:
    """Directory holding nvml.h (driver_api.h includes it): explicit, the toolkit, or the
    ``nvidia/nvml_dev/include`` folder of ``nvidia-nvml-dev-cu12`` next to ``nvidia/cuda_runtime``."""
    cands = ([pathlib.Path(nvml_include)] if nvml_include else []) + [
        cuda_home / "include", cuda_home.parent / "nvml_dev" / "include",
        cuda_home / "targets" / "x86_64-linux" / "include", pathlib.Path("/usr/local/cuda/include"),
        pathlib.Path("/usr/include")]
    for c in cands:
        if (c / "nvml.h").is_file():
            return c
    raise C10BuildError(f"nvml.h not found (tried {', '.join(map(str, cands))}); "
                        "pip download nvidia-nvml-dev-cu12 or pass nvml_include=")


def needs_nvml(tree: os.PathLike) -> bool:
    """Whether the tree's c10/cuda includes nvml.h: v2.x's driver_api.h does, v1.13.1 has none."""
    api = pathlib.Path(tree) / "c10" / "cuda" / "driver_api.h"
    return api.is_file() and "nvml.h" in api.read_text(errors="replace")


def find_cudart(cuda_home: pathlib.Path) -> pathlib.Path:
    for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
        hits = sorted(glob.glob(str(cuda_home / sub / "libcudart.so*")))
        if hits:
            return pathlib.Path(hits[0])
    raise C10BuildError(f"no libcudart.so* under {cuda_home}/lib64 or lib")
