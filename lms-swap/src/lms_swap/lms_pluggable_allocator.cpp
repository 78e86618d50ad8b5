// Large Model Support as a pluggable allocator for stock PyTorch
// (torch.cuda.memory.CUDAPluggableAllocator): the allocator-level LMS of the
// patched build, with no rebuild of PyTorch.
//
// The LMS logic is not here. It is the patched build's own translation units,
// compiled into this library unchanged (lms_swap/allocator_sources.py lists
// them): c10/cuda/CUDALargeModelSupport.cpp (settings), impl/LMSHostBudget.cpp
// (the host budget), impl/LMSStats.cpp (statistics), impl/LMSPageRemap.cpp
// (page remaps), impl/LMSCApi.cpp (the C API), impl/LMSDeviceAllocator.cpp
// (the search order of a malloc with LMS on, returns, the OOM report),
// impl/LMSPageMoves.cpp (page moves), impl/LMSHostPool.cpp (pinned host
// pages), impl/LMSLaunchGate.cpp.
// They reach an allocator only through lms::impl::AllocatorHooks. Here a
// small caching allocator implements those hooks, as each tag's
// DeviceCachingAllocator does in the patched build:
//   Segments    VMM segments whose pages LMS moves (lms_pluggable_segments.h):
//               fixed, one per large request as upstream's default, or one
//               expandable per stream, as with PyTorch's expandable_segments
//               setting, which this allocator follows
//               (ExpandableSegments, lms_pluggable_expandable.h)
//   FreeBlocks  best fit per stream, split and merged (lms_pluggable_free_blocks.h)
//   PendingFrees blocks freed while other streams used them, until their
//               events (lms_pluggable_pending_frees.h)
//   page walks  which pages may move, for the core (lms_pluggable_page_walks.h)
//   DeviceLms   the core, which calls back through the hooks below
// Every entry takes the device's mutex; the core runs under it.
#include "lms_pluggable_allocator.h"

#include "lms_pluggable_expandable.h"
#include "lms_pluggable_free_blocks.h"
#include "lms_pluggable_page_walks.h"
#include "lms_pluggable_pending_frees.h"
#include "lms_pluggable_segments.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDALargeModelSupport.h>
#include <c10/cuda/impl/LMSAllocatorHooks.h>
#include <c10/cuda/impl/LMSDeviceAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lms_pluggable {

namespace {

namespace lms = c10::cuda::CUDACachingAllocator::lms;

constexpr size_t kSmallSegment = size_t(2) << 20; // small pool's segment/page
constexpr size_t kUpstreamLargePage = size_t(20) << 20;
constexpr size_t kSharedBelow = size_t(10) << 20; // requests sharing a segment

std::string format_bytes(size_t n) {
  std::ostringstream o;
  o.precision(2);
  o << std::fixed;
  if (n >= (size_t(1) << 30)) {
    o << static_cast<double>(n) / double(size_t(1) << 30) << " GiB";
  } else if (n >= (size_t(1) << 20)) {
    o << static_cast<double>(n) / double(size_t(1) << 20) << " MiB";
  } else {
    o << n << " bytes";
  }
  return o.str();
}

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

class DeviceAllocator final : public lms::impl::AllocatorHooks {
 public:
  explicit DeviceAllocator(int device)
      : device_(device),
        expandable_(expandable_segments_setting()),
        segments_(device) {}

  void* malloc(size_t size, cudaStream_t stream) {
    if (size == 0) {
      return nullptr;
    }
    std::lock_guard<std::recursive_mutex> lock(mu_);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    pending_.collect(/*wait=*/false);
    Request req;
    req.size = round_up(size, kRound);
    req.stream = stream;
    req.small = req.size <= kSmallRequest;
    RequestScope scope(*this, &req);
    Block* b = free_.take(req.size, stream, req.small);
    bool ok = serve(req, b);
    if (!ok && !pending_.empty()) {
      // blocks other streams still used: wait for those streams once
      pending_.collect(/*wait=*/true);
      b = free_.take(req.size, stream, req.small);
      ok = serve(req, b);
    }
    if (!ok) {
      oom(req);
    }
    b = b ? b : req.got;
    b->allocated = true;
    b->requested = size;
    b->tick = ++clock_;
    live_[b->ptr] = b;
    allocated_ += size;
    peak_allocated_ = std::max(peak_allocated_, allocated_);
    running_peak_ = std::max(running_peak_, allocated_);
    peak_device_allocated_ =
        std::max(peak_device_allocated_, device_allocated());
    return b->ptr;
  }

