// Large Model Support: one DeviceCachingAllocator's LMS. See
// impl/LMSDeviceAllocator.h. Everything here runs under the allocator's
// mutex; what it needs of the allocator it asks through AllocatorHooks.
#include <c10/cuda/impl/LMSDeviceAllocator.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDALargeModelSupport.h>
#include <c10/cuda/impl/LMSHostBudget.h>

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <sstream>

namespace c10::cuda::CUDACachingAllocator::lms::impl {

#if !defined(USE_ROCM) && defined(PYTORCH_C10_DRIVER_API_SUPPORTED)

namespace {
// upstream's kLargeBuffer: the large pool's page without LMS
constexpr size_t kUpstreamLargePage = size_t(20) << 20;

// Device memory kept free for what is allocated outside this allocator: the
// driver's lazily loaded kernels, library handles (cublasCreate on a new
// thread), NCCL's buffers. Those allocations cannot make LMS move anything,
// so on a card LMS has filled they fail. 1/64 of the card, at least 256 MiB.
size_t foreign_reserve(size_t total) {
  return std::max<size_t>(size_t(256) << 20, total / 64);
}

// What served a request that mapped new pages: pages moved for it, else the
// free cache released for it (counted as defrag when defrag is on), else new
// device memory alone.
Stat served_by(bool moved, size_t released) {
  if (moved) {
    return kAllocLmsReclaim;
  }
  return released > 0 && defrag_enabled() ? kAllocDefrag : kAllocNewDevice;
}
} // namespace

size_t DeviceLms::host_bytes() const {
  return static_cast<size_t>(
      std::max<int64_t>(0, stat_get(mover_.device(), kHostBytes)));
}

// device memory held by this allocator (mapped bytes minus host pages)
size_t DeviceLms::device_bytes() const {
  size_t h = host_bytes();
  size_t mapped = hooks_.mapped_bytes();
  return mapped > h ? mapped - h : 0;
}

// Host pages are made in the background so that a spill finds them made
// (making pinned host pages runs at a tenth of the copy's speed). Their page
// is that of the device pages a spill would move: a segment keeps the page it
// was made with, so segments made before LMS was switched on keep upstream's
// page, and host pages of LMS's own size would not serve their spill.
// * A reserve set by the user (lms_host_reserve_mb): filling starts once
//   device use reaches 3/4 of `cap`, what LMS may use (prefill).
// * Automatic: nothing is made before LMS has moved something, so a job that
//   fits holds no host pages; from then on the idle reserve follows the most
//   LMS has held on the host, up to 1/8 of `cap`, so the next, larger spill
//   finds its pages made (follow_host_bytes, after each spill).
void DeviceLms::prefill(size_t want, size_t cap) {
  const size_t setting = host_reserve_setting();
  if (setting == kAutoHostReserve || prefill_asked_ ||
      device_bytes() + want < cap / 4 * 3) {
    return;
  }
  prefill_asked_ = true;
  const int dev = mover_.device();
  host_pool_prefill(dev, hooks_.busiest_large_page(dev), setting);
}

void DeviceLms::follow_host_bytes(size_t cap) {
  if (host_reserve_setting() != kAutoHostReserve) {
    return;
  }
  const size_t reserve = std::min(host_bytes(), cap / 8);
  if (reserve > reserve_asked_) {
    reserve_asked_ = reserve;
    const int dev = mover_.device();
    host_pool_prefill(dev, hooks_.busiest_large_page(dev), reserve);
  }
}

// Releases free cached memory until at least `at_least` device bytes are
// released (a tag may release all it can). With defrag: free pages; without:
// only segments that are completely free. What stays cached serves the next
// allocations without mapping its pages again. Returns the device bytes
// released (host pages of free blocks go back to the host pool too, but give
// the device nothing).
size_t DeviceLms::release_free(size_t at_least) {
  if (hooks_.capturing()) {
    return 0;
  }
  const size_t before = device_bytes();
  hooks_.release_free_at_least(at_least, defrag_enabled());
  const size_t after = device_bytes();
  const size_t released = before > after ? before - after : 0;
  if (defrag_enabled()) {
    stat_add(
        mover_.device(), kDefragReleasedBytes, static_cast<int64_t>(released));
  }
  return released;
}

// Moves least recently allocated device pages to host until `need` bytes of
// device memory are released, under `cap` (what LMS may use: the automatic
// host reserve follows what moved). Returns the bytes released.
size_t DeviceLms::swap_out(size_t need, size_t cap) {
  auto pages = hooks_.movable_pages(/*on_host=*/false);
  std::sort(pages.begin(), pages.end(), [](const PageRef& a, const PageRef& b) {
    return a.tick < b.tick;
  });
  std::vector<PageRef> victims;
  std::vector<cudaStream_t> streams;
  size_t planned = 0;
  size_t eligible = 0;
  for (auto& p : pages) {
    const size_t ps = hooks_.page_size(p.seg);
    eligible += ps;
    if (planned < need) {
      streams.insert(streams.end(), p.streams.begin(), p.streams.end());
      victims.push_back(std::move(p));
      planned += ps;
    }
  }
  attempt_.eligible_left = eligible - planned;
  if (victims.empty()) {
    return 0;
  }
  PageMover::SwapOut out;
  out.host_exhausted = attempt_.host_exhausted; // a refusal holds for the request
  try {
    mover_.swap_out(hooks_, victims, std::move(streams), out);
  } catch (...) {
    attempt_.swapped += out.released;
    attempt_.host_exhausted = out.host_exhausted;
    throw;
  }
  attempt_.swapped += out.released;
  attempt_.host_exhausted = out.host_exhausted;
  if (out.released > 0) {
    follow_host_bytes(cap);
  }
  return out.released;
}

// Device bytes LMS may bring back now, keeping `headroom` free for the
// allocations that follow; `releasable`: free cached bytes counted as if
// released already (what a release_free() first would add).
size_t DeviceLms::return_room(size_t headroom, size_t releasable) {
  size_t dev = device_bytes();
  dev = dev > releasable ? dev - releasable : 0;
  size_t lim = limit();
  size_t free_b = 0;
  size_t total_b = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  free_b += releasable;
  // keep a margin so that the next allocations do not swap straight back
  size_t margin = lim ? kUpstreamLargePage * 8
                      : std::max<size_t>(kUpstreamLargePage * 8, total_b / 50);
  margin = std::max(margin, headroom);
  // The card's free memory also keeps the foreign reserve; room under the
  // LMS limit does not (memory outside the allocator is not under the limit).
  const size_t card_margin = std::max(margin, foreign_reserve(total_b));
  size_t room = free_b > card_margin ? free_b - card_margin : 0;
  if (lim) {
    size_t under = lim > dev + margin ? lim - dev - margin : 0;
    room = std::min(room, under);
  }
  return room;
}

// Room kept free by the returns after frees: 1/16 of what LMS may use. Also
// the least a release of the cache asks for, so that one release serves
// several requests and returns rather than one.
size_t DeviceLms::return_headroom() {
  if (device_total_ == 0) {
    size_t free_b = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_b, &device_total_));
  }
  const size_t lim = limit();
  return (lim ? std::min(lim, device_total_) : device_total_) / 16;
}

