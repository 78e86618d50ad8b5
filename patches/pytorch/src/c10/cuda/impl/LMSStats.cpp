// Large Model Support: the statistics, per device (stat_add and the rest of
// CUDALargeModelSupport.h's "statistics" section), and stats_text, the
// "key=value" lines torch/cuda/lms.py turns into the lms.* keys of
// torch.cuda.memory_stats(). kStatNames holds one name per Stat, in the
// enum's order.
#include <c10/cuda/CUDALargeModelSupport.h>
#include <c10/cuda/impl/LMSHostBudget.h>
#include <c10/cuda/impl/LMSState.h>

#include <sstream>
#include <string>

namespace c10::cuda::CUDACachingAllocator::lms {

namespace impl {

std::array<DeviceStats, kMaxDevices>& all_stats() {
  static std::array<DeviceStats, kMaxDevices> s;
  return s;
}

} // namespace impl

using impl::all_stats;
using impl::host_budget_peak;
using impl::kMaxDevices;

namespace {

const char* const kStatNames[] = {
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
    "returns_held",
    "limit_spills",
    "limit_spill_bytes",
    "reserve_reclaims",
};
// a Stat added without its name would print a null name
static_assert(
    sizeof(kStatNames) / sizeof(kStatNames[0]) == kNumStats,
    "kStatNames needs one name per Stat");

} // namespace

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
  impl::reset_host_budget_peak();
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

} // namespace c10::cuda::CUDACachingAllocator::lms
