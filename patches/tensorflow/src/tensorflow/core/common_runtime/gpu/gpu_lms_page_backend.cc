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

#include <algorithm>
#include <string>
#include <vector>

#include "tensorflow/tsl/platform/errors.h"
#include "tensorflow/tsl/platform/logging.h"
#include "tensorflow/tsl/platform/strcat.h"

namespace tensorflow {
namespace {

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
  void Quiesce() override {
    ScopedContext sc(ctx_);
    CUresult r = cuCtxSynchronize();
    if (r != CUDA_SUCCESS) LOG(ERROR) << CuStatus(r, "cuCtxSynchronize");
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
  return std::unique_ptr<tsl::LmsPageBackend>(new GpuLmsPageBackend(
      context, device_ordinal, dev, numa_id, page, stream, scratch,
      scratch_pages));
#endif
}

}  // namespace tensorflow

#endif  // GOOGLE_CUDA