// Brings host pages back to device memory (most recently allocated first)
// while there is room above `headroom`. Returns bytes brought back.
size_t DeviceLms::swap_in(size_t headroom) {
  if (host_bytes() == 0 || hooks_.capturing()) {
    return 0;
  }
  size_t room = return_room(headroom, 0);
  auto pages = hooks_.movable_pages(/*on_host=*/true);
  if (pages.empty() || room == 0) {
    return 0;
  }
  std::sort(pages.begin(), pages.end(), [](const PageRef& a, const PageRef& b) {
    return a.tick > b.tick;
  });
  return mover_.swap_in(hooks_, pages, room);
}

// The net under release_free_at_least's promise (LMSAllocatorHooks.h): a
// request that maps more than it asked room for, as one did when a release
// unmapped pages of the free run it then grew into, has what it maps past the
// LMS limit go out again at once (least recently allocated pages; the new
// block is not among them), so that the limit holds after every request.
// Counted (limit_spills), since no hooks should need it: each one is a
// synchronous spill that the release before the request should have made.
void DeviceLms::keep_under_limit(size_t lim, size_t cap) {
  if (lim && device_bytes() > lim && !hooks_.capturing()) {
    const size_t moved = swap_out(device_bytes() - lim, cap);
    stat_add(mover_.device(), kLimitSpills, 1);
    stat_add(mover_.device(), kLimitSpillBytes, static_cast<int64_t>(moved));
  }
}

