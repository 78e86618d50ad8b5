// Large Model Support: moving pages of allocated blocks between device and
// host memory. See impl/LMSPageMoves.h. Every move of a live page runs inside
// a lms::QuietDevice (impl/LMSLaunchGate.cpp) with the host pool's filler
// paused (impl/LMSHostPool.cpp).
#include <c10/cuda/impl/LMSPageMoves.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDALargeModelSupport.h>
#include <c10/util/Exception.h>

#if !defined(USE_ROCM) && defined(PYTORCH_C10_DRIVER_API_SUPPORTED)
#include <c10/cuda/impl/LMSDriverAPI.h>
#endif

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <utility>

namespace c10::cuda::CUDACachingAllocator::lms::impl {

#if !defined(USE_ROCM) && defined(PYTORCH_C10_DRIVER_API_SUPPORTED)

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The host pool's filler makes no driver calls while pages move (they
// contend: a return ran at 0.15 of a pinned copy beside it).
struct FillerPaused {
  FillerPaused() {
    host_pool_pause();
  }
  ~FillerPaused() {
    host_pool_resume();
  }
  FillerPaused(const FillerPaused&) = delete;
  FillerPaused& operator=(const FillerPaused&) = delete;
};

} // namespace

// Pages being moved together: their copies were queued on the mover's stream
// into host pages (out) or into one half of the staging window (in); `done`
// fires when the copies finished. Moves are pipelined: the host remaps chunk
// k while the copy engine moves chunk k+1. On a failure partway (a driver
// error; remap leaves the failed page on its old handle) the pages from
// `finished` on were not moved: their new pages are given back
// (drop_unmoved).
struct PageMover::Chunk {
  size_t ps = 0;
  unsigned long long win = 0;
  std::vector<std::pair<const PageRef*, PageHandle>> pages;
  cudaEvent_t done = nullptr;
  size_t finished = 0; // pages remapped at their address
  size_t win_mapped = 0; // (in) pages mapped in the staging window
  size_t win_unmapped = 0; // (in) of those, unmapped from it again
};

