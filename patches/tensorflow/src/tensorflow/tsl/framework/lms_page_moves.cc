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

// The page moves of LmsVirtualMemSubAllocator (lms_sub_allocator.h): spills
// and returns of pages of live data, what a failed move leaves (holes), and
// giving idle host pages back.  Invariants kept here: pages of live data move
// only while the launch gate is active (or under the explicit unsafe opt-in),
// and a physical page is recycled only when nothing maps it any more.

#include <algorithm>
#include <chrono>
#include <mutex>
#include <vector>

#include "tensorflow/tsl/framework/lms_sub_allocator.h"
#include "tensorflow/tsl/platform/errors.h"
#include "tensorflow/tsl/platform/logging.h"

namespace tsl {

namespace {
// Adds the time from its construction to its destruction to '*to'.
class AddElapsedNs {
 public:
  explicit AddElapsedNs(int64_t* to)
      : to_(to), t0_(std::chrono::steady_clock::now()) {}
  ~AddElapsedNs() {
    *to_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::steady_clock::now() - t0_)
                .count();
  }

 private:
  int64_t* const to_;
  const std::chrono::steady_clock::time_point t0_;
};

}  // namespace

Status LmsVirtualMemSubAllocator::LiveMovesAllowed() {
  Status s = backend_->LiveMovesAllowed();
  if (s.ok() || !unsafe_moves_) return s;
  if (!warned_unsafe_) {
    warned_unsafe_ = true;
    LOG(WARNING) << "LMS: TF_LMS_UNSAFE_MOVE_WITHOUT_GATE is set: moving "
                    "pages of live tensors with only a device "
                    "synchronization (" << s.message() << ")";
  }
  return OkStatus();
}

void LmsVirtualMemSubAllocator::SetMoved(size_t i, bool to_host,
                                         LmsPageBackend::PageHandle h) {
  RecyclePage(!to_host, pages_[i].handle);  // nothing maps it any more
  pages_[i].state = to_host ? PageState::kHost : PageState::kDevice;
  pages_[i].handle = h;
  size_t& gained = to_host ? host_mapped_ : device_mapped_;
  size_t& lost = to_host ? device_mapped_ : host_mapped_;
  --lost;
  ++gained;
}

Status LmsVirtualMemSubAllocator::MoveRun(
    size_t i, bool to_host, const std::vector<LmsPageBackend::PageHandle>& to) {
  const size_t n = to.size();
  std::vector<LmsPageBackend::PageHandle> from;
  for (size_t k = i; k < i + n; ++k) from.push_back(pages_[k].handle);
  std::vector<LmsPageBackend::Placed> placed;
  Status s = backend_->Remap(base_ + i * page_size_, n, to_host, from, to,
                             &placed);
  if (s.ok()) placed.assign(n, LmsPageBackend::Placed::kOnTo);
  CHECK_EQ(placed.size(), n) << "LMS: " << backend_name_
                             << " did not say where the pages are: " << s;
  // Invariant: a page is recycled only when nothing maps it any more.
  for (size_t k = 0; k < n; ++k) {
    switch (placed[k]) {
      case LmsPageBackend::Placed::kOnFrom:
        RecyclePage(to_host, to[k]);
        break;
      case LmsPageBackend::Placed::kOnTo:
        SetMoved(i + k, to_host, to[k]);
        break;
      case LmsPageBackend::Placed::kUnmapped:
        holes_.push_back(Hole{i + k, to[k], s});
        break;
    }
  }
  peak_host_mapped_ = std::max(peak_host_mapped_, host_mapped_);
  window_peak_host_ = std::max(window_peak_host_, host_mapped_);
  return s;
}

size_t LmsVirtualMemSubAllocator::TrimHostPool() {
  const size_t keep = std::max(host_reserve_pages_, window_peak_host_);
  window_peak_host_ = host_mapped_;
  std::vector<LmsPageBackend::PageHandle> give;
  {
    std::lock_guard<std::mutex> l(pool_mu_);
    const size_t in_use = host_created_ - host_pool_.size();
    const size_t idle_keep = keep > in_use ? keep - in_use : 0;
    while (host_pool_.size() > idle_keep) {
      give.push_back(host_pool_.back());
      host_pool_.pop_back();
    }
    host_created_ -= give.size();
  }
  for (auto h : give) backend_->DestroyPage(/*host=*/true, h);
  if (!give.empty()) {
    VLOG(1) << "LMS: gave back " << give.size() << " idle host pages";
  }
  return give.size();
}

Status LmsVirtualMemSubAllocator::RepairHoles() {
  std::vector<Hole> left;
  for (Hole& h : holes_) {
    Page& pg = pages_[h.index];
    char* va = base_ + h.index * page_size_;
    const bool old_host = pg.state == PageState::kHost;
    // Its old page first, then the new copy (both hold the data).
    Status s = backend_->Map(va, old_host, pg.handle);
    if (s.ok()) {
      RecyclePage(!old_host, h.to);
      continue;
    }
    s = backend_->Map(va, !old_host, h.to);
    if (s.ok()) {
      SetMoved(h.index, /*to_host=*/!old_host, h.to);
      continue;
    }
    h.why = s;
    left.push_back(h);
  }
  holes_.swap(left);
  if (holes_.empty()) return OkStatus();
  return errors::Internal(
      "LMS: ", holes_.size(), " page(s) of live tensors are unmapped, the "
      "first at ", static_cast<const void*>(base_ + holes_[0].index * page_size_),
      ": a page move failed and putting the page back failed too (",
      holes_[0].why.message(), "); both copies of the data are kept and "
      "nothing is allocated until the page can be mapped again");
}

Status LmsVirtualMemSubAllocator::MoveRange(bool to_host, const void* p,
                                            size_t bytes, size_t* pages_moved) {
  const AddElapsedNs timer(to_host ? &spill_ns_ : &fetch_ns_);
  // A spill moves device pages onto new host pages, a fetch the reverse.
  const PageState from = to_host ? PageState::kDevice : PageState::kHost;
  *pages_moved = 0;
  TF_RETURN_IF_ERROR(LiveMovesAllowed());
  TF_RETURN_IF_ERROR(RepairHoles());
  size_t first, last;
  PageSpan(p, bytes, &first, &last);
  size_t i = first;
  while (i < last) {
    if (pages_[i].state != from) {
      ++i;
      continue;
    }
    // A run of pages [i, j) to move, each with a page taken on the other side.
    size_t j = i;
    std::vector<LmsPageBackend::PageHandle> to;
    Status taken;
    while (j < last && pages_[j].state == from) {
      LmsPageBackend::PageHandle h;
      taken = TakePage(/*host=*/to_host, &h);
      if (!taken.ok()) break;
      to.push_back(h);
      ++j;
    }
    if (j > i) {
      TF_RETURN_IF_ERROR(MoveRun(i, to_host, to));
      *pages_moved += j - i;
    }
    if (!taken.ok()) {
      // Out of host pages a spill fails (the host budget is exhausted); out
      // of device pages a fetch stops without error, the rest stays on host.
      if (to_host) return taken;
      if (j == i) return OkStatus();
    }
    i = j;
  }
  return OkStatus();
}

Status LmsVirtualMemSubAllocator::SpillRange(const void* p, size_t bytes,
                                             size_t* pages_spilled) {
  return MoveRange(/*to_host=*/true, p, bytes, pages_spilled);
}

Status LmsVirtualMemSubAllocator::FetchRange(const void* p, size_t bytes,
                                             size_t* pages_fetched) {
  return MoveRange(/*to_host=*/false, p, bytes, pages_fetched);
}

}  // namespace tsl
