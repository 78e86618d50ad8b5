// Large Model Support: the host budget (host_mem_limit, host_reserve and the
// rest of CUDALargeModelSupport.h's "host budget" section) and the rule for
// its default (impl/LMSHostBudget.h).
//
// One budget per process, shared by the allocator's host pages (the host
// pool charges every handle it makes) and Python's activation swapping
// (torch/cuda/lms.py _host_reserve/_host_release). Invariants: host_reserve
// refuses what would take the bytes in use past the limit; use, peak and the
// first read of the default limit are guarded by one mutex, under which no
// driver call is made.
#include <c10/cuda/CUDALargeModelSupport.h>
#include <c10/cuda/impl/LMSHostBudget.h>
#include <c10/cuda/impl/LMSState.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>

namespace c10::cuda::CUDACachingAllocator::lms {

using impl::kMiB;
using impl::settings;

namespace {

// The host budget's default for this process: host_budget_rule
// (impl/LMSHostBudget.h) on the host memory that is available now.
size_t default_host_limit() {
  size_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (meminfo >> key >> kb >> unit) {
    if (key == "MemAvailable:") {
      available = kb * 1024;
      break;
    }
  }
  size_t bytes = 0;
  std::string err;
  TORCH_CHECK(
      impl::host_budget_rule(
          std::getenv("PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB"),
          std::getenv("LOCAL_WORLD_SIZE"),
          available,
          &bytes,
          &err),
      err);
  return bytes;
}

std::mutex& budget_mutex() {
  static std::mutex m;
  return m;
}
size_t g_host_used = 0; // guarded by budget_mutex
size_t g_host_peak = 0;

} // namespace

namespace impl {

size_t parse_local_world_size(const char* value) {
  if (value == nullptr || *value == '\0') {
    return 1;
  }
  size_t n = 0;
  for (const char* c = value; *c; ++c) {
    if (*c < '0' || *c > '9') {
      return 1;
    }
    const size_t d = static_cast<size_t>(*c - '0');
    // saturates: a budget shared by that many processes is 0 either way
    n = n > (SIZE_MAX - d) / 10 ? SIZE_MAX : n * 10 + d;
  }
  return n > 0 ? n : 1;
}

size_t local_world_size() {
  return parse_local_world_size(std::getenv("LOCAL_WORLD_SIZE"));
}

bool host_budget_rule(
    const char* limit_mb,
    const char* local_world_size,
    size_t host_bytes,
    size_t* bytes,
    std::string* err) {
  std::string raw = limit_mb ? limit_mb : "";
  const char* blanks = " \t\n\r\f\v";
  const size_t b = raw.find_first_not_of(blanks);
  if (limit_mb == nullptr || b == std::string::npos) {
    // unset or blank: 80% of the host, shared by the node's processes
    const double share = static_cast<double>(host_bytes) * 0.80;
    *bytes = static_cast<size_t>(share) /
        parse_local_world_size(local_world_size);
    return true;
  }
  const std::string text = raw.substr(b, raw.find_last_not_of(blanks) - b + 1);
  auto refuse = [&](const char* why) {
    *err = std::string("PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB='") + raw +
        "': expected a number of MiB, finite and >= 0 (e.g. 65536)" + why;
    return false;
  };
  // what Python's float() reads: decimal only, '_' only between digits
  std::string num;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '_') {
      const bool between = i > 0 && i + 1 < text.size() &&
          std::isdigit(static_cast<unsigned char>(text[i - 1])) &&
          std::isdigit(static_cast<unsigned char>(text[i + 1]));
      if (!between) {
        return refuse("");
      }
      continue;
    }
    if (c == 'x' || c == 'X' || c == 'p' || c == 'P' || c == '(') {
      return refuse(""); // hexadecimal floats and nan(...) are C's only
    }
    num.push_back(c);
  }
  char* end = nullptr;
  const double mb = std::strtod(num.c_str(), &end);
  if (end == num.c_str() || *end != '\0') {
    return refuse("");
  }
  if (!std::isfinite(mb)) {
    return refuse("; it is not finite");
  }
  if (mb < 0) {
    return refuse("; must not be negative");
  }
  const double v = mb * static_cast<double>(kMiB);
  *bytes = v >= 18446744073709551615.0 ? SIZE_MAX : static_cast<size_t>(v);
  return true;
}

size_t host_budget_peak() {
  std::lock_guard<std::mutex> g(budget_mutex());
  return g_host_peak;
}
void reset_host_budget_peak() {
  std::lock_guard<std::mutex> g(budget_mutex());
  g_host_peak = g_host_used;
}

} // namespace impl

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

} // namespace c10::cuda::CUDACachingAllocator::lms
