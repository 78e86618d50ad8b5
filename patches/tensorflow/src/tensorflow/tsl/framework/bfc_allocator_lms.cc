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

// Large Model Support (LMS) for BFCAllocator.
//
// With BFCAllocator::Options::lms_enabled and a LmsVirtualMemSubAllocator as
// sub-allocator, an allocation that the device cannot serve is served anyway:
//
//  1. (defrag, Options::lms_defrag_enabled) the device pages under free chunks
//     are unmapped and mapped again at the end of the address range, forming
//     a contiguous region out of fragmented free memory.  No tensor moves.
//  2. (spill) the device pages of the least recently used allocations are
//     copied to host pages, which are mapped at the same virtual addresses:
//     every pointer stays valid and its bytes stay readable and writable.
//  3. the freed device pages are mapped under the new allocation.
//
// While data is spilled, device memory that frees give back is used to bring
// the most recently used spilled allocations back ("swap in", a return).  A
// return needs a quiesced device (below), so frees do not return one by one:
// a return runs once bytes in use fell, since the last one, by as much as is
// spilled or by a quarter of the device budget, whichever is less; training's
// backward pass then synchronizes a few times per step, not once per freed
// tensor.  Between returns, freed host pages stay mapped under free chunks
// (released at the next return or spill).  The host memory used for
// spilling is bounded by TF_GPU_HOST_MEM_LIMIT_IN_MB.
//
// Invariant: pages without physical backing only ever lie inside free chunks;
// FindChunkPtr maps device pages under them before a chunk is handed out.
//
// Recency: an allocation's recency is its allocation id (allocation order),
// raised by LmsTouch (for callers that know an allocation is about to be
// used, e.g. an executor before a kernel launch).
//
// Moving pages that device work may touch.  Pages of live allocations are
// copied and remapped (spill, swap-in), pages of free chunks unmapped
// (defrag, frees: stream-ordered frees leave queued work that may still read
// them), only inside a LmsVirtualMemSubAllocator::QuietScope: the backend is
// quiesced for the life of the scope.  With the CUDA backend that is the
// launch gate (gpu_lms_page_backend.cc): the gate closes (new kernel
// launches, copies and memsets of other threads wait at the API call's
// entry; calls already inside have returned), the device is synchronized,
// the pages move, and the scope's end opens the gate, on every path out
// (errors and early returns too).  The mover's own calls pass the gate
// (per thread), and scopes nest (LmsPrepareChunk inside LmsAllocateSlow).
// TensorFlow's executor launches from many threads onto one compute stream
// without telling the allocator, so waiting for the allocator's own streams
// would not do.  Without the gate (TF_LMS_LAUNCH_GATE=0, no CUPTI, or CUPTI
// taken by a profiler) LMS fails closed: pages of live tensors do not move
// (SpillRange/FetchRange refuse, LmsLiveMovesAllowed), and an allocation that
// needed a spill fails saying why and what to do; unmapping free pages
// (defrag, frees, garbage collection) still runs after a synchronization,
// since no later launch may touch freed memory.  TF_LMS_UNSAFE_MOVE_WITHOUT_GATE=1
// moves live pages after the synchronization only (launches made during the
// move by other threads are not held: GetLmsStats().launch_gate_active says
// which rule holds).
//
// Driver errors.  A failed move leaves every page mapped on a whole copy (its
// old page, or its new one when putting it back failed) and recycles only
// pages nothing maps; a page that could be mapped on neither is a hole that
// keeps both copies, and while one exists no allocation is served (the next
// one tries to map it again, or fails with the driver's error).  Device page
// creation that fails (the driver out of memory) makes the pages made so far
// the budget: LMS spills to make room instead of counting on pages it cannot
// create, and pages under a chunk are mapped before the chunk is taken
// (LmsCanBack), so a failure refuses the chunk instead of aborting.
//
// Lock order: lock_, then the gate.  Every scope is opened with lock_ held,
// and the mover holds lock_ while it waits for the gate to close and while
// the gate is closed.  That cannot deadlock because
//  (a) no thread waits for lock_ from inside a gated call: CUDA API calls
//      never call back into the allocator; host functions on streams
//      (cuLaunchHostFunc) must not allocate or free with an LMS allocator,
//      which the device synchronization under lock_ needed before the gate;
//      so the threads the mover waits for (those inside a gated call) all
//      return;
//  (b) while the gate is closed the mover waits only for the device and
//      the driver, never for a lock a thread held at the gate may own: in a
//      scope the allocator only copies, maps and unmaps pages and updates its
//      own state (no SubAllocator visitor runs in a scope: Extend, which
//      calls the alloc visitors, is outside them), and a thread held at the
//      gate cannot own this lock_ (the mover does).  A thread held at the gate
//      may own another allocator's lock; that allocator's mover then waits for
//      its lock_, not at the gate, until this scope ends.  Movers of two
//      allocators (two GPUs) quiesce one at a time (the shared core's
//      QuietRounds): one waiting for another holds no launch;
//  (c) the waits for the gate to close and for the devices to drain are
//      bounded while launches are held (QuietRounds): work queued on one GPU
//      may wait for a launch held on another (a collective's partner
//      kernel), so a round past its bound opens the gate and starts over.

