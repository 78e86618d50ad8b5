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
  // Quiesce rounds given up because the gate did not close or the devices
  // did not drain within their bound (TF_LMS_QUIESCE_WAIT_MS, doubled per
  // round): work queued on one GPU waited for a launch the gate held on
  // another (a collective's partner kernel).  The gate was opened and the
  // round started over.
  int64_t launch_gate_quiesce_retries = 0;

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
  // Where a page of a failed Remap is left (see Remap).
  enum class Placed : uint8_t {
    kOnFrom = 0,  // mapped on its old page: the new one may be recycled
    kOnTo = 1,    // mapped on its new page (a full copy): the old one may
    kUnmapped = 2,  // neither: both pages hold the data; neither may be
                    // recycled until the page is mapped again
  };
  // Copies the 'n' pages now mapped at 'va' (the pages 'from') into the
  // pages 'to' and maps those at 'va' in place of the old ones (which stay
  // alive: the caller recycles them).  The contents at 'va' are the same
  // before and after.  On an error the backend puts the moved pages back on
  // their 'from' pages, trying every page even after a put-back failed, and
  // says in 'placed' (n entries) where each page is left; a page whose
  // put-back failed stays on its new page when it can (the copy is whole),
  // else it is kUnmapped.  The caller recycles only pages no longer mapped
  // (a page recycled while mapped would be mapped at a second address: two
  // tensors sharing memory).
  // Fault injection (tests, read when the backend is made; LmsRemapFaults):
  // TF_LMS_TEST_FAIL_REMAP=N[,M...] fails the backend's Nth (Mth...) page
  // map of a move, put-backs counted too; TF_LMS_TEST_FAIL_CREATE=N fails
  // the Nth and every later device page creation.
  virtual Status Remap(void* va, size_t n, bool to_host,
                       const std::vector<PageHandle>& from,
                       const std::vector<PageHandle>& to,
                       std::vector<Placed>* placed) = 0;
  // Whether pages of live data may move now: OK when the backend's launch
  // gate is active; else FailedPrecondition saying why and what to do
  // (LmsLiveMovesAllowed).  Backends without a gate report reason 5.
  virtual Status LiveMovesAllowed() const;
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
  // Device pages that can be mapped right now (pooled + not yet created
  // within the budget; after a device page creation failed, pooled only:
  // the driver's memory, not the budget, is the bound then, and LMS spills
  // to make room instead of counting on pages it cannot create).
  size_t DevicePagesAvailable() const;
  size_t HostPagesAvailable() const;
  PageState StateOf(const void* va) const;
  // Number of pages in [p, p + bytes) in the given state.
  size_t CountPages(const void* p, size_t bytes, PageState state) const;
  // Spills the device pages of [p, p + bytes) to host pages.  Stops with
  // ResourceExhausted when the host budget is exhausted.  SpillRange and
  // FetchRange move pages of live data: without an active launch gate they
  // move nothing and fail (FailedPrecondition, LmsLiveMovesAllowed) unless
  // TF_LMS_UNSAFE_MOVE_WITHOUT_GATE=1 was set when this was made.
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
  // not enough device pages are available or the driver fails (nothing it
  // mapped stays mapped then).
  Status BackRange(const void* p, size_t bytes);
  // OK unless a failed move left a page of live data unmapped (both its
  // copies kept) and mapping it again fails now too: then the error says
  // where and why, and the allocator serves nothing until it is repaired
  // (retried at each call), so that no work is handed memory next to a
  // hole.  Call with the allocator's lock held, in a QuietScope.
  Status RepairHoles();
  size_t holes() const { return holes_.size(); }
  // Gives back (destroys) idle host pages above a watermark: the most host
  // pages in use since the last trim, or the reserve, whichever is more.
  // Pinned memory returns to the system after a spike, while a steady
  // training loop keeps what its next step spills into (creating pinned
  // pages runs at a tenth of the copy).  Called after a return that brought
  // every spilled page back; returns the pages given back.
  size_t TrimHostPool();
  // The last driver error of BackRange (OK if none since cleared).
  const Status& last_map_error() const { return last_map_error_; }
  void clear_last_map_error() { last_map_error_ = OkStatus(); }
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
  // The setting the host budget came from, named in errors (default
  // "TF_GPU_HOST_MEM_LIMIT_IN_MB"; the GPU wiring sets the config option's
  // name when that set it).
  void set_host_limit_setting(const std::string& s) { host_limit_setting_ = s; }
  const std::string& host_limit_setting() const { return host_limit_setting_; }
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
  // on.  On an error each page is where the backend says (Remap's
  // 'placed'): only pages nothing maps are recycled, and a page left
  // unmapped becomes a hole (RepairHoles).
  void SetMoved(size_t i, bool to_host, LmsPageBackend::PageHandle h);
  Status MoveRun(size_t i, bool to_host,
                 const std::vector<LmsPageBackend::PageHandle>& to);
  // SpillRange (to_host) and FetchRange (!to_host): moves the pages of
  // [p, p + bytes) that are on the other side, in runs (MoveRun), while pages
  // to move onto can be taken; counts the pages moved in '*pages_moved' and
  // the time in spill_ns_ or fetch_ns_.
  Status MoveRange(bool to_host, const void* p, size_t bytes,
                   size_t* pages_moved);
  Status MapFresh(size_t index, bool host);
  // OK when pages of live data may move (gate active or the unsafe opt-in).
  Status LiveMovesAllowed();
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
  // Device pages that may still be created: the budget's, 0 once a creation
  // failed (see DevicePagesAvailable).
  size_t device_creatable_ = 0;
  // A page of live data left unmapped by a failed move: both copies are
  // kept (neither is recycled) until it is mapped again (RepairHoles).
  struct Hole {
    size_t index;
    LmsPageBackend::PageHandle to;  // the new copy; pages_[index] has the old
    Status why;
  };
  std::vector<Hole> holes_;
  Status last_map_error_;
  const bool unsafe_moves_;       // TF_LMS_UNSAFE_MOVE_WITHOUT_GATE=1
  bool warned_unsafe_ = false;
  std::string host_limit_setting_ = "TF_GPU_HOST_MEM_LIMIT_IN_MB";
  size_t device_mapped_ = 0, host_mapped_ = 0, peak_host_mapped_ = 0;
  size_t window_peak_host_ = 0;  // the most host pages mapped since a trim
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
// gpu_host_bfc allocator); 'default_bytes' when unset.  A value that is not a
// whole number of MiB (negative, junk) is refused with an error naming the
// variable, and 'default_bytes' used; one above kLmsMaxHostMemLimitMiB or
// the machine's physical memory is capped there, with a warning (no
// 'mb << 20' wraps around).
size_t LmsHostMemLimitFromEnv(size_t default_bytes);
// The same check for a value of 'mb' MiB that 'setting' (e.g. the config
// option's name) gave.
size_t LmsHostMemLimitBytes(long long mb, const char* setting,
                            size_t default_bytes);
