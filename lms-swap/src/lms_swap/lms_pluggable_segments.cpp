// The pluggable LMS allocator's segments: see lms_pluggable_segments.h.
#include "lms_pluggable_segments.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDALargeModelSupport.h>
#include <c10/cuda/impl/LMSDriverAPI.h>

#include <algorithm>
#include <chrono>

namespace lms_pluggable {

namespace {

size_t ns_since(std::chrono::steady_clock::time_point t0) {
  return static_cast<size_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now() - t0)
          .count());
}

// The alignment of a segment's address range: every page starts on a multiple
// of the page from the range's start, so the range needs only the largest power
// of two that divides the page (the driver refuses an alignment that is not a
// power of two, such as stock's 20 MiB page).
size_t range_alignment(size_t page) {
  return page & (~page + 1);
}

} // namespace

namespace lms = c10::cuda::CUDACachingAllocator::lms;
using c10::cuda::DriverAPI;

bool Segments::new_device_handle(
    size_t page,
    CUmemGenericAllocationHandle* out) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  CUresult st = DriverAPI::get()->cuMemCreate_(out, page, &prop, 0);
  if (st == CUDA_ERROR_OUT_OF_MEMORY) {
    return false;
  }
  C10_CUDA_DRIVER_CHECK(st);
  return true;
}

Block* Segments::make(
    size_t size,
    size_t page,
    bool small,
    cudaStream_t stream) {
  auto* api = DriverAPI::get();
  auto seg = std::make_unique<Segment>();
  seg->small = small;
  seg->page = page;
  seg->size = size;
  const size_t n = size / page;
  const auto t0 = std::chrono::steady_clock::now();
  C10_CUDA_DRIVER_CHECK(
      api->cuMemAddressReserve_(&seg->base, size, range_alignment(page), 0, 0));
  // undoes what was made (the first `mapped` pages are mapped)
  auto undo = [&](size_t mapped) {
    for (size_t i = 0; i < seg->handles.size(); ++i) {
      if (i < mapped) {
        (void)api->cuMemUnmap_(seg->base + i * page, page);
      }
      (void)api->cuMemRelease_(seg->handles[i]);
    }
    (void)api->cuMemAddressFree_(seg->base, size);
  };
  for (size_t i = 0; i < n; ++i) {
    CUmemGenericAllocationHandle h = 0;
    bool made = false;
    try {
      made = new_device_handle(page, &h);
    } catch (...) {
      undo(0);
      throw;
    }
    if (!made) {
      undo(0);
      return nullptr;
    }
    seg->handles.push_back(h);
  }
  for (size_t i = 0; i < n; ++i) {
    CUresult st =
        api->cuMemMap_(seg->base + i * page, page, 0, seg->handles[i], 0ULL);
    if (st != CUDA_SUCCESS) {
      undo(i);
      C10_CUDA_DRIVER_CHECK(st);
    }
  }
  const int access = lms::set_device_access(seg->base, size, device_);
  if (access != 0) {
    undo(n);
    C10_CUDA_DRIVER_CHECK(static_cast<CUresult>(access));
  }
  mapped_ += size;
  note_device_bytes();
  costs_.map_bytes += size;
  costs_.map_ns += ns_since(t0);
  return add(std::move(seg), stream, /*mapped=*/true);
}

Block* Segments::reserve(size_t size, size_t page, cudaStream_t stream) {
  auto seg = std::make_unique<Segment>();
  seg->page = page;
  seg->size = size;
  seg->expandable = true;
  C10_CUDA_DRIVER_CHECK(
      DriverAPI::get()->cuMemAddressReserve_(&seg->base, size, range_alignment(page), 0, 0));
  seg->handles.assign(size / page, 0);
  return add(std::move(seg), stream, /*mapped=*/false);
}

Block* Segments::add(
    std::unique_ptr<Segment> seg,
    cudaStream_t stream,
    bool mapped) {
  const size_t n = seg->size / seg->page;
  seg->mapped.assign(n, mapped);
  seg->on_host.assign(n, false);
  auto* b = new Block();
  b->ptr = reinterpret_cast<char*>(seg->base);
  b->size = seg->size;
  b->stream = stream;
  b->seg = seg.get();
  b->mapped = mapped;
  seg->first = b;
  segments_.push_back(std::move(seg));
  return b;
}

