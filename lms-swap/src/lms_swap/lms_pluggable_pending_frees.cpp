// The pluggable LMS allocator's pending frees: see lms_pluggable_pending_frees.h.
#include "lms_pluggable_pending_frees.h"

#include <c10/cuda/CUDAException.h>

namespace lms_pluggable {

void PendingFrees::add(Block* b) {
  for (cudaStream_t s : b->uses) {
    cudaEvent_t ev = take_event();
    C10_CUDA_CHECK(cudaEventRecord(ev, s));
    pending_.emplace_back(ev, b);
    ++b->events;
  }
  b->uses.clear();
  if (b->events == 0) {
    list_(b);
  }
}

void PendingFrees::collect(bool wait) {
  while (!pending_.empty()) {
    auto [ev, b] = pending_.front();
    if (wait) {
      C10_CUDA_CHECK(cudaEventSynchronize(ev));
    } else {
      const cudaError_t st = cudaEventQuery(ev);
      if (st == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return;
      }
      C10_CUDA_CHECK(st);
    }
    pending_.pop_front();
    idle_.push_back(ev);
    if (--b->events == 0 && !b->allocated) {
      list_(b);
    }
  }
}

cudaEvent_t PendingFrees::take_event() {
  if (!idle_.empty()) {
    cudaEvent_t ev = idle_.back();
    idle_.pop_back();
    return ev;
  }
  cudaEvent_t ev = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  return ev;
}

} // namespace lms_pluggable