void PageMover::init(int device) {
  if (stream_ == nullptr) {
    device_ = device;
    CUDAGuard g(static_cast<c10::DeviceIndex>(device));
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
}

cudaEvent_t PageMover::take_event() {
  if (!idle_events_.empty()) {
    cudaEvent_t ev = idle_events_.back();
    idle_events_.pop_back();
    return ev;
  }
  CUDAGuard g(static_cast<c10::DeviceIndex>(device_));
  cudaEvent_t ev = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  return ev;
}

void PageMover::give_event(cudaEvent_t ev) {
  if (ev != nullptr) {
    idle_events_.push_back(ev);
  }
}

unsigned long long PageMover::window(size_t page_size) {
  auto it = windows_.find(page_size);
  if (it != windows_.end()) {
    return it->second;
  }
  CUdeviceptr va = 0;
  C10_CUDA_DRIVER_CHECK(DriverAPI::get()->cuMemAddressReserve_(
      &va, page_size * kWindowPages * 2, 0, 0, 0ULL));
  windows_[page_size] = va;
  return va;
}

void PageMover::window_map(unsigned long long va, size_t size, PageHandle h) {
  C10_CUDA_DRIVER_CHECK(DriverAPI::get()->cuMemMap_(va, size, 0, h, 0ULL));
  C10_CUDA_DRIVER_CHECK(
      static_cast<CUresult>(set_device_access(va, size, device_)));
}

// Orders the mover's stream after all work queued so far on `streams`. One
// event serves every stream: a stream wait takes the event's state at the
// time of the wait call.
void PageMover::wait_for(std::vector<cudaStream_t>& streams) {
  std::sort(streams.begin(), streams.end());
  streams.erase(std::unique(streams.begin(), streams.end()), streams.end());
  CUDAGuard g(static_cast<c10::DeviceIndex>(device_));
  cudaEvent_t ev = take_event();
  try {
    for (cudaStream_t s : streams) {
      C10_CUDA_CHECK(cudaEventRecord(ev, s));
      C10_CUDA_CHECK(cudaStreamWaitEvent(stream_, ev, 0));
    }
  } catch (...) {
    give_event(ev);
    throw;
  }
  give_event(ev);
}

// After a failed move: waits for the copies still queued (they write the new
// pages), then gives back the new pages of every page not remapped: host
// pages to the pool (out), device handles and their window mappings (in).
// Errors here are ignored: the move already failed with its own.
void PageMover::drop_unmoved(Chunk* c, bool out) {
  if (c == nullptr) {
    return;
  }
  (void)cudaStreamSynchronize(stream_);
  auto* api = DriverAPI::get();
  for (size_t j = c->finished; j < c->pages.size(); ++j) {
    const auto h = c->pages[j].second;
    if (out) {
      host_page_release(device_, c->ps, h);
      continue;
    }
    if (j < c->win_mapped && j >= c->win_unmapped) {
      (void)api->cuMemUnmap_(c->win + j * c->ps, c->ps);
    }
    (void)api->cuMemRelease_(h);
  }
  give_event(c->done);
  c->done = nullptr;
}

void PageMover::swap_out(
    AllocatorHooks& hooks,
    const std::vector<PageRef>& victims,
    std::vector<cudaStream_t> streams,
    SwapOut& out) {
  if (victims.empty()) {
    return;
  }
  const int64_t t0 = now_ns();
  stat_add(device_, kReclaimEvents, 1);
  // the pages are live: nothing may run on them until they are remapped
  QuietDevice quiet(device_);
  FillerPaused paused;
  wait_for(streams);
  stat_add(device_, kSwapOutQuiesceNs, now_ns() - t0);
  size_t k = 0;
  std::optional<Chunk> prev;
  std::optional<Chunk> cur;
  auto finish = [&](Chunk& c) {
    const int64_t w0 = now_ns();
    C10_CUDA_CHECK(cudaEventSynchronize(c.done));
    stat_add(device_, kSwapOutCopyWaitNs, now_ns() - w0);
    while (c.finished < c.pages.size()) {
      const PageRef& pg = *c.pages[c.finished].first;
      PageHandle old =
          hooks.remap(pg.seg, pg.idx, c.pages[c.finished].second, true);
      ++c.finished;
      out.released += c.ps;
      stat_add(device_, kHostBytes, static_cast<int64_t>(c.ps));
      stat_add(device_, kSwapOutBytes, static_cast<int64_t>(c.ps));
      stat_add(device_, kSwapOutPages, 1);
      C10_CUDA_DRIVER_CHECK(DriverAPI::get()->cuMemRelease_(old));
    }
    give_event(c.done);
    c.done = nullptr;
  };
  try {
    while (k < victims.size() && !out.host_exhausted) {
      // a chunk of pages of one page size
      Chunk& c = cur.emplace();
      c.ps = hooks.page_size(victims[k].seg);
      while (k < victims.size() && c.pages.size() < kWindowPages &&
             c.pages.size() * c.ps < kChunkBytes &&
             hooks.page_size(victims[k].seg) == c.ps) {
        unsigned long long h = 0;
        unsigned long long host_va = 0;
        if (!host_page_acquire(device_, c.ps, &h, &host_va)) {
          out.host_exhausted = true;
          break;
        }
        c.pages.emplace_back(&victims[k], h);
        C10_CUDA_CHECK(cudaMemcpyAsync(
            reinterpret_cast<void*>(host_va),
            hooks.page_ptr(victims[k].seg, victims[k].idx),
            c.ps,
            cudaMemcpyDeviceToDevice,
            stream_));
        ++k;
      }
      if (c.pages.empty()) {
        cur.reset();
        break;
      }
      c.done = take_event();
      C10_CUDA_CHECK(cudaEventRecord(c.done, stream_));
      if (prev) {
        finish(*prev);
      }
      prev = std::move(cur);
      cur.reset();
    }
    if (prev) {
      finish(*prev);
    }
  } catch (...) {
    // Every page is still mapped, on its old or its new memory: the
    // allocation fails with the driver's error, nothing is lost.
    drop_unmoved(prev ? &*prev : nullptr, /*out=*/true);
    drop_unmoved(cur ? &*cur : nullptr, /*out=*/true);
    throw;
  }
  stat_add(device_, kSwapOutNs, now_ns() - t0);
}

size_t PageMover::swap_in(
    AllocatorHooks& hooks,
    const std::vector<PageRef>& pages,
    size_t room) {
  if (pages.empty() || room == 0) {
    return 0;
  }
  // the pages are live: nothing may run on them until they are remapped
  QuietDevice quiet(device_);
  FillerPaused paused;
  const int64_t t0 = now_ns();
  size_t back = 0;
  size_t planned = 0;
  size_t k = 0;
  int half = 0;
  bool device_full = false;
  std::optional<Chunk> prev;
  std::optional<Chunk> cur;
  auto finish = [&](Chunk& c) {
    C10_CUDA_CHECK(cudaEventSynchronize(c.done));
    while (c.finished < c.pages.size()) {
      const size_t j = c.finished;
      if (c.win_unmapped <= j) {
        C10_CUDA_DRIVER_CHECK(
            DriverAPI::get()->cuMemUnmap_(c.win + j * c.ps, c.ps));
        c.win_unmapped = j + 1;
      }
      const PageRef& pg = *c.pages[j].first;
      PageHandle old = hooks.remap(pg.seg, pg.idx, c.pages[j].second, false);
      c.finished = j + 1;
      host_page_release(device_, c.ps, old);
      back += c.ps;
      stat_add(device_, kHostBytes, -static_cast<int64_t>(c.ps));
      stat_add(device_, kSwapInBytes, static_cast<int64_t>(c.ps));
      stat_add(device_, kSwapInPages, 1);
    }
    give_event(c.done);
    c.done = nullptr;
  };
  try {
    while (k < pages.size() && !device_full) {
      Chunk& c = cur.emplace();
      c.ps = hooks.page_size(pages[k].seg);
      c.win = window(c.ps) + half * kWindowPages * c.ps;
      std::vector<cudaStream_t> streams;
      while (k < pages.size() && c.pages.size() < kWindowPages &&
             c.pages.size() * c.ps < kChunkBytes &&
             hooks.page_size(pages[k].seg) == c.ps) {
        if (room < planned + c.ps) {
          device_full = true;
          break;
        }
        PageHandle h = 0;
        if (!hooks.new_device_page(pages[k].seg, &h)) {
          device_full = true;
          break;
        }
        c.pages.emplace_back(&pages[k], h);
        window_map(c.win + (c.pages.size() - 1) * c.ps, c.ps, h);
        c.win_mapped = c.pages.size();
        streams.insert(
            streams.end(), pages[k].streams.begin(), pages[k].streams.end());
        planned += c.ps;
        ++k;
      }
      if (c.pages.empty()) {
        cur.reset();
        break;
      }
      wait_for(streams);
      for (size_t j = 0; j < c.pages.size(); ++j) {
        const PageRef& pg = *c.pages[j].first;
        C10_CUDA_CHECK(cudaMemcpyAsync(
            reinterpret_cast<void*>(c.win + j * c.ps),
            hooks.page_ptr(pg.seg, pg.idx),
            c.ps,
            cudaMemcpyDeviceToDevice,
            stream_));
      }
      c.done = take_event();
      C10_CUDA_CHECK(cudaEventRecord(c.done, stream_));
      if (prev) {
        finish(*prev);
      }
      prev = std::move(cur);
      cur.reset();
      half ^= 1;
    }
    if (prev) {
      finish(*prev);
    }
  } catch (const std::exception& e) {
    drop_unmoved(prev ? &*prev : nullptr, /*out=*/false);
    drop_unmoved(cur ? &*cur : nullptr, /*out=*/false);
    TORCH_WARN(
        "Large Model Support: bringing pages back to the GPU failed; their "
        "data stays in host memory (still usable, over PCIe): ",
        e.what());
  }
  if (back) {
    stat_add(device_, kSwapInNs, now_ns() - t0);
  }
  return back;
}

#else // LMS cannot be enabled here (lms::supported())

void PageMover::init(int device) {
  device_ = device;
}
void PageMover::swap_out(
    AllocatorHooks&,
    const std::vector<PageRef>&,
    std::vector<cudaStream_t>,
    SwapOut&) {}
size_t PageMover::swap_in(AllocatorHooks&, const std::vector<PageRef>&, size_t) {
  return 0;
}

#endif

} // namespace c10::cuda::CUDACachingAllocator::lms::impl
