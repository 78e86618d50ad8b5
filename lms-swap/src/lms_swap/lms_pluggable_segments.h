#pragma once
// The pluggable LMS allocator's memory: segments of CUDA driver (VMM) pages
// and the blocks carved from them (lms_pluggable_segments.cpp).
//
// A segment is a reserved virtual range whose pages are driver handles. A
// fixed segment maps all its pages when it is made; an expandable one
// (PyTorch's expandable_segments) reserves a wide range and maps pages as
// requests grow into it, unmapping free ones when memory is released. LMS may
// replace a page's handle by a host-backed one holding the same bytes (and
// back), always at the same address, so a pointer handed out stays valid
// wherever its bytes live. Blocks of one segment form a list by address
// (prev/next) and cover it; in an expandable segment an unmapped block
// covers whole pages with nothing mapped under them.
#include "lms_pluggable_map_costs.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace lms_pluggable {

constexpr size_t kPageGranularity = size_t(2) << 20; // the driver's, on every GPU here
constexpr size_t kMinLargePage = size_t(8) << 20; // smaller pages move slowly

// The page of a new large segment for a request of `size` bytes: the largest of
// `large_page`, large_page/2, ... (not under kMinLargePage, each a multiple of
// kPageGranularity) whose rounding leaves at most size/32 of the segment
// unused, else the one leaving least. Rounded to the large page (64 MiB on
// the H100), every large segment may leave up to a page unused that requests
// of other sizes do not reuse while its block is allocated, so that a batch
// which fits PyTorch's own allocator need not fit here.
inline size_t segment_page(size_t size, size_t large_page) {
  size_t best = large_page;
  size_t best_waste = static_cast<size_t>(-1);
  for (size_t p = large_page; p >= std::min(kMinLargePage, large_page) &&
       p % kPageGranularity == 0;
       p /= 2) {
    const size_t waste = (size + p - 1) / p * p - size;
    if (waste * 32 <= size) {
      return p;
    }
    if (waste < best_waste) {
      best = p;
      best_waste = waste;
    }
  }
  return best;
}

struct Segment;

struct Block {
  char* ptr = nullptr;
  size_t size = 0;
  cudaStream_t stream = nullptr; // the stream of the segment's first request
  Segment* seg = nullptr;
  Block* prev = nullptr; // neighbours inside the segment, by address
  Block* next = nullptr;
  bool allocated = false;
  size_t requested = 0; // bytes asked for, while allocated
  uint64_t tick = 0; // allocation clock when last handed out
  std::vector<cudaStream_t> uses; // other streams (record_stream)
  int events = 0; // events still to complete before it is free
  bool mapped = true; // false: pages of an expandable segment not mapped
};

struct Segment {
  CUdeviceptr base = 0;
  size_t size = 0;
  size_t page = 0;
  bool small = false; // of the small pool
  bool expandable = false; // maps and unmaps pages as it grows and shrinks
  std::vector<CUmemGenericAllocationHandle> handles; // one per page
  std::vector<bool> mapped; // whether a handle is mapped at the page
  std::vector<bool> on_host;
  Block* first = nullptr;

  char* page_ptr(size_t idx) const {
    return reinterpret_cast<char*>(base) + idx * page;
  }
  // bytes of pages [first, first + count) mapped on the device
  size_t device_bytes(size_t first, size_t count) const {
    size_t n = 0;
    for (size_t i = first; i < first + count; ++i) {
      n += mapped[i] && !on_host[i];
    }
    return n * page;
  }
  size_t page_index(const void* p) const {
    return static_cast<size_t>(
               static_cast<const char*>(p) -
               reinterpret_cast<const char*>(base)) /
        page;
  }
};

// What the expandable segments' growth and release ask of the segments
// (lms_pluggable_expandable.h): Segments below on a GPU, a stand-in on the
// CPU in the tests.
class PageMapper {
 public:
  virtual const std::vector<std::unique_ptr<Segment>>& all() const = 0;
  // An expandable segment of `size` bytes of address space in pages of
  // `page` bytes, nothing mapped, covered by one unmapped block of `stream`.
  virtual Block* reserve(size_t size, size_t page, cudaStream_t stream) = 0;
  // Maps new device pages at pages [first, first + count) of expandable s
  // (none of them mapped); false when the device has no memory for them
  // (none is left mapped); other driver errors throw.
  virtual bool map_pages(Segment* s, size_t first, size_t count) = 0;
  // Unmaps pages [first, first + count) of expandable s, which no allocated
  // block and no stream uses any more: device pages to the driver, host
  // pages to LMS's host pool.
  virtual void unmap_pages(Segment* s, size_t first, size_t count) = 0;
  virtual ~PageMapper() = default;
};

// The segments of one GPU.
class Segments final : public PageMapper {
 public:
  explicit Segments(int device) : device_(device) {}
  Segments(const Segments&) = delete;
  Segments& operator=(const Segments&) = delete;

  // A new segment of `size` bytes in pages of `page` bytes (size a multiple
  // of it), covered by one free block of `stream`. nullptr when the device
  // has no memory for it (nothing is left behind); other driver errors throw.
  Block* make(size_t size, size_t page, bool small, cudaStream_t stream);

  Block* reserve(size_t size, size_t page, cudaStream_t stream) override;
  bool map_pages(Segment* s, size_t first, size_t count) override;
  void unmap_pages(Segment* s, size_t first, size_t count) override;

  // Gives back a segment whose one block is free and no longer used by any
  // stream: device pages to the driver, host pages to LMS's host pool. The
  // block is deleted.
  void release(Segment* s);

  // Waits for all work on the device, as a release must before it unmaps the
  // pages of blocks whose last users may still run; counted in costs().
  void synchronize_for_release();

  // A new device handle of `page` bytes; false when the device is out of
  // memory.
  bool new_device_handle(size_t page, CUmemGenericAllocationHandle* out);

  // Maps h (which already holds the page's bytes) at page idx of s instead of
  // its handle, and returns the old handle (lms::remap_page: on a driver
  // error it throws with the old handle still mapped).
  CUmemGenericAllocationHandle remap(
      Segment* s,
      size_t idx,
      CUmemGenericAllocationHandle h,
      bool on_host);

  // bytes of all segments, wherever their pages are
  size_t mapped_bytes() const {
    return mapped_;
  }
  // bytes of pages on the device, now and at most since reset_peak
  size_t device_bytes() const {
    return mapped_ - on_host_;
  }
  size_t peak_device_bytes() const {
    return peak_device_;
  }
  void reset_peak() {
    peak_device_ = device_bytes();
  }
  const std::vector<std::unique_ptr<Segment>>& all() const override {
    return segments_;
  }
  const MapCosts& costs() const {
    return costs_;
  }

 private:
  // Lists seg (its handles made, mapped or not as `mapped` says), covered by
  // one free block of `stream`, and returns that block.
  Block* add(std::unique_ptr<Segment> seg, cudaStream_t stream, bool mapped);

  void note_device_bytes() {
    peak_device_ = std::max(peak_device_, device_bytes());
  }

  const int device_;
  size_t mapped_ = 0;
  size_t on_host_ = 0; // bytes of pages LMS moved to host memory
  size_t peak_device_ = 0;
  MapCosts costs_;
  std::vector<std::unique_ptr<Segment>> segments_;
};

} // namespace lms_pluggable
