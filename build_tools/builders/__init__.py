"""Full framework builds. Each module returns a Plan: printed by --dry-run, executed otherwise.

pytorch_full.py     setup.py bdist_wheel with the tag's build profile (USE_CUDA, TORCH_CUDA_ARCH_LIST, MAX_JOBS)
tensorflow_full.py  configure.py + bazel build_pip_package with the bazel version the tag pins
toolchain.py        finding nvcc, cuDNN, compilers, bazel; what to install when one is missing
"""