bool Segments::map_pages(Segment* s, size_t first, size_t count) {
  auto* api = DriverAPI::get();
  const auto t0 = std::chrono::steady_clock::now();
  const size_t page = s->page;
  size_t done = 0; // pages [first, first + done) are mapped
  auto undo = [&]() {
    for (size_t i = first; i < first + done; ++i) {
      (void)api->cuMemUnmap_(s->base + i * page, page);
      (void)api->cuMemRelease_(s->handles[i]);
      s->handles[i] = 0;
      s->mapped[i] = false;
    }
  };
  for (; done < count; ++done) {
    const size_t i = first + done;
    CUmemGenericAllocationHandle h = 0;
    bool made = false;
    try {
      made = new_device_handle(page, &h);
    } catch (...) {
      undo();
      throw;
    }
    if (!made) {
      undo();
      return false;
    }
    CUresult st = api->cuMemMap_(s->base + i * page, page, 0, h, 0ULL);
    if (st != CUDA_SUCCESS) {
      (void)api->cuMemRelease_(h);
      undo();
      C10_CUDA_DRIVER_CHECK(st);
    }
    s->handles[i] = h;
    s->mapped[i] = true;
    s->on_host[i] = false;
  }
  const int access =
      lms::set_device_access(s->base + first * page, count * page, device_);
  if (access != 0) {
    undo();
    C10_CUDA_DRIVER_CHECK(static_cast<CUresult>(access));
  }
  mapped_ += count * page;
  note_device_bytes();
  costs_.map_bytes += count * page;
  costs_.map_ns += ns_since(t0);
  return true;
}

void Segments::unmap_pages(Segment* s, size_t first, size_t count) {
  auto* api = DriverAPI::get();
  const auto t0 = std::chrono::steady_clock::now();
  size_t device_pages = 0;
  for (size_t i = first; i < first + count; ++i) {
    if (!s->mapped[i]) {
      continue;
    }
    C10_CUDA_DRIVER_CHECK(api->cuMemUnmap_(s->base + i * s->page, s->page));
    if (s->on_host[i]) {
      on_host_ -= s->page;
      lms::host_page_release(device_, s->page, s->handles[i]);
      lms::stat_add(device_, lms::kHostBytes, -static_cast<int64_t>(s->page));
      lms::stat_add(device_, lms::kHostPagesDropped, 1);
    } else {
      C10_CUDA_DRIVER_CHECK(api->cuMemRelease_(s->handles[i]));
      ++device_pages;
    }
    s->handles[i] = 0;
    s->mapped[i] = false;
    s->on_host[i] = false;
    mapped_ -= s->page;
  }
  costs_.unmap_bytes += device_pages * s->page;
  costs_.unmap_ns += ns_since(t0);
}

void Segments::synchronize_for_release() {
  const auto t0 = std::chrono::steady_clock::now();
  C10_CUDA_CHECK(cudaDeviceSynchronize());
  ++costs_.release_syncs;
  costs_.release_sync_ns += ns_since(t0);
}

void Segments::release(Segment* s) {
  unmap_pages(s, 0, s->handles.size());
  C10_CUDA_DRIVER_CHECK(
      DriverAPI::get()->cuMemAddressFree_(s->base, s->size));
  delete s->first;
  segments_.erase(std::find_if(
      segments_.begin(), segments_.end(), [s](const auto& p) {
        return p.get() == s;
      }));
}

CUmemGenericAllocationHandle Segments::remap(
    Segment* s,
    size_t idx,
    CUmemGenericAllocationHandle h,
    bool on_host) {
  CUmemGenericAllocationHandle old = s->handles.at(idx);
  const int devices[1] = {device_};
  C10_CUDA_DRIVER_CHECK(static_cast<CUresult>(
      lms::remap_page(s->base + idx * s->page, s->page, old, h, devices, 1)));
  s->handles[idx] = h;
  if (s->on_host[idx] != on_host) {
    on_host_ = on_host ? on_host_ + s->page : on_host_ - s->page;
    note_device_bytes();
  }
  s->on_host[idx] = on_host;
  return old;
}

} // namespace lms_pluggable
