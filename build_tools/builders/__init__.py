"""Full framework builds. Each module returns a Plan: printed by --dry-run, executed otherwise.

plan.py             Plan and Step: a build as a list of steps, run under the build folder's lock
common.py           the patched tree in build/ (composed from the LMS sources), the wheel into dist/
pytorch_full.py     setup.py bdist_wheel with the tag's build profile (USE_CUDA, TORCH_CUDA_ARCH_LIST, MAX_JOBS)
pytorch_overlay.py  the overlay build (build_tools.overlay) as a Plan
tensorflow_full.py  configure.py + bazel build_pip_package with the bazel version the tag pins
The toolchain checks they make are build_tools.toolchain's.
"""
