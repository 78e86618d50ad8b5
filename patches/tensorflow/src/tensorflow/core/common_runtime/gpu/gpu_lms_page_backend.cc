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

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "tensorflow/tsl/platform/errors.h"
#include "tensorflow/tsl/platform/logging.h"
#include "tensorflow/tsl/platform/strcat.h"

namespace tensorflow {
namespace gpu_lms {
// The launch gate's core (CUPTI API callbacks on every work-submitting driver
// and runtime call; close() holds other threads' submissions at entry and
// waits for those inside, open() lets them go): framework-neutral, shared
// with PyTorch's LMS (patches/shared/lms_launch_gate_core.inc).
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
// CUPTI (dlopen'ed by the core: libcupti.so from the loader path, CUDA_HOME
// or /usr/local/cuda) takes one subscriber per process, and TensorFlow's
// profiler (tf.profiler, the GPU tracer of TensorBoard's profile plugin) is
// a CUPTI subscriber too: under a profiler that subscribed first the gate
// cannot subscribe (launch_gate_inactive_reason 2) and the old rule holds,
// a device synchronization before each move, which covers work queued before
// it but not launches made during it by other threads.  With the gate on, the
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
}

// Starts the gate the first time an LMS page backend is created.
void StartLaunchGateOnce() {
  static const bool once = [] {
    LaunchGate& gate = LaunchGate::get();
    if (!tsl::LmsLaunchGateWantedFromEnv()) {
      gate.stop();  // never started: records "off by setting"
      LOG(INFO) << "Large Model Support: launch gate off (TF_LMS_LAUNCH_GATE): "
                   "pages of live tensors move after a device "
                   "synchronization only";
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
                 << "): pages of live tensors move after a device "
                    "synchronization only, which does not hold back kernels "
                    "that other threads launch meanwhile";
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

class GpuLmsPageBackend : public LmsPageBackend {
 public:
  GpuLmsPageBackend(CUcontext ctx, int ordinal, CUdevice dev, int numa_id,
                    size_t page, CUstream stream, CUdeviceptr scratch,
                    size_t scratch_pages)
      : ctx_(ctx),
        ordinal_(ordinal),
        dev_(dev),
        numa_id_(numa_id),
        page_(page),
        stream_(stream),
        scratch_(scratch),
        scratch_pages_(scratch_pages) {}
  ~GpuLmsPageBackend() override {
    ScopedContext sc(ctx_);
    cuMemAddressFree(scratch_, scratch_pages_ * page_);
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

  Status CreatePage(bool host, PageHandle* handle) override {
    ScopedContext sc(ctx_);
    CUmemAllocationProp prop = Prop(host);
    CUmemGenericAllocationHandle h;
    TF_RETURN_IF_ERROR(CuStatus(cuMemCreate(&h, page_, &prop, 0),
                                host ? "cuMemCreate(host)" : "cuMemCreate"));
    *handle = static_cast<PageHandle>(h);
    return tsl::OkStatus();
  }
  void DestroyPage(bool host, PageHandle handle) override {
    ScopedContext sc(ctx_);
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
               const std::vector<PageHandle>& to) override {
    ScopedContext sc(ctx_);
    const CUdeviceptr base = reinterpret_cast<CUdeviceptr>(va);
    for (size_t done = 0; done < n;) {
      const size_t m = std::min(n - done, scratch_pages_);
      // Map the new pages in the scratch window and copy the data over.
      for (size_t k = 0; k < m; ++k) {
        TF_RETURN_IF_ERROR(MapLocked(scratch_ + k * page_, to[done + k]));
      }
      Status s = CuStatus(cuMemcpyDtoDAsync(scratch_, base + done * page_,
                                            m * page_, stream_),
                          "cuMemcpyDtoDAsync");
      if (s.ok()) s = CuStatus(cuStreamSynchronize(stream_), "sync");
      for (size_t k = 0; k < m; ++k) {
        cuMemUnmap(scratch_ + k * page_, page_);
      }
      TF_RETURN_IF_ERROR(s);
      // Put the new pages under the original addresses.
      for (size_t k = 0; k < m; ++k) {
        const CUdeviceptr p = base + (done + k) * page_;
        TF_RETURN_IF_ERROR(CuStatus(cuMemUnmap(p, page_), "cuMemUnmap"));
        TF_RETURN_IF_ERROR(MapLocked(p, to[done + k]));
      }
      done += m;
    }
    return tsl::OkStatus();
  }
  // Closes the launch gate (when it is active) and synchronizes the context;
  // Resume() opens the gate again.  A failed synchronization is logged and
  // the gate stays closed until Resume(): QuietScope pairs them on every
  // path.
  void Quiesce() override {
    if (t_quiet_depth++ == 0) {
      t_quiet_gated = LaunchGate::get().active();
      if (t_quiet_gated) LaunchGate::get().close();
    }
    ScopedContext sc(ctx_);
    CUresult r = cuCtxSynchronize();
    if (r != CUDA_SUCCESS) LOG(ERROR) << CuStatus(r, "cuCtxSynchronize");
  }
  void Resume() override {
    if (--t_quiet_depth == 0 && t_quiet_gated) {
      t_quiet_gated = false;
      LaunchGate::get().open();
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
  Status MapLocked(CUdeviceptr va, PageHandle handle) {
    TF_RETURN_IF_ERROR(CuStatus(
        cuMemMap(va, page_, 0,
                 static_cast<CUmemGenericAllocationHandle>(handle), 0),
        "cuMemMap"));
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = ordinal_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    Status s = CuStatus(cuMemSetAccess(va, page_, &access, 1), "cuMemSetAccess");
    if (!s.ok()) cuMemUnmap(va, page_);
    return s;
  }

  const CUcontext ctx_;
  const int ordinal_;
  const CUdevice dev_;
  const int numa_id_;
  const size_t page_;
  const CUstream stream_;
  const CUdeviceptr scratch_;
  const size_t scratch_pages_;
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
    CUcontext context, int device_ordinal) {
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
  size_t page = 2 << 20;
  for (bool host : {false, true}) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type =
        host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = host ? numa_id : device_ordinal;
    size_t g = 0;
    TF_RETURN_IF_ERROR(CuStatus(
        cuMemGetAllocationGranularity(&g, &prop,
                                      CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity"));
    page = std::max(page, g);
  }
  CUstream stream;
  TF_RETURN_IF_ERROR(
      CuStatus(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
  const size_t scratch_pages = 64;
  CUdeviceptr scratch = 0;
  Status s = CuStatus(
      cuMemAddressReserve(&scratch, scratch_pages * page, page, 0, 0),
      "cuMemAddressReserve(scratch)");
  if (!s.ok()) {
    cuStreamDestroy(stream);
    return s;
  }
  StartLaunchGateOnce();
  return std::unique_ptr<tsl::LmsPageBackend>(new GpuLmsPageBackend(
      context, device_ordinal, dev, numa_id, page, stream, scratch,
      scratch_pages));
#endif
}

}  // namespace tensorflow

#endif  // GOOGLE_CUDA
