"""TensorFlow's own BFC allocator test, adapted as little as a standalone build needs."""
from __future__ import annotations

from ...errors import LmsError

__all__ = ["adapt_upstream_test"]


def _cut(text: str, start: str, end: str, replacement: str) -> str:
    i = text.find(start)
    j = text.find(end, i + 1)
    if i < 0 or j < 0:
        raise LmsError(f"upstream test: anchor not found: {start!r} .. {end!r}")
    return text[:i] + replacement + text[j:]


def adapt_upstream_test(text: str) -> str:
    """The only changes made to TensorFlow's gpu_bfc_allocator_test.cc:

    1. StreamExecutor/GPU-device includes and ``using`` lines are dropped (they
       need the GPU runtime of a full build); ``lms_test_support.h`` is added.
    2. The two sub-allocator factories (``CreateVirtualMemorySubAllocator`` =
       GpuVirtualMemAllocator, ``CreateGPUMemAllocator`` = DeviceMemAllocator)
       are replaced by the standalone equivalents: the page-mapped LMS
       sub-allocator with LMS off (contiguous, coalescing, like
       GpuVirtualMemAllocator) and a plain non-coalescing allocator (mmap on
       the CPU, cuMemAlloc on the GPU).
    3. The BM_* benchmarks are dropped (they need google-benchmark).
    Every TEST/TEST_P/TEST_F body is compiled unchanged; the file is compiled
    with GOOGLE_CUDA=1 and CUDA_VERSION=12000 so the VMM tests are included.
    """
    drop_lines = [
        '#include "tensorflow/compiler/xla/stream_executor/device_id_utils.h"',
        '#include "tensorflow/compiler/xla/stream_executor/gpu/gpu_driver.h"',
        '#include "tensorflow/compiler/xla/stream_executor/gpu/gpu_init.h"',
        '#include "tensorflow/compiler/xla/stream_executor/stream_executor.h"',
        '#include "tensorflow/core/common_runtime/device/device_mem_allocator.h"',
        '#include "tensorflow/core/common_runtime/gpu/gpu_virtual_mem_allocator.h"',
        '#include "tensorflow/tsl/platform/test_benchmark.h"',
        "using stream_executor::DeviceIdUtil;",
        "using stream_executor::GPUMachineManager;",
        "using tensorflow::DeviceMemAllocator;",
    ]
    for line in drop_lines:
        if text.count(line + "\n") != 1:
            raise LmsError(f"upstream test: expected line not found once: {line}")
        text = text.replace(line + "\n", "")
    text = text.replace(
        '#include "tensorflow/core/common_runtime/gpu/gpu_bfc_allocator.h"\n',
        '#include "tensorflow/core/common_runtime/gpu/gpu_bfc_allocator.h"\n'
        '#include "lms_test_support.h"  // standalone sub-allocators\n', 1)
    text = _cut(
        text,
        "#if CUDA_VERSION >= 10020\nstd::unique_ptr<SubAllocator> CreateVirtualMemorySubAllocator(",
        "std::unique_ptr<SubAllocator> CreateSubAllocator(",
        "// [standalone build] sub-allocators from lms_test_support.h\n"
        "std::unique_ptr<SubAllocator> CreateVirtualMemorySubAllocator(\n"
        "    size_t virtual_address_space_size = 1ull << 32) {\n"
        "  return lms_test::VmmSubAllocator(virtual_address_space_size);\n"
        "}\n\n"
        "std::unique_ptr<SubAllocator> CreateGPUMemAllocator(size_t s) {\n"
        "  return lms_test::PlainSubAllocator(s);\n"
        "}\n\n")
    text = _cut(
        text, "static void BM_Allocation(",
        "}  // namespace\n\nclass GPUBFCAllocatorPrivateMethodsTest",
        "// [standalone build] BM_* benchmarks dropped (google-benchmark).\n\n")
    return text
