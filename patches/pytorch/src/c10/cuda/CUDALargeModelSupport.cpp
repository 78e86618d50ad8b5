// Large Model Support: settings, host budget, host handle pool, statistics and
// the C API. The allocator-side logic lives in impl/LMSDeviceAllocator.inc
// (included into CUDACachingAllocator.cpp, where Block and ExpandableSegment
// are defined). See CUDALargeModelSupport.h.
#include <c10/cuda/CUDALargeModelSupport.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#if !defined(USE_ROCM) && defined(PYTORCH_C10_DRIVER_API_SUPPORTED)
#include <c10/cuda/impl/LMSDriverAPI.h>
#endif
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace c10::cuda::CUDACachingAllocator::lms {

namespace {

constexpr size_t kMiB = 1024 * 1024;
constexpr int kMaxDevices = 64;

#if !defined(USE_ROCM) && defined(PYTORCH_C10_DRIVER_API_SUPPORTED)
// CUDA 12.2's host allocations (the driver version, the location types and
// the device attribute), named here for headers older than 12.2.
constexpr int kHostNumaDriver = 12020;
constexpr auto kLocationHost = static_cast<CUmemLocationType>(0x2);
constexpr auto kLocationHostNuma = static_cast<CUmemLocationType>(0x3);
constexpr auto kAttrHostNumaId = static_cast<CUdevice_attribute>(134);
#endif

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

Settings& settings() {
  static Settings s;
  return s;
}

// Processes that share this node's host memory: torchrun's LOCAL_WORLD_SIZE
// (1 when it is unset or not a positive number).
size_t local_world_size() {
  const char* env = std::getenv("LOCAL_WORLD_SIZE");
  if (env == nullptr) {
    return 1;
  }
  char* end = nullptr;
  long n = std::strtol(env, &end, 10);
  return (end != env && *end == '\0' && n > 0) ? static_cast<size_t>(n) : 1;
}

// Default host budget: PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB (per process), else
// 80% of the host memory that is available when LMS first needs it, shared
// equally by the processes on the node (LOCAL_WORLD_SIZE), so that pinned swap
// space can never push the node into the kernel's OOM killer.
size_t default_host_limit() {
  if (const char* env = std::getenv("PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB")) {
    char* end = nullptr;
    double mb = std::strtod(env, &end);
    TORCH_CHECK(
        end != env && mb >= 0,
        "PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB must be a number of MiB >= 0, got '",
        env,
        "'");
    return static_cast<size_t>(mb * kMiB);
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (meminfo >> key >> kb >> unit) {
    if (key == "MemAvailable:") {
      return kb * 1024 / 10 * 8 / local_world_size();
    }
  }
  return 0;
}

std::mutex& budget_mutex() {
  static std::mutex m;
  return m;
}
size_t g_host_used = 0; // guarded by budget_mutex
size_t g_host_peak = 0;

struct DeviceStats {
  std::array<std::atomic<int64_t>, kNumStats> v{};
  std::atomic<int64_t> host_peak{0};
  std::atomic<size_t> total_memory{0}; // the device's, once asked
  std::atomic<size_t> large_page{0}; // large_page_bytes' last answer
};
std::array<DeviceStats, kMaxDevices>& all_stats() {
  static std::array<DeviceStats, kMaxDevices> s;
  return s;
}

const char* kStatNames[kNumStats] = {
    "swap_out_bytes",
    "swap_out_count",
    "swap_in_bytes",
    "swap_in_count",
    "host_bytes.current",
    "reclaim_events",
    "alloc_served.free_list",
    "alloc_served.new_device_memory",
    "alloc_served.lms_reclaim",
    "alloc_served.defrag",
    "swap_out_time_ns",
    "swap_in_time_ns",
    "host_pages_dropped_on_free",
    "defrag_released_bytes",
    "num_ooms",
    "swap_out_quiesce_ns",
    "swap_out_copy_wait_ns",
};

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
size_t host_mem_limit() {
  auto& s = settings();
  if (!s.host_limit_set.load()) {
    std::lock_guard<std::mutex> g(budget_mutex());
    if (!s.host_limit_set.load()) {
      s.host_limit = default_host_limit();
      s.host_limit_set = true;
    }
  }
  return s.host_limit.load();
}
void set_host_mem_limit(size_t bytes) {
  std::lock_guard<std::mutex> g(budget_mutex());
  settings().host_limit = bytes;
  settings().host_limit_set = true;
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

bool host_reserve(size_t bytes) {
  size_t lim = host_mem_limit();
  std::lock_guard<std::mutex> g(budget_mutex());
  if (g_host_used + bytes > lim) {
    return false;
  }
  g_host_used += bytes;
  g_host_peak = std::max(g_host_peak, g_host_used);
  return true;
}
void host_release(size_t bytes) {
  std::lock_guard<std::mutex> g(budget_mutex());
  g_host_used -= std::min(bytes, g_host_used);
}
size_t host_used() {
  std::lock_guard<std::mutex> g(budget_mutex());
  return g_host_used;
}
static size_t host_budget_peak() {
  std::lock_guard<std::mutex> g(budget_mutex());
  return g_host_peak;
}

const char* stat_name(int s) {
  return (s >= 0 && s < kNumStats) ? kStatNames[s] : "?";
}
void stat_add(int device, int s, int64_t v) {
  if (device < 0 || device >= kMaxDevices) {
    return;
  }
  auto& d = all_stats()[device];
  int64_t now = d.v[s].fetch_add(v) + v;
  if (s == kHostBytes) {
    int64_t peak = d.host_peak.load();
    while (now > peak && !d.host_peak.compare_exchange_weak(peak, now)) {
    }
  }
}
int64_t stat_get(int device, int s) {
  if (device < 0 || device >= kMaxDevices) {
    return 0;
  }
  return all_stats()[device].v[s].load();
}
int64_t host_bytes_peak(int device) {
  if (device < 0 || device >= kMaxDevices) {
    return 0;
  }
  return all_stats()[device].host_peak.load();
}
void reset_peak(int device) {
  if (device >= 0 && device < kMaxDevices) {
    auto& d = all_stats()[device];
    d.host_peak = d.v[kHostBytes].load();
  }
  std::lock_guard<std::mutex> g(budget_mutex());
  g_host_peak = g_host_used;
}
void reset_accumulated(int device) {
  if (device < 0 || device >= kMaxDevices) {
    return;
  }
  auto& d = all_stats()[device];
  for (int s = 0; s < kNumStats; ++s) {
    if (s != kHostBytes) {
      d.v[s] = 0;
    }
  }
}

std::string stats_text(int device) {
  std::ostringstream o;
  o << "enabled=" << (enabled() ? 1 : 0) << "\n";
  for (int s = 0; s < kNumStats; ++s) {
    o << kStatNames[s] << "=" << stat_get(device, s) << "\n";
  }
  o << "host_bytes.peak=" << host_bytes_peak(device) << "\n";
  o << "page_bytes.large="
    << (device >= 0 && device < kMaxDevices
            ? all_stats()[device].large_page.load()
            : 0)
    << "\n";
  o << "host_budget.limit=" << host_mem_limit() << "\n";
  o << "host_budget.used=" << host_used() << "\n";
  o << "host_budget.peak=" << host_budget_peak() << "\n";
  o << host_pool_stats();
  o << "limit=" << limit() << "\n";
  o << "size=" << min_swap_size() << "\n";
  o << "defrag=" << (defrag_enabled() ? 1 : 0) << "\n";
  o << launch_gate_stats();
  return o.str();
}

#include <c10/cuda/impl/LMSHostPool.inc>
#include <c10/cuda/impl/LMSLaunchGate.inc>

} // namespace c10::cuda::CUDACachingAllocator::lms

namespace lms = c10::cuda::CUDACachingAllocator::lms;

extern "C" {
int c10_lms_abi_version() {
  return 1;
}
int c10_lms_supported() {
  return lms::supported() ? 1 : 0;
}
void c10_lms_set_enabled(int on) {
  lms::set_enabled(on != 0);
}
int c10_lms_get_enabled() {
  return lms::enabled() ? 1 : 0;
}
void c10_lms_set_limit(unsigned long long bytes) {
  lms::set_limit(bytes);
}
unsigned long long c10_lms_get_limit() {
  return lms::limit();
}
void c10_lms_set_size(unsigned long long bytes) {
  lms::set_min_swap_size(bytes);
}
unsigned long long c10_lms_get_size() {
  return lms::min_swap_size();
}
void c10_lms_set_host_mem_limit(unsigned long long bytes) {
  lms::set_host_mem_limit(bytes);
}
unsigned long long c10_lms_get_host_mem_limit() {
  return lms::host_mem_limit();
}
void c10_lms_set_defrag(int on) {
  lms::set_defrag_enabled(on != 0);
}
int c10_lms_get_defrag() {
  return lms::defrag_enabled() ? 1 : 0;
}
int c10_lms_host_reserve(unsigned long long bytes) {
  return lms::host_reserve(bytes) ? 1 : 0;
}
void c10_lms_host_release(unsigned long long bytes) {
  lms::host_release(bytes);
}
unsigned long long c10_lms_host_used() {
  return lms::host_used();
}
unsigned long long c10_lms_stats(
    int device,
    char* buf,
    unsigned long long cap) {
  std::string s = lms::stats_text(device);
  if (buf && cap > 0) {
    size_t n = std::min<size_t>(s.size(), cap - 1);
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  }
  return s.size();
}
void c10_lms_reset_peak_stats(int device) {
  lms::reset_peak(device);
}
void c10_lms_reset_accumulated_stats(int device) {
  lms::reset_accumulated(device);
}
int c10_lms_parse_settings(
    const char* settings,
    char* err,
    unsigned long long cap) {
  try {
    // the same lexer rules as CUDAAllocatorConfig::lexArgs
    std::vector<std::string> config;
    std::string buf;
    for (const char* c = settings; c && *c; ++c) {
      if (*c == ',' || *c == ':' || *c == '[' || *c == ']') {
        if (!buf.empty()) {
          config.push_back(buf);
          buf.clear();
        }
        config.emplace_back(1, *c);
      } else if (*c != ' ') {
        buf.push_back(*c);
      }
    }
    if (!buf.empty()) {
      config.push_back(buf);
    }
    for (size_t i = 0; i < config.size(); ++i) {
      size_t last = i;
      TORCH_CHECK(
          lms::parse_setting(config, i, &last),
          "not an LMS option: ",
          config[i]);
      i = last;
      if (i + 1 < config.size()) {
        TORCH_CHECK(config[i + 1] == ",", "expected ',' after ", config[i]);
        ++i;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    if (err && cap > 0) {
      std::string m = e.what();
      size_t n = std::min<size_t>(m.size(), cap - 1);
      std::memcpy(err, m.data(), n);
      err[n] = '\0';
    }
    return -1;
  }
}
}
