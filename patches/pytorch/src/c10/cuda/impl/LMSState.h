#pragma once
// Large Model Support: the process-wide state that the settings
// (c10/cuda/CUDALargeModelSupport.cpp), the host budget
// (impl/LMSHostBudget.cpp) and the statistics (impl/LMSStats.cpp) share. Not
// an installed header; nothing here is C10_CUDA_API.
//
// One Settings for the process and one DeviceStats per device index below
// kMaxDevices, each made on first use (function-local statics, so no
// translation unit depends on another's static initialisation). Every field
// is an atomic; host_limit and host_limit_set are written only under the host
// budget's mutex (impl/LMSHostBudget.cpp).
#include <c10/cuda/CUDALargeModelSupport.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace c10::cuda::CUDACachingAllocator::lms::impl {

constexpr size_t kMiB = 1024 * 1024;
constexpr int kMaxDevices = 64;

// the lms* settings (defined in c10/cuda/CUDALargeModelSupport.cpp)
struct Settings {
  std::atomic<bool> enabled{false};
  std::atomic<size_t> limit{0};
  std::atomic<size_t> size{kMiB};
  std::atomic<bool> defrag{true};
  std::atomic<size_t> host_limit{0};
  std::atomic<bool> host_limit_set{false};
  std::atomic<bool> launch_gate{true};
  std::atomic<size_t> host_reserve{kAutoHostReserve};
  std::atomic<size_t> large_page{0}; // 0: auto (large_page_bytes)
};
Settings& settings();

// per-device statistics (defined in impl/LMSStats.cpp); large_page is written
// by large_page_bytes (c10/cuda/CUDALargeModelSupport.cpp)
struct DeviceStats {
  std::array<std::atomic<int64_t>, kNumStats> v{};
  std::atomic<int64_t> host_peak{0};
  std::atomic<size_t> total_memory{0}; // the device's, once asked
  std::atomic<size_t> large_page{0}; // large_page_bytes' last answer
};
std::array<DeviceStats, kMaxDevices>& all_stats();

} // namespace c10::cuda::CUDACachingAllocator::lms::impl
