/* Copyright 2026 The LMS Project Authors. All Rights Reserved.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
==============================================================================*/

// Large Model Support (LMS) for the BFC allocator: a page-mapped sub-allocator.
//
// The BFC allocator hands out pointers that the rest of TensorFlow keeps for
// the lifetime of a tensor, so LMS never moves a tensor to another address.
// Instead, the memory under a pointer is made of fixed-size physical pages
// mapped into one large reserved virtual address range (CUDA VMM:
// cuMemAddressReserve + cuMemCreate + cuMemMap).  Each page of that range is
// either
//   - kDevice:   backed by a device page (fast),
//   - kHost:     backed by a host page mapped at the same virtual address
//                (the data stays reachable at the same pointer, over the
//                interconnect), or
//   - kUnbacked: no physical memory (only ever inside free BFC chunks).
//
// Spilling ("swap out") copies a device page into a host page and remaps the
// host page at the same address; bringing back ("swap in") does the reverse.
// Defragmentation releases the device pages under free BFC chunks and maps
// them at new addresses: no tensor is moved.
//
// The physical pages come from an LmsPageBackend: the CUDA VMM backend lives in
// tensorflow/core/common_runtime/gpu/gpu_lms_page_backend.h; a host-only
// backend (memfd "device" and "host" page pools remapped with mmap MAP_FIXED,
// the same semantics on a machine without a GPU) is in
// lms_posix_page_backend.cc, for tests.

#ifndef TENSORFLOW_TSL_FRAMEWORK_LMS_SUB_ALLOCATOR_H_
#define TENSORFLOW_TSL_FRAMEWORK_LMS_SUB_ALLOCATOR_H_

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tensorflow/tsl/framework/allocator.h"
#include "tensorflow/tsl/platform/status.h"

namespace tsl {

// Counters of the LMS machinery of one BFC allocator (see
// BFCAllocator::GetLmsStats).
struct LmsStats {
  bool enabled = false;
  bool defrag_enabled = false;
  int64_t page_bytes = 0;              // Granularity of the page mapping.
  int64_t device_bytes_limit = 0;      // Device memory LMS may map.
  int64_t device_bytes_mapped = 0;     // Device pages mapped under pointers.
  int64_t device_bytes_reserved = 0;   // Device pages created (incl. pooled).
  int64_t host_bytes_limit = 0;        // TF_GPU_HOST_MEM_LIMIT_IN_MB.
  int64_t host_bytes_in_use = 0;       // Host pages mapped under pointers.
  int64_t peak_host_bytes_in_use = 0;
  int64_t host_bytes_reserved = 0;     // Host pages created (incl. pooled).
  int64_t host_reserve_bytes = 0;      // Idle host pages kept made ahead.
  int64_t host_bytes_made_ahead = 0;   // Host pages the filler made, in all.
  int64_t swap_out_ns = 0;             // Time spent copying and remapping
  int64_t swap_in_ns = 0;              // pages out / back in.
  int64_t bytes_swapped_out = 0;       // Device -> host page copies.
  int64_t bytes_swapped_in = 0;        // Host -> device page copies.
  int64_t num_swap_outs = 0;           // Pages spilled.
  int64_t num_swap_ins = 0;            // Pages brought back.
  int64_t num_reclaims = 0;            // Allocations served by the LMS slow path.
  int64_t num_defrag_events = 0;       // Slow paths that remapped free pages.
  int64_t bytes_defragmented = 0;      // Free device bytes remapped by defrag.
  int64_t num_failures = 0;            // Requests LMS could not serve.
  // Quiesced scopes (each synchronizes the device): spills, returns, defrag.
  int64_t num_device_syncs = 0;
  // Of those, returns of spilled data started by frees (one per batch).
  int64_t num_device_syncs_on_free = 0;