// Before new device pages are mapped for `want` bytes: where they would leave
// less than the foreign reserve free, the cache is released and pages move
// out until they would not (a few rounds at most). Soft: what cannot be
// reclaimed is mapped into the reserve rather than failing the request.
// Returns whether pages moved.
bool DeviceLms::keep_reserve(size_t want, size_t total, size_t cap) {
  const size_t keep = want + foreign_reserve(total);
  size_t free_b = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
  if (free_b >= keep) {
    return false;
  }
  attempt_.released += release_free(std::max(keep - free_b, return_headroom()));
  bool moved = false;
  for (int round = 0; round < 4; ++round) {
    C10_CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    if (free_b >= keep || swap_out(keep - free_b, cap) == 0) {
      break;
    }
    moved = true;
    if (attempt_.host_exhausted) {
      break;
    }
  }
  if (moved) {
    stat_add(mover_.device(), kReserveReclaims, 1);
  }
  return moved;
}

bool DeviceLms::malloc(bool found, int device, size_t want, bool* refused) {
  *refused = false;
  mover_.init(device);
  const int dev = mover_.device();
  if (found) {
    stat_add(dev, kAllocFreeList, 1);
    return true;
  }
  attempt_ = Attempt{};
  size_t free_b = 0;
  size_t total_b = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (want > total_b) {
    attempt_.too_large = true;
    *refused = true;
    return false;
  }
  const bool capturing = hooks_.capturing();
  // The LMS limit: device memory this process keeps under. Reclaim before
  // passing it; when reclaiming cannot get under it, the request fails.
  size_t lim = limit();
  const size_t cap = lim ? std::min(lim, total_b) : total_b;
  prefill(want, cap);
  bool reclaimed = false;
  if (lim && device_bytes() + want > lim) {
    if (!capturing) {
      // only the excess: the rest of the cache serves the next allocations
      attempt_.released +=
          release_free(std::max(device_bytes() + want - lim, return_headroom()));
      // until under the limit, a few rounds at most
      for (int round = 0; round < 4 && device_bytes() + want > lim; ++round) {
        if (swap_out(device_bytes() + want - lim, cap) == 0) {
          break;
        }
        reclaimed = true;
        if (attempt_.host_exhausted) {
          break;
        }
      }
    }
    if (device_bytes() + want > lim) {
      attempt_.over_limit = true;
      *refused = true;
      return false;
    }
  }
  if (!capturing && keep_reserve(want, total_b, cap)) {
    reclaimed = true;
  }
  if (hooks_.alloc_block(/*is_retry=*/false)) {
    keep_under_limit(lim, cap);
    // the free cache may have been released for it under the limit or the
    // reserve
    stat_add(dev, served_by(reclaimed, attempt_.released), 1);
    return true;
  }
  if (capturing) {
    return false;
  }
  // the free cache: first what the request needs (with the floor), then all
  const size_t asks[] = {
      std::max(want, return_headroom()), AllocatorHooks::kReleaseAll};
  for (const size_t ask : asks) {
    const size_t rel = release_free(ask);
    attempt_.released += rel;
    if (rel == 0) {
      break;
    }
    if (hooks_.alloc_block(/*is_retry=*/true)) {
      keep_under_limit(lim, cap);
      stat_add(dev, served_by(/*moved=*/false, rel), 1);
      return true;
    }
  }
  // swap out, a few rounds (a request may need more than its size when the
  // pages freed are not where the new mapping lands)
  size_t need = want;
  for (int round = 0; round < 4; ++round) {
    if (swap_out(need, cap) == 0) {
      break;
    }
    if (hooks_.alloc_block(/*is_retry=*/true)) {
      keep_under_limit(lim, cap);
      stat_add(dev, kAllocLmsReclaim, 1);
      return true;
    }
    if (attempt_.host_exhausted) {
      break;
    }
    need *= 2;
  }
  return false;
}

