#pragma once
// The eviction net's running peak (lms_swap_guard.cpp): per device, the requested device
// bytes at their highest since lms_swap marked the level (mark_peak at each backward's
// start: backward's exact peak every step, without resetting the program's own
// max_memory_allocated), and a count of the segments the allocator released (how lms_swap
// sees a step that ran the allocator to its edge).
//
// Invariants: the levels, peaks and counts are atomics that change only in the allocator's
// trace callback (track, under that device's allocator lock), when the tracker is attached
// (attach_tracker, before the allocator is redirected) and at a mark (the module's
// mark_peak); no lock of the net's is taken for them.  A device outside [0, kMaxDevices) is
// not tracked.
//
// Part of lms_swap_guard.cpp's one translation unit, like each lms_swap_guard_*.h: what it
// defines has internal linkage (an unnamed namespace), so it is included from there only.
#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>

namespace {

// ---- a running peak of requested bytes per device ------------------------------------
// Fed by the allocator's trace callbacks (called under that device's allocator lock for
// every allocation and free request; nothing else is recorded unless the program turns
// the allocator's history on).  Levels count from the moment of attachment, so only
// differences mean anything: peak_growth() is the highest level since mark_peak() less
// the level at the mark.
constexpr int kMaxDevices = 64;
std::atomic<int64_t> g_level[kMaxDevices];
std::atomic<int64_t> g_peak[kMaxDevices];
std::atomic<int64_t> g_mark[kMaxDevices];
std::atomic<int64_t> g_released[kMaxDevices];  // segments the allocator gave back

void track(const c10::cuda::CUDACachingAllocator::TraceEntry& te) {
  using TE = c10::cuda::CUDACachingAllocator::TraceEntry;
  const int d = static_cast<int>(te.device_);
  if (d < 0 || d >= kMaxDevices) return;
  if (te.action_ == TE::ALLOC) {
    const int64_t now =
        g_level[d].fetch_add(static_cast<int64_t>(te.size_), std::memory_order_relaxed) +
        static_cast<int64_t>(te.size_);
    int64_t p = g_peak[d].load(std::memory_order_relaxed);
    while (now > p && !g_peak[d].compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  } else if (te.action_ == TE::FREE_REQUESTED) {
    g_level[d].fetch_sub(static_cast<int64_t>(te.size_), std::memory_order_relaxed);
  } else if (te.action_ == TE::SEGMENT_FREE || te.action_ == TE::SEGMENT_UNMAP) {
    // the allocator released cached memory: to serve a request it could not (a
    // retry, which synchronises the device), or at the program's empty_cache()
    g_released[d].fetch_add(1, std::memory_order_relaxed);
  }
}

void attach_tracker() {
  for (int d = 0; d < kMaxDevices; ++d) {
    g_level[d] = 0;
    g_peak[d] = 0;
    g_mark[d] = 0;
    g_released[d] = 0;
  }
  c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(&track);
}

}  // namespace
