// Large Model Support: the CUDA driver calls under a page move
// (set_device_access, remap_page) and whether this driver can do LMS at all
// (supported). remap_page keeps the invariant the page moves rely on
// (impl/LMSPageMoves.cpp): a page of live data is never left unmapped.
#include <c10/cuda/CUDALargeModelSupport.h>

#include <c10/util/Exception.h>

#if !defined(USE_ROCM) && defined(PYTORCH_C10_DRIVER_API_SUPPORTED)
#include <c10/cuda/impl/LMSDriverAPI.h>
#endif
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>

namespace c10::cuda::CUDACachingAllocator::lms {

namespace {

#if !defined(USE_ROCM) && defined(PYTORCH_C10_DRIVER_API_SUPPORTED)
// CUDA 12.2's driver version: its host allocations (impl/LMSHostPool.cpp)
// are what LMS needs.
constexpr int kHostNumaDriver = 12020;
#endif

} // namespace

// Host pages are host allocations of the VMM API: a driver older than CUDA
// 12.2 makes LMS unavailable. The headers a tag builds with may be older
// (v1.13.1's wheel: CUDA 11.7); the enum values are fixed in the driver's ABI.
// Without a driver (0) nothing can be allocated, and settings still work.
int set_device_access(unsigned long long va, size_t size, int device) {
#if !defined(USE_ROCM) && defined(PYTORCH_C10_DRIVER_API_SUPPORTED)
  CUmemAccessDesc desc = {};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return c10::cuda::DriverAPI::get()->cuMemSetAccess_(va, size, &desc, 1);
#else
  (void)va;
  (void)size;
  (void)device;
  return -1; // not reached: LMS cannot be enabled here (supported())
#endif
}

int remap_page(
    unsigned long long va,
    size_t size,
    unsigned long long from,
    unsigned long long to,
    const int* devices,
    size_t n) {
#if !defined(USE_ROCM) && defined(PYTORCH_C10_DRIVER_API_SUPPORTED)
  static const long fail_at = [] {
    const char* env = std::getenv("PYTORCH_LMS_TEST_FAIL_REMAP");
    return env ? std::strtol(env, nullptr, 10) : 0L;
  }();
  static std::atomic<long> calls{0};
  auto* api = c10::cuda::DriverAPI::get();
  auto open = [&](CUresult r) {
    for (size_t k = 0; k < n && r == CUDA_SUCCESS; ++k) {
      r = static_cast<CUresult>(set_device_access(va, size, devices[k]));
    }
    return r;
  };
  CUresult r = api->cuMemUnmap_(va, size);
  if (r != CUDA_SUCCESS) {
    return r; // nothing changed
  }
  const bool inject = fail_at > 0 && ++calls == fail_at;
  r = inject ? CUDA_ERROR_OUT_OF_MEMORY : api->cuMemMap_(va, size, 0, to, 0ULL);
  if (r == CUDA_SUCCESS) {
    r = open(r);
    if (r == CUDA_SUCCESS) {
      return 0;
    }
    api->cuMemUnmap_(va, size);
  }
  // put the old page back under the data's address
  CUresult back = open(api->cuMemMap_(va, size, 0, from, 0ULL));
  TORCH_CHECK(
      back == CUDA_SUCCESS,
      "Large Model Support: moving a page failed (CUDA driver error ",
      static_cast<int>(r),
      ") and mapping its old memory back failed too (error ",
      static_cast<int>(back),
      "); the tensors on it cannot be used");
  return static_cast<int>(r);
#else
  (void)va;
  (void)size;
  (void)from;
  (void)to;
  (void)devices;
  (void)n;
  return -1; // not reached: LMS cannot be enabled here (supported())
#endif
}

bool supported() {
#if !defined(USE_ROCM) && defined(PYTORCH_C10_DRIVER_API_SUPPORTED)
  static const bool ok = [] {
    int v = 0;
    if (cudaDriverGetVersion(&v) != cudaSuccess) {
      v = 0;
    }
    return v == 0 || v >= kHostNumaDriver;
  }();
  return ok;
#else
  return false;
#endif
}

} // namespace c10::cuda::CUDACachingAllocator::lms
