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

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "tensorflow/tsl/platform/errors.h"
#include "tensorflow/tsl/platform/logging.h"
#include "tensorflow/tsl/platform/strcat.h"

namespace tsl {

std::string LmsStats::DebugString() const {
  return strings::StrCat(
      "LMS enabled: ", enabled, "\nLMS defrag enabled: ", defrag_enabled,
      "\nPage bytes: ", page_bytes, "\nDevice bytes limit: ",
      device_bytes_limit, "\nDevice bytes mapped: ", device_bytes_mapped,
      "\nDevice bytes reserved: ", device_bytes_reserved,
      "\nHost bytes limit: ", host_bytes_limit,
      "\nHost bytes in use: ", host_bytes_in_use,
      "\nPeak host bytes in use: ", peak_host_bytes_in_use,
      "\nHost bytes reserved: ", host_bytes_reserved,
      "\nBytes swapped out: ", bytes_swapped_out,
      "\nBytes swapped in: ", bytes_swapped_in,
      "\nPages swapped out: ", num_swap_outs,
      "\nPages swapped in: ", num_swap_ins, "\nReclaims: ", num_reclaims,
      "\nDefrag events: ", num_defrag_events,
      "\nBytes defragmented: ", bytes_defragmented,
      "\nFailures: ", num_failures,
      "\nDevice syncs: ", num_device_syncs,
      "\nDevice syncs on free: ", num_device_syncs_on_free,
      "\nLaunch gate active: ", launch_gate_active,
      "\nLaunch gate inactive reason: ", launch_gate_inactive_reason,
      "\nLaunch gate gated calls: ", launch_gate_gated_calls,
      "\nLaunch gate closes: ", launch_gate_closes,
      "\nLaunch gate close wait ns: ", launch_gate_close_wait_ns,
      "\nLaunch gate calls held: ", launch_gate_calls_held, "\n");
}

size_t LmsHostMemLimitFromEnv(size_t default_bytes) {
  const char* v = std::getenv("TF_GPU_HOST_MEM_LIMIT_IN_MB");
  if (v == nullptr || *v == '\0') return default_bytes;
  char* end = nullptr;
  long long mb = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0' || mb < 0) {
    LOG(ERROR) << "TF_GPU_HOST_MEM_LIMIT_IN_MB=\"" << v
               << "\" is not a number of MiB; using the default of "
               << (default_bytes >> 20) << " MiB.";
    return default_bytes;
  }
  return static_cast<size_t>(mb) << 20;
}

