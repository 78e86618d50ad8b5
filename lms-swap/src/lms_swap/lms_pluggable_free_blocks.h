#pragma once
// The pluggable LMS allocator's free blocks (lms_pluggable_free_blocks.cpp):
// best fit per stream, splitting and merging inside a segment.
//
// A freed block serves later requests of its segment's stream at once (that
// stream's order keeps them apart); a block other streams used comes here
// only after their events completed (the allocator's pending list). Requests
// up to kSmallRequest bytes are served from the small pool's segments, the
// others from the large pool's, as upstream's caching allocator does.
#include "lms_pluggable_segments.h"

#include <cstddef>
#include <cstdint>
#include <set>

namespace lms_pluggable {

constexpr size_t kRound = 512; // every block is a multiple of this
constexpr size_t kSmallRequest = size_t(1) << 20; // up to this: small pool
constexpr size_t kMinLargeSplit = size_t(1) << 20; // large remainders kept apart

class FreeBlocks {
 public:
  FreeBlocks() = default;
  FreeBlocks(const FreeBlocks&) = delete;
  FreeBlocks& operator=(const FreeBlocks&) = delete;

  // The smallest free block of `stream` in the pool of `small` that holds
  // `size` bytes, cut to that size (its rest stays free); nullptr if none.
  Block* take(size_t size, cudaStream_t stream, bool small);

  // Keeps the first `size` bytes in b (not listed); the rest becomes a free
  // block when it is worth keeping apart.
  void cut(Block* b, size_t size);

  // A mapped block no stream uses any more: merged with its free mapped
  // neighbours, listed.
  void add(Block* b);

  // Takes a free block off its list (its segment is being released).
  void remove(Block* b) {
    pool(b->seg->small).erase(b);
  }

  size_t bytes() const;

 private:
  // by stream, then size, then address
  struct Order {
    bool operator()(const Block* a, const Block* b) const {
      if (a->stream != b->stream) {
        return reinterpret_cast<uintptr_t>(a->stream) <
            reinterpret_cast<uintptr_t>(b->stream);
      }
      if (a->size != b->size) {
        return a->size < b->size;
      }
      return a->ptr < b->ptr;
    }
  };
  using Pool = std::set<Block*, Order>;

  Pool& pool(bool small) {
    return small ? small_ : large_;
  }

  Pool small_;
  Pool large_;
};

} // namespace lms_pluggable