  void free(void* ptr) {
    if (!ptr) {
      return;
    }
    std::lock_guard<std::recursive_mutex> lock(mu_);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    auto it = live_.find(ptr);
    TORCH_CHECK(
        it != live_.end(),
        "LMS pluggable allocator: free of a pointer it did not allocate");
    Block* b = it->second;
    live_.erase(it);
    b->allocated = false;
    allocated_ -= b->requested;
    b->requested = 0;
    const size_t freed = b->size;
    if (growth_.holds_host_pages(*b)) {
      // its host pages are unmapped once its own stream is past this free
      // too, without a device sync (pending_ lists it)
      b->uses.push_back(b->stream);
    }
    pending_.add(b);
    if (lms_.started()) {
      RequestScope scope(*this, nullptr);
      lms_.after_free(freed);
    }
  }

  bool record_stream(void* ptr, cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto it = live_.find(ptr);
    if (it == live_.end()) {
      return false;
    }
    Block* b = it->second;
    if (s != b->stream &&
        std::find(b->uses.begin(), b->uses.end(), s) == b->uses.end()) {
      b->uses.push_back(s);
    }
    return true;
  }

  void empty_cache() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    RequestScope scope(*this, nullptr);
    release_free_pages();
    lms_.empty_cache();
  }

  Counters counters() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    Counters c;
    c.allocated = allocated_;
    c.peak_allocated = peak_allocated_;
    c.reserved = segments_.mapped_bytes();
    c.device_reserved = segments_.device_bytes();
    c.peak_device_reserved = segments_.peak_device_bytes();
    c.device_allocated = device_allocated();
    c.peak_device_allocated = peak_device_allocated_;
    c.segments = segments_.all().size();
    c.cached_free = free_.bytes();
    c.live = live_.size();
    c.mapping = segments_.costs();
    return c;
  }

  void reset_peak() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    peak_allocated_ = allocated_;
    peak_device_allocated_ = device_allocated();
    segments_.reset_peak();
  }

  // The running peak activation swapping marks at phase boundaries: it leaves
  // the program's own peak (reset_peak) alone.
  void mark_peak() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    mark_ = running_peak_ = allocated_;
  }
  size_t peak_growth() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return running_peak_ - mark_;
  }
  size_t released() {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return released_;
  }

  // ---- lms::impl::AllocatorHooks: segments ----
  size_t page_size(const void* seg) const override {
    return as_segment(seg)->page;
  }
  char* page_ptr(const void* seg, size_t idx) const override {
    return as_segment(seg)->page_ptr(idx);
  }
  bool on_host(const void* seg, size_t idx) const override {
    return as_segment(seg)->on_host.at(idx);
  }
  size_t page_index(const void* seg, const void* p) const override {
    return as_segment(seg)->page_index(p);
  }
  bool new_device_page(void* seg, lms::impl::PageHandle* out) override {
    CUmemGenericAllocationHandle h = 0;
    if (!segments_.new_device_handle(as_segment(seg)->page, &h)) {
      return false;
    }
    *out = h;
    return true;
  }
  lms::impl::PageHandle remap(
      void* seg,
      size_t idx,
      lms::impl::PageHandle h,
      bool host) override {
    return segments_.remap(as_segment(seg), idx, h, host);
  }

  // ---- lms::impl::AllocatorHooks: the allocator ----
  bool capturing() const override {
    if (!req_) {
      return false;
    }
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(req_->stream, &st));
    return st != cudaStreamCaptureStatusNone;
  }
  // Unless lms_page_mb says otherwise: with expandable segments, PyTorch's own
  // large page, so that a range is mapped in the steps stock maps it and a
  // batch at stock's edge fits here as it fits stock (each partly used page
  // is held whole: at 64 MiB, Llama at stock's largest batch moved pages every
  // step); page moves pay more per byte at that page. Fixed segments take the
  // larger automatic page, and segment_page cuts it to the request.
  size_t new_large_page(int device) const override {
    return lms::large_page_bytes(device, kUpstreamLargePage, /*grow=*/!expandable_);
  }
  bool alloc_block(bool /*is_retry*/) override {
    TORCH_INTERNAL_ASSERT(req_, "LMS pluggable allocator: no request");
    return new_segment(*req_);
  }
  // Free segments go whole; in an expandable segment the whole pages of
  // every free block are unmapped too. A fixed segment that holds an
  // allocated block keeps its pages.
  void release_free_pages() override {
    release_free_at_least(kReleaseAll, /*pages=*/true);
  }
  void release_free_segments() override {
    release_free_at_least(kReleaseAll, /*pages=*/false);
  }
  // Whole free segments first, then (`pages`, expandable segments) the whole
  // pages of free blocks, the largest runs first, until at least `at_least`
  // device bytes go: what stays serves the next allocations without a map.
  // A release made for a request leaves the free run it grows into, so that
  // it maps no more than the core's search gave it room for under the LMS
  // limit. One device synchronization at most: the blocks' last users may
  // still run, and nothing is unmapped under them.
  void release_free_at_least(size_t at_least, bool pages) override {
    pending_.collect(/*wait=*/true);
    const ExpandableSegments::Kept keep = req_ && expandable_ && !req_->small
        ? growth_.growth_run(req_->size, req_->stream)
        : ExpandableSegments::Kept{};
    std::vector<Segment*> idle;
    size_t planned = 0;
    for (const auto& s : segments_.all()) {
      const Block* b = s->first;
      if (planned < at_least && !b->allocated && b->events == 0 && !b->next &&
          (b->mapped || !s->expandable) && !ExpandableSegments::kept(keep, b)) {
        idle.push_back(s.get());
        planned += s->device_bytes(0, s->handles.size());
      }
    }
    const bool more = pages && expandable_ && planned < at_least;
    bool synced = false;
    if (!idle.empty()) {
      segments_.synchronize_for_release();
      synced = true;
      for (Segment* s : idle) {
        free_.remove(s->first);
        segments_.release(s);
      }
      released_ += idle.size();
    }
    if (!more) {
      return;
    }
    const ExpandableSegments::Spans spans = at_least == kReleaseAll
        ? growth_.free_pages(keep)
        : growth_.largest_free_pages(at_least - planned, keep);
    if (spans.empty()) {
      return;
    }
    if (!synced) {
      segments_.synchronize_for_release();
    }
    growth_.unmap(spans);
    released_ += spans.size();
  }
  std::string format_size(size_t bytes) const override {
    return format_bytes(bytes);
  }
  size_t mapped_bytes() const override {
    return segments_.mapped_bytes();
  }
  // what moves: lms_pluggable_page_walks.h
  std::vector<lms::impl::PageRef> movable_pages(bool host) override {
    return lms_pluggable::movable_pages(
        segments_.all(), host, lms::min_swap_size());
  }
  size_t busiest_large_page(int device) const override {
    return lms_pluggable::busiest_large_page(
        segments_.all(), new_large_page(device));
  }
  size_t cached_free_bytes() const override {
    return free_.bytes();
  }

 private:
  struct Request {
    size_t size = 0;
    cudaStream_t stream = nullptr;
    bool small = false;
    Block* got = nullptr; // the block alloc_block made for it
  };

  // The request being served, for the hooks the core calls back.
  class RequestScope {
   public:
    RequestScope(DeviceAllocator& a, Request* r) : a_(a), prev_(a.req_) {
      a_.req_ = r;
    }
    ~RequestScope() {
      a_.req_ = prev_;
    }
    RequestScope(const RequestScope&) = delete;
    RequestScope& operator=(const RequestScope&) = delete;

   private:
    DeviceAllocator& a_;
    Request* prev_;
  };

  // Allocated bytes on the device: allocated less the pages LMS moved to
  // host memory, which lie under allocated blocks but may hold free bytes too
  // (then this counts low by those).
  size_t device_allocated() const {
    const int64_t host = lms::stat_get(device_, lms::kHostBytes);
    const size_t h = host > 0 ? static_cast<size_t>(host) : 0;
    return allocated_ > h ? allocated_ - h : 0;
  }

  static Segment* as_segment(const void* seg) {
    return static_cast<Segment*>(const_cast<void*>(seg));
  }

  // The page and size of the segment a request gets when nothing free serves
  // it: the small pool's; a shared one of the large page for requests under
  // kSharedBelow (cut for the next ones); else the request's own, in pages
  // that leave little of it unused (segment_page).
  std::pair<size_t, size_t> segment_shape(const Request& r) const {
    if (r.small) {
      return {kSmallSegment, kSmallSegment};
    }
    const size_t large = new_large_page(device_);
    if (r.size < kSharedBelow) {
      return {large, round_up(std::max(kUpstreamLargePage, r.size), large)};
    }
    const size_t page = segment_page(r.size, large);
    return {page, round_up(r.size, page)};
  }

  // With LMS on, the core's search (free list, limit, new pages, releases,
  // swaps); off, a new segment. `found`: what the free list served, if
  // anything (back on it where the search throws).
  bool serve(Request& r, Block* found) {
    try {
      if (!lms::enabled()) {
        return found || new_segment(r);
      }
      bool refused = false;
      return lms_.malloc(found != nullptr, device_, new_bytes(r), &refused);
    } catch (...) {
      if (found) {
        free_.add(found);
      }
      throw;
    }
  }

  // Device bytes a request no free block serves would map now.
  size_t new_bytes(const Request& r) const {
    if (!expandable_ || r.small) {
      return segment_shape(r).second;
    }
    return growth_.new_bytes(r.size, r.stream, new_large_page(device_));
  }

  bool new_segment(Request& r) {
    if (expandable_ && !r.small) {
      if (device_total_ == 0) {
        size_t free_b = 0;
        C10_CUDA_CHECK(cudaMemGetInfo(&free_b, &device_total_));
      }
      r.got =
          growth_.grow(r.size, r.stream, new_large_page(device_), device_total_);
      return r.got != nullptr;
    }
    const auto [page, size] = segment_shape(r);
    Block* b = segments_.make(size, page, r.small, r.stream);
    if (!b) {
      return false;
    }
    free_.cut(b, r.size);
    r.got = b;
    return true;
  }

  [[noreturn]] void oom(const Request& r) {
    size_t free_b = 0;
    size_t total_b = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    std::ostringstream o;
    o << "CUDA out of memory (LMS pluggable allocator). Tried to allocate "
      << format_bytes(r.size) << " on GPU " << device_ << " ("
      << format_bytes(total_b) << " in all, " << format_bytes(free_b)
      << " free); this allocator holds " << format_bytes(mapped_bytes())
      << " in segments, " << format_bytes(allocated_) << " allocated, "
      << format_bytes(free_.bytes()) << " cached and free. ";
    if (lms::enabled()) {
      o << lms_.oom_message(r.size);
    } else {
      o << "Large Model Support is off.";
    }
    TORCH_CHECK_WITH(OutOfMemoryError, false, o.str());
  }

  std::recursive_mutex mu_;
  const int device_;
  const bool expandable_; // large requests grow expandable segments
  size_t device_total_ = 0; // the card's bytes, once an expandable one grew
  Segments segments_;
  FreeBlocks free_;
  ExpandableSegments growth_{segments_, free_};
  std::unordered_map<void*, Block*> live_;
  // a freed block no stream uses any more goes to the free blocks, its host
  // pages back to the host pool first, as the patched build's allocator drops
  // them on free: a new allocation served there would live on host memory
  PendingFrees pending_{
      [this](Block* b) { growth_.list_dropping_host_pages(b); }};
  uint64_t clock_ = 0;
  size_t allocated_ = 0;
  size_t peak_allocated_ = 0;
  size_t peak_device_allocated_ = 0;
  size_t mark_ = 0; // allocated_ at the last mark_peak
  size_t running_peak_ = 0; // the highest allocated_ since then
  size_t released_ = 0; // segments and spans of pages given back to the driver
  Request* req_ = nullptr;
  lms::impl::DeviceLms lms_{*this};
};

