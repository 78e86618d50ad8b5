#pragma once
// The eviction net's slot (lms_swap_guard.cpp): one saved tensor the policy kept on the
// device, which the net may move to host memory, and the host memory its copy goes to.
// A slot holds the tensor's device memory (`dev`) until an eviction commits; from then on
// it is evicted for good, its bytes in `host`.  Built with LMS_GUARD_C10_ONLY, a slot
// holds a c10::Storage instead of an at::Tensor.
//
// Invariants:
// - g_resident counts the slots that hold device memory: one more where a slot is
//   registered, one less where an eviction commits or a resident slot is destroyed.
// - g_host_bytes counts the host bytes the net took for its copies: added under the host
//   budget before the memory is mapped (Guard::take_host), taken off where the mapping
//   failed or the memory is unmapped (host_free).
//
// Part of lms_swap_guard.cpp's one translation unit, like each lms_swap_guard_*.h: what it
// defines has internal linkage (an unnamed namespace), so it is included from there only.
#ifdef LMS_GUARD_C10_ONLY
#include <c10/core/Storage.h>
#else
#include <torch/extension.h>
#endif

#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <system_error>
#include <thread>
#include <vector>

namespace {

// What a slot keeps on the device while it is resident: its owners are the storage's
// owners, its bytes the tensor's (at its offset), and dropping it frees the memory.
#ifdef LMS_GUARD_C10_ONLY
using Resident = c10::Storage;
int64_t owners_of(const Resident& r) { return static_cast<int64_t>(r.use_count()); }
const void* bytes_of(const Resident& r) { return r.data(); }
bool held(const Resident& r) { return static_cast<bool>(r); }
#else
using Resident = at::Tensor;
int64_t owners_of(const Resident& t) { return static_cast<int64_t>(t.storage().use_count()); }
const void* bytes_of(const Resident& t) { return t.data_ptr(); }
bool held(const Resident& t) { return t.defined(); }
#endif

struct HostBuffer {
  void* ptr = nullptr;
  size_t nbytes = 0;
};

std::atomic<int64_t> g_host_bytes{0};
std::atomic<int64_t> g_resident{0};  // slots holding device memory

// Anonymous memory for `n` bytes with every page already faulted in, or nullptr.  The
// driver's copy into pages it must fault in one by one ran at 1.5 GB/s on the H100
// machine, and MAP_POPULATE, which faults them in from one thread, at 2.7 GB/s: that
// was most of what one intervention of the net cost (examples/pytorch/benchmarks/
// net_cost.py).  Here huge pages are asked for and the pages are written from several
// threads, each over its own part.
void* map_populated(size_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  (void)madvise(p, n, MADV_HUGEPAGE);  // where the kernel allows it; 4 KiB pages else
  constexpr size_t kPage = 4096, kPart = 64 << 20;
  auto touch = [p](size_t from, size_t to) {
    volatile char* c = static_cast<volatile char*>(p);
    for (size_t o = from; o < to; o += kPage) c[o] = 0;
  };
  const size_t threads = std::min<size_t>(
      std::max(1u, std::min(8u, std::thread::hardware_concurrency())), (n + kPart - 1) / kPart);
  if (threads <= 1) {
    touch(0, n);
    return p;
  }
  const size_t part = (n / threads + kPage - 1) / kPage * kPage;
  std::vector<std::thread> pool;
  try {
    for (size_t i = 1; i < threads; ++i) {
      pool.emplace_back(touch, std::min(n, i * part), std::min(n, (i + 1) * part));
    }
  } catch (const std::system_error&) {  // no thread to be had: the rest on this one
    touch(pool.size() * part + part, n);
  }
  touch(0, std::min(n, part));
  for (auto& t : pool) t.join();
  return p;
}

void host_free(void* p, size_t n) {
  if (p != nullptr) {
    munmap(p, n);
    g_host_bytes -= static_cast<int64_t>(n);
  }
}

// `dev` changes only under the net's mu_ (read it there too: Guard::resident_of); `host`
// is written before `evicted` is set (release) and never changes after it; nbytes,
// device and ready are set before the slot is registered.
struct Slot {
  Resident dev;            // while resident
  HostBuffer host;         // after an eviction
  int64_t nbytes = 0;
  int device = -1;
  std::atomic<bool> evicted{false};
  bool moving = false;     // claimed by an eviction in progress (under mu_)
  // recorded on the stream that was current when the slot was made: the net's copy
  // waits for it (the tensor may have been written on a side stream).  nullptr with
  // order_by_device: no event could be made, the copy waits for the whole device.
  cudaEvent_t ready = nullptr;
  bool order_by_device = false;
  ~Slot() {
    if (!evicted.load()) g_resident--;
    host_free(host.ptr, host.nbytes);
    if (ready != nullptr && cudaEventDestroy(ready) != cudaSuccess) (void)cudaGetLastError();
  }
};

int64_t mem_available() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t kb = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "MemAvailable: %ld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

}  // namespace
