// The pluggable LMS allocator's connection to PyTorch: the module
// lms_swap/allocator.py loads, which installs it as the CUDA allocator
// (torch::cuda::CUDAPluggableAllocator, made here rather than through Python's
// CUDAPluggableAllocator(path, alloc, free), which connects neither
// record_stream nor empty_cache).
#include "lms_pluggable_allocator.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDALargeModelSupport.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>

#include <memory>
#include <string>
#include <vector>

namespace {

namespace lms = c10::cuda::CUDACachingAllocator::lms;

void* alloc_fn(size_t size, int device, cudaStream_t stream) {
  return lms_pluggable::malloc(device, size, stream);
}

void free_fn(void* ptr, size_t /*size*/, int device, cudaStream_t /*stream*/) {
  lms_pluggable::free(device, ptr);
}

void empty_all() {
  for (int d = 0; d < lms_pluggable::devices(); ++d) {
    lms_pluggable::empty_cache(d);
  }
}

// Makes this library PyTorch's CUDA allocator, with record_stream,
// empty_cache and the per-process memory fraction connected. PyTorch refuses
// once its allocator has served an allocation.
void install() {
  using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;
  auto a = std::make_shared<CUDAPluggableAllocator>(alloc_fn, free_fn);
  // the tensor's device need not be the current one
  a->set_record_stream_fn([](void* ptr, cudaStream_t s) {
    for (int d = 0; d < lms_pluggable::devices(); ++d) {
      if (lms_pluggable::record_stream(d, ptr, s)) {
        return;
      }
    }
  });
  a->set_reset_fn(empty_all);
  // torch.cuda.set_per_process_memory_fraction: where the native allocator
  // would fail, LMS moves pages instead (the LMS limit, one for the process)
  a->set_memory_fraction_fn([](double fraction, int device) {
    TORCH_CHECK(
        fraction > 0.0 && fraction <= 1.0,
        "set_per_process_memory_fraction: ",
        fraction,
        " is not in (0, 1]");
    size_t free_b = 0;
    size_t total_b = 0;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    C10_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    lms::set_limit(
        fraction < 1.0 ? static_cast<size_t>(fraction * double(total_b)) : 0);
  });
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(a);
}

py::dict memory_stats(int device) {
  const auto c = lms_pluggable::counters(device);
  py::dict d;
  d["allocated_bytes"] = c.allocated;
  d["peak_allocated_bytes"] = c.peak_allocated;
  d["reserved_bytes"] = c.reserved;
  d["device_reserved_bytes"] = c.device_reserved;
  d["peak_device_reserved_bytes"] = c.peak_device_reserved;
  d["device_allocated_bytes"] = c.device_allocated;
  d["peak_device_allocated_bytes"] = c.peak_device_allocated;
  d["segments"] = c.segments;
  d["cached_free_bytes"] = c.cached_free;
  d["live_allocations"] = c.live;
  d["map_bytes"] = c.mapping.map_bytes;
  d["map_ns"] = c.mapping.map_ns;
  d["unmap_bytes"] = c.mapping.unmap_bytes;
  d["unmap_ns"] = c.mapping.unmap_ns;
  d["release_syncs"] = c.mapping.release_syncs;
  d["release_sync_ns"] = c.mapping.release_sync_ns;
  d["lms"] = lms::stats_text(device);
  return d;
}

void configure(const std::string& settings) {
  std::vector<char> err(512, '\0');
  TORCH_CHECK(
      c10_lms_parse_settings(settings.c_str(), err.data(), err.size()) == 0,
      err.data());
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install);
  m.def("set_enabled", [](bool on) { lms::set_enabled(on); });
  m.def("enabled", [] { return lms::enabled(); });
  m.def("supported", [] { return lms::supported(); });
  m.def("configure", &configure);
  m.def("memory_stats", &memory_stats);
  // what activation swapping reads at every saved tensor (no dict, no LMS
  // text): allocated bytes wherever their pages are, so that it keeps the
  // whole allocation within the device and LMS's page moves stay a net; the
  // reserved bytes on the device; the peak of allocated bytes
  m.def("device_counts", [](int device) {
    const auto c = lms_pluggable::counters(device);
    return py::make_tuple(c.allocated, c.device_reserved, c.peak_allocated);
  });
  m.def("reset_peak", [](int device) {
    lms_pluggable::reset_peak(device);
    lms::reset_peak(device);
  });
  // activation swapping's running peak and release count, which the eviction
  // net gives it under the native allocator
  m.def("mark_peak", &lms_pluggable::mark_peak);
  m.def("peak_growth", &lms_pluggable::peak_growth);
  m.def("released", &lms_pluggable::released);
  m.def("empty_cache", &empty_all);
  // the host budget activation swapping shares, and the LMS limit it aims under
  m.def("host_reserve", [](size_t bytes) { return lms::host_reserve(bytes); });
  m.def("host_release", [](size_t bytes) { lms::host_release(bytes); });
  m.def("limit", [] { return lms::limit(); });
}
