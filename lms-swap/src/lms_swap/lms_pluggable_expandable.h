#pragma once
// The pluggable LMS allocator's expandable segments
// (lms_pluggable_expandable.cpp): one reserved address range per stream for
// the large pool, as PyTorch's allocator has with expandable_segments. A
// request no free block serves grows into the run of free and unmapped
// blocks that maps least (lms_pluggable_block_walks.h); releasing memory
// unmaps the whole pages of free blocks. The allocator owns the segments and
// FreeBlocks this works on, and calls it under its mutex. No CUDA call is
// made here but through the PageMapper.
#include "lms_pluggable_block_walks.h"
#include "lms_pluggable_free_blocks.h"
#include "lms_pluggable_segments.h"

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace lms_pluggable {

// PyTorch's expandable_segments setting, read as PyTorch reads it: from
// PYTORCH_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF ("key:value,...").
bool expandable_segments_setting();

class ExpandableSegments {
 public:
  ExpandableSegments(PageMapper& segments, FreeBlocks& free)
      : segments_(segments), free_(free) {}
  ExpandableSegments(const ExpandableSegments&) = delete;
  ExpandableSegments& operator=(const ExpandableSegments&) = delete;

  // Device bytes that serving `size` bytes on `stream` would map now (in a
  // new segment of pages of `page` where no segment of the stream holds it).
  size_t new_bytes(size_t size, cudaStream_t stream, size_t page) const;

  // A block of `size` bytes on `stream` (cut from the run, the rest listed
  // free), or nullptr when the device has no memory for the pages it needs:
  // the pages mapped on the way stay, listed as free memory. A new segment
  // (pages of `page`, address space for `device_total` four times over)
  // where no segment of the stream holds the request.
  Block* grow(size_t size, cudaStream_t stream, size_t page, size_t device_total);

  // The free mapped blocks that serving `size` bytes on `stream` grows over
  // now (the run that maps least). A release made for that request leaves
  // them: unmapping them would only make the request map them again, past
  // the new_bytes() it was given room for.
  using Kept = std::vector<const Block*>;
  Kept growth_run(size_t size, cudaStream_t stream) const;
  static bool kept(const Kept& keep, const Block* b) {
    return std::find(keep.begin(), keep.end(), b) != keep.end();
  }

  // The whole pages of every free block with no event pending, by block,
  // but those of the blocks in `keep`.
  using Spans = std::vector<std::pair<Block*, PageSpan>>;
  Spans free_pages(const Kept& keep = {}) const;
  // Of those, the largest runs first, as many whole pages as make up at
  // least `at_least` device bytes (all, where they make up less): of the
  // last run it takes, only the pages at its end that make up the rest.
  Spans largest_free_pages(size_t at_least, const Kept& keep = {}) const;

  // Whether free block b (unlisted) of an expandable segment holds whole
  // pages on the host (a fixed segment's block: false).
  bool holds_host_pages(const Block& b) const;

  // Lists free block b, which no stream uses any more: first, in an
  // expandable segment, its whole pages from the first on the host to the
  // last are unmapped (host pages to the host pool, no copy), so that no new
  // allocation lands on host memory. A fixed segment keeps its host pages
  // until they come back or the segment is released.
  void list_dropping_host_pages(Block* b);

  // Unmaps `spans` (of free_pages(), nothing allocated or freed since):
  // device pages to the driver, host pages to the host pool. The caller has
  // made sure no stream still uses them (a device synchronization).
  void unmap(const Spans& spans);

 private:
  // Of the stream's segments, the run that maps least for `size` bytes
  // (plan_growth); `start` nullptr where none holds it.
  Growth best_growth(size_t size, cudaStream_t stream) const;

  PageMapper& segments_;
  FreeBlocks& free_;
};

} // namespace lms_pluggable
