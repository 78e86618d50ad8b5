"""Where the pluggable LMS allocator's C++ comes from: its own files in this package
(``lms_pluggable_*.cpp``) and the patched build's LMS core, compiled unchanged.

The core is kept once, in this repository's ``patches/`` (the patched build's sources).
A wheel carries a copy of it under ``lms_swap/allocator_core/`` (``lms-swap/setup.py``
stages it there at build time), and so does an sdist, under ``src/lms_swap/allocator_core/``,
for the wheel built from it; an editable install or a checkout reads it from ``patches/``
itself.  Imports nothing of this package and not torch: ``setup.py`` loads
this file on its own.
"""

from __future__ import annotations

import os
import shutil
from typing import Dict, List, Optional

__all__ = ["CORE_FILES", "PACKAGED_CORE", "core_sources", "core_tree", "has_core",
           "repository_root", "stage_core"]

# path inside the staged tree (as the core's #includes name it) = file of this repository
CORE_FILES: Dict[str, str] = {
    "c10/cuda/CUDALargeModelSupport.h": "patches/pytorch/src/c10/cuda/CUDALargeModelSupport.h",
    "c10/cuda/CUDALargeModelSupport.cpp": "patches/pytorch/src/c10/cuda/CUDALargeModelSupport.cpp",
    "c10/cuda/impl/LMSAllocatorHooks.h": "patches/pytorch/src/c10/cuda/impl/LMSAllocatorHooks.h",
    "c10/cuda/impl/LMSCApi.cpp": "patches/pytorch/src/c10/cuda/impl/LMSCApi.cpp",
    "c10/cuda/impl/LMSDeviceAllocator.h": "patches/pytorch/src/c10/cuda/impl/LMSDeviceAllocator.h",
    "c10/cuda/impl/LMSDeviceAllocator.cpp":
        "patches/pytorch/src/c10/cuda/impl/LMSDeviceAllocator.cpp",
    "c10/cuda/impl/LMSHostBudget.h": "patches/pytorch/src/c10/cuda/impl/LMSHostBudget.h",
    "c10/cuda/impl/LMSHostBudget.cpp": "patches/pytorch/src/c10/cuda/impl/LMSHostBudget.cpp",
    "c10/cuda/impl/LMSHostPool.cpp": "patches/pytorch/src/c10/cuda/impl/LMSHostPool.cpp",
    "c10/cuda/impl/LMSLaunchGate.cpp": "patches/pytorch/src/c10/cuda/impl/LMSLaunchGate.cpp",
    "c10/cuda/impl/LMSPageMoves.h": "patches/pytorch/src/c10/cuda/impl/LMSPageMoves.h",
    "c10/cuda/impl/LMSPageMoves.cpp": "patches/pytorch/src/c10/cuda/impl/LMSPageMoves.cpp",
    "c10/cuda/impl/LMSPageRemap.cpp": "patches/pytorch/src/c10/cuda/impl/LMSPageRemap.cpp",
    "c10/cuda/impl/LMSState.h": "patches/pytorch/src/c10/cuda/impl/LMSState.h",
    "c10/cuda/impl/LMSStats.cpp": "patches/pytorch/src/c10/cuda/impl/LMSStats.cpp",
    # the launch gate's CUPTI core, shared with TensorFlow's LMS (patches/pytorch/shared.toml)
    "c10/cuda/impl/LMSLaunchGateCore.inc": "patches/shared/lms_launch_gate_core.inc",
    # a stock PyTorch >= 2.4 has the driver entry points the core calls: v2.6.0's header,
    # which includes upstream's c10/cuda/driver_api.h
    "c10/cuda/impl/LMSDriverAPI.h": "patches/pytorch/v2.6.0/src/c10/cuda/impl/LMSDriverAPI.h",
}

# the staged core inside an installed package
PACKAGED_CORE = "allocator_core"

_HERE = os.path.dirname(os.path.abspath(__file__))


def repository_root(package_dir: str = _HERE) -> Optional[str]:
    """The checkout this package lies in (``lms-swap/src/lms_swap`` of it), or None."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(package_dir)))
    return root if all(os.path.isfile(os.path.join(root, f)) for f in CORE_FILES.values()) \
        else None


def stage(root: str, into: str) -> None:
    """Copies the core from the checkout at ``root`` into ``into`` at its include paths
    (files only where they differ, so a rebuild sees unchanged times)."""
    _copy({inside: os.path.join(root, source) for inside, source in CORE_FILES.items()}, into)


def _copy(files: Dict[str, str], into: str) -> None:
    """Each file of ``files`` (path inside the tree = file to copy) into ``into``, each
    written whole (a temporary beside it, then renamed) and only where it differs."""
    for inside, src in files.items():
        dst = os.path.join(into, inside)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(src, "rb") as f:
            data = f.read()
        if os.path.isfile(dst):
            with open(dst, "rb") as f:
                if f.read() == data:
                    continue
        tmp = dst + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, dst)


def _packaged(package_dir: str) -> Optional[str]:
    """The package's own staged copy of the core (a wheel's, an unpacked sdist's), if whole."""
    packaged = os.path.join(package_dir, PACKAGED_CORE)
    return packaged if all(os.path.isfile(os.path.join(packaged, f)) for f in CORE_FILES) \
        else None


def has_core(package_dir: str = _HERE) -> bool:
    """Whether :func:`core_tree` and :func:`stage_core` find the core for ``package_dir``."""
    return _packaged(package_dir) is not None or repository_root(package_dir) is not None


def core_tree(package_dir: str = _HERE, scratch: Optional[str] = None) -> str:
    """A folder holding the core at its include paths: the package's staged copy, else the
    checkout's files staged into ``scratch``.  Raises FileNotFoundError naming both."""
    packaged = _packaged(package_dir)
    if packaged is not None:
        return packaged
    root = repository_root(package_dir)
    if root is None or scratch is None:
        raise FileNotFoundError(
            f"the LMS core's sources are neither in {os.path.join(package_dir, PACKAGED_CORE)} "
            f"(a wheel of lms-swap built from this repository has them) nor in a checkout "
            f"around {package_dir}")
    stage(root, scratch)
    return scratch


def core_sources(tree: str) -> List[str]:
    """The core's translation units inside ``tree``."""
    return [os.path.join(tree, f) for f in CORE_FILES if f.endswith(".cpp")]


def stage_core(package_dir: str, into: str) -> bool:
    """``setup.py``: the core staged afresh into ``into`` (a built package's or an sdist's
    ``allocator_core``), from the package's own copy, else from the checkout around it.
    False, with nothing written, where there is neither."""
    packaged, root = _packaged(package_dir), repository_root(package_dir)
    if packaged is None and root is None:
        return False
    if os.path.isdir(into):
        shutil.rmtree(into)
    if packaged is not None:
        _copy({inside: os.path.join(packaged, inside) for inside in CORE_FILES}, into)
    else:
        stage(root, into)
    return True
