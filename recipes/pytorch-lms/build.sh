#!/bin/bash
# conda-build build script: PyTorch's own setup.py with the LMS patch applied (see meta.yaml).
# Same environment as `make build TORCH=v2.6.0 MODE=full` (patches/pytorch/v2.6.0/profile.toml).
set -euxo pipefail
export USE_CUDA=1 USE_CUDNN=1 USE_NCCL=1 USE_SYSTEM_NCCL=1 USE_DISTRIBUTED=1 BUILD_TEST=0
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;8.6;9.0}"
export CUDA_HOME="${PREFIX}" CMAKE_PREFIX_PATH="${PREFIX}"
export PYTORCH_BUILD_VERSION="${PKG_VERSION}" PYTORCH_BUILD_NUMBER="${PKG_BUILDNUM}"
export MAX_JOBS="${MAX_JOBS:-${CPU_COUNT}}"
# compiler cache: PyTorch's CMake uses ccache itself when it is on PATH (USE_CCACHE=ON by default)
export CCACHE_DIR="${CCACHE_DIR:-${HOME}/.cache/ccache}"
${PYTHON} -m pip install . -vv --no-deps --no-build-isolation
