#pragma once
// Large Model Support: one DeviceCachingAllocator's LMS (the search order of
// malloc with LMS on, when pages come back, the OOM report), in
// impl/LMSDeviceAllocator.cpp. Not an installed header. The allocator owns
// one DeviceLms next to its hooks (impl/LMSDeviceAllocator.inc) and calls it
// under its mutex.
//
// Design (see c10/cuda/CUDALargeModelSupport.h):
// * With LMS on, segments are made of VMM pages whose virtual address stays
//   while the memory behind it may change (v2.6.0: expandable segments;
//   v1.13.1: impl/LMSVmmSegment.inc).
// * Search order of malloc with LMS on (malloc): free list -> [if the LMS
//   limit would be passed: reclaim first] -> [if the card's free memory would
//   fall under the foreign reserve: reclaim first, softly] -> new device pages -> release free
//   pages ("defrag") -> swap out least recently allocated pages of allocated
//   blocks (>= lms size) to pooled host handles -> OutOfMemoryError with an
//   LMS report (oom_message).
// * Swapping a page (impl/LMSPageMoves.cpp): wait for every stream that may
//   use the page and, inside a lms::QuietDevice, for all work of every thread
//   (impl/LMSLaunchGate.cpp); copy the page into a pooled host page through
//   that page's own mapping (impl/LMSHostPool.cpp); wait for the copy; then
//   remap the page's virtual address to the host handle and release the
//   device handle. Host pages are made ahead of need (prefill): once LMS has
//   moved something, as many as it has held on the host (at most 1/8 of what
//   LMS may use), or a set reserve once the device is 3/4 full; of the page
//   the spill will move. Kernels launched
//   afterwards read and write the page over PCIe.
// * Return: when freed bytes add up (after_free) and enough memory is free to
//   keep what comes back above a headroom (1/16 of what LMS may use), or on
//   emptyCache, free pages are released and host pages come back (most
//   recently allocated first) while device memory is below the limit less
//   that headroom.
// * A host page whose blocks are all freed goes back to the host pool
//   without copying where the tag can unmap free pages (the tag's hooks).
#include <c10/cuda/impl/LMSAllocatorHooks.h>
#include <c10/cuda/impl/LMSPageMoves.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace c10::cuda::CUDACachingAllocator::lms::impl {

class DeviceLms {
 public:
  explicit DeviceLms(AllocatorHooks& hooks) : hooks_(hooks) {}
  DeviceLms(const DeviceLms&) = delete;
  DeviceLms& operator=(const DeviceLms&) = delete;

  // malloc's search with LMS on for `want` bytes on `device`; `found`: the
  // free list already served it. False: not served; `*refused` is true when
  // LMS refused the request itself (larger than the device, or over the LMS
  // limit) rather than an allocation failing.
  bool malloc(bool found, int device, size_t want, bool* refused);

  // After a free of `freed` bytes (the tag has dropped host pages of free
  // blocks already): brings pages back once enough memory was freed.
  void after_free(size_t freed);

  // Whether LMS served a request on this allocator yet (nothing to do
  // before).
  bool started() const {
    return mover_.device() >= 0;
  }

  // emptyCache(): pages come back, idle host pages go back to the host.
  void empty_cache();

  // The LMS part of the OutOfMemoryError for a request of alloc_size bytes.
  std::string oom_message(size_t alloc_size);

 private:
  struct Attempt { // what the last failed malloc tried (for the OOM message)
    size_t released = 0;
    size_t swapped = 0;
    size_t eligible_left = 0;
    bool host_exhausted = false;
    bool too_large = false;
    bool over_limit = false;
  };

  size_t host_bytes() const;
  size_t device_bytes() const;
  void prefill(size_t want, size_t cap);
  void follow_host_bytes(size_t cap);
  size_t release_free(size_t at_least);
  size_t swap_out(size_t need, size_t cap);
  void keep_under_limit(size_t lim, size_t cap);
  bool keep_reserve(size_t want, size_t total, size_t cap);
  size_t return_room(size_t headroom, size_t releasable);
  size_t return_headroom();
  size_t swap_in(size_t headroom);

  AllocatorHooks& hooks_;
  PageMover mover_;
  size_t freed_since_return_ = 0;
  size_t device_total_ = 0; // the device's bytes, once asked
  bool prefill_asked_ = false; // a set reserve, since the last emptyCache
  size_t reserve_asked_ = 0; // the automatic reserve, since the last emptyCache
  Attempt attempt_;
};

} // namespace c10::cuda::CUDACachingAllocator::lms::impl
