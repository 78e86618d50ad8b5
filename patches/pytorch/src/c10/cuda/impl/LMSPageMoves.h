#pragma once
// Large Model Support: moving pages of allocated blocks between device and
// host memory (impl/LMSPageMoves.cpp). Not an installed header. One PageMover
// per DeviceCachingAllocator; it runs under the allocator's mutex and reaches
// the allocator's segments only through AllocatorHooks.
//
// Costs that shape it (examples/pytorch/benchmarks/vmm_costs.cu, H100): a
// spill is bound by the driver's cuMemSetAccess of the host mapping at the
// page's address (14-27 us per MiB, serialised in the driver), not by the
// copy (54 GB/s): so host pages come with their own mapping and the copy goes
// straight into it, the remaps of one chunk (kChunkBytes) run while the copy
// engine moves the next, and large-pool pages are larger while LMS is on
// (lms::large_page_bytes).
#include <c10/cuda/impl/LMSAllocatorHooks.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <unordered_map>
#include <vector>

namespace c10::cuda::CUDACachingAllocator::lms::impl {

class PageMover {
 public:
  // A chunk holds at most this many pages, and at most kChunkBytes: the host
  // remaps one chunk while the copy engine moves the next, so the first
  // chunk's copy and the last chunk's remaps are not overlapped; small
  // chunks keep those ends short.
  static constexpr size_t kWindowPages = 32;
  static constexpr size_t kChunkBytes = size_t(64) << 20;

  // What a swap out did so far (filled while it runs, so that a caller sees
  // the bytes released before a driver error too).
  struct SwapOut {
    size_t released = 0;
    bool host_exhausted = false; // the host pool or budget refused a page
  };

  // First use on `device`: makes the mover's stream. Later calls do nothing.
  void init(int device);
  int device() const {
    return device_;
  }

  // Moves `victims` (device pages, in order) to pooled host pages, after all
  // work queued on `streams` and, inside a lms::QuietDevice, all device work
  // of the process. Stops early when the host refuses a page. On a driver
  // error it throws with every page still mapped, on its old or its new
  // memory (nothing is lost); `out` says what was moved.
  void swap_out(
      AllocatorHooks& hooks,
      const std::vector<PageRef>& victims,
      std::vector<cudaStream_t> streams,
      SwapOut& out);

  // Brings `pages` (host pages, in order) back to new device pages while
  // their bytes fit in `room` and the device makes pages. Returns bytes
  // brought back. Never throws: returns run on frees, where an exception
  // would end the process; a failed return is reported and its data stays in
  // host memory.
  size_t swap_in(
      AllocatorHooks& hooks,
      const std::vector<PageRef>& pages,
      size_t room);

 private:
  struct Chunk;
  unsigned long long window(size_t page_size);
  void window_map(unsigned long long va, size_t size, PageHandle h);
  void wait_for(std::vector<cudaStream_t>& streams);
  cudaEvent_t take_event();
  void give_event(cudaEvent_t ev);
  void drop_unmoved(Chunk* c, bool out);

  int device_ = -1;
  cudaStream_t stream_ = nullptr; // made once, never destroyed (used at exit)
  // staging windows by page size: 2 * kWindowPages pages of address space
  std::unordered_map<size_t, unsigned long long> windows_;
  std::vector<cudaEvent_t> idle_events_; // never destroyed (used at exit)
};

} // namespace c10::cuda::CUDACachingAllocator::lms::impl
