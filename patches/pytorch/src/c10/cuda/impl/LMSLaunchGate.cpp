// Large Model Support: the launch gate (launch_gate_* and QuietDevice of
// CUDALargeModelSupport.h). What the gate keeps and how:
// impl/LMSLaunchGateCore.inc (framework-neutral, shared with TensorFlow's LMS,
// included here inside namespace lms as its header asks); here is PyTorch's
// use of it.
//
// QuietDevice closes the gate and synchronizes the device; the gate opens again
// when it goes out of scope. Without the gate (lms_launch_gate:False, or CUPTI
// missing or taken) QuietDevice still synchronizes the device, which covers
// work queued before the move but not launches made during it by other
// threads; stats_text says which rule holds (launch_gate.active).

#include <c10/cuda/CUDALargeModelSupport.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace c10::cuda::CUDACachingAllocator::lms {

#include <c10/cuda/impl/LMSLaunchGateCore.inc>

bool launch_gate_start() {
  return LaunchGate::get().start();
}
void launch_gate_stop() {
  LaunchGate::get().stop();
}
bool launch_gate_active() {
  return LaunchGate::get().active();
}
std::string launch_gate_stats() {
  return LaunchGate::get().stats();
}

QuietDevice::QuietDevice(int device) {
  auto& g = LaunchGate::get();
  gated_ = g.active();
  if (gated_) {
    g.close();
  }
  // work queued before the gate closed, on every stream of the device
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    if (gated_) {
      g.open();
    }
    C10_CUDA_CHECK(err);
  }
}

QuietDevice::~QuietDevice() {
  if (gated_) {
    LaunchGate::get().open();
  }
}

} // namespace c10::cuda::CUDACachingAllocator::lms