constexpr long long kLmsMaxHostMemLimitMiB = 1LL << 30;  // 1 PiB

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

// For LmsPageBackend implementations.  A backend counts its page maps in
// moves (forward and put-back) in one LmsRemapFaults: Next() is an error for
// each one that TF_LMS_TEST_FAIL_REMAP lists (comma-separated, counted from
// 1; none when unset or not positive numbers), OK otherwise; Create() is an
// error for the device page creation TF_LMS_TEST_FAIL_CREATE names and every
// later one (a driver out of memory).  For tests of the error paths.
class LmsRemapFaults {
 public:
  LmsRemapFaults();
  Status Next(const char* call);  // callers hold the allocator's lock
  Status Create(bool host);       // thread-safe

 private:
  const std::vector<size_t> fail_at_;
  const size_t fail_create_at_;
  size_t count_ = 0;
  std::mutex create_mu_;
  size_t creates_ = 0;
};
// The error a failed Remap returns: the move's error 'failed' and where its
// pages are left ('placed'; 'back' the first put-back error, if any).
Status LmsRemapFailed(const Status& failed,
                      const std::vector<LmsPageBackend::Placed>& placed,
                      const Status& back);

// TF_LMS_QUIESCE_WAIT_MS: the first bound, in milliseconds, on closing the
// launch gate and on draining the devices before a page move (doubled per
// round given up, up to 64 times; LmsStats::launch_gate_quiesce_retries).
// A whole number from 1 to 60000; 100 when unset; another value is refused
// with an error naming the variable, and 100 used.
int64_t LmsQuiesceWaitMsFromEnv();
constexpr int64_t kLmsQuiesceWaitMsDefault = 100;
constexpr int64_t kLmsQuiesceWaitMsMax = 60000;

// Whether the page backend's launch gate is wanted: false when
// TF_LMS_LAUNCH_GATE is 0, false, False, FALSE, off or no; true otherwise.
bool LmsLaunchGateWantedFromEnv();
// TF_LMS_UNSAFE_MOVE_WITHOUT_GATE=1 (or true/on/yes): move pages of live
// data without an active launch gate, after a device synchronization only
// (other threads' launches during the move may then read or write the
// wrong page: error 700, lost writes).  Off by default: LMS fails closed.
bool LmsUnsafeMovesWithoutGateFromEnv();
// OK when 'gate' (LmsStats::launch_gate_*) is active; else
// FailedPrecondition naming the reason and what to do.
Status LmsLiveMovesAllowed(const LmsStats& gate);

}  // namespace tsl

#endif  // TENSORFLOW_TSL_FRAMEWORK_LMS_SUB_ALLOCATOR_H_
