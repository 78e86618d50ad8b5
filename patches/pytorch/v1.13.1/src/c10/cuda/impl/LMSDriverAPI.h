#pragma once
// Large Model Support: the CUDA driver entry points LMS calls, as
// c10::cuda::DriverAPI::get()->cuMemMap_(...) and C10_CUDA_DRIVER_CHECK. Every
// tag has a header of this name. PyTorch v1.13.1 has no driver API table of
// its own (c10 links only the runtime), so this one opens libcuda.so.1 at
// first use and looks the functions up by name; a driver without them makes
// the first LMS call fail with a message, nothing at load time.
#include <c10/util/Exception.h>
#include <cuda.h>
#include <dlfcn.h>

#define C10_LMS_LIBCUDA_API(_)     \
  _(cuDeviceGetAttribute)          \
  _(cuMemAddressReserve)           \
  _(cuMemAddressFree)              \
  _(cuMemCreate)                   \
  _(cuMemRelease)                  \
  _(cuMemMap)                      \
  _(cuMemUnmap)                    \
  _(cuMemSetAccess)                \
  _(cuMemGetAllocationGranularity) \
  _(cuGetErrorString)

namespace c10 {
namespace cuda {

struct DriverAPI {
#define C10_LMS_DRIVER_MEMBER(name) decltype(&name) name##_ = nullptr;
  C10_LMS_LIBCUDA_API(C10_LMS_DRIVER_MEMBER)
#undef C10_LMS_DRIVER_MEMBER

  static DriverAPI* get() {
    static DriverAPI* api = load(); // leaked on purpose: used at exit
    return api;
  }

 private:
  static DriverAPI* load() {
    void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (lib == nullptr) {
      lib = dlopen("libcuda.so.1", RTLD_LAZY);
    }
    TORCH_CHECK(
        lib != nullptr,
        "Large Model Support: cannot open the CUDA driver (libcuda.so.1): ",
        dlerror());
    auto* api = new DriverAPI();
#define C10_LMS_DRIVER_LOOKUP(name)                                        \
  api->name##_ = reinterpret_cast<decltype(&name)>(dlsym(lib, #name));    \
  TORCH_CHECK(                                                             \
      api->name##_ != nullptr,                                             \
      "Large Model Support: the CUDA driver has no " #name                 \
      " (a driver for CUDA 12.2 or newer is needed)");
    C10_LMS_LIBCUDA_API(C10_LMS_DRIVER_LOOKUP)
#undef C10_LMS_DRIVER_LOOKUP
    return api;
  }
};

} // namespace cuda
} // namespace c10

#define C10_CUDA_DRIVER_CHECK(EXPR)                                       \
  do {                                                                    \
    CUresult c10_lms_err_ = (EXPR);                                       \
    if (c10_lms_err_ != CUDA_SUCCESS) {                                   \
      const char* c10_lms_msg_ = nullptr;                                 \
      if (c10::cuda::DriverAPI::get()->cuGetErrorString_(                 \
              c10_lms_err_, &c10_lms_msg_) != CUDA_SUCCESS ||             \
          c10_lms_msg_ == nullptr) {                                      \
        c10_lms_msg_ = "unknown error";                                   \
      }                                                                   \
      TORCH_CHECK(false, "CUDA driver error: ", c10_lms_msg_);            \
    }                                                                     \
  } while (0)
