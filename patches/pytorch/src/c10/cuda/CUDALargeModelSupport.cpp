// Large Model Support: the settings (the lms* keys of the allocator settings
// string, their setters and getters, the large pool's page). The other pieces
// of CUDALargeModelSupport.h live in impl/: the state they share
// (LMSState.h), the host budget and its rule (LMSHostBudget.cpp), the
// statistics (LMSStats.cpp), the driver calls that move a page
// (LMSPageRemap.cpp), the C API for ctypes (LMSCApi.cpp), the host page pool
// (LMSHostPool.cpp), the launch gate (LMSLaunchGate.cpp), a device
// allocator's LMS (LMSDeviceAllocator.cpp, LMSPageMoves.cpp) and its hooks
// into CUDACachingAllocator.cpp (LMSDeviceAllocator.inc and the tag's
// LMSAllocatorAdapter.inc, which see its private Block).
#include <c10/cuda/CUDALargeModelSupport.h>
#include <c10/cuda/impl/LMSState.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace c10::cuda::CUDACachingAllocator::lms {

namespace impl {

Settings& settings() {
  static Settings s;
  return s;
}

} // namespace impl

using impl::all_stats;
using impl::kMaxDevices;
using impl::kMiB;
using impl::settings;

namespace {

bool parse_bool(const std::string& key, const std::string& v) {
  TORCH_CHECK(
      v == "True" || v == "False" || v == "true" || v == "false" || v == "1" ||
          v == "0",
      "Expected True/False for ",
      key,
      ", got '",
      v,
      "'");
  return v == "True" || v == "true" || v == "1";
}

double parse_number(const std::string& key, const std::string& v) {
  char* end = nullptr;
  double d = std::strtod(v.c_str(), &end);
  TORCH_CHECK(
      end != v.c_str() && *end == '\0' && d >= 0,
      "Expected a number >= 0 for ",
      key,
      ", got '",
      v,
      "'");
  return d;
}

} // namespace

bool enabled() {
  return settings().enabled.load(std::memory_order_relaxed);
}
void set_enabled(bool on) {
  TORCH_CHECK(
      !on || supported(),
      "Large Model Support needs CUDA virtual memory management with host NUMA "
      "allocations (a CUDA 12.2 or newer driver); not available here");
  settings().enabled = on;
  if (on && settings().launch_gate) {
    // before the program's threads queue work the gate would not have seen
    launch_gate_start();
  }
}
size_t limit() {
  return settings().limit.load(std::memory_order_relaxed);
}
void set_limit(size_t bytes) {
  settings().limit = bytes;
}
size_t min_swap_size() {
  return settings().size.load(std::memory_order_relaxed);
}
void set_min_swap_size(size_t bytes) {
  settings().size = bytes;
}
bool defrag_enabled() {
  return settings().defrag.load(std::memory_order_relaxed);
}
void set_defrag_enabled(bool on) {
  settings().defrag = on;
}

size_t host_reserve_setting() {
  return settings().host_reserve.load();
}
void set_host_reserve(size_t bytes) {
  settings().host_reserve = bytes;
}

size_t large_page_setting() {
  return settings().large_page.load();
}
void set_large_page(size_t bytes) {
  constexpr size_t kGranule = 2 * kMiB; // VMM granularity of current GPUs
  TORCH_CHECK(
      bytes % kGranule == 0 && bytes <= 1024 * kMiB,
      "lms_page_mb must be a multiple of 2 MiB, at most 1024 (0: auto); got ",
      static_cast<double>(bytes) / kMiB);
  settings().large_page = bytes;
}
size_t large_page_bytes(int device, size_t upstream_page, bool grow) {
  size_t page = large_page_setting();
  if (page == 0 && !grow) {
    page = upstream_page;
  } else if (page == 0) {
    size_t total = 0;
    if (device >= 0 && device < kMaxDevices) {
      auto& d = all_stats()[device];
      total = d.total_memory.load();
      if (total == 0) {
        CUDAGuard g(static_cast<c10::DeviceIndex>(device));
        size_t free_b = 0;
        C10_CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
        d.total_memory = total;
      }
    }
    page = 2 * kMiB;
    while (page * 2 <= std::min<size_t>(total / 256, 64 * kMiB)) {
      page *= 2;
    }
    page = std::max(page, upstream_page);
  }
  if (device >= 0 && device < kMaxDevices) {
    all_stats()[device].large_page = page;
  }
  return page;
}

bool parse_setting(
    const std::vector<std::string>& config,
    size_t i,
    size_t* last) {
  const std::string& key = config[i];
  if (key.rfind("lms", 0) != 0) {
    return false;
  }
  TORCH_CHECK(
      i + 2 < config.size() && config[i + 1] == ":",
      "Error parsing CachingAllocator settings: expected ':' and a value after ",
      key);
  const std::string& v = config[i + 2];
  if (key == "lms") {
    set_enabled(parse_bool(key, v));
  } else if (key == "lms_limit_mb") {
    set_limit(static_cast<size_t>(parse_number(key, v) * kMiB));
  } else if (key == "lms_size_mb") {
    set_min_swap_size(static_cast<size_t>(parse_number(key, v) * kMiB));
  } else if (key == "lms_host_mem_limit_mb") {
    set_host_mem_limit(static_cast<size_t>(parse_number(key, v) * kMiB));
  } else if (key == "lms_defrag") {
    set_defrag_enabled(parse_bool(key, v));
  } else if (key == "lms_host_reserve_mb") {
    set_host_reserve(static_cast<size_t>(parse_number(key, v) * kMiB));
  } else if (key == "lms_page_mb") {
    set_large_page(static_cast<size_t>(parse_number(key, v) * kMiB));
  } else if (key == "lms_launch_gate") {
    settings().launch_gate = parse_bool(key, v);
    if (!settings().launch_gate) {
      launch_gate_stop();
    } else if (enabled()) {
      launch_gate_start();
    }
  } else {
    TORCH_CHECK(
        false,
        "Unrecognized CachingAllocator option: ",
        key,
        " (LMS keys: lms, lms_limit_mb, lms_size_mb, lms_host_mem_limit_mb, "
        "lms_host_reserve_mb, lms_defrag, lms_launch_gate, lms_page_mb)");
  }
  *last = i + 2;
  return true;
}

} // namespace c10::cuda::CUDACachingAllocator::lms
