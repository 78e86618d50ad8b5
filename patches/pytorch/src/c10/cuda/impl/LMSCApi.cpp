// Large Model Support: the C API for ctypes (the extern "C" c10_lms_*
// functions of CUDALargeModelSupport.h; torch/cuda/lms.py loads them from
// libc10_cuda). Each one calls the C++ API; c10_lms_host_budget_rule and
// c10_lms_parse_settings write their errors into the caller's buffer instead
// of throwing.
#include <c10/cuda/CUDALargeModelSupport.h>
#include <c10/cuda/impl/LMSHostBudget.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

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
int c10_lms_host_budget_rule(
    const char* limit_mb,
    const char* local_world_size,
    unsigned long long host_bytes,
    unsigned long long* bytes,
    char* err,
    unsigned long long cap) {
  size_t out = 0;
  std::string why;
  if (!lms::impl::host_budget_rule(
          limit_mb, local_world_size, static_cast<size_t>(host_bytes), &out, &why)) {
    if (err && cap > 0) {
      size_t n = std::min<size_t>(why.size(), cap - 1);
      std::memcpy(err, why.data(), n);
      err[n] = '\0';
    }
    return -1;
  }
  if (bytes) {
    *bytes = out;
  }
  return 0;
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
