"""Overlay build: a patched PyTorch wheel in minutes, from the official wheel of the same tag.

Because the PyTorch LMS patch keeps its C++ inside ``c10/cuda`` (plus pure Python under ``torch/``),
only ``libc10_cuda.so`` must be recompiled. The overlay build:

1. decides from the tree's diff against the tag what to rebuild (:mod:`.plan`): ``c10/cuda/**`` ->
   libc10_cuda.so, other ``c10/**`` -> libc10.so too, ``torch/**/*.py`` -> copied; anything else is
   refused with a pointer to the full build (``make build TORCH=<tag> MODE=full``);
2. fetches the official wheel for the tag and the target Python from PyPI (``pip download``, cached
   in ``.cache/wheels/``) and reads its build facts from its files (:mod:`.facts`: CUDA version, CXX11
   ABI flag, compile flags, RPATH, which libraries import what from libc10_cuda);
3. stages matching CUDA headers from NVIDIA's PyPI wheels (:mod:`build_tools.cudahome`);
4. compiles the patched tree's libraries with CMake + ninja (``build_tools.c10_build``, with
   ccache/sccache as CMAKE_CXX_COMPILER_LAUNCHER when installed), and the UNPATCHED tag the same way;
5. runs the ABI check (``build_tools.abi``: abidiff official vs rebuilt, toolchain baseline, type
   check with debug info) and REFUSES to go on if it fails;
6. writes the new wheel: rebuilt libraries, patched Python files and headers, local version
   ``<version>+lms<N>`` (METADATA, .dist-info name, file name, torch/version.py ``__version__``),
   RECORD rewritten, platform tag raised if the rebuilt library needs a newer glibc/libstdc++;
7. moves it (and ``<wheel>.overlay.json``, the build report) into ``dist_dir`` atomically at the end.

API (called by ``python -m build_tools build --mode overlay``)::

    build_overlay(tag, tree, dist_dir, *, python=sys.executable, framework_name="pytorch",
                  base=None, wheel_requirement=None, wheel_cache=None, work_dir=None,
                  launcher="auto", jobs=None, lms_build=build_tools.LMS_BUILD,
                  progress=print) -> OverlayResult

    tag               supported tag (patches/pytorch/<tag>/profile.toml), e.g. "v2.6.0"
    tree              the patched tree: a git checkout containing ``base`` (default: the tag)
    dist_dir          where the finished wheel goes (created); nothing is written there on failure
    python            interpreter the wheel is for (its tags choose the official wheel)
    wheel_requirement override of the profile's ``[build.overlay] wheel`` (e.g. "torch==2.6.0")
    wheel_cache       download cache (default <repo>/.cache/wheels)
    work_dir          scratch + incremental build dirs (default <repo>/build/overlay)
    launcher          "auto" ($LMS_COMPILER_LAUNCHER, else sccache/ccache if installed) | "ccache" | "sccache" | "none"
    Returns OverlayResult(wheel, report, version, platform_tag, plan, abi, timings).
    Raises LmsError subclasses with a clear message: unknown tag (catalog), WheelNotFound,
    OverlayRefused (patch needs the full build), AbiError, OverlayError.

CLI: ``python -m build_tools.overlay --help``.
"""
from ..wheels import WheelNotFound, fetch_wheel
from .build import OverlayError, OverlayResult, build_overlay, compiler_launcher
from .plan import OverlayPlan, OverlayRefused, plan_overlay

__all__ = ["OverlayError", "OverlayPlan", "OverlayRefused", "OverlayResult", "WheelNotFound", "build_overlay",
           "compiler_launcher", "fetch_wheel", "plan_overlay"]
