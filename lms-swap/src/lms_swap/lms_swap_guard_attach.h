#pragma once
// How the eviction net is put under the CUDA caching allocator (lms_swap_guard.cpp):
// arm_once attaches the running peak's trace tracker (lms_swap_guard_peak.h), then
// redirects the allocator's `allocate` (lms_swap_guard_hook.h).
//
// Invariants: the net goes under PyTorch's native caching allocator only, and once (under
// g_arm_mu); arming it again only checks that the allocator and its table are still the
// ones it redirected.  What it refuses, it refuses before changing anything.
//
// Part of lms_swap_guard.cpp's one translation unit, like each lms_swap_guard_*.h: what it
// defines has internal linkage (an unnamed namespace), so it is included from there only.
#include "lms_swap_guard_hook.h"
#include "lms_swap_guard_peak.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

namespace {

// Whether `fn` lies in the shared object that holds `anchor` (unknown: true).
bool same_object(const void* fn, const void* anchor) {
  Dl_info a{}, b{};
  if (dladdr(fn, &a) == 0 || dladdr(anchor, &b) == 0) return true;
  return a.dli_fbase == b.dli_fbase;
}

std::mutex g_arm_mu;
c10::Allocator* g_redirected = nullptr;  // the allocator whose table is ours (under g_arm_mu)

// Puts the net under the CUDA allocator, once; later calls check that nothing changed.
// Refused (an error, nothing changed) for any allocator but PyTorch's native caching
// allocator: a pluggable allocator has no trace trackers, and redirecting a table that
// is not the native one's (a wrapper's, or one already redirected) would make every
// allocation call itself.  The tracker is attached before the table is redirected, so a
// failure leaves the allocator as it was.
void arm_once() {
  std::lock_guard<std::mutex> lk(g_arm_mu);
  auto* alloc = c10::cuda::CUDACachingAllocator::get();
  TORCH_CHECK(alloc != nullptr, "LMS guard: no CUDA caching allocator");
  void** vtable = *reinterpret_cast<void***>(alloc);
  if (g_redirected != nullptr) {
    TORCH_CHECK(g_redirected == alloc && vtable == g_vtable.data() + 2,
                "LMS guard: the CUDA allocator changed since the net was armed");
    return;
  }
  const std::string name = alloc->name();
  TORCH_CHECK(name == "native", "LMS guard: the CUDA allocator is '", name,
              "', not PyTorch's native caching allocator");
  const void* entry = vtable[allocate_slot()];
  TORCH_CHECK(entry != reinterpret_cast<const void*>(&guarded_allocate) &&
                  same_object(entry, &c10::cuda::CUDACachingAllocator::allocator),
              "LMS guard: the CUDA allocator's allocate is not the caching allocator's own "
              "(wrapped or redirected already)");
  attach_tracker();
  redirect_allocate();
  g_redirected = alloc;
}

}  // namespace