bool LmsLaunchGateWantedFromEnv() {
  const char* v = std::getenv("TF_LMS_LAUNCH_GATE");
  if (v == nullptr || *v == '\0') return true;
  for (const char* off : {"0", "false", "False", "FALSE", "off", "no"}) {
    if (std::strcmp(v, off) == 0) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Host-only backend.
namespace {

class PosixLmsPageBackend : public LmsPageBackend {
 public:
  explicit PosixLmsPageBackend(size_t page_size) : page_size_(page_size) {
    fd_[0] = memfd_create("tf_lms_device_pages", MFD_CLOEXEC);
    fd_[1] = memfd_create("tf_lms_host_pages", MFD_CLOEXEC);
    CHECK(fd_[0] >= 0 && fd_[1] >= 0) << "memfd_create: " << strerror(errno);
  }
  ~PosixLmsPageBackend() override {
    close(fd_[0]);
    close(fd_[1]);
  }
  std::string Name() const override { return "posix-memfd"; }
  size_t page_size() const override { return page_size_; }
  AllocatorMemoryType GetMemoryType() const override {
    return AllocatorMemoryType::kHostPageable;
  }

  void* ReserveAddressRange(size_t bytes) override {
    void* p = mmap(nullptr, bytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  void ReleaseAddressRange(void* base, size_t bytes) override {
    munmap(base, bytes);
  }
  Status CreatePage(bool host, PageHandle* handle) override {
    const int k = host ? 1 : 0;
    if (!free_[k].empty()) {
      *handle = free_[k].back();
      free_[k].pop_back();
      return OkStatus();
    }
    const uint64_t off = size_[k];
    if (ftruncate(fd_[k], off + page_size_) != 0) {
      return errors::ResourceExhausted("ftruncate: ", strerror(errno));
    }
    size_[k] = off + page_size_;
    *handle = off;
    return OkStatus();
  }
  void DestroyPage(bool host, PageHandle handle) override {
    const int k = host ? 1 : 0;
    // Give the memory back; the offset is recycled by a later CreatePage.
    fallocate(fd_[k], FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, handle,
              page_size_);
    free_[k].push_back(handle);
  }
  Status Map(void* va, bool host, PageHandle handle) override {
    void* p = mmap(va, page_size_, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, fd_[host ? 1 : 0],
                   static_cast<off_t>(handle));
    if (p == MAP_FAILED) {
      return errors::Internal("mmap(MAP_FIXED): ", strerror(errno));
    }
    return OkStatus();
  }
  Status Unmap(void* va) override {
    void* p = mmap(va, page_size_, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
                   0);
    if (p == MAP_FAILED) {
      return errors::Internal("mmap(PROT_NONE): ", strerror(errno));
    }
    return OkStatus();
  }
  Status Remap(void* va, size_t n, bool to_host,
               const std::vector<PageHandle>& to) override {
    const int k = to_host ? 1 : 0;
    for (size_t i = 0; i < n; ++i) {
      char* page = static_cast<char*>(va) + i * page_size_;
      // Copy the bytes now visible at 'page' into the new page ...
      size_t done = 0;
      while (done < page_size_) {
        ssize_t w = pwrite(fd_[k], page + done, page_size_ - done,
                           static_cast<off_t>(to[i] + done));
        if (w <= 0) return errors::Internal("pwrite: ", strerror(errno));
        done += w;
      }
      // ... and map it at the same address.
      TF_RETURN_IF_ERROR(Map(page, to_host, to[i]));
    }
    return OkStatus();
  }

 private:
  const size_t page_size_;
  int fd_[2];
  uint64_t size_[2] = {0, 0};
  std::vector<PageHandle> free_[2];
};

}  // namespace

std::unique_ptr<LmsPageBackend> CreatePosixLmsPageBackend(size_t page_size) {
  return std::make_unique<PosixLmsPageBackend>(page_size);
}

// ---------------------------------------------------------------------------
// LmsVirtualMemSubAllocator.

/*static*/ std::unique_ptr<LmsVirtualMemSubAllocator>
LmsVirtualMemSubAllocator::Create(std::unique_ptr<LmsPageBackend> backend,
                                  size_t va_bytes, size_t device_bytes_limit,
                                  size_t host_bytes_limit,
                                  const std::vector<Visitor>& alloc_visitors,
                                  const std::vector<Visitor>& free_visitors,
                                  int index) {
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
                                    alloc_visitors, free_visitors, index));
}

LmsVirtualMemSubAllocator::LmsVirtualMemSubAllocator(
    std::unique_ptr<LmsPageBackend> backend, char* base, size_t va_bytes,
    size_t device_bytes_limit, size_t host_bytes_limit,
    const std::vector<Visitor>& alloc_visitors,
    const std::vector<Visitor>& free_visitors, int index)
    : SubAllocator(alloc_visitors, free_visitors),
      backend_(std::move(backend)),
      backend_name_(backend_->Name()),
      page_size_(backend_->page_size()),
      base_(base),
      va_bytes_(va_bytes),
      device_limit_pages_(device_bytes_limit / backend_->page_size()),
      host_limit_pages_(host_bytes_limit / backend_->page_size()),
      index_(index),
      pages_(va_bytes / backend_->page_size()) {}

LmsVirtualMemSubAllocator::~LmsVirtualMemSubAllocator() {
  for (size_t i = 0; i < pages_.size(); ++i) {
    Page& pg = pages_[i];
    if (pg.state == PageState::kUnbacked) continue;
    backend_->Unmap(base_ + i * page_size_).IgnoreError();
    backend_->DestroyPage(pg.state == PageState::kHost, pg.handle);
  }
  for (auto h : device_pool_) backend_->DestroyPage(false, h);
  for (auto h : host_pool_) backend_->DestroyPage(true, h);
  backend_->ReleaseAddressRange(base_, va_bytes_);
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
  return device_pool_.size() + (device_limit_pages_ - device_created_);
}

size_t LmsVirtualMemSubAllocator::HostPagesAvailable() const {
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
  auto& pool = host ? host_pool_ : device_pool_;
  if (!pool.empty()) {
    *h = pool.back();
    pool.pop_back();
    return OkStatus();
  }
  size_t& created = host ? host_created_ : device_created_;
  const size_t limit = host ? host_limit_pages_ : device_limit_pages_;
  if (created >= limit) {
    return errors::ResourceExhausted(host ? "host" : "device",
                                     " page budget exhausted");
  }
  TF_RETURN_IF_ERROR(backend_->CreatePage(host, h));
  ++created;
  return OkStatus();
}

void LmsVirtualMemSubAllocator::RecyclePage(bool host,
                                            LmsPageBackend::PageHandle h) {
  (host ? host_pool_ : device_pool_).push_back(h);
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
  ReleaseRange(ptr, num_bytes, &host_released);
  if (last == next_page_) next_page_ = first;
}

Status LmsVirtualMemSubAllocator::SpillRange(const void* p, size_t bytes,
                                             size_t* pages_spilled) {
  *pages_spilled = 0;
  size_t first, last;
  PageSpan(p, bytes, &first, &last);
  size_t i = first;
  while (i < last) {
    if (pages_[i].state != PageState::kDevice) {
      ++i;
      continue;
    }
    // A run of device pages [i, j).
    size_t j = i;
    std::vector<LmsPageBackend::PageHandle> to;
    Status budget;
    while (j < last && pages_[j].state == PageState::kDevice) {
      LmsPageBackend::PageHandle h;
      budget = TakePage(/*host=*/true, &h);
      if (!budget.ok()) break;
      to.push_back(h);
      ++j;
    }
    if (j > i) {
      Status s = backend_->Remap(base_ + i * page_size_, j - i,
                                 /*to_host=*/true, to);
      if (!s.ok()) {
        for (auto h : to) RecyclePage(true, h);
        return s;
      }
      for (size_t k = i; k < j; ++k) {
        RecyclePage(false, pages_[k].handle);
        pages_[k].state = PageState::kHost;
        pages_[k].handle = to[k - i];
      }
      device_mapped_ -= j - i;
      host_mapped_ += j - i;
      peak_host_mapped_ = std::max(peak_host_mapped_, host_mapped_);
      *pages_spilled += j - i;
    }
    if (!budget.ok()) return budget;
    i = j;
  }
  return OkStatus();
}

Status LmsVirtualMemSubAllocator::FetchRange(const void* p, size_t bytes,
                                             size_t* pages_fetched) {
  *pages_fetched = 0;
  size_t first, last;
  PageSpan(p, bytes, &first, &last);
  size_t i = first;
  while (i < last) {
    if (pages_[i].state != PageState::kHost) {
      ++i;
      continue;
    }
    size_t j = i;
    std::vector<LmsPageBackend::PageHandle> to;
    while (j < last && pages_[j].state == PageState::kHost) {
      LmsPageBackend::PageHandle h;
      if (!TakePage(/*host=*/false, &h).ok()) break;
      to.push_back(h);
      ++j;
    }
    if (j == i) return OkStatus();  // No device page available.
    Status s =
        backend_->Remap(base_ + i * page_size_, j - i, /*to_host=*/false, to);
    if (!s.ok()) {
      for (auto h : to) RecyclePage(false, h);
      return s;
    }
    for (size_t k = i; k < j; ++k) {
      RecyclePage(true, pages_[k].handle);
      pages_[k].state = PageState::kDevice;
      pages_[k].handle = to[k - i];
    }
    host_mapped_ -= j - i;
    device_mapped_ += j - i;
    *pages_fetched += j - i;
    i = j;
  }
  return OkStatus();
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
    Status s = backend_->Unmap(base_ + i * page_size_);
    if (!s.ok()) {
      LOG(ERROR) << "LMS: unmapping a page failed: " << s;
      continue;
    }
    const bool host = pg.state == PageState::kHost;
    RecyclePage(host, pg.handle);
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
  size_t first, last;
  PageSpan(p, bytes, &first, &last);
  for (size_t i = first; i < last; ++i) {
    if (pages_[i].state != PageState::kUnbacked) continue;
    TF_RETURN_IF_ERROR(MapFresh(i, /*host=*/false));
  }
  return OkStatus();
}

}  // namespace tsl