int device_count() {
  int n = 0;
  C10_CUDA_CHECK(cudaGetDeviceCount(&n));
  return n;
}

// One allocator per GPU, made on its first allocation and never destroyed:
// frees arrive from tensors that die during interpreter exit. `make` false:
// nullptr for a GPU this process never allocated on (nothing to ask of it,
// and no CUDA context made there by asking).
DeviceAllocator* device_allocator(int device, bool make) {
  static std::mutex mu;
  static auto* all = new std::vector<DeviceAllocator*>();
  std::lock_guard<std::mutex> lock(mu);
  if (all->empty()) {
    all->assign(static_cast<size_t>(device_count()), nullptr);
  }
  TORCH_CHECK(
      device >= 0 && static_cast<size_t>(device) < all->size(),
      "LMS pluggable allocator: no GPU ",
      device);
  auto& slot = (*all)[static_cast<size_t>(device)];
  if (!slot && make) {
    slot = new DeviceAllocator(device);
  }
  return slot;
}

} // namespace

int devices() {
  return device_count();
}

void* malloc(int device, size_t size, cudaStream_t stream) {
  return device_allocator(device, true)->malloc(size, stream);
}

void free(int device, void* ptr) {
  DeviceAllocator* a = device_allocator(device, false);
  TORCH_CHECK(
      a || !ptr,
      "LMS pluggable allocator: free on GPU ",
      device,
      ", where it allocated nothing");
  if (a) {
    a->free(ptr);
  }
}

bool record_stream(int device, void* ptr, cudaStream_t stream) {
  DeviceAllocator* a = device_allocator(device, false);
  return a && a->record_stream(ptr, stream);
}

void empty_cache(int device) {
  if (DeviceAllocator* a = device_allocator(device, false)) {
    a->empty_cache();
  }
}

Counters counters(int device) {
  DeviceAllocator* a = device_allocator(device, false);
  return a ? a->counters() : Counters{};
}

void reset_peak(int device) {
  if (DeviceAllocator* a = device_allocator(device, false)) {
    a->reset_peak();
  }
}

void mark_peak(int device) {
  if (DeviceAllocator* a = device_allocator(device, false)) {
    a->mark_peak();
  }
}

size_t peak_growth(int device) {
  DeviceAllocator* a = device_allocator(device, false);
  return a ? a->peak_growth() : 0;
}

size_t released(int device) {
  DeviceAllocator* a = device_allocator(device, false);
  return a ? a->released() : 0;
}

} // namespace lms_pluggable
