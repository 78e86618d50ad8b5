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

// The host-only LmsPageBackend (see CreatePosixLmsPageBackend in
// lms_sub_allocator.h): memfd "device" and "host" page pools remapped with
// mmap(MAP_FIXED), for machines without a GPU (tests, CI).

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/tsl/framework/lms_sub_allocator.h"
#include "tensorflow/tsl/platform/errors.h"
#include "tensorflow/tsl/platform/logging.h"

namespace tsl {

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
    TF_RETURN_IF_ERROR(faults_.Create(host));
    std::lock_guard<std::mutex> l(mu_);  // the filler creates host pages too
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
    std::lock_guard<std::mutex> l(mu_);
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
               const std::vector<PageHandle>& from,
               const std::vector<PageHandle>& to,
               std::vector<Placed>* placed) override {
    const int k = to_host ? 1 : 0;
    for (size_t i = 0; i < n; ++i) {
      char* page = static_cast<char*>(va) + i * page_size_;
      // Copy the bytes now visible at 'page' into the new page ...
      Status s;
      size_t done = 0;
      while (s.ok() && done < page_size_) {
        ssize_t w = pwrite(fd_[k], page + done, page_size_ - done,
                           static_cast<off_t>(to[i] + done));
        if (w <= 0) {
          s = errors::Internal("pwrite: ", strerror(errno));
        } else {
          done += w;
        }
      }
      // ... and map it at the same address.
      if (s.ok()) s = faults_.Next("mmap");
      if (s.ok()) s = Map(page, to_host, to[i]);
      if (!s.ok()) return PutBack(va, i, to_host, from, to, s, placed);
    }
    return OkStatus();
  }

 private:
  // After page 'failed' of a move failed: maps pages [0, failed] on their
  // 'from' pages again, every one even after one failed.  Pages below
  // 'failed' hold a whole copy on their 'to' page: one that cannot go back
  // stays there (kOnTo) or, when that map fails too, is kUnmapped.  Page
  // 'failed' may hold a partial copy: it goes back or is kUnmapped.  An
  // injected put-back fault first unmaps the page, as a failed cuMemMap
  // after its cuMemUnmap leaves it.
  Status PutBack(void* va, size_t failed, bool to_host,
                 const std::vector<PageHandle>& from,
                 const std::vector<PageHandle>& to, const Status& s,
                 std::vector<Placed>* placed) {
    placed->assign(from.size(), Placed::kOnFrom);
    Status lost;
    for (size_t m = 0; m <= failed; ++m) {
      char* page = static_cast<char*>(va) + m * page_size_;
      Status back = faults_.Next("mmap(put back)");
      if (!back.ok()) Unmap(page).IgnoreError();
      if (back.ok()) back = Map(page, !to_host, from[m]);
      if (back.ok()) continue;
      Status keep = m < failed ? faults_.Next("mmap(keep the copy)") : back;
      if (keep.ok()) keep = Map(page, to_host, to[m]);
      if (keep.ok()) {
        (*placed)[m] = Placed::kOnTo;
        continue;
      }
      (*placed)[m] = Placed::kUnmapped;
      if (lost.ok()) lost = back;
    }
    return LmsRemapFailed(s, *placed, lost);
  }

  const size_t page_size_;
  LmsRemapFaults faults_;
  int fd_[2];
  std::mutex mu_;  // size_ and free_
  uint64_t size_[2] = {0, 0};
  std::vector<PageHandle> free_[2];
};

}  // namespace

std::unique_ptr<LmsPageBackend> CreatePosixLmsPageBackend(size_t page_size) {
  return std::make_unique<PosixLmsPageBackend>(page_size);
}

}  // namespace tsl