  // The launch gate of the page backend (process-wide; see
  // LmsPageBackend::Quiesce): while it is active, other threads' kernel
  // launches, copies and memsets wait while pages of live allocations move.
  // Counters come from the CUDA backend (launch_gate.* of the shared core).
  bool launch_gate_active = false;
  // 0 active, 1 no CUPTI library, 2 another CUPTI subscriber holds CUPTI
  // (TensorFlow's profiler, Nsight, compute-sanitizer), 3 CUPTI refused,
  // 4 off (TF_LMS_LAUNCH_GATE=0), 5 not tried (a backend without a gate).
  int64_t launch_gate_inactive_reason = 5;
  int64_t launch_gate_gated_calls = 0;     // API functions the gate watches.
  int64_t launch_gate_closes = 0;          // Moves that closed the gate.
  int64_t launch_gate_close_wait_ns = 0;   // Time closing waited for calls.
  int64_t launch_gate_calls_held = 0;      // Calls that waited at the gate.

  std::string DebugString() const;
};

// Physical pages that can be mapped into a reserved virtual address range.
// All calls are made with the owning allocator's lock held, except
// CreatePage(true, ...), which the sub-allocator's filler thread also makes
// (and DestroyPage(true, ...) at destruction): those two must be safe beside
// the other calls.
class LmsPageBackend {
 public:
  typedef uint64_t PageHandle;
  virtual ~LmsPageBackend() = default;

  virtual std::string Name() const = 0;
  // Page size: every address and size handed to the backend is a multiple.
  virtual size_t page_size() const = 0;
  // Reserves 'bytes' of virtual address space without backing; nullptr on
  // failure.
  virtual void* ReserveAddressRange(size_t bytes) = 0;
  virtual void ReleaseAddressRange(void* base, size_t bytes) = 0;
  // Creates one physical page on the device (host == false) or in host memory
  // that the device can access (host == true).
  virtual Status CreatePage(bool host, PageHandle* handle) = 0;
  virtual void DestroyPage(bool host, PageHandle handle) = 0;
  // Maps 'handle' at 'va' (one page) with read/write access.
  virtual Status Map(void* va, bool host, PageHandle handle) = 0;
  // Removes the mapping of the page at 'va' (the address stays reserved).
  virtual Status Unmap(void* va) = 0;
  // Copies the 'n' pages now mapped at 'va' (the pages 'from') into the
  // pages 'to' and maps those at 'va' in place of the old ones (which stay
  // alive: the caller recycles them).  The contents at 'va' are the same
  // before and after.  On an error every page at 'va' is mapped on its
  // 'from' page again, as before the call: a page under live data is never
  // left unmapped or on a page the caller recycles.  The error then says
  // so; should putting a page back fail too, it says that the data is lost.
  // TF_LMS_TEST_FAIL_REMAP=N (tests, read when the backend is made) fails
  // the backend's Nth page remap after its unmap (LmsRemapFaults).
  virtual Status Remap(void* va, size_t n, bool to_host,
                       const std::vector<PageHandle>& from,
                       const std::vector<PageHandle>& to) = 0;
  // Quiesce() is called before pages that may hold live data are copied or
  // unmapped, Resume() once they are in place again (always paired, on the
  // same thread, by LmsVirtualMemSubAllocator::QuietScope; pairs may nest).
  // Between them no device work may touch memory of this allocator: the CUDA
  // backend closes its launch gate (other threads' work submissions wait)
  // and synchronizes the device; Resume() opens the gate.
  virtual void Quiesce() {}
  virtual void Resume() {}
  // Adds the launch gate's state and counters (LmsStats::launch_gate_*).
  virtual void AddLaunchGateStats(LmsStats* stats) const {}
  virtual AllocatorMemoryType GetMemoryType() const {
    return AllocatorMemoryType::kDevice;
  }
};

// Host-only backend: "device" and "host" pages are pages of two memfd files,
// mapped with mmap(MAP_SHARED | MAP_FIXED).  Used where no GPU exists (tests,
// CI): same pointer-stability and budget semantics as the CUDA VMM backend.
std::unique_ptr<LmsPageBackend> CreatePosixLmsPageBackend(size_t page_size);

// A SubAllocator for BFCAllocator over an LmsPageBackend.  Without LMS it
// behaves like GpuVirtualMemAllocator (contiguous growth, coalescable regions)
// and never maps more than 'device_bytes_limit' of device pages.  The BFC
// allocator drives the LMS page operations below when LMS is enabled.
class LmsVirtualMemSubAllocator : public SubAllocator {
 public:
  enum class PageState : uint8_t { kUnbacked = 0, kDevice = 1, kHost = 2 };

