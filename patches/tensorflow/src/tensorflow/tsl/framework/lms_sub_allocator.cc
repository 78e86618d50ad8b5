/* Copyright 2026 The LMS Project Authors. All Rights Reserved.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
==============================================================================*/

#include "tensorflow/tsl/framework/lms_sub_allocator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "tensorflow/tsl/platform/errors.h"
#include "tensorflow/tsl/platform/logging.h"
#include "tensorflow/tsl/platform/strcat.h"

namespace tsl {

// ---------------------------------------------------------------------------
// LmsVirtualMemSubAllocator.

/*static*/ std::unique_ptr<LmsVirtualMemSubAllocator>
LmsVirtualMemSubAllocator::Create(std::unique_ptr<LmsPageBackend> backend,
                                  size_t va_bytes, size_t device_bytes_limit,
                                  size_t host_bytes_limit,
                                  const std::vector<Visitor>& alloc_visitors,
                                  const std::vector<Visitor>& free_visitors,
                                  int index, size_t host_reserve_bytes) {
  const size_t ps = backend->page_size();
  va_bytes = (va_bytes + ps - 1) / ps * ps;
  char* base = static_cast<char*>(backend->ReserveAddressRange(va_bytes));
  if (base == nullptr) {
    LOG(ERROR) << "LMS: could not reserve " << (va_bytes >> 20)
               << " MiB of virtual address space (" << backend->Name() << ")";
    return nullptr;
  }
  return std::unique_ptr<LmsVirtualMemSubAllocator>(
      new LmsVirtualMemSubAllocator(std::move(backend), base, va_bytes,
                                    device_bytes_limit, host_bytes_limit,
                                    alloc_visitors, free_visitors, index,
                                    host_reserve_bytes));
}

namespace {
// Host pages a sub-allocator keeps made ahead (see kHostReserveAuto).
size_t HostReservePages(size_t reserve_bytes, size_t device_bytes,
                        size_t host_bytes, size_t page_size) {
  if (reserve_bytes == LmsVirtualMemSubAllocator::kHostReserveAuto) {
    reserve_bytes = std::min(device_bytes / 8, host_bytes / 2);
  }
  return std::min(reserve_bytes, host_bytes) / page_size;
}

// Sub-allocators whose filler may run (never destroyed: sub-allocators may
// outlive static destruction).
struct FillerRegistry {
  std::mutex mu;
  std::vector<LmsVirtualMemSubAllocator*> live;
};
FillerRegistry& Fillers() {
  static auto* r = new FillerRegistry();
  return *r;
}
}  // namespace

// Stops every filler at exit, before the CUDA driver's own exit handlers
// (registered earlier, so run later) tear down what page creation uses.
// TensorFlow never destroys its GPU allocators, so their destructors do not
// run at exit.  Constructed when the first filler starts.
struct LmsVirtualMemSubAllocator::StopFillersAtExit {
  ~StopFillersAtExit() {
    std::vector<LmsVirtualMemSubAllocator*> all;
    {
      std::lock_guard<std::mutex> l(Fillers().mu);
      all.swap(Fillers().live);
    }
    for (auto* a : all) a->StopFiller();
  }
};

LmsVirtualMemSubAllocator::LmsVirtualMemSubAllocator(
    std::unique_ptr<LmsPageBackend> backend, char* base, size_t va_bytes,
    size_t device_bytes_limit, size_t host_bytes_limit,
    const std::vector<Visitor>& alloc_visitors,
    const std::vector<Visitor>& free_visitors, int index,
    size_t host_reserve_bytes)
    : SubAllocator(alloc_visitors, free_visitors),
      backend_(std::move(backend)),
      backend_name_(backend_->Name()),
      page_size_(backend_->page_size()),
      base_(base),
      va_bytes_(va_bytes),
      device_limit_pages_(device_bytes_limit / backend_->page_size()),
      host_limit_pages_(host_bytes_limit / backend_->page_size()),
      index_(index),
      pages_(va_bytes / backend_->page_size()),
      device_creatable_(device_limit_pages_),
      unsafe_moves_(LmsUnsafeMovesWithoutGateFromEnv()),
      host_reserve_pages_(HostReservePages(host_reserve_bytes,
                                           device_bytes_limit, host_bytes_limit,
                                           backend_->page_size())) {}

LmsVirtualMemSubAllocator::~LmsVirtualMemSubAllocator() {
  StopFiller();
  for (size_t i = 0; i < pages_.size(); ++i) {
    Page& pg = pages_[i];
    if (pg.state == PageState::kUnbacked) continue;
    backend_->Unmap(base_ + i * page_size_).IgnoreError();
    backend_->DestroyPage(pg.state == PageState::kHost, pg.handle);
  }
  for (const Hole& h : holes_) {  // the other copy of an unmapped page
    backend_->DestroyPage(pages_[h.index].state != PageState::kHost, h.to);
  }
  for (auto h : device_pool_) backend_->DestroyPage(false, h);
  for (auto h : host_pool_) backend_->DestroyPage(true, h);
  backend_->ReleaseAddressRange(base_, va_bytes_);
}

void LmsVirtualMemSubAllocator::BeginQuiet() {
  if (quiet_depth_++ == 0) {
    ++quiet_scopes_;
    PauseFiller(+1);  // its driver calls would slow the moves down
  }
  backend_->Quiesce();
}

void LmsVirtualMemSubAllocator::EndQuiet() {
  backend_->Resume();
  if (--quiet_depth_ == 0) PauseFiller(-1);
}

void LmsVirtualMemSubAllocator::PauseFiller(int delta) {
  {
    std::lock_guard<std::mutex> l(pool_mu_);
    filler_paused_ += delta;
  }
  if (delta < 0) filler_cv_.notify_all();
}

void LmsVirtualMemSubAllocator::StartFiller() {
  filler_started_ = true;
  if (host_reserve_pages_ == 0) return;
  static StopFillersAtExit stop_at_exit;
  {
    std::lock_guard<std::mutex> l(Fillers().mu);
    Fillers().live.push_back(this);
  }
  std::lock_guard<std::mutex> l(pool_mu_);
  if (filler_stop_) return;
  filler_pid_ = getpid();
  filler_ = std::make_unique<std::thread>([this] { FillerLoop(); });
}

void LmsVirtualMemSubAllocator::FillerLoop() {
  std::unique_lock<std::mutex> l(pool_mu_);
  while (!filler_stop_) {
    if (filler_paused_ > 0 || host_pool_.size() >= host_reserve_pages_ ||
        host_created_ + host_making_ >= host_limit_pages_) {
      filler_cv_.wait(l);
      continue;
    }
    ++host_making_;  // charged to the budget while it is made
    l.unlock();
    LmsPageBackend::PageHandle h;
    Status s = backend_->CreatePage(/*host=*/true, &h);
    l.lock();
    --host_making_;
    if (!s.ok()) {
      LOG(WARNING) << "LMS: stopped making host pages ahead of need: " << s;
      filler_cv_.notify_all();  // a TakePage waiting for this page goes on
      return;
    }
    ++host_created_;
    ++host_made_ahead_;
    host_pool_.push_back(h);
    filler_cv_.notify_all();  // a TakePage may wait for this page
  }
}

void LmsVirtualMemSubAllocator::StopFiller() {
  {
    std::lock_guard<std::mutex> l(Fillers().mu);
    auto& v = Fillers().live;
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
  }
  std::unique_ptr<std::thread> t;
  {
    std::lock_guard<std::mutex> l(pool_mu_);
    filler_stop_ = true;
    t = std::move(filler_);
  }
  filler_cv_.notify_all();
  if (t == nullptr) return;
  if (filler_pid_ == getpid()) {
    t->join();
  } else {
    t.release();  // not this process's thread: leave the object alone
  }
}

size_t LmsVirtualMemSubAllocator::host_pages_created() const {
  std::lock_guard<std::mutex> l(pool_mu_);
  return host_created_;
}

size_t LmsVirtualMemSubAllocator::host_pages_made_ahead() const {
  std::lock_guard<std::mutex> l(pool_mu_);
  return host_made_ahead_;
}

bool LmsVirtualMemSubAllocator::Owns(const void* p) const {
  const char* c = static_cast<const char*>(p);
  return c >= base_ && c < base_ + va_bytes_;
}

size_t LmsVirtualMemSubAllocator::PageIndex(const void* p) const {
  DCHECK(Owns(p));
  return (static_cast<const char*>(p) - base_) / page_size_;
}

void LmsVirtualMemSubAllocator::PageSpan(const void* p, size_t bytes,
                                         size_t* first, size_t* last) const {
  const size_t off = static_cast<const char*>(p) - base_;
  *first = off / page_size_;
  *last = bytes == 0 ? *first : (off + bytes + page_size_ - 1) / page_size_;
}

size_t LmsVirtualMemSubAllocator::DevicePagesAvailable() const {
  return device_pool_.size() + device_creatable_;
}

size_t LmsVirtualMemSubAllocator::HostPagesAvailable() const {
  std::lock_guard<std::mutex> l(pool_mu_);
  // A page the filler is making counts: TakePage waits for it.
  return host_pool_.size() + (host_limit_pages_ - host_created_);
}

LmsVirtualMemSubAllocator::PageState LmsVirtualMemSubAllocator::StateOf(
    const void* va) const {
  return pages_[PageIndex(va)].state;
}

size_t LmsVirtualMemSubAllocator::CountPages(const void* p, size_t bytes,
                                             PageState state) const {
  size_t first, last, n = 0;
  PageSpan(p, bytes, &first, &last);
  for (size_t i = first; i < last; ++i) n += pages_[i].state == state;
  return n;
}

Status LmsVirtualMemSubAllocator::TakePage(bool host,
                                           LmsPageBackend::PageHandle* h) {
  if (!host) {
    if (!device_pool_.empty()) {
      *h = device_pool_.back();
      device_pool_.pop_back();
      return OkStatus();
    }
    if (device_creatable_ == 0) {
      return errors::ResourceExhausted("device page budget exhausted");
    }
    Status s = backend_->CreatePage(false, h);
    if (!s.ok()) {
      // The driver is out of memory (another process, another allocator):
      // from now on only the pages made so far count, and LMS spills to
      // make room rather than promise pages it cannot create.
      LOG(WARNING) << "LMS: creating a device page failed (" << s
                   << "); the device budget is now the "
                   << device_created_ << " pages made so far";
      device_creatable_ = 0;
      return s;
    }
    ++device_created_;
    --device_creatable_;
    return OkStatus();
  }
  {
    std::unique_lock<std::mutex> l(pool_mu_);
    for (;;) {
      if (!host_pool_.empty()) {
        *h = host_pool_.back();
        host_pool_.pop_back();
        filler_cv_.notify_all();  // below the reserve: the filler tops it up
        return OkStatus();
      }
      if (host_created_ + host_making_ < host_limit_pages_) break;
      if (host_making_ == 0) {
        return errors::ResourceExhausted("host page budget exhausted");
      }
      // The budget's last pages are being made by the filler (which may be
      // paused only between pages): wait for them to land in the pool.
      filler_cv_.wait(l);
    }
    ++host_created_;  // charged before it exists, as the filler does
  }
  Status s = backend_->CreatePage(true, h);
  if (!s.ok()) {
    std::lock_guard<std::mutex> l(pool_mu_);
    --host_created_;
  }
  return s;
}

void LmsVirtualMemSubAllocator::RecyclePage(bool host,
                                            LmsPageBackend::PageHandle h) {
  if (!host) {
    device_pool_.push_back(h);
    return;
  }
  std::lock_guard<std::mutex> l(pool_mu_);
  host_pool_.push_back(h);
}

Status LmsVirtualMemSubAllocator::MapFresh(size_t index, bool host) {
  LmsPageBackend::PageHandle h;
  TF_RETURN_IF_ERROR(TakePage(host, &h));
  Status s = backend_->Map(base_ + index * page_size_, host, h);
  if (!s.ok()) {
    RecyclePage(host, h);
    return s;
  }
  pages_[index].state = host ? PageState::kHost : PageState::kDevice;
  pages_[index].handle = h;
  if (host) {
    ++host_mapped_;
    peak_host_mapped_ = std::max(peak_host_mapped_, host_mapped_);
    window_peak_host_ = std::max(window_peak_host_, host_mapped_);
  } else {
    ++device_mapped_;
  }
  return OkStatus();
}

void* LmsVirtualMemSubAllocator::Alloc(size_t alignment, size_t num_bytes,
                                       size_t* bytes_received) {
  if (num_bytes == 0) return nullptr;
  const size_t n = (num_bytes + page_size_ - 1) / page_size_;
  if (next_page_ + n > pages_.size()) {
    LOG(WARNING) << "LMS: virtual address range of " << (va_bytes_ >> 20)
                 << " MiB exhausted";
    return nullptr;
  }
  if (DevicePagesAvailable() < n) return nullptr;
  const size_t first = next_page_;
  for (size_t i = 0; i < n; ++i) {
    Status s = MapFresh(first + i, /*host=*/false);
    if (!s.ok()) {
      LOG(ERROR) << "LMS: mapping a device page failed: " << s;
      last_map_error_ = s;
      size_t unused;
      ReleaseRange(base_ + first * page_size_, i * page_size_, &unused);
      return nullptr;
    }
  }
  next_page_ += n;
  void* p = base_ + first * page_size_;
  *bytes_received = n * page_size_;
  VisitAlloc(p, index_, *bytes_received);
  return p;
}

void LmsVirtualMemSubAllocator::Free(void* ptr, size_t num_bytes) {
  if (ptr == nullptr) return;
  VisitFree(ptr, index_, num_bytes);
  size_t first, last, host_released;
  PageSpan(ptr, num_bytes, &first, &last);
  {
    // The BFC allocator frees whole free regions here (garbage collection:
    // DeallocateFreeRegions, on by default for GPUs).  Queued work may still
    // read freed memory: unmap only in a quiesced scope, as every other
    // unmap of pages that were handed out.
    const bool mapped = CountPages(ptr, num_bytes, PageState::kUnbacked) <
                        last - first;
    std::unique_ptr<QuietScope> quiet;
    if (mapped) quiet = std::make_unique<QuietScope>(this);
    ReleaseRange(ptr, num_bytes, &host_released);
  }
  if (last == next_page_) next_page_ = first;
}

size_t LmsVirtualMemSubAllocator::ReleaseRange(const void* p, size_t bytes,
                                               size_t* host_released,
                                               bool host_only) {
  *host_released = 0;
  size_t first, last, device_released = 0;
  PageSpan(p, bytes, &first, &last);
  for (size_t i = first; i < last; ++i) {
    Page& pg = pages_[i];
    if (pg.state == PageState::kUnbacked) continue;
    if (host_only && pg.state != PageState::kHost) continue;
    auto hole = std::find_if(holes_.begin(), holes_.end(),
                             [i](const Hole& h) { return h.index == i; });
    // A hole is unmapped already; its data is dead now: both copies go.
    Status s = hole != holes_.end() ? OkStatus()
                                    : backend_->Unmap(base_ + i * page_size_);
    if (!s.ok()) {
      LOG(ERROR) << "LMS: unmapping a page failed: " << s;
      continue;
    }
    const bool host = pg.state == PageState::kHost;
    RecyclePage(host, pg.handle);
    if (hole != holes_.end()) {
      RecyclePage(!host, hole->to);
      holes_.erase(hole);
    }
    if (host) {
      --host_mapped_;
      ++*host_released;
    } else {
      --device_mapped_;
      ++device_released;
    }
    pg.state = PageState::kUnbacked;
    pg.handle = 0;
  }
  return device_released;
}

Status LmsVirtualMemSubAllocator::BackRange(const void* p, size_t bytes) {
  const size_t need = CountPages(p, bytes, PageState::kUnbacked);
  if (need == 0) return OkStatus();
  if (DevicePagesAvailable() < need) {
    return errors::ResourceExhausted("LMS: ", need,
                                     " device pages needed, ",
                                     DevicePagesAvailable(), " available");
  }
  size_t f0, l0;
  PageSpan(p, bytes, &f0, &l0);
  std::vector<bool> was_unbacked;
  for (size_t i = f0; i < l0; ++i) {
    was_unbacked.push_back(pages_[i].state == PageState::kUnbacked);
  }
  size_t first, last;
  PageSpan(p, bytes, &first, &last);
  for (size_t i = first; i < last; ++i) {
    if (pages_[i].state != PageState::kUnbacked) continue;
    Status s = MapFresh(i, /*host=*/false);
    if (!s.ok()) {
      last_map_error_ = s;
      // All or nothing: the pages mapped by this call (free memory, no
      // data) go back to the pool.
      for (size_t k = first; k < i; ++k) {
        if (was_unbacked[k - first]) {
          size_t unused;
          ReleaseRange(base_ + k * page_size_, page_size_, &unused);
        }
      }
      return s;
    }
  }
  return OkStatus();
}

}  // namespace tsl
