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

#include "tensorflow/core/common_runtime/gpu/gpu_lms_page_backend.h"

#if GOOGLE_CUDA

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensorflow/tsl/platform/errors.h"
#include "tensorflow/tsl/platform/logging.h"
#include "tensorflow/tsl/platform/strcat.h"

namespace tensorflow {
namespace gpu_lms {
// The launch gate's core (CUPTI API callbacks on every work-submitting driver
// and runtime call; close() holds other threads' submissions at entry and
// waits for those inside, open() lets them go) and the bounded quiesce rounds
// (QuietRounds: why a mover never waits without a bound while it holds
// launches): framework-neutral, shared with PyTorch's LMS
// (patches/shared/lms_launch_gate_core.inc).
#include "tensorflow/core/common_runtime/gpu/gpu_lms_launch_gate_core.inc"
}  // namespace gpu_lms

namespace {

// ---------------------------------------------------------------------------
// Large Model Support's launch gate in TensorFlow.
//
// TensorFlow's executor launches the kernels of a GPU from many host threads
// onto one compute stream, and NCCL, tf.data and user code have streams of
// their own: none of them tells the allocator what it is about to touch.  So
// before LMS copies or unmaps pages that may hold live data, the page backend
// (Quiesce) closes the launch gate: new kernel launches, copies, memsets and
// stream memory operations of every other thread wait at the CUDA API call's
// entry, calls already inside have returned; then the context is
// synchronized, so nothing queued before can still run.  Resume() opens the
// gate when the pages are in place.  The mover's own calls pass (per thread).
// The lock order this relies on (BFC allocator lock, then the gate) is
// argued in tensorflow/tsl/framework/bfc_allocator_lms.cc.
//
// The gate is started once per process, when the first LMS page backend is
// created (GPU device creation, before the executor runs work), and never
// stopped: a gate switched off and on again mid-run would lose the exits of
// calls in flight.  TF_LMS_LAUNCH_GATE=0 (or false/off) leaves it off.
//
// CUPTI (dlopen'ed by the core, cupti_search_paths: the loader path,
// LD_LIBRARY_PATH, CUDA_HOME/CUDA_PATH, pip's site-packages/nvidia/cuda_cupti
// or nvidia/cu13 beside this library, /usr/local/cuda) takes one subscriber
// per process, and TensorFlow's
// profiler (tf.profiler, the GPU tracer of TensorBoard's profile plugin) is
// a CUPTI subscriber too: under a profiler that subscribed first the gate
// cannot subscribe (launch_gate_inactive_reason 2).  Without an active gate
// LMS fails closed: pages of live tensors do not move and an allocation that
// needs a spill fails, saying why (tsl::LmsLiveMovesAllowed); only
// TF_LMS_UNSAFE_MOVE_WITHOUT_GATE=1 moves them after a device
// synchronization, which covers work queued before the move but not launches
// made during it by other threads.  With the gate on, the
// profiler's GPU tracer is the one that cannot subscribe; to profile GPU
// activity with LMS, set TF_LMS_LAUNCH_GATE=0.  GetLmsStats() (and
// tf.config.experimental.get_memory_stats, lms_launch_gate_*) says which rule
// holds.
using gpu_lms::LaunchGate;

// Copies the gate's state and counters into 'stats'.
void ReadLaunchGateStats(tsl::LmsStats* stats) {
  const LaunchGate::Counters c = LaunchGate::get().counters();
  stats->launch_gate_active = c.active;
  stats->launch_gate_inactive_reason = c.inactive_reason;
  stats->launch_gate_gated_calls = c.gated_calls;
  stats->launch_gate_closes = c.closes;
  stats->launch_gate_close_wait_ns = c.close_wait_ns;
  stats->launch_gate_calls_held = c.calls_held;
  stats->launch_gate_quiesce_retries =
      gpu_lms::QuietRounds::get().counters().retries;
}

// The context of each GPU that has an LMS page backend, by ordinal: a move
// drains its own GPU and its peers (Quiesce), in the contexts their work
// runs in.
struct BackendContexts {
  std::mutex mu;
  std::multimap<int, CUcontext> by_ordinal;
};
BackendContexts& Contexts() {
  static auto* c = new BackendContexts();  // outlives static destructors
  return *c;
}

// Starts the gate the first time an LMS page backend is created.
void StartLaunchGateOnce() {
  static const bool once = [] {
    LaunchGate& gate = LaunchGate::get();
    if (!tsl::LmsLaunchGateWantedFromEnv()) {
      gate.stop();  // never started: records "off by setting"
      LOG(WARNING) << "Large Model Support: launch gate off "
                      "(TF_LMS_LAUNCH_GATE=0): pages of live tensors do not "
                      "move (allocations past the device fail) unless "
                      "TF_LMS_UNSAFE_MOVE_WITHOUT_GATE=1";
      return false;
    }
    if (gate.start()) {
      tsl::LmsStats s;
      ReadLaunchGateStats(&s);
      LOG(INFO) << "Large Model Support: launch gate on ("
                << s.launch_gate_gated_calls
                << " CUDA API functions held while pages of live tensors "
                   "move)";
      return true;
    }
    tsl::LmsStats s;
    ReadLaunchGateStats(&s);
    LOG(WARNING) << "Large Model Support: launch gate unavailable (reason "
                 << s.launch_gate_inactive_reason
                 << (s.launch_gate_inactive_reason == 1
                         ? ": no CUPTI library found"
                         : s.launch_gate_inactive_reason == 2
                               ? ": CUPTI is taken by another client, e.g. "
                                 "TensorFlow's profiler"
                               : ": CUPTI refused")
                 << "): pages of live tensors do not move (allocations past "
                    "the device fail) unless TF_LMS_UNSAFE_MOVE_WITHOUT_GATE=1, "
                    "which moves them after a device synchronization only "
                    "(kernels other threads launch meanwhile are not held)";
    return false;
  }();
  (void)once;
}

// Quiesce/Resume pairs of this thread (they nest: a swap-in inside the slow
// allocation path) and whether the outermost one closed the gate.
thread_local int t_quiet_depth = 0;
thread_local bool t_quiet_gated = false;

using tsl::LmsPageBackend;
using tsl::Status;

Status CuStatus(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return tsl::OkStatus();
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    return tsl::errors::ResourceExhausted(what, ": ", name ? name : "?");
  }
  return tsl::errors::Internal(what, ": ", name ? name : "?");
}

class ScopedContext {
 public:
  explicit ScopedContext(CUcontext c) { cuCtxPushCurrent(c); }
  ~ScopedContext() {
    CUcontext unused;
    cuCtxPopCurrent(&unused);
  }
};

// How pages move.  Every host page keeps a mapping of its own, made with the
// page; a device page gets one the first time data is copied into it.  A
// move queues the copies of all its pages straight into the new pages
// through those mappings, then maps each new page at the data's address as
// soon as the copies of its chunk finished, while the copy engine moves the
// next chunks.  What the pieces cost on the H100
// (examples/pytorch/benchmarks/records/probes.jsonl, runs 119-122, vmm_costs.cu): a
// cuMemSetAccess of a host mapping takes 14-27 us per MiB, serialised in the
// driver, and bounds a spill near 0.64 of a pinned copy; a staging window
// paid it twice per page.  Creating host pages runs at 4-5 GB/s, so the
// sub-allocator's filler makes them ahead of need (kHostReserveAuto).
class GpuLmsPageBackend : public LmsPageBackend {
 public:
  GpuLmsPageBackend(CUcontext ctx, int ordinal, CUdevice dev, int numa_id,
                    size_t page, CUstream stream, std::vector<int> peers)
      : ctx_(ctx),
        ordinal_(ordinal),
        peers_(std::move(peers)),
        dev_(dev),
        numa_id_(numa_id),
        page_(page),
        chunk_pages_(std::max<size_t>(1, kChunkBytes / page)),
        stream_(stream),
        first_wait_ns_(tsl::LmsQuiesceWaitMsFromEnv() * 1000000),
        drainer_([this] { DrainDevices(); }) {
    std::lock_guard<std::mutex> l(Contexts().mu);
    Contexts().by_ordinal.emplace(ordinal_, ctx_);
  }
  ~GpuLmsPageBackend() override {
    {
      std::lock_guard<std::mutex> l(Contexts().mu);
      auto range = Contexts().by_ordinal.equal_range(ordinal_);
      for (auto it = range.first; it != range.second; ++it) {
        if (it->second == ctx_) {
          Contexts().by_ordinal.erase(it);
          break;
        }
      }
    }
    ScopedContext sc(ctx_);
    // The sub-allocator destroyed every page (and its own mapping) before.
    for (CUdeviceptr slab : slabs_) {
      cuMemAddressFree(slab, kSlabPages * page_);
    }
    for (CUevent e : events_) cuEventDestroy(e);
    cuStreamDestroy(stream_);
  }

