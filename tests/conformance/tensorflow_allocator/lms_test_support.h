// Test support for the TensorFlow LMS allocator conformance program
// (tests/conformance/tensorflow_allocator).  Two implementations:
//   lms_test_support_cpu.cc  - host memory: memfd page backend, mmap'd plain
//                              sub-allocator, patterns written with the CPU;
//   lms_test_support_cuda.cc - CUDA: VMM page backend (device + host-NUMA
//                              pages), cuMemAlloc plain sub-allocator,
//                              patterns written and checked by GPU kernels.
#ifndef LMS_TEST_SUPPORT_H_
#define LMS_TEST_SUPPORT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tensorflow/tsl/framework/allocator.h"
#include "tensorflow/tsl/framework/lms_sub_allocator.h"

namespace lms_test {

// "cpu" or "cuda".
std::string BackendKind();
// Device budget used by the LMS tests (CPU: 64 MiB; CUDA: LMS_TEST_DEVICE_MB,
// default 4096 MiB).
size_t DeviceBudget();
// A LMS page-mapped sub-allocator, with TensorFlow's page for the device
// budget (tsl::LmsPageBytes; CUDA: LMS_TEST_PAGE_MB overrides it).
std::unique_ptr<tsl::LmsVirtualMemSubAllocator> MakeLmsSubAllocator(
    size_t va_bytes, size_t device_bytes, size_t host_bytes,
    size_t host_reserve = tsl::LmsVirtualMemSubAllocator::kHostReserveAuto);
// The sub-allocators of the upstream GPUBFCAllocator tests:
// "GPUMemAllocator" (a plain allocator that never coalesces) and the
// virtual-memory allocator (contiguous, coalescing; LMS off).
std::unique_ptr<tsl::SubAllocator> PlainSubAllocator(size_t ignored);
std::unique_ptr<tsl::SubAllocator> VmmSubAllocator(size_t va_bytes);
// Writes/checks a pattern (32-bit words derived from seed and index) through
// the device: on CUDA by kernels reading/writing the pointer.
void Fill(void* p, size_t bytes, uint32_t seed);
// Words that differ from the pattern plus `add` (after `add` increments).
size_t CountMismatchesAdd(const void* p, size_t bytes, uint32_t seed,
                          uint32_t add);
inline size_t CountMismatches(const void* p, size_t bytes, uint32_t seed) {
  return CountMismatchesAdd(p, bytes, seed, 0);
}

// Seconds of one copy of 'bytes' between device memory and pinned host memory
// (to_host: device to host), the best of three; a negative value where the
// backend has no such copy (CPU).
double PinnedCopySeconds(size_t bytes, bool to_host);

// The backends' part of Writers: what the writer threads share (CUDA: the one
// compute stream; CPU: nothing), and one round of +1 passes over every word of
// a block, finished before it returns (CPU: plain writes; CUDA: a kernel on the
// shared stream, waited for); AddPasses returns the passes it made.
void* WritersBegin();
void WritersEnd(void* shared);
int AddPasses(void* shared, void* p, size_t bytes);

// Several devices in one process.  CPU: two simulated devices, each a worker
// thread that runs the "kernels" launched to it in launch order (a launch
// passes the stand-in gate; a drain waits until the device ran dry); CUDA:
// the GPUs, each in its primary context.
int Devices();
// Whether kernels on device 'from' can access memory of device 'to' (CPU:
// yes; CUDA: peer access, cuDeviceCanAccessPeer).
bool PeerAccess(int from, int to);
// An LMS sub-allocator of device 'device' (TensorFlow's page for the budget)
// whose pages are mapped for every other device (its peers), and whose page
// moves drain it and its peers.
std::unique_ptr<tsl::LmsVirtualMemSubAllocator> MakeLmsSubAllocatorOn(
    int device, size_t va_bytes, size_t device_bytes, size_t host_bytes);
// Makes 'device' the calling thread's device: Fill and CountMismatchesAdd
// run there (CUDA: its primary context; CPU: nothing to do).
void UseDevice(int device);
// Launches on 'device', from the calling thread and without waiting for it,
// a kernel adding 1 to every word of [p, p + bytes): memory of any device.
void LaunchAdd(int device, void* p, size_t bytes);
// Launches on 'device' its side of a two-device handshake, as a collective's
// kernels are: the kernel marks 'round' for its device, then waits until
// the other device's kernel marked it.  Rounds count from 1.
void LaunchHandshake(int device, int round);
// Waits for the kernels the calling thread launched on 'device'.
void Finish(int device);

// TensorFlow's executor pattern: one host thread per block, each adding 1 to
// every word of its block, round after round, until Stop(); the allocator is
// not told.
class Writers {
 public:
  Writers(const std::vector<void*>& blocks, size_t bytes)
      : shared_(WritersBegin()), passes_(blocks.size()) {
    for (auto& c : passes_) c.store(0);
    for (size_t b = 0; b < blocks.size(); ++b) {
      threads_.emplace_back([this, b, p = blocks[b], bytes] {
        while (!stop_.load()) passes_[b] += AddPasses(shared_, p, bytes);
      });
    }
  }
  ~Writers() { Stop(); }
  // Stops the threads between rounds; the passes each completed.
  std::vector<uint64_t> Stop() {
    stop_ = true;
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    if (shared_ != nullptr) {
      WritersEnd(shared_);
      shared_ = nullptr;
    }
    std::vector<uint64_t> out;
    for (auto& n : passes_) out.push_back(n.load());
    return out;
  }

 private:
  void* shared_;
  std::atomic<bool> stop_{false};
  std::vector<std::atomic<uint64_t>> passes_;
  std::vector<std::thread> threads_;
};

}  // namespace lms_test

#endif  // LMS_TEST_SUPPORT_H_