  // Host pages are made ahead of need: once StartHostPagesAhead() was called
  // (by the BFC allocator, when 3/4 of the device budget is in use), a filler
  // thread creates host pages (off the allocator's lock, never while pages
  // move) until 'host_reserve_bytes' of idle ones wait in the pool, within
  // the host budget.  A first spill then copies at the
  // speed of a warm one instead of waiting for page creation (~4 GB/s).
  // kHostReserveAuto: 1/8 of the device budget, at most half the host one.
  static constexpr size_t kHostReserveAuto = ~size_t{0};

  // 'va_bytes' of address space is reserved up front (cheap); at most
  // 'device_bytes_limit' of device pages and 'host_bytes_limit' of host pages
  // are ever created.  'index' is passed to the visitors (the GPU id).
  static std::unique_ptr<LmsVirtualMemSubAllocator> Create(
      std::unique_ptr<LmsPageBackend> backend, size_t va_bytes,
      size_t device_bytes_limit, size_t host_bytes_limit,
      const std::vector<Visitor>& alloc_visitors = {},
      const std::vector<Visitor>& free_visitors = {}, int index = 0,
      size_t host_reserve_bytes = kHostReserveAuto);
  ~LmsVirtualMemSubAllocator() override;

  // SubAllocator.  Alloc maps fresh device pages at the end of the used
  // address range and fails (nullptr) when the device budget is exhausted.
  void* Alloc(size_t alignment, size_t num_bytes,
              size_t* bytes_received) override;
  void Free(void* ptr, size_t num_bytes) override;
  bool SupportsCoalescing() const override { return true; }
  AllocatorMemoryType GetMemoryType() const override {
    return backend_->GetMemoryType();
  }

  // ---- Page operations used by BFCAllocator (its lock held). ----
  size_t page_size() const { return page_size_; }
  // Device pages that can be mapped right now (pooled + not yet created).
  size_t DevicePagesAvailable() const;
  size_t HostPagesAvailable() const;
  PageState StateOf(const void* va) const;
  // Number of pages in [p, p + bytes) in the given state.
  size_t CountPages(const void* p, size_t bytes, PageState state) const;
  // Spills the device pages of [p, p + bytes) to host pages.  Stops with
  // ResourceExhausted when the host budget is exhausted.
  Status SpillRange(const void* p, size_t bytes, size_t* pages_spilled);
  // Brings back host pages of [p, p + bytes) while device pages are
  // available.
  Status FetchRange(const void* p, size_t bytes, size_t* pages_fetched);
  // Unmaps the pages of [p, p + bytes) (must hold no live data; only the host
  // pages with 'host_only') and recycles their physical pages.  Returns the
  // number of device pages released.
  size_t ReleaseRange(const void* p, size_t bytes, size_t* host_released,
                      bool host_only = false);
  // Maps device pages under the unbacked pages of [p, p + bytes).  Fails when
  // not enough device pages are available (nothing is mapped then).
  Status BackRange(const void* p, size_t bytes);
  // Starts making host pages ahead of need (the first call; see
  // kHostReserveAuto).  Not on mapping: a pool made without growth maps the
  // whole device budget at its first allocation.
  void StartHostPagesAhead() {
    if (!filler_started_) StartFiller();
  }
  // While one lives, pages that may be in use can be copied and unmapped:
  // the backend is quiesced (LmsPageBackend::Quiesce) from its construction
  // to its destruction, on every path out of the scope.  Scopes nest; the
  // outermost ones are counted (quiet_scopes()).
  class QuietScope {
   public:
    explicit QuietScope(LmsVirtualMemSubAllocator* a) : a_(a) {
      a_->BeginQuiet();
    }
    ~QuietScope() { a_->EndQuiet(); }