  std::string Name() const override {
    return tsl::strings::StrCat("cuda-vmm(GPU ", ordinal_, ", host NUMA ",
                                numa_id_, ")");
  }
  size_t page_size() const override { return page_; }

  void* ReserveAddressRange(size_t bytes) override {
    ScopedContext sc(ctx_);
    CUdeviceptr p = 0;
    if (cuMemAddressReserve(&p, bytes, page_, 0, 0) != CUDA_SUCCESS) {
      return nullptr;
    }
    return reinterpret_cast<void*>(p);
  }
  void ReleaseAddressRange(void* base, size_t bytes) override {
    ScopedContext sc(ctx_);
    cuMemAddressFree(reinterpret_cast<CUdeviceptr>(base), bytes);
  }

  // Host pages come with their own mapping (this runs on the filler thread
  // too).
  Status CreatePage(bool host, PageHandle* handle) override {
    TF_RETURN_IF_ERROR(faults_.Create(host));
    ScopedContext sc(ctx_);
    CUmemAllocationProp prop = Prop(host);
    CUmemGenericAllocationHandle h;
    TF_RETURN_IF_ERROR(CuStatus(cuMemCreate(&h, page_, &prop, 0),
                                host ? "cuMemCreate(host)" : "cuMemCreate"));
    if (host) {
      CUdeviceptr own;
      Status s = OwnMapping(h, &own);
      if (!s.ok()) {
        cuMemRelease(h);
        return s;
      }
    }
    *handle = static_cast<PageHandle>(h);
    return tsl::OkStatus();
  }
  void DestroyPage(bool host, PageHandle handle) override {
    ScopedContext sc(ctx_);
    CUdeviceptr own = 0;
    {
      std::lock_guard<std::mutex> l(own_mu_);
      auto it = own_.find(handle);
      if (it != own_.end()) {
        own = it->second;
        own_.erase(it);
      }
    }
    if (own != 0) {
      cuMemUnmap(own, page_);
      std::lock_guard<std::mutex> l(own_mu_);
      free_slots_.push_back(own);
    }
    cuMemRelease(static_cast<CUmemGenericAllocationHandle>(handle));
  }
  Status Map(void* va, bool host, PageHandle handle) override {
    ScopedContext sc(ctx_);
    return MapLocked(reinterpret_cast<CUdeviceptr>(va), handle);
  }
  Status Unmap(void* va) override {
    ScopedContext sc(ctx_);
    return CuStatus(cuMemUnmap(reinterpret_cast<CUdeviceptr>(va), page_),
                    "cuMemUnmap");
  }
  Status Remap(void* va, size_t n, bool to_host,
               const std::vector<PageHandle>& from,
               const std::vector<PageHandle>& to,
               std::vector<Placed>* placed) override {
    placed->assign(n, Placed::kOnFrom);
    ScopedContext sc(ctx_);
    const CUdeviceptr base = reinterpret_cast<CUdeviceptr>(va);
    std::vector<CUdeviceptr> dst(n);
    for (size_t k = 0; k < n; ++k) {
      TF_RETURN_IF_ERROR(OwnMapping(to[k], &dst[k]));
    }
    // Queue every copy, with an event after each chunk.  Pages made one
    // after another have adjacent own mappings: one copy covers them.
    const size_t chunks = (n + chunk_pages_ - 1) / chunk_pages_;
    Status s = EnsureEvents(chunks);
    for (size_t c = 0; s.ok() && c < chunks; ++c) {
      const size_t hi = std::min(n, (c + 1) * chunk_pages_);
      for (size_t k = c * chunk_pages_; s.ok() && k < hi;) {
        size_t e = k + 1;
        while (e < hi && dst[e] == dst[e - 1] + page_) ++e;
        s = CuStatus(cuMemcpyDtoDAsync(dst[k], base + k * page_,
                                       (e - k) * page_, stream_),
                     "cuMemcpyDtoDAsync");
        k = e;
      }
      if (s.ok()) s = CuStatus(cuEventRecord(events_[c], stream_), "cuEventRecord");
    }
    if (!s.ok()) {
      cuStreamSynchronize(stream_);
      return tsl::LmsRemapFailed(s, *placed, tsl::OkStatus());  // nothing moved
    }
    // Put the new pages under the data's addresses, chunk by chunk as their
    // copies finish.
    size_t moved = 0;  // pages [0, moved) are on their new page
    bool hole = false;  // page 'moved' is unmapped
    for (size_t c = 0; s.ok() && c < chunks; ++c) {
      s = CuStatus(cuEventSynchronize(events_[c]), "cuEventSynchronize");
      const size_t hi = std::min(n, (c + 1) * chunk_pages_);
      for (size_t k = c * chunk_pages_; s.ok() && k < hi; ++k) {
        const CUdeviceptr p = base + k * page_;
        s = CuStatus(cuMemUnmap(p, page_), "cuMemUnmap");
        if (!s.ok()) break;
        hole = true;
        s = faults_.Next("cuMemMap");
        if (s.ok()) s = MapLocked(p, to[k]);
        if (s.ok()) {
          hole = false;
          moved = k + 1;
        }
      }
    }
    if (s.ok()) return tsl::OkStatus();
    cuStreamSynchronize(stream_);
    return PutBack(base, moved + (hole ? 1 : 0), moved, from, to, s, placed);
  }
  // Several GPUs.  Pages of this GPU are mapped for its peers (MapLocked),
  // so a move must meet no work of this GPU nor of a peer: the gate holds
  // every launch of the process, and this GPU and its peers are drained
  // (DrainDevices).  Work queued on one GPU may wait for a launch on
  // another (an NCCL collective's partner kernel): the outermost Quiesce of
  // a thread therefore closes the gate and drains in bounded rounds
  // (QuietRounds in the shared core: it never waits without a bound while
  // it holds launches, and one mover of the process holds them at a time),
  // first bound TF_LMS_QUIESCE_WAIT_MS, doubled per round given up, up to
  // 64 times that.  A nested Quiesce (a return inside a spill's scope) finds
  // the gate closed and the devices drained by its outer scope; it waits for
  // this GPU's own work, the only work that can have been queued since.
  // A failed synchronization is logged; Resume() opens the gate on every
  // path (QuietScope pairs them).
  void Quiesce() override {
    if (t_quiet_depth++ > 0) {
      ScopedContext sc(ctx_);
      CUresult r = cuCtxSynchronize();
      if (r != CUDA_SUCCESS) LOG(ERROR) << CuStatus(r, "cuCtxSynchronize");
      return;
    }
    t_quiet_gated = LaunchGate::get().active();
    gpu_lms::QuietRounds::get().begin(
        t_quiet_gated ? &LaunchGate::get() : nullptr, drainer_,
        first_wait_ns_, 64 * first_wait_ns_);
  }
  void Resume() override {
    if (--t_quiet_depth == 0) {
      gpu_lms::QuietRounds::get().end(t_quiet_gated ? &LaunchGate::get()
                                                    : nullptr);
      t_quiet_gated = false;
    }
  }
  void AddLaunchGateStats(tsl::LmsStats* stats) const override {
    ReadLaunchGateStats(stats);
  }

