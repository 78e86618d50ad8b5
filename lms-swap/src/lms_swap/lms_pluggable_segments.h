#pragma once
// The pluggable LMS allocator's memory: segments of CUDA driver (VMM) pages
// and the blocks carved from them (lms_pluggable_segments.cpp).
//
// A segment is a reserved virtual range whose pages are driver handles,
// mapped when the segment is made. LMS may replace a page's handle by a
// host-backed one holding the same bytes (and back), always at the same
// address, so a pointer handed out stays valid wherever its bytes live.
// Blocks of one segment form a list by address (prev/next) and cover it.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace lms_pluggable {

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
};

struct Segment {
  CUdeviceptr base = 0;
  size_t size = 0;
  size_t page = 0;
  bool small = false; // of the small pool
  std::vector<CUmemGenericAllocationHandle> handles; // one per page
  std::vector<bool> on_host;
  Block* first = nullptr;

  char* page_ptr(size_t idx) const {
    return reinterpret_cast<char*>(base) + idx * page;
  }
  size_t page_index(const void* p) const {
    return static_cast<size_t>(
               static_cast<const char*>(p) -
               reinterpret_cast<const char*>(base)) /
        page;
  }
};

// The segments of one GPU.
class Segments {
 public:
  explicit Segments(int device) : device_(device) {}
  Segments(const Segments&) = delete;
  Segments& operator=(const Segments&) = delete;

  // A new segment of `size` bytes in pages of `page` bytes (size a multiple
  // of it), covered by one free block of `stream`. nullptr when the device
  // has no memory for it (nothing is left behind); other driver errors throw.
  Block* make(size_t size, size_t page, bool small, cudaStream_t stream);

  // Gives back a segment whose one block is free and no longer used by any
  // stream: device pages to the driver, host pages to LMS's host pool. The
  // block is deleted.
  void release(Segment* s);

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

  size_t mapped_bytes() const {
    return mapped_;
  }
  const std::vector<std::unique_ptr<Segment>>& all() const {
    return segments_;
  }

 private:
  const int device_;
  size_t mapped_ = 0;
  std::vector<std::unique_ptr<Segment>> segments_;
};

} // namespace lms_pluggable
