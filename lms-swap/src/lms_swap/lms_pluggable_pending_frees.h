#pragma once
// The pluggable LMS allocator's pending frees (lms_pluggable_pending_frees.cpp):
// blocks freed while streams other than their own still used them, or whose
// own stream must be done with them first.
//
// PyTorch frees a block as soon as its tensor dies, before the streams that
// used it (record_stream) are done with it. Such a block waits here for an
// event recorded on each of those streams, and goes to the free blocks only
// when the last has completed; a block only its own stream used goes there at
// once (that stream's order keeps its users apart), unless the allocator asks
// for its own stream too (a block whose host pages are to be unmapped).
// Events are reused and never destroyed: frees arrive during interpreter exit.
#include "lms_pluggable_free_blocks.h"

#include <cuda_runtime_api.h>

#include <deque>
#include <functional>
#include <utility>
#include <vector>

namespace lms_pluggable {

class PendingFrees {
 public:
  // `list`: takes a block no stream uses any more (to the free blocks).
  explicit PendingFrees(std::function<void(Block*)> list)
      : list_(std::move(list)) {}
  PendingFrees(const PendingFrees&) = delete;
  PendingFrees& operator=(const PendingFrees&) = delete;

  // A block just freed (not allocated): an event on each stream in b->uses
  // (then cleared), or listed at once where none.
  void add(Block* b);

  // Blocks whose last event completed are listed, oldest first,
  // up to the first event not yet done; `wait`: waits for every event.
  void collect(bool wait);

  bool empty() const {
    return pending_.empty();
  }

 private:
  cudaEvent_t take_event();

  std::function<void(Block*)> list_;
  std::deque<std::pair<cudaEvent_t, Block*>> pending_;
  std::vector<cudaEvent_t> idle_; // completed events, for reuse
};

} // namespace lms_pluggable