  CUmemAllocationProp Prop(bool host) const {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    if (host) {
#if CUDA_VERSION >= 12020
      prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
      prop.location.id = numa_id_;
#endif
    } else {
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = ordinal_;
    }
    return prop;
  }

 private:
  // After a failed Remap: maps pages [0, n) at 'base' on their 'from' pages
  // again, every one even after one failed; those below 'moved' are on their
  // new page now, the one at 'moved' (if n > moved) is unmapped.  Every page
  // in [0, n) holds a whole copy on its 'to' page (its copy finished before
  // it was unmapped), so a page that cannot go back is mapped on that copy
  // (kOnTo) or, failing that too, left kUnmapped with both copies kept; the
  // sub-allocator recycles only pages nothing maps (never one still mapped,
  // which a later map at a second address would share).
  Status PutBack(CUdeviceptr base, size_t n, size_t moved,
                 const std::vector<PageHandle>& from,
                 const std::vector<PageHandle>& to, const Status& failed,
                 std::vector<Placed>* placed) {
    Status lost;
    for (size_t m = 0; m < n; ++m) {
      const CUdeviceptr p = base + m * page_;
      if (m < moved) {
        (*placed)[m] = Placed::kOnTo;
        Status un = CuStatus(cuMemUnmap(p, page_), "cuMemUnmap");
        if (!un.ok()) {  // still on its new copy
          if (lost.ok()) lost = un;
          continue;
        }
      }
      Status back = faults_.Next("cuMemMap(put back)");
      if (back.ok()) back = MapLocked(p, from[m]);
      if (back.ok()) {
        (*placed)[m] = Placed::kOnFrom;
        continue;
      }
      if (lost.ok()) lost = back;
      Status keep = faults_.Next("cuMemMap(keep the copy)");
      if (keep.ok()) keep = MapLocked(p, to[m]);
      (*placed)[m] = keep.ok() ? Placed::kOnTo : Placed::kUnmapped;
    }
    return tsl::LmsRemapFailed(failed, *placed, lost);
  }

