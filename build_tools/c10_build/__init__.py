"""Build libc10.so / libc10_cuda.so of a PyTorch tree with CMake + ninja.

Two modes, one function (:func:`build_c10`):

* **tree mode** (``wheel_root=None``): compile ``c10`` and ``c10/cuda`` of a (patched) PyTorch tree
  into ``libc10.so`` and ``libc10_cuda.so``. Used by the CI compile check and the GPU conformance.
  The Debian tree has ``third_party/`` stripped, so two outside dependencies are looked up:
  ``fmt`` headers (c10 uses fmt header-only: ``fmt_include``, default: Debian ``libfmt-dev`` in
  /usr/include, else an installed torch wheel's ``torch/include``) and ``cpuinfo`` (only
  ``c10/core/thread_pool.cpp`` uses it: Debian ``libcpuinfo-dev``).
* **wheel mode** (``wheel_root=<unpacked wheel>/torch``): compile only ``libc10_cuda.so`` from the
  tree's ``c10/cuda`` against the official wheel's ``torch/include`` (c10 headers, generated
  ``cmake_macros.h``, fmt) and link it to the wheel's own ``torch/lib/libc10.so``. This is what the
  overlay build (build_tools/overlay) calls; pass the wheel's ``cxx11_abi`` and its CUDA headers.

CUDA: ``cuda_home`` must hold ``include/cuda.h``, ``include/cuda_runtime_api.h`` and
``lib/libcudart.so*`` or ``lib64/libcudart.so*`` (a toolkit such as /usr/local/cuda, or the unpacked
``nvidia/cuda_runtime`` folder of ``nvidia-cuda-runtime-cu12==12.4.127``). ``c10/cuda/driver_api.h``
also includes ``nvml.h`` (v2.x trees; v1.13.1 has no driver_api.h): from the toolkit, or
``nvidia-nvml-dev-cu12==12.4.127`` unpacked next to it.

CLI: ``python -m build_tools.c10_build --help``.

inputs.py  fmt headers, nvml.h, libcudart: where they are found
build.py   build_c10: configure (CMakeLists.txt beside it) and build
"""
from .build import C10BuildResult, build_c10
from .inputs import C10BuildError, find_cudart, find_fmt_include, find_nvml_include

__all__ = ["C10BuildError", "C10BuildResult", "build_c10", "find_cudart", "find_fmt_include", "find_nvml_include"]
