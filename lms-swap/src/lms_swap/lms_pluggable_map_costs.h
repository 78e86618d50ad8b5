#pragma once
// What the pluggable LMS allocator's cache has paid for its own mapping since
// the process began (kept by Segments, lms_pluggable_segments.h; read through
// counters(), lms_pluggable_allocator.h).
#include <cstddef>

namespace lms_pluggable {

// New device pages mapped (segments made, expandable pages grown into) and
// device pages given back (segments released, free pages unmapped), bytes and
// the time the driver calls took, and the device synchronizations releases
// waited on first. Page moves to and from host are LMS's, counted there.
struct MapCosts {
  size_t map_bytes = 0;
  size_t map_ns = 0;
  size_t unmap_bytes = 0;
  size_t unmap_ns = 0;
  size_t release_syncs = 0;
  size_t release_sync_ns = 0;
};

} // namespace lms_pluggable