  // Maps 'handle' at 'va', readable and writable by this GPU and, for the
  // pages under tensors ('peers'), by the peer GPUs of peers_: those
  // TensorFlow enabled peer access for, whose cross-device copies, NCCL
  // kernels and peer reads touch tensors directly, as they touch upstream's
  // cudaMalloc and virtual-memory allocations (memory mapped for one device
  // only would fault there).  A page's own mapping (copies on this GPU's
  // move stream only) skips them: each device given costs the driver.
  Status MapLocked(CUdeviceptr va, PageHandle handle, bool peers = true) {
    TF_RETURN_IF_ERROR(CuStatus(
        cuMemMap(va, page_, 0,
                 static_cast<CUmemGenericAllocationHandle>(handle), 0),
        "cuMemMap"));
    std::vector<CUmemAccessDesc> access(1 + (peers ? peers_.size() : 0));
    for (size_t i = 0; i < access.size(); ++i) {
      access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access[i].location.id = i == 0 ? ordinal_ : peers_[i - 1];
      access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    Status s = CuStatus(cuMemSetAccess(va, page_, access.data(), access.size()),
                        "cuMemSetAccess");
    if (!s.ok()) cuMemUnmap(va, page_);
    return s;
  }

  // The page's own mapping, made on first use.  Own mappings live in slabs
  // of reserved address space handed out in ascending order.
  Status OwnMapping(PageHandle h, CUdeviceptr* va) {
    {
      std::lock_guard<std::mutex> l(own_mu_);
      auto it = own_.find(h);
      if (it != own_.end()) {
        *va = it->second;
        return tsl::OkStatus();
      }
      if (free_slots_.empty()) {
        CUdeviceptr slab = 0;
        TF_RETURN_IF_ERROR(CuStatus(
            cuMemAddressReserve(&slab, kSlabPages * page_, page_, 0, 0),
            "cuMemAddressReserve(own mappings)"));
        slabs_.push_back(slab);
        for (size_t i = kSlabPages; i-- > 0;) {
          free_slots_.push_back(slab + i * page_);
        }
      }
      *va = free_slots_.back();
      free_slots_.pop_back();
    }
    Status s = MapLocked(*va, h, /*peers=*/false);
    std::lock_guard<std::mutex> l(own_mu_);
    if (!s.ok()) {
      free_slots_.push_back(*va);
      return s;
    }
    own_[h] = *va;
    return tsl::OkStatus();
  }

  // Synchronizes this GPU and each peer its pages are mapped for, in the
  // context of an LMS backend of that GPU, else its primary context when
  // one is active (TensorFlow's GPU devices run in primary contexts); a GPU
  // with neither has no work.  Runs on the drainer's thread: only
  // synchronizations and context switches, none of them a gated call.
  void DrainDevices() {
    std::vector<CUcontext> ctxs = {ctx_};
    std::vector<CUdevice> primaries;
    {
      std::lock_guard<std::mutex> l(Contexts().mu);
      for (int d : peers_) {
        auto it = Contexts().by_ordinal.find(d);
        if (it != Contexts().by_ordinal.end()) {
          ctxs.push_back(it->second);
          continue;
        }
        CUdevice dev;
        unsigned int flags = 0;
        int active = 0;
        if (cuDeviceGet(&dev, d) == CUDA_SUCCESS &&
            cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS &&
            active) {
          primaries.push_back(dev);
        }
      }
    }
    for (CUcontext c : ctxs) {
      ScopedContext sc(c);
      CUresult r = cuCtxSynchronize();
      if (r != CUDA_SUCCESS) LOG(ERROR) << CuStatus(r, "cuCtxSynchronize");
    }
    for (CUdevice dev : primaries) {
      CUcontext c;
      if (cuDevicePrimaryCtxRetain(&c, dev) != CUDA_SUCCESS) continue;
      {
        ScopedContext sc(c);
        CUresult r = cuCtxSynchronize();
        if (r != CUDA_SUCCESS) LOG(ERROR) << CuStatus(r, "cuCtxSynchronize");
      }
      cuDevicePrimaryCtxRelease(dev);
    }
  }

  // At least 'n' events for the chunks of one move (allocator lock held).
  Status EnsureEvents(size_t n) {
    while (events_.size() < n) {
      CUevent e;
      TF_RETURN_IF_ERROR(CuStatus(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING),
                                  "cuEventCreate"));
      events_.push_back(e);
    }
    return tsl::OkStatus();
  }

