#pragma once
// Large Model Support: the interface between LMS's own translation units
// (impl/LMSDeviceAllocator.cpp, impl/LMSPageMoves.cpp) and one tag's
// DeviceCachingAllocator. Not an installed header.
//
// The allocator's types (Block, AllocParams, its segments) are private to
// c10/cuda/CUDACachingAllocator.cpp, so LMS's own .cpp files never see them:
// they ask through AllocatorHooks. Each tag implements it inside `class
// DeviceCachingAllocator`, where those types are visible: the tag's
// impl/LMSAllocatorAdapter.inc answers what differs between tags (its
// segments, how a block is allocated and memory released), and
// impl/LMSDeviceAllocator.inc the walks over Blocks that every tag shares.
// A tag that misses a member does not compile (pure virtual).
//
// Everything here is called under the allocator's mutex.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace c10::cuda::CUDACachingAllocator::lms::impl {

// A CUDA driver memory handle (CUmemGenericAllocationHandle)
using PageHandle = unsigned long long;

// One page of a segment that holds allocated blocks. `seg` is the tag's
// segment object, opaque outside the tag's hooks.
struct PageRef {
  void* seg = nullptr;
  size_t idx = 0;
  uint64_t tick = 0; // allocation clock of the newest block on the page
  std::vector<cudaStream_t> streams; // every stream that may use the page
};

class AllocatorHooks {
 public:
  AllocatorHooks() = default;
  AllocatorHooks(const AllocatorHooks&) = delete;
  AllocatorHooks& operator=(const AllocatorHooks&) = delete;

  // ---- the tag's VMM segments (impl/LMSAllocatorAdapter.inc) ----
  virtual size_t page_size(const void* seg) const = 0;
  virtual char* page_ptr(const void* seg, size_t idx) const = 0;
  virtual bool on_host(const void* seg, size_t idx) const = 0;
  // the page of seg that holds address p
  virtual size_t page_index(const void* seg, const void* p) const = 0;
  // A new device handle of one page of seg; false when the device is out of
  // memory (other driver errors throw).
  virtual bool new_device_page(void* seg, PageHandle* out) = 0;
  // Maps h (which already holds the page's bytes) at page idx instead of its
  // current handle and returns the old handle. On a driver error it throws
  // with the old handle still mapped (lms::remap_page).
  virtual PageHandle remap(void* seg, size_t idx, PageHandle h, bool on_host) = 0;

  // ---- the tag's allocator (impl/LMSAllocatorAdapter.inc) ----
  virtual bool capturing() const = 0; // a CUDA graph capture is underway
  // the page a large-pool segment of `device` made now gets
  virtual size_t new_large_page(int device) const = 0;
  // Serves the request being handled (malloc's AllocParams) from new device
  // memory; false when that fails (the request's error is set).
  virtual bool alloc_block(bool is_retry) = 0;
  // Releases free cached memory: every free page the tag can unmap (defrag
  // on), or only segments that are completely free (defrag off).
  virtual void release_free_pages() = 0;
  virtual void release_free_segments() = 0;
  // release_free_at_least's argument that asks for all the free cache
  static constexpr size_t kReleaseAll = ~size_t(0);
  // Releases as those do (`pages`: as release_free_pages) until at least
  // `at_least` device bytes are released or nothing free is left, so that the
  // rest of the cache serves the next allocations without a map. A tag that
  // cannot stop part way releases it all: this default. Made while a request
  // is served, a release must not raise what alloc_block then maps above the
  // `want` malloc was given (the LMS limit is reckoned with it): a tag whose
  // `want` is the whole request keeps this whatever it unmaps; one whose
  // `want` counts free mapped blocks the request grows over leaves those.
  virtual void release_free_at_least(size_t at_least, bool pages) {
    (void)at_least;
    if (pages) {
      release_free_pages();
    } else {
      release_free_segments();
    }
  }
  // Upstream's size formatting, for messages that sit beside upstream's.
  virtual std::string format_size(size_t bytes) const = 0;

  // ---- walks over Blocks, shared by every tag (impl/LMSDeviceAllocator.inc)
  // mapped bytes of the allocator's segments (total_allocated_memory)
  virtual size_t mapped_bytes() const = 0;
  // Pages of allocated blocks that LMS may move now, one entry per page, in
  // no particular order: device pages (on_host false; every allocated block
  // on the page at least lms::min_swap_size()) or host pages (on_host true).
  // A page is movable when every block on it is mapped, has no pending
  // events and is not in a CUDA graph's private pool.
  virtual std::vector<PageRef> movable_pages(bool on_host) = 0;
  // The page size under the most bytes of allocated large-pool blocks
  // (new_large_page(device) when there are none): what a spill would move.
  virtual size_t busiest_large_page(int device) const = 0;
  // bytes mapped but free (the free lists of both pools, mapped blocks only)
  virtual size_t cached_free_bytes() const = 0;

  virtual ~AllocatorHooks() = default;
};

} // namespace c10::cuda::CUDACachingAllocator::lms::impl
