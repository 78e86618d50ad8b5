#pragma once
// The pluggable LMS allocator's answers to the core's questions about pages
// (lms_pluggable_page_walks.cpp): which pages may move now and how recently
// each was used, and the page size most allocated bytes sit on. Walks over
// the segments' blocks with no driver call, so that they run on hand-made
// segments in the tests as on the GPU.
#include "lms_pluggable_segments.h"

#include <c10/cuda/impl/LMSAllocatorHooks.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace lms_pluggable {

// The mapped pages of large segments that are on the host (`host`) or on the
// device, each with the allocation clock of the newest allocated block on it
// and every stream that may use it. A device page moves only when every
// allocated block on it is at least `min_size` bytes and it holds one; no page
// moves while a block on it waits for an event. Host pages come back whatever
// lies on them.
std::vector<c10::cuda::CUDACachingAllocator::lms::impl::PageRef> movable_pages(
    const std::vector<std::unique_ptr<Segment>>& segments,
    bool host,
    size_t min_size);

// The page size of the large segments that hold the most allocated bytes;
// `otherwise` where none holds any.
size_t busiest_large_page(
    const std::vector<std::unique_ptr<Segment>>& segments,
    size_t otherwise);

} // namespace lms_pluggable
