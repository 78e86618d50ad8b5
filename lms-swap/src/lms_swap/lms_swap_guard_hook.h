#pragma once
// The eviction net's hook in the CUDA caching allocator (lms_swap_guard.cpp): how the net
// sees the failing request.  The allocator object's `allocate` entry is redirected, in a
// private copy of its virtual table, to a function that calls the original and catches its
// OutOfMemoryError (exact size, after the allocator's own retries, with no allocator lock
// held): the net (Guard::on_oom) makes room and the request is asked again, at most 16
// times.  Nothing else of the allocator changes.
//
// Invariants: the allocator's table pointer changes by one aligned store, so a caller sees
// the old table or the new one, both valid; the copy of the table (g_vtable) and the
// original entry (g_allocate) are written before that store and never again.  Only
// lms_swap_guard_attach.h redirects.
//
// Part of lms_swap_guard.cpp's one translation unit, like each lms_swap_guard_*.h: what it
// defines has internal linkage (an unnamed namespace), so it is included from there only.
#include "lms_swap_guard_eviction.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

// ---- the allocator's `allocate`, redirected -----------------------------------------
using AllocateFn = c10::DataPtr (*)(c10::Allocator*, size_t);
AllocateFn g_allocate = nullptr;   // the allocator's own
std::vector<void*> g_vtable;       // the private copy of its virtual table

// Itanium C++ ABI: a member function is called with the hidden return-slot pointer first
// and `this` second, exactly as this free function with `self` first is.
std::atomic<int64_t> g_allocations{0};

c10::DataPtr guarded_allocate(c10::Allocator* self, size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  for (int attempt = 0;; ++attempt) {
    try {
      c10::DataPtr p = g_allocate(self, n);
      if (attempt > 0) Guard::get().served_++;
      return p;
    } catch (const c10::OutOfMemoryError& e) {
      Guard& g = Guard::get();
      if (attempt < 16 && g.on_oom(c10::cuda::current_device(), n, attempt)) continue;
      if (!g.armed()) throw;
      TORCH_CHECK_WITH(OutOfMemoryError, false, g.explain(e.msg(), n));
    }
  }
}

// The slot of c10::Allocator::allocate in a virtual table (Itanium ABI member pointer).
size_t allocate_slot() {
  auto pmf = &c10::Allocator::allocate;
  struct {
    uintptr_t ptr;
    ptrdiff_t adj;
  } raw{};
  static_assert(sizeof(pmf) == sizeof(raw), "unexpected member pointer layout");
  std::memcpy(&raw, &pmf, sizeof raw);
#if defined(__aarch64__) || defined(__arm__)
  TORCH_CHECK(raw.adj & 1, "LMS guard: allocate is not virtual");
  return raw.ptr / sizeof(void*);
#else
  TORCH_CHECK((raw.ptr & 1) && raw.adj == 0, "LMS guard: allocate is not virtual");
  return (raw.ptr - 1) / sizeof(void*);
#endif
}

// Bytes readable from `p` on in its mapping (bounds the copy of the virtual table).
size_t readable_from(const void* p) {
  FILE* f = std::fopen("/proc/self/maps", "r");
  TORCH_CHECK(f != nullptr, "LMS guard: cannot read /proc/self/maps");
  uintptr_t a = reinterpret_cast<uintptr_t>(p), lo = 0, hi = 0;
  char perms[8];
  size_t out = 0;
  while (std::fscanf(f, "%lx-%lx %7s %*[^\n]", &lo, &hi, perms) == 3) {
    if (a >= lo && a < hi && perms[0] == 'r') {
      out = hi - a;
      break;
    }
  }
  std::fclose(f);
  return out;
}

void redirect_allocate() {
  c10::Allocator* alloc = c10::cuda::CUDACachingAllocator::get();
  TORCH_CHECK(alloc != nullptr, "LMS guard: no CUDA caching allocator");
  void** vtable = *reinterpret_cast<void***>(alloc);
  const size_t slot = allocate_slot();
  // entries from offset-to-top and typeinfo (two before the address point) on
  const size_t avail = readable_from(vtable - 2) / sizeof(void*);
  const size_t count = std::min<size_t>(avail, 2 + 1024);
  TORCH_CHECK(count > 2 + slot, "LMS guard: virtual table too short");
  g_vtable.assign(vtable - 2, vtable - 2 + count);
  g_allocate = reinterpret_cast<AllocateFn>(g_vtable[2 + slot]);
  g_vtable[2 + slot] = reinterpret_cast<void*>(&guarded_allocate);
  // one aligned pointer store: callers see the old table or the new one, both valid
  __atomic_store_n(reinterpret_cast<void***>(alloc), g_vtable.data() + 2, __ATOMIC_RELEASE);
}

}  // namespace
