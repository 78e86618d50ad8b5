"""Build of lms-swap with or without its eviction net compiled in.

By default the wheel is pure Python (``py3-none-any``, version ``0.1.0``): it carries the net's
source, which ``lms_swap.guard`` compiles at first use on a GPU.  With ``LMS_SWAP_BUILD_NET=1``
(``make lms-swap``, ``python -m build_tools lms-swap``) the net is compiled here, with
torch.utils.cpp_extension, against the torch of the building interpreter (so: ``pip wheel
--no-build-isolation``), and the wheel is made for that torch only, as torchvision's are:
  - version ``0.1.0+torch<X.Y.Z>.<cuNNN|cpu>`` and ``Requires-Dist: torch==X.Y.Z``;
  - the module ``lms_swap/_lms_swap_guard.*.so`` and its record ``lms_swap/_net_build.json``
    (the torch it was built against), which ``lms_swap.prebuilt`` checks at import.
Compiling needs a C++ compiler, the torch headers and the CUDA runtime headers (a toolkit or
NVIDIA's wheels, found as ``lms_swap.guard`` finds them at run time), not a GPU.

Either way the wheel carries the patched build's LMS core (``lms_swap/allocator_core/``, staged
from this repository's ``patches/`` by ``lms_swap/allocator_sources.py``), which
``lms_swap.allocator`` compiles at first use with the pluggable allocator's own sources.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
BASE_VERSION = "0.1.0"
# the stock torch the pure-Python package supports (see README.md)
TORCH_REQUIREMENT = "torch>=2.4"
EXTENSION = "lms_swap._lms_swap_guard"
RECORD = "_net_build.json"      # prebuilt.RECORD_FILE


def _wanted() -> bool:
    value = os.environ.get("LMS_SWAP_BUILD_NET", "0").strip().lower()
    if value not in ("0", "1", "", "no", "yes", "false", "true"):
        sys.exit(f"LMS_SWAP_BUILD_NET={value!r}: use 1 (compile the eviction net into the wheel) or 0")
    return value in ("1", "yes", "true")


def _standalone(name: str):
    """lms_swap/<name>.py alone (net_toolchain and prebuilt import only torch): where the build
    finds the CUDA headers is where the run-time compile finds them, and what the build records
    is what the import checks."""
    spec = importlib.util.spec_from_file_location(
        f"_lms_swap_build_{name}", os.path.join(HERE, "src", "lms_swap", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    record = prebuilt.build_record(toolchain.cuda_headers_version(includes))
    version = f"{BASE_VERSION}+{prebuilt.local_version_tag(record['torch'], record['torch_cuda'])}"

    class BuildNet(BuildExtension):
        """Compiles the net, and writes beside it the record of the torch it was compiled for."""

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
                       include_dirs=includes, extra_compile_args=["-O2"],
                       extra_link_args=toolchain.libstdcxx_link_flags())
    public = torch.__version__.split("+")[0]
    return dict(version=version, install_requires=[f"torch=={public}"], ext_modules=[ext],
                cmdclass={"build_ext": BuildNet.with_options(use_ninja=True)})


class BuildPyWithCore(build_py):
    """build_py, then the LMS core staged into the built package from the checkout around this
    folder (a source tree without it builds a package whose pluggable allocator says so)."""

    def run(self):
        super().run()
        sources = _standalone("allocator_sources")
        root = sources.repository_root(os.path.join(HERE, "src", "lms_swap"))
        if root is None:
            print(f"lms-swap: no LMS core in {os.path.dirname(HERE)}/patches: the wheel's "
                  f"pluggable allocator will say so", file=sys.stderr)
            return
        sources.stage_into_package(root, os.path.join(self.build_lib, "lms_swap"))


if _wanted():
    options = _net_setup()
    options["cmdclass"]["build_py"] = BuildPyWithCore
    setup(**options)
else:
    setup(version=BASE_VERSION, install_requires=[TORCH_REQUIREMENT],
          cmdclass={"build_py": BuildPyWithCore})
