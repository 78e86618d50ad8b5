"""Build of lms-swap with or without its eviction net compiled in.

By default the wheel is pure Python (``py3-none-any``, version ``0.1.0``): it carries the net's
source, which ``lms_swap.guard`` compiles at first use on a GPU.  With ``LMS_SWAP_BUILD_NET=1``
(``make lms-swap``, ``python -m build_tools lms-swap``) the net is compiled here, with
torch.utils.cpp_extension, against the torch of the building interpreter (so: ``pip wheel
--no-build-isolation``), and the wheel is made for that torch only, as torchvision's are:
  - version ``0.1.0+torch<X.Y.Z>.<cuNNN|cpu>`` and ``Requires-Dist: torch==X.Y.Z``;
  - the module ``lms_swap/_lms_swap_guard.*.so`` and its record ``lms_swap/_net_build.json``
    (the torch it was built against), which ``lms_swap.prebuilt`` checks at import;
  - the pluggable allocator (``lms_swap.allocator``) compiled too, as
    ``lms_swap/_lms_pluggable_allocator.*.so``, where this torch and these headers allow it
    (``allocator_build``: a CUDA torch >= 2.0 without LMS of its own, and ``nvml.h``); else the
    record says why not, and it compiles at first use.
Compiling needs a C++ compiler, the torch headers and the CUDA runtime headers (a toolkit or
NVIDIA's wheels, found as ``lms_swap.guard`` finds them at run time), not a GPU.

Either way the wheel carries the patched build's LMS core (``lms_swap/allocator_core/``, staged
from this repository's ``patches/`` by ``lms_swap/allocator_sources.py``), from which
``lms_swap.allocator`` compiles the allocator at first use where the wheel has no compiled one.
The sdist carries it too (``src/lms_swap/allocator_core/``), for the wheel built from it.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import types

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
BASE_VERSION = "0.1.0"
# the stock torch the pure-Python package supports (see README.md)
TORCH_REQUIREMENT = "torch>=2.4"
EXTENSION = "lms_swap._lms_swap_guard"
RECORD = "_net_build.json"      # prebuilt.RECORD_FILE
# setuptools compiles with the interpreter's CFLAGS, which carry -g: the wheel's modules go
# without debug information, as torch.utils.cpp_extension compiles them at first use
NO_DEBUG_INFO = ["-g0"]


def _wanted() -> bool:
    value = os.environ.get("LMS_SWAP_BUILD_NET", "0").strip().lower()
    if value not in ("0", "1", "", "no", "yes", "false", "true"):
        sys.exit(f"LMS_SWAP_BUILD_NET={value!r}: use 1 (compile the eviction net and the "
                 f"pluggable allocator into the wheel) or 0")
    return value in ("1", "yes", "true")


PACKAGE_DIR = os.path.join(HERE, "src", "lms_swap")
_BUILD_PACKAGE = "_lms_swap_build"
_NO_CORE = (f"no LMS core, neither in {os.path.dirname(HERE)}/patches (a checkout) nor in "
            f"src/lms_swap/allocator_core (an sdist)")


def _standalone(name: str):
    """lms_swap/<name>.py without the package's ``__init__`` (the build modules, net_toolchain,
    prebuilt, allocator_sources and allocator_build, import only torch and each other): where
    the build finds the CUDA headers is where the run-time compile finds them, and what the
    build records is what the import checks."""
    if _BUILD_PACKAGE not in sys.modules:
        package = types.ModuleType(_BUILD_PACKAGE)
        package.__path__ = [PACKAGE_DIR]
        sys.modules[_BUILD_PACKAGE] = package
    return importlib.import_module(f"{_BUILD_PACKAGE}.{name}")


def _allocator_extension(CppExtension):
    """``(extension, None)`` for the pluggable allocator compiled into the wheel, or ``(None,
    why not)``.  Its flags and units are those of the compile at first use (allocator_build);
    the core is staged from the checkout into build/."""
    build, core = _standalone("allocator_build"), _standalone("allocator_sources")
    why = build.torch_refusal() or build.toolchain_refusal()
    if why is None and not core.has_core(PACKAGE_DIR):
        why = _NO_CORE
    if why is not None:
        return None, why
    tree = core.core_tree(PACKAGE_DIR, os.path.join(HERE, "build", "allocator_core"))
    includes, cflags, ldflags = build.compile_flags(tree)
    units = [os.path.relpath(u, HERE) for u in build.sources(tree, PACKAGE_DIR)]
    headers = sorted(f"src/lms_swap/{f}" for f in os.listdir(PACKAGE_DIR)
                     if f.startswith("lms_pluggable_") and f.endswith(".h"))
    return CppExtension(f"lms_swap.{build.PREBUILT_MODULE}", sources=units, depends=headers,
                        include_dirs=includes, extra_compile_args=cflags + NO_DEBUG_INFO,
                        extra_link_args=ldflags), None


def _net_setup() -> dict:
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError as e:
        sys.exit(f"LMS_SWAP_BUILD_NET=1 needs torch in the building interpreter ({e}): build with "
                 f"`pip wheel --no-build-isolation` in the environment of the torch to build for")
    toolchain, prebuilt = _standalone("net_toolchain"), _standalone("prebuilt")
    reason = toolchain.refusal()
    if reason:
        sys.exit(f"cannot compile the eviction net: {reason}")
    includes = toolchain.cuda_include_dirs()
    allocator, why_not = _allocator_extension(CppExtension)
    if allocator is None:
        print(f"lms-swap: the pluggable allocator is not compiled into the wheel ({why_not}); "
              f"lms_swap.allocator compiles it at first use", file=sys.stderr)
    record = prebuilt.build_record(
        toolchain.cuda_headers_version(includes),
        allocator=None if allocator is None else _standalone("allocator_build").PREBUILT_MODULE,
        allocator_absent=why_not)
    version = f"{BASE_VERSION}+{prebuilt.local_version_tag(record['torch'], record['torch_cuda'])}"

    class BuildNet(BuildExtension):
        """Compiles the net (and the allocator), and writes beside them the record of the torch
        they were compiled for."""

        def run(self):
            super().run()
            out = os.path.join(self.build_lib, "lms_swap", RECORD)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=1, sort_keys=True)
                f.write("\n")

        def get_outputs(self):
            return super().get_outputs() + [os.path.join(self.build_lib, "lms_swap", RECORD)]

    # one translation unit; the headers of the net's parts are what it depends on besides (a
    # change of one rebuilds the module)
    ext = CppExtension(EXTENSION, sources=[f"src/lms_swap/{toolchain.NET_SOURCE}"],
                       depends=[f"src/lms_swap/{h}" for h in toolchain.NET_HEADERS],
                       include_dirs=includes, extra_compile_args=["-O2"] + NO_DEBUG_INFO,
                       extra_link_args=toolchain.libstdcxx_link_flags())
    public = torch.__version__.split("+")[0]
    return dict(version=version, install_requires=[f"torch=={public}"],
                ext_modules=[ext] + ([allocator] if allocator is not None else []),
                cmdclass={"build_ext": BuildNet.with_options(use_ninja=True)})


class BuildPyWithCore(build_py):
    """build_py, then the LMS core staged into the built package, from the checkout around this
    folder or from the sdist this folder was unpacked from (a source tree with neither builds a
    package whose pluggable allocator says so)."""

    def run(self):
        super().run()
        sources = _standalone("allocator_sources")
        into = os.path.join(self.build_lib, "lms_swap", sources.PACKAGED_CORE)
        if not sources.stage_core(PACKAGE_DIR, into):
            print(f"lms-swap: {_NO_CORE}: the wheel's pluggable allocator will say so",
                  file=sys.stderr)


class SdistWithCore(sdist):
    """sdist with the LMS core at ``src/lms_swap/allocator_core/``, so that the wheel built from
    it (``python -m build`` builds the sdist first) carries the core as one built from the
    checkout does.  An sdist without the core is refused before anything is written."""

    def run(self):
        if not _standalone("allocator_sources").has_core(PACKAGE_DIR):
            sys.exit(f"lms-swap: cannot make an sdist: {_NO_CORE}")
        super().run()

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        sources = _standalone("allocator_sources")
        sources.stage_core(PACKAGE_DIR,
                           os.path.join(base_dir, "src", "lms_swap", sources.PACKAGED_CORE))


if _wanted():
    options = _net_setup()
    options["cmdclass"].update(build_py=BuildPyWithCore, sdist=SdistWithCore)
    setup(**options)
else:
    setup(version=BASE_VERSION, install_requires=[TORCH_REQUIREMENT],
          cmdclass={"build_py": BuildPyWithCore, "sdist": SdistWithCore})