   private:
    LmsVirtualMemSubAllocator* const a_;
    QuietScope(const QuietScope&) = delete;
    void operator=(const QuietScope&) = delete;
  };
  // While one lives, the host pool's filler makes no page: its driver calls
  // would contend with the slow path's (the driver serialises them).
  // QuietScopes pause it too.
  class FillerPause {
   public:
    explicit FillerPause(LmsVirtualMemSubAllocator* a) : a_(a) {
      a_->PauseFiller(+1);
    }
    ~FillerPause() { a_->PauseFiller(-1); }

   private:
    LmsVirtualMemSubAllocator* const a_;
    FillerPause(const FillerPause&) = delete;
    void operator=(const FillerPause&) = delete;
  };
  void AddLaunchGateStats(LmsStats* stats) const {
    backend_->AddLaunchGateStats(stats);
  }

  size_t device_bytes_limit() const { return device_limit_pages_ * page_size_; }
  size_t host_bytes_limit() const { return host_limit_pages_ * page_size_; }
  size_t device_pages_mapped() const { return device_mapped_; }
  size_t host_pages_mapped() const { return host_mapped_; }
  size_t peak_host_pages_mapped() const { return peak_host_mapped_; }
  size_t device_pages_created() const { return device_created_; }
  // Host pages created, idle ones and those made ahead included.
  size_t host_pages_created() const;
  size_t host_reserve_pages() const { return host_reserve_pages_; }
  int64_t spill_ns() const { return spill_ns_; }
  int64_t fetch_ns() const { return fetch_ns_; }
  // Host pages the filler made so far (whether used since or not).
  size_t host_pages_made_ahead() const;
  // Outermost QuietScopes opened so far.
  size_t quiet_scopes() const { return quiet_scopes_; }
  const std::string& backend_name() const { return backend_name_; }
  const LmsPageBackend* backend() const { return backend_.get(); }
  // True if 'p' lies in this allocator's reserved address range.
  bool Owns(const void* p) const;

 private:
  LmsVirtualMemSubAllocator(std::unique_ptr<LmsPageBackend> backend,
                            char* base, size_t va_bytes,
                            size_t device_bytes_limit, size_t host_bytes_limit,
                            const std::vector<Visitor>& alloc_visitors,
                            const std::vector<Visitor>& free_visitors,
                            int index, size_t host_reserve_bytes);
  struct Page {
    PageState state = PageState::kUnbacked;
    LmsPageBackend::PageHandle handle = 0;
  };
  size_t PageIndex(const void* p) const;
  // First and one-past-last page index overlapping [p, p + bytes).
  void PageSpan(const void* p, size_t bytes, size_t* first,
                size_t* last) const;
  Status TakePage(bool host, LmsPageBackend::PageHandle* h);
  void RecyclePage(bool host, LmsPageBackend::PageHandle h);
  // Moves pages [i, i + to.size()), all on the other side now, onto the
  // pages 'to' (host pages when 'to_host'), and recycles the pages they were
  // on.  On an error every page stays where it was (LmsPageBackend::Remap)
  // and the pages 'to' are recycled.
  Status MoveRun(size_t i, bool to_host,
                 const std::vector<LmsPageBackend::PageHandle>& to);
  Status MapFresh(size_t index, bool host);
  void BeginQuiet();
  void EndQuiet();
  void PauseFiller(int delta);
  // Starts the filler (once) when host pages are to be made ahead.
  void StartFiller();
  void FillerLoop();
  void StopFiller();
  struct StopFillersAtExit;