// Returns after frees are held back until they can keep what they bring:
// room for at least min(host bytes, 1 GiB) above the headroom. While the job
// still grows (a forward pass frees temporaries all the time while its saved
// tensors pile up), pages brought into the last free bytes would go straight
// out again at the next allocation, each move a device sync, and releasing
// the cache to make that room unmaps pages the next allocations map again.
void DeviceLms::after_free(size_t freed) {
  if (mover_.device() < 0) {
    return;
  }
  const size_t on_host = host_bytes();
  if (on_host == 0) {
    freed_since_return_ = 0;
    return;
  }
  freed_since_return_ += freed;
  const size_t threshold = std::max<size_t>(
      kUpstreamLargePage, std::min<size_t>(on_host, size_t(256) << 20));
  if (freed_since_return_ < threshold || hooks_.capturing()) {
    return;
  }
  freed_since_return_ = 0;
  const size_t headroom = return_headroom();
  const size_t worth = std::min<size_t>(on_host, size_t(1) << 30);
  const size_t cached = hooks_.cached_free_bytes();
  const size_t reachable = return_room(headroom, cached);
  if (reachable < worth) {
    stat_add(mover_.device(), kReturnsHeld, 1);
    return;
  }
  // Only the cache the pages coming back need is released: the room grows
  // byte for byte with what is released, up to `reachable`. Releasing all of
  // it unmapped pages that the next allocations map again (a driver call
  // each), step after step.
  const size_t bring = std::min(on_host, reachable);
  if (bring + cached > reachable) {
    release_free(std::max(bring + cached - reachable, headroom));
  }
  swap_in(headroom);
}

void DeviceLms::empty_cache() {
  if (mover_.device() >= 0) {
    swap_in(/*headroom=*/0);
  }
  host_pool_trim();
  prefill_asked_ = false;
  reserve_asked_ = 0;
}

std::string DeviceLms::oom_message(size_t alloc_size) {
  std::ostringstream o;
  size_t free_b = 0;
  size_t total_b = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const auto& a = attempt_;
  auto fmt = [&](size_t n) { return hooks_.format_size(n); };
  o << "Large Model Support could not serve this allocation. ";
  if (a.too_large) {
    o << "The request (" << fmt(alloc_size)
      << ") is larger than the whole GPU (" << fmt(total_b)
      << "): LMS swaps whole pages of other tensors to host memory but a "
         "single block must fit in device memory; split the tensor. ";
  } else {
    o << "Tried: the free list, new device pages, releasing free cached "
         "pages (defrag "
      << (defrag_enabled() ? "on" : "off") << ", released "
      << fmt(a.released) << "), swapping least recently allocated "
      << "pages to host (swapped " << fmt(a.swapped)
      << " for this request; " << fmt(a.eligible_left)
      << " of swappable pages left on the device). ";
  }
  o << "Host swap in use for this GPU: " << fmt(host_bytes())
    << "; host budget used " << fmt(host_used()) << " of "
    << fmt(host_mem_limit()) << ". ";
  if (a.over_limit) {
    o << "The LMS device limit (" << fmt(limit())
      << ") would be passed (device memory in use " << fmt(device_bytes())
      << "): raise it with torch.cuda.set_limit_lms() or lms_limit_mb. ";
  }
  if (a.host_exhausted) {
    o << "The host memory limit was reached";
    if (const char* rank = std::getenv("RANK")) {
      const char* local = std::getenv("LOCAL_RANK");
      // the divisor of the host budget's default (host_budget_rule)
      o << " in rank " << rank << " (local rank " << (local ? local : "?")
        << " of " << local_world_size()
        << " on this node, which share its host memory)";
    }
    o << ": raise it with PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB (per process) or "
         "torch.cuda.set_host_mem_limit_lms(). ";
  } else if (!a.too_large && a.eligible_left == 0 && a.swapped == 0) {
    o << "No block large enough to swap: lower the smallest swappable block "
         "size with torch.cuda.set_size_lms() (now "
      << fmt(min_swap_size()) << "). ";
  }
  const size_t reserved_unalloc = hooks_.cached_free_bytes();
  if (!a.too_large && reserved_unalloc >= alloc_size) {
    o << "Fragmentation: " << fmt(reserved_unalloc)
      << " is reserved but free, in pieces too small for this request"
      << (defrag_enabled() ? ". "
                           : "; enable defragmentation with "
                             "torch.cuda.set_lms_defrag_enabled(True). ");
  }
  stat_add(mover_.device(), kOoms, 1);
  return o.str();
}

#else // LMS cannot be enabled here (lms::supported())

bool DeviceLms::malloc(bool found, int, size_t, bool* refused) {
  *refused = false;
  return found;
}
void DeviceLms::after_free(size_t) {}
void DeviceLms::empty_cache() {}
std::string DeviceLms::oom_message(size_t) {
  return "";
}

#endif

} // namespace c10::cuda::CUDACachingAllocator::lms::impl
