// Test support for the TensorFlow LMS allocator conformance program
// (tests/conformance/tensorflow_allocator).  Two implementations:
//   lms_test_support_cpu.cc  - host memory: memfd page backend, mmap'd plain
//                              sub-allocator, patterns written with the CPU;
//   lms_test_support_cuda.cc - CUDA: VMM page backend (device + host-NUMA
//                              pages), cuMemAlloc plain sub-allocator,
//                              patterns written and checked by GPU kernels.
#ifndef LMS_TEST_SUPPORT_H_
#define LMS_TEST_SUPPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorflow/tsl/framework/allocator.h"
#include "tensorflow/tsl/framework/lms_sub_allocator.h"

namespace lms_test {

// "cpu" or "cuda".
std::string BackendKind();
// Device budget used by the LMS tests (CPU: 64 MiB; CUDA: LMS_TEST_DEVICE_MB,
// default 4096 MiB).
size_t DeviceBudget();
// A LMS page-mapped sub-allocator.
std::unique_ptr<tsl::LmsVirtualMemSubAllocator> MakeLmsSubAllocator(
    size_t va_bytes, size_t device_bytes, size_t host_bytes);
// The sub-allocators of the upstream GPUBFCAllocator tests:
// "GPUMemAllocator" (a plain allocator that never coalesces) and the
// virtual-memory allocator (contiguous, coalescing; LMS off).
std::unique_ptr<tsl::SubAllocator> PlainSubAllocator(size_t ignored);
std::unique_ptr<tsl::SubAllocator> VmmSubAllocator(size_t va_bytes);
// Writes/checks a pattern (32-bit words derived from seed and index) through
// the device: on CUDA by kernels reading/writing the pointer.
void Fill(void* p, size_t bytes, uint32_t seed);
size_t CountMismatches(const void* p, size_t bytes, uint32_t seed);
// Words that differ from the pattern plus `add` (after `add` increments).
size_t CountMismatchesAdd(const void* p, size_t bytes, uint32_t seed,
                          uint32_t add);

// TensorFlow's executor pattern: one host thread per block, each adding 1 to
// every word of its block, pass after pass, until Stop(); the allocator is not
// told (CPU: plain writes; CUDA: kernels on one compute stream shared by all
// the threads, each thread waiting for its kernel before the next).
class Writers {
 public:
  Writers(const std::vector<void*>& blocks, size_t bytes);
  ~Writers();
  // Stops the threads between passes; the passes each completed.
  std::vector<uint64_t> Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lms_test

#endif  // LMS_TEST_SUPPORT_H_