  std::unique_ptr<LmsPageBackend> backend_;
  const std::string backend_name_;
  const size_t page_size_;
  char* const base_;
  const size_t va_bytes_;
  const size_t device_limit_pages_;
  const size_t host_limit_pages_;
  const int index_;
  size_t next_page_ = 0;  // First page never handed out by Alloc.
  std::vector<Page> pages_;
  std::vector<LmsPageBackend::PageHandle> device_pool_;
  size_t device_created_ = 0;
  size_t device_mapped_ = 0, host_mapped_ = 0, peak_host_mapped_ = 0;
  size_t quiet_depth_ = 0, quiet_scopes_ = 0;
  int64_t spill_ns_ = 0, fetch_ns_ = 0;

  // The host pool and its filler.  pool_mu_ guards the fields below it; it
  // is never held across a backend call made by the filler.  Invariant:
  // host_created_ + host_making_ <= host_limit_pages_ (pages being made by
  // the filler are charged to the budget before they exist).
  const size_t host_reserve_pages_;
  bool filler_started_ = false;  // under the allocator's lock
  mutable std::mutex pool_mu_;
  std::condition_variable filler_cv_;
  std::vector<LmsPageBackend::PageHandle> host_pool_;
  size_t host_created_ = 0;
  size_t host_making_ = 0;
  size_t host_made_ahead_ = 0;
  int filler_paused_ = 0;      // open FillerPauses and QuietScopes
  bool filler_stop_ = false;
  std::unique_ptr<std::thread> filler_;
  pid_t filler_pid_ = 0;       // a forked child has the object, not the thread

  LmsVirtualMemSubAllocator(const LmsVirtualMemSubAllocator&) = delete;
  void operator=(const LmsVirtualMemSubAllocator&) = delete;
};

// Reads TF_GPU_HOST_MEM_LIMIT_IN_MB (the variable upstream uses for the
// gpu_host_bfc allocator); 'default_bytes' when unset or unparsable.
size_t LmsHostMemLimitFromEnv(size_t default_bytes);

// The LMS page for a device budget of 'device_bytes': TF_LMS_PAGE_IN_MB when
// set (a power of two from 2 to 1024), else the largest power of two of at
// most 1/256 of the budget, within [2 MiB, 64 MiB].  A move's cost is
// dominated by the driver's per-mapping work, so larger pages move faster
// (H100: warm spill 0.25 of a pinned copy with 2 MiB pages, 0.5 with 8 MiB,
// 0.7 with 32 MiB, 0.87 with 64 MiB); smaller ones spill less of a victim's
// neighbours.  The backend rounds it up to the driver's granularity.
size_t LmsPageBytes(size_t device_bytes);

// Reads TF_LMS_HOST_RESERVE_IN_MB: MiB of host pages to make ahead of need
// (0 disables); kHostReserveAuto when unset, "auto" or unparsable.
size_t LmsHostReserveFromEnv();

// For LmsPageBackend::Remap implementations.  A backend counts its page
// remaps in one LmsRemapFaults: Next() is an error for the remap that
// TF_LMS_TEST_FAIL_REMAP names (counted from 1; none when unset or not a
// positive number), for tests of the error path, OK otherwise.  Callers hold
// the allocator's lock.
class LmsRemapFaults {
 public:
  LmsRemapFaults();
  Status Next(const char* call);

 private:
  const size_t fail_at_;
  size_t count_ = 0;
};
// The error a failed Remap returns: the move's error 'failed', and, when
// putting a page back failed too ('back' not OK), that its data is lost.
Status LmsRemapFailed(const Status& failed, const Status& back);

// Whether the page backend's launch gate is wanted: false when
// TF_LMS_LAUNCH_GATE is 0, false, False, FALSE, off or no; true otherwise.
bool LmsLaunchGateWantedFromEnv();

}  // namespace tsl

#endif  // TENSORFLOW_TSL_FRAMEWORK_LMS_SUB_ALLOCATOR_H_