#include <algorithm>
#include <utility>
#include <vector>

#include "tensorflow/tsl/framework/bfc_allocator.h"
#include "tensorflow/tsl/framework/lms_sub_allocator.h"
#include "tensorflow/tsl/platform/logging.h"
#include "tensorflow/tsl/platform/numbers.h"
#include "tensorflow/tsl/platform/strcat.h"

namespace tsl {

namespace {
size_t RoundUpTo(size_t v, size_t m) { return (v + m - 1) / m * m; }
size_t RoundDownTo(size_t v, size_t m) { return v / m * m; }

// A swap-in that failed left the data where it was: on its host pages, still
// mapped at its address (a move rolls back or keeps a whole copy), or, if
// putting a page back failed too, in a hole that fails every allocation until
// it is mapped again (LmsAllocateSlow).  Logged and kept for LmsLastError.
void NoteSwapInFailure(const Status& s, std::string* last_error) {
  if (s.ok()) return;
  *last_error = strings::StrCat("LMS: swap-in failed: ", s.ToString());
  LOG(ERROR) << *last_error;
}
}  // namespace

void BFCAllocator::LmsInit() {
  lms_ = dynamic_cast<LmsVirtualMemSubAllocator*>(sub_allocator_.get());
  if (lms_ == nullptr) {
    LOG(WARNING) << "Large Model Support was requested for allocator "
                 << name_
                 << " but its sub-allocator is not page-mapped "
                    "(LmsVirtualMemSubAllocator); LMS stays off.";
    return;
  }
  mutex_lock l(lock_);
  lms_stats_.enabled = true;
  lms_stats_.defrag_enabled = opts_.lms_defrag_enabled;
  LmsStats gate;
  lms_->AddLaunchGateStats(&gate);
  LOG(INFO) << "Large Model Support enabled for " << name_ << " (device limit "
            << strings::HumanReadableNumBytes(lms_->device_bytes_limit())
            << ", host swap limit "
            << strings::HumanReadableNumBytes(lms_->host_bytes_limit())
            << ", defrag " << (opts_.lms_defrag_enabled ? "on" : "off")
            << ", pages of "
            << strings::HumanReadableNumBytes(lms_->page_size()) << " via "
            << lms_->backend_name() << ", launch gate "
            << (gate.launch_gate_active
                    ? std::string("on")
                    : strings::StrCat("off (reason ",
                                      gate.launch_gate_inactive_reason, ")"))
            << ")";
}

uint64 BFCAllocator::LmsRecency(ChunkHandle h) {
  const Chunk* c = ChunkFromHandle(h);
  uint64 r = static_cast<uint64>(c->allocation_id);
  auto it = lms_touched_.find(c->ptr);
  if (it != lms_touched_.end()) r = std::max(r, it->second);
  return r;
}

// Called by FindChunkPtr for the free chunk it is about to hand out: maps
// device pages under its unbacked pages now, while refusing it is still
// possible (a driver error then skips the chunk and the allocation fails or
// is served elsewhere, instead of aborting in LmsPrepareChunk).  Backed pages
// under a free chunk are normal (freed memory keeps its pages).  Refuses
// every chunk while a failed move left a page of a live tensor unmapped
// (LmsAllocateSlow repairs it or fails saying why).
bool BFCAllocator::LmsCanBack(const Chunk* free_chunk, size_t rounded_bytes) {
  if (lms_->holes() > 0) return false;
  // With LMS, FindChunkPtr splits off any remainder of a page or more, so the
  // chunk handed out is shorter than rounded_bytes + one page.
  const size_t bytes =
      std::min(free_chunk->size, rounded_bytes + lms_->page_size());
  const size_t need = lms_->CountPages(
      free_chunk->ptr, bytes, LmsVirtualMemSubAllocator::PageState::kUnbacked);
  if (need > lms_->DevicePagesAvailable()) return false;
  return lms_->BackRange(free_chunk->ptr, bytes).ok();
}

void BFCAllocator::LmsPrepareChunk(ChunkHandle h) {
  lms_in_use_mark_ = std::max(lms_in_use_mark_, stats_.bytes_in_use);
  Chunk* c = ChunkFromHandle(h);
  // The device is filling up (bytes_in_use counts this chunk already): have
  // host pages ready for the first spill.
  if (4 * static_cast<size_t>(stats_.bytes_in_use) >=
      3 * lms_->device_bytes_limit()) {
    lms_->StartHostPagesAhead();
  }
  // LmsCanBack() backed every page of the chunk already (the chunk handed
  // out lies within what it backed).
  DCHECK_EQ(lms_->CountPages(c->ptr, c->size,
                             LmsVirtualMemSubAllocator::PageState::kUnbacked),
            0u);
  Status s;
  if (lms_->DevicePagesAvailable() > 0 &&
      lms_->CountPages(c->ptr, c->size,
                       LmsVirtualMemSubAllocator::PageState::kHost) > 0) {
    // Pages shared with spilled neighbours: bring them back while we can.
    LmsVirtualMemSubAllocator::QuietScope quiet(lms_);
    size_t n = 0;
    s = lms_->FetchRange(c->ptr, c->size, &n);
    NoteSwapInFailure(s, &lms_last_error_);
    lms_stats_.bytes_swapped_in += n * lms_->page_size();
    lms_stats_.num_swap_ins += n;
  }
}

BFCAllocator::ChunkHandle BFCAllocator::LmsBestFit(size_t rounded_bytes) {
  for (BinNum b = BinNumForSize(rounded_bytes); b < kNumBins; ++b) {
    for (ChunkHandle h : BinFromIndex(b)->free_chunks) {
      if (ChunkFromHandle(h)->size >= rounded_bytes) return h;
    }
  }
  return kInvalidChunkHandle;
}

// Unmaps the pages under free chunks shorter than 'below_bytes', other than
// 'keep', until 'want_pages' are released (device pages; host pages only, and
// counted, with 'host_only').  In a QuietScope: queued work may still read
// freed memory.
size_t BFCAllocator::LmsReleaseFreePages(size_t want_pages, size_t below_bytes,
                                         ChunkHandle keep, bool host_only) {
  const size_t ps = lms_->page_size();
  size_t released = 0;
  for (const AllocationRegion& region : region_manager_.regions()) {
    ChunkHandle h = region_manager_.get_handle(region.ptr());
    while (h != kInvalidChunkHandle && released < want_pages) {
      const Chunk* c = ChunkFromHandle(h);
      if (!c->in_use() && c->size < below_bytes && h != keep) {
        const uintptr_t b = reinterpret_cast<uintptr_t>(c->ptr);
        const uintptr_t lo = RoundUpTo(b, ps);
        const uintptr_t hi = RoundDownTo(b + c->size, ps);
        if (hi > lo) {
          size_t host_released = 0;
          const size_t device_released = lms_->ReleaseRange(
              reinterpret_cast<void*>(lo), hi - lo, &host_released, host_only);
          released += host_only ? host_released : device_released;
        }
      }
      h = c->next;
    }
  }
  return released;
}

std::vector<std::pair<uint64, BFCAllocator::ChunkHandle>>
BFCAllocator::LmsInUseChunksWith(LmsVirtualMemSubAllocator::PageState state) {
  std::vector<std::pair<uint64, ChunkHandle>> out;
  for (const AllocationRegion& region : region_manager_.regions()) {
    ChunkHandle h = region_manager_.get_handle(region.ptr());
    while (h != kInvalidChunkHandle) {
      const Chunk* c = ChunkFromHandle(h);
      if (c->in_use() && lms_->CountPages(c->ptr, c->size, state) > 0) {
        out.emplace_back(LmsRecency(h), h);
      }
      h = c->next;
    }
  }
  return out;
}

Status BFCAllocator::LmsSpillLru(size_t need_pages) {
  std::vector<std::pair<uint64, ChunkHandle>> victims =
      LmsInUseChunksWith(LmsVirtualMemSubAllocator::PageState::kDevice);
  std::sort(victims.begin(), victims.end());
  for (const auto& v : victims) {
    if (lms_->DevicePagesAvailable() >= need_pages) break;
    const Chunk* c = ChunkFromHandle(v.second);
    size_t n = 0;
    Status s = lms_->SpillRange(c->ptr, c->size, &n);
    lms_stats_.bytes_swapped_out += n * lms_->page_size();
    lms_stats_.num_swap_outs += n;
    if (!s.ok()) return s;
  }
  return OkStatus();
}

bool BFCAllocator::LmsExtendExact(size_t bytes) {
  // Extend() grows by curr_region_allocation_bytes_; ask for exactly 'bytes'.
  const size_t saved = curr_region_allocation_bytes_;
  curr_region_allocation_bytes_ = bytes;
  const bool ok = Extend(lms_->page_size(), bytes);
  curr_region_allocation_bytes_ = saved;
  return ok;
}

void* BFCAllocator::LmsAllocateSlow(BinNum bin_num, size_t rounded_bytes,
                                    size_t num_bytes, uint64 freed_before) {
  LmsVirtualMemSubAllocator::FillerPause filler_pause(lms_);
  if (lms_->holes() > 0) {
    // A failed move left a page of a live tensor unmapped: map it again or
    // serve nothing, so that the failure reaches the op (an allocation
    // failure) instead of work running over the hole.
    Status s;
    {
      LmsVirtualMemSubAllocator::QuietScope quiet(lms_);
      s = lms_->RepairHoles();
    }
    if (!s.ok()) {
      ++lms_stats_.num_failures;
      lms_last_error_ = strings::StrCat(
          "Large Model Support could not serve ",
          strings::HumanReadableNumBytes(num_bytes), " on ", name_, ": ",
          s.ToString());
      LOG(ERROR) << lms_last_error_;
      return nullptr;
    }
  }
  const size_t ps = lms_->page_size();
  const size_t region_bytes = RoundUpTo(rounded_bytes, ps);
  const size_t need = region_bytes / ps;

  const int64_t swapped_before = lms_stats_.bytes_swapped_out;
  bool defragged = false;
  Status spill_status;
  void* ptr = nullptr;
  // Makes 'want' device pages available: (defrag) unmaps the device pages
  // under free chunks other than 'target', fragments too small for this
  // request first; then spills the least recently used allocations.
  auto make_room = [&](size_t want, ChunkHandle target) {
    if (lms_->DevicePagesAvailable() >= want) return true;
    // Pages are about to be unmapped or moved: quiesce the device until they
    // are in place (the scope ends with this call).
    LmsVirtualMemSubAllocator::QuietScope quiet(lms_);
    // Freed host pages first: they count against the host budget.
    if (lms_->host_pages_mapped() > 0) {
      LmsReleaseFreePages(SIZE_MAX, SIZE_MAX, target, /*host_only=*/true);
    }
    if (opts_.lms_defrag_enabled) {
      size_t released = LmsReleaseFreePages(
          want - lms_->DevicePagesAvailable(), rounded_bytes, target);
      if (lms_->DevicePagesAvailable() < want) {
        released += LmsReleaseFreePages(want - lms_->DevicePagesAvailable(),
                                        SIZE_MAX, target);
      }
      if (released > 0) {
        if (!defragged) ++lms_stats_.num_defrag_events;
        defragged = true;
        lms_stats_.bytes_defragmented += released * ps;
      }
    }
    if (lms_->DevicePagesAvailable() < want) {
      spill_status = LmsSpillLru(want);
    }
    return lms_->DevicePagesAvailable() >= want;
  };
  // Each round picks the placement FindChunkPtr will use (the best fitting
  // free chunk, or a new region at the end of the address range), makes
  // room for the device pages it lacks, and allocates.
  for (int round = 0; ptr == nullptr && round < 4; ++round) {
    const ChunkHandle target = LmsBestFit(rounded_bytes);
    if (target == kInvalidChunkHandle) {
      if (!make_room(need, kInvalidChunkHandle) ||
          !LmsExtendExact(region_bytes)) {
        break;
      }
      continue;  // The new region may have merged with a free chunk.
    }
    const Chunk* c = ChunkFromHandle(target);
    const size_t want = lms_->CountPages(
        c->ptr, std::min(c->size, rounded_bytes + ps),
        LmsVirtualMemSubAllocator::PageState::kUnbacked);
    if (!make_room(want, target)) break;
    ptr = FindChunkPtr(bin_num, rounded_bytes, num_bytes, freed_before);
  }

  if (ptr != nullptr) {
    ++lms_stats_.num_reclaims;
    VLOG(1) << "LMS served " << strings::HumanReadableNumBytes(num_bytes)
            << " on " << name_ << " (swapped out "
            << strings::HumanReadableNumBytes(lms_stats_.bytes_swapped_out -
                                              swapped_before)
            << (defragged ? ", defragmented" : "") << ")";
    AddTraceMe("MemoryAllocation", ptr);
    return ptr;
  }

  // Failure: explain what would have helped.
  ++lms_stats_.num_failures;
  int64_t free_bytes = 0, largest_free = 0, free_chunks = 0;
  for (const AllocationRegion& region : region_manager_.regions()) {
    ChunkHandle h = region_manager_.get_handle(region.ptr());
    while (h != kInvalidChunkHandle) {
      const Chunk* c = ChunkFromHandle(h);
      if (!c->in_use()) {
        free_bytes += c->size;
        largest_free = std::max<int64_t>(largest_free, c->size);
        ++free_chunks;
      }
      h = c->next;
    }
  }
  std::string msg = strings::StrCat(
      "Large Model Support could not serve ",
      strings::HumanReadableNumBytes(num_bytes), " on ", name_,
      " (device pages available: ", lms_->DevicePagesAvailable(), " of ",
      lms_->device_bytes_limit() / ps, ", needed: ", need,
      ", in use: ", strings::HumanReadableNumBytes(stats_.bytes_in_use),
      ", pool: ", strings::HumanReadableNumBytes(*stats_.pool_bytes), ").");
  if (!spill_status.ok() && errors::IsResourceExhausted(spill_status)) {
    const size_t missing_pages =
        need > lms_->DevicePagesAvailable()
            ? need - lms_->DevicePagesAvailable()
            : 0;
    const size_t limit_mb = lms_->host_bytes_limit() >> 20;
    size_t suggest_mb = limit_mb + ((missing_pages * ps + (1 << 20) - 1) >> 20);
    suggest_mb = std::max<size_t>(RoundUpTo(suggest_mb, 1024),
                                  std::max<size_t>(limit_mb * 2, 1024));
    // Name the setting that gave the limit in force (the environment
    // variable or the config option).
    const std::string& setting = lms_->host_limit_setting();
    const bool env = setting == "TF_GPU_HOST_MEM_LIMIT_IN_MB";
    strings::StrAppend(
        &msg, " The host swap space is full: ",
        strings::HumanReadableNumBytes(lms_->host_pages_mapped() * ps),
        " of device memory is already swapped out to host memory and the "
        "limit is ", setting, "=", limit_mb, ". Set ",
        env ? "the environment variable " : "", setting, "=", suggest_mb,
        " (or larger) to allow more host memory for swapping.");
  } else if (!spill_status.ok()) {
    strings::StrAppend(&msg, " Swapping failed: ", spill_status.ToString());
  }
  if (!lms_->last_map_error().ok()) {
    strings::StrAppend(&msg, " Mapping device pages failed: ",
                       lms_->last_map_error().ToString());
    lms_->clear_last_map_error();
  }
  if (!opts_.lms_defrag_enabled && free_bytes >= (int64_t)rounded_bytes) {
    strings::StrAppend(
        &msg, " The memory is fragmented: ",
        strings::HumanReadableNumBytes(free_bytes), " are free in ",
        free_chunks, " chunks, the largest being ",
        strings::HumanReadableNumBytes(largest_free),
        ". Enable LMS defragmentation with "
        "tf.config.experimental.set_lms_defrag_enabled(True) (or "
        "gpu_options.experimental.lms_defrag_enabled = True in the session "
        "ConfigProto): free device pages are then remapped into a contiguous "
        "range, no tensor is moved.");
  }
  lms_last_error_ = msg;
  LOG(WARNING) << msg;
  return nullptr;
}

void BFCAllocator::LmsOnFree(const void* freed_ptr) {
  lms_touched_.erase(freed_ptr);
  if (lms_->host_pages_mapped() == 0) {
    lms_in_use_mark_ = stats_.bytes_in_use;
    return;
  }
  const int64_t ps = lms_->page_size();
  const int64_t batch = std::max<int64_t>(
      ps, std::min<int64_t>(lms_->host_pages_mapped() * ps,
                            lms_->device_bytes_limit() / 4));
  if (lms_in_use_mark_ - stats_.bytes_in_use >= batch) LmsReturnSpilled();
}

// One return (see the top of this file): gives back the host pages under
// free chunks, unmaps free device pages where spilled data needs them, and
// brings the most recently used spilled allocations back.
//
// The host pages given back stay in the sub-allocator's pool (at most the
// peak spilled, within the host limit): the next step spills into them
// instead of creating pinned pages again, which runs at a tenth of the copy.
// Once a return brought everything back, idle pages above the most used
// since the previous such return are destroyed (TrimHostPool).
void BFCAllocator::LmsReturnSpilled() {
  {
    // Freed memory may still be read by queued work, and spilled pages moved
    // back may be in use: quiesce the device until both are done.
    LmsVirtualMemSubAllocator::QuietScope quiet(lms_);
    ++lms_stats_.num_device_syncs_on_free;
    LmsReleaseFreePages(SIZE_MAX, SIZE_MAX, kInvalidChunkHandle,
                        /*host_only=*/true);
    // Spilled data has priority over cached free device memory.
    if (lms_->host_pages_mapped() > lms_->DevicePagesAvailable()) {
      LmsReleaseFreePages(
          lms_->host_pages_mapped() - lms_->DevicePagesAvailable(), SIZE_MAX,
          kInvalidChunkHandle);
    }
    LmsFetchMru();
  }
  // Everything came back: pinned host pages above what recent steps used go
  // back to the system (a spike's pages are not held for the process's life).
  if (lms_->host_pages_mapped() == 0) lms_->TrimHostPool();
  lms_in_use_mark_ = stats_.bytes_in_use;
}

// In a QuietScope (LmsReturnSpilled).
void BFCAllocator::LmsFetchMru() {
  if (lms_->host_pages_mapped() == 0 || lms_->DevicePagesAvailable() == 0) {
    return;
  }
  std::vector<std::pair<uint64, ChunkHandle>> spilled =
      LmsInUseChunksWith(LmsVirtualMemSubAllocator::PageState::kHost);
  std::sort(spilled.rbegin(), spilled.rend());
  for (const auto& v : spilled) {
    if (lms_->DevicePagesAvailable() == 0) break;
    const Chunk* c = ChunkFromHandle(v.second);
    size_t n = 0;
    Status s = lms_->FetchRange(c->ptr, c->size, &n);
    lms_stats_.bytes_swapped_in += n * lms_->page_size();
    lms_stats_.num_swap_ins += n;
    if (!s.ok()) {
      NoteSwapInFailure(s, &lms_last_error_);
      break;
    }
  }
}

void BFCAllocator::LmsTouch(const void* ptr) {
  if (lms_ == nullptr || ptr == nullptr) return;
  mutex_lock l(lock_);
  ChunkHandle h = region_manager_.get_handle(ptr);
  if (h == kInvalidChunkHandle) return;
  Chunk* c = ChunkFromHandle(h);
  if (!c->in_use()) return;
  lms_touched_[c->ptr] = static_cast<uint64>(next_allocation_id_++);
  if (lms_->DevicePagesAvailable() > 0 &&
      lms_->CountPages(c->ptr, c->size,
                       LmsVirtualMemSubAllocator::PageState::kHost) > 0) {
    LmsVirtualMemSubAllocator::QuietScope quiet(lms_);
    size_t n = 0;
    Status s = lms_->FetchRange(c->ptr, c->size, &n);
    NoteSwapInFailure(s, &lms_last_error_);
    lms_stats_.bytes_swapped_in += n * lms_->page_size();
    lms_stats_.num_swap_ins += n;
  }
}

LmsStats BFCAllocator::GetLmsStats() {
  mutex_lock l(lock_);
  LmsStats s = lms_stats_;
  if (lms_ != nullptr) {
    const int64_t ps = lms_->page_size();
    s.page_bytes = ps;
    s.device_bytes_limit = lms_->device_bytes_limit();
    s.device_bytes_mapped = lms_->device_pages_mapped() * ps;
    s.device_bytes_reserved = lms_->device_pages_created() * ps;
    s.host_bytes_limit = lms_->host_bytes_limit();
    s.host_bytes_in_use = lms_->host_pages_mapped() * ps;
    s.peak_host_bytes_in_use = lms_->peak_host_pages_mapped() * ps;
    s.host_bytes_reserved = lms_->host_pages_created() * ps;
    s.host_reserve_bytes = lms_->host_reserve_pages() * ps;
    s.host_bytes_made_ahead = lms_->host_pages_made_ahead() * ps;
    s.swap_out_ns = lms_->spill_ns();
    s.swap_in_ns = lms_->fetch_ns();
    s.num_device_syncs = static_cast<int64_t>(lms_->quiet_scopes());
    lms_->AddLaunchGateStats(&s);
  }
  return s;
}

std::string BFCAllocator::LmsLastError() {
  mutex_lock l(lock_);
  return lms_last_error_;
}

void BFCAllocator::LmsAdjustStats(AllocatorStats* stats) {
  // The pool of an LMS allocator is virtual: report the device limit.
  stats->bytes_limit = static_cast<int64_t>(lms_->device_bytes_limit());
}

}  // namespace tsl