  static constexpr size_t kChunkBytes = size_t{64} << 20;  // per copy wait
  static constexpr size_t kSlabPages = 512;   // own mappings per reservation

  const CUcontext ctx_;
  const int ordinal_;
  // GPUs the pages under tensors are mapped for (CreateGpuLmsPageBackend)
  const std::vector<int> peers_;
  const CUdevice dev_;
  const int numa_id_;
  const size_t page_;
  const size_t chunk_pages_;
  const CUstream stream_;
  tsl::LmsRemapFaults faults_;
  std::vector<CUevent> events_;
  std::mutex own_mu_;  // own_, free_slots_, slabs_ (the filler makes pages)
  std::unordered_map<PageHandle, CUdeviceptr> own_;
  std::vector<CUdeviceptr> free_slots_;
  std::vector<CUdeviceptr> slabs_;
  const int64_t first_wait_ns_;  // QuietRounds' first bound
  gpu_lms::Drainer drainer_;     // last: its thread calls DrainDevices
};

#if CUDA_VERSION >= 12020
// Whether the device maps host-NUMA pages with the VMM calls.  cuda.h names the attribute
// from CUDA 12.9 on; against the 12.2-12.8 headers a TensorFlow build pins it is asked
// for by its number, which a driver that knows it answers.  An older driver rejects the
// question: then one host page is created and released.
#if CUDA_VERSION >= 12090
constexpr CUdevice_attribute kHostNumaVmmAttribute =
    CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
#else
constexpr CUdevice_attribute kHostNumaVmmAttribute =
    static_cast<CUdevice_attribute>(141);
#endif

bool HostNumaVmmSupported(CUdevice dev, int numa_id) {
  int supported = 0;
  if (cuDeviceGetAttribute(&supported, kHostNumaVmmAttribute, dev) ==
      CUDA_SUCCESS) {
    return supported != 0;
  }
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = numa_id;
  size_t granularity = 0;
  if (cuMemGetAllocationGranularity(&granularity, &prop,
                                    CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
      CUDA_SUCCESS) {
    return false;
  }
  CUmemGenericAllocationHandle handle;
  if (cuMemCreate(&handle, granularity, &prop, 0) != CUDA_SUCCESS) return false;
  cuMemRelease(handle);
  return true;
}
#endif

}  // namespace

tsl::StatusOr<std::unique_ptr<tsl::LmsPageBackend>> CreateGpuLmsPageBackend(
    CUcontext context, int device_ordinal, size_t page_bytes,
    const std::vector<int>& peer_ordinals) {
#if CUDA_VERSION < 12020
  return tsl::errors::Unimplemented(
      "Large Model Support needs CUDA >= 12.2 (host-located VMM pages).");
#else
  ScopedContext sc(context);
  CUdevice dev;
  TF_RETURN_IF_ERROR(CuStatus(cuDeviceGet(&dev, device_ordinal), "cuDeviceGet"));
  int vmm = 0, numa_id = 0;
  cuDeviceGetAttribute(
      &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
  cuDeviceGetAttribute(&numa_id, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);
  if (numa_id < 0) numa_id = 0;
  const int host_vmm = vmm && HostNumaVmmSupported(dev, numa_id) ? 1 : 0;
  if (!vmm || !host_vmm) {
    return tsl::errors::Unimplemented(
        "Large Model Support needs CUDA virtual memory management with host "
        "NUMA pages on GPU ",
        device_ordinal, " (VMM supported: ", vmm, ", host NUMA VMM: ", host_vmm,
        ")");
  }
  if (page_bytes == 0) {
    return tsl::errors::InvalidArgument("LMS page size of 0 bytes");
  }
  // The peers the pages under tensors are mapped for: those of
  // 'peer_ordinals' that can access this GPU's memory and map VMM memory, as
  // upstream's GpuVirtualMemAllocator chooses them from the same list.
  std::vector<int> peers;
  for (int d : peer_ordinals) {
    CUdevice peer;
    int can = 0, peer_vmm = 0;
    if (d == device_ordinal ||
        std::find(peers.begin(), peers.end(), d) != peers.end() ||
        cuDeviceGet(&peer, d) != CUDA_SUCCESS) {
      continue;
    }
    cuDeviceGetAttribute(
        &peer_vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        peer);
    if (cuDeviceCanAccessPeer(&can, peer, dev) == CUDA_SUCCESS && can &&
        peer_vmm) {
      peers.push_back(d);
    } else {
      LOG(INFO) << "Large Model Support: GPU " << d
                << " cannot access GPU " << device_ordinal
                << "'s LMS pages (no peer access or no virtual memory "
                   "management)";
    }
  }
  // The page: a multiple of the granularity of this GPU, its host NUMA node
  // and every peer (the largest of them, as upstream takes).
  size_t page = page_bytes;
  std::vector<std::pair<CUmemLocationType, int>> places = {
      {CU_MEM_LOCATION_TYPE_DEVICE, device_ordinal},
      {CU_MEM_LOCATION_TYPE_HOST_NUMA, numa_id}};
  for (int d : peers) places.push_back({CU_MEM_LOCATION_TYPE_DEVICE, d});
  for (const auto& place : places) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = place.first;
    prop.location.id = place.second;
    size_t g = 0;
    TF_RETURN_IF_ERROR(CuStatus(
        cuMemGetAllocationGranularity(&g, &prop,
                                      CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity"));
    page = (page + g - 1) / g * g;
  }
  CUstream stream;
  TF_RETURN_IF_ERROR(
      CuStatus(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
  StartLaunchGateOnce();
  return std::unique_ptr<tsl::LmsPageBackend>(new GpuLmsPageBackend(
      context, device_ordinal, dev, numa_id, page, stream, std::move(peers)));
#endif
}

}  // namespace tensorflow

#endif  // GOOGLE_CUDA
