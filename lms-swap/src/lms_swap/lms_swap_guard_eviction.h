#pragma once
// The eviction net's registry and its eviction (lms_swap_guard.cpp): Guard, the one object
// that every slot is registered with and that, when the caching allocator cannot serve a
// request, copies slots to host memory, earliest registered first (backward needs them
// last), frees their device memory and says whether to ask the allocator again.  It keeps
// the host budget those copies are taken under (with lms_swap's pinned pool and the idle
// chunks the pool offers it), the net's counters, and the words of the error the program
// gets where the net could make no room.
//
// Invariants:
// - Only a slot whose storage nobody else references is evicted (use_count 1): no tensor
//   of the program can still reach those bytes.  The copy runs on the current stream of
//   the allocating thread after the work queued there and after an event recorded when
//   the slot was made (on the stream then current: a tensor written on a side stream),
//   into pageable host memory, and has finished before the device memory is freed.
// - mu_ guards the slots' device tensors and is held only to pick a slot and to commit
//   its move: nothing waits under it (not the copy, not the wait for host room).  A
//   slot taken back meanwhile (Slot.device_tensor) stays, and its copy is dropped.
// - Nothing here calls into Python or takes the GIL (it only asks whether this thread
//   holds it, before waiting for the pool's releaser).  No tensor is destroyed while mu_
//   is held (destroying a device tensor enters the allocator).
// - Host bytes taken here count against the same host limit as every byte lms_swap's
//   pinned pool holds (set_host_budget) and those its releaser is still giving back
//   (add_releasing): host memory stays under the limit at all times.  The pool offers
//   the net its idle chunks (offer); when its copies would go over the limit the net
//   gives such chunks back itself (unpinned, their pages returned with MADV_DONTNEED;
//   the pool drops them from its books when it next asks, take_discarded), so an idle
//   pool never makes the net refuse.  An offered chunk is the net's to discard until
//   the pool withdraws it, which it does before it carves from it or releases it.
//   The machine keeps min_available bytes available at all times.
//
// Part of lms_swap_guard.cpp's one translation unit, like each lms_swap_guard_*.h: what it
// defines has internal linkage (an unnamed namespace), so it is included from there only.
#include "lms_swap_guard_slot.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

class Guard {
 public:
  static Guard& get() {
    static Guard* g = new Guard();  // never destroyed: the allocator may call late
    return *g;
  }

  void add(const std::shared_ptr<Slot>& s) {
    std::vector<std::shared_ptr<Slot>> hold;  // released after mu_
    std::lock_guard<std::mutex> lk(mu_);
    slots_.push_back(s);
    if (slots_.size() > 2 * live_hint_ + 1024) compact_locked(hold);
  }

  void arm(bool on) { armed_ = on; }

  // ---- the pool's idle chunks (see the invariants above) ----
  void offer(int64_t id, void* p, int64_t size, int device) {
    std::lock_guard<std::mutex> lk(offers_mu_);
    offers_.push_back(Offer{id, p, size, device});
  }
  // True: the chunk was still offered and is the pool's again; false: the net gave it back.
  bool withdraw(int64_t id) {
    std::lock_guard<std::mutex> lk(offers_mu_);
    for (auto it = offers_.begin(); it != offers_.end(); ++it) {
      if (it->id == id) {
        offers_.erase(it);
        return true;
      }
    }
    return false;
  }
  std::vector<int64_t> take_discarded() {
    std::lock_guard<std::mutex> lk(offers_mu_);
    std::vector<int64_t> out;
    out.swap(discarded_);
    return out;
  }
  void add_releasing(int64_t delta) {
    releasing_ += delta;
    note_host_peak();
  }
  bool armed() const { return armed_; }
  void set_host_budget(int64_t limit, int64_t other, int64_t min_available) {
    host_limit_ = limit;
    host_other_ = other;
    min_available_ = min_available;
    note_host_peak();
  }

  // The slot's device tensor (storage) while it is resident, else an empty one.
  Resident resident_of(const Slot& s) {
    std::lock_guard<std::mutex> lk(mu_);
    if (s.evicted.load() || !held(s.dev)) return Resident();
    return s.dev;
  }
  int64_t owners(const Slot& s) {
    std::lock_guard<std::mutex> lk(mu_);
    return held(s.dev) ? owners_of(s.dev) : 0;
  }

  // An allocation of `n` bytes on `device` failed (`attempt` errors in a row for this
  // request): make room and say whether to retry.
  bool on_oom(int device, size_t n, int attempt) {
    if (!armed_ || g_resident.load() == 0) return false;
    ooms_++;
    // inside a CUDA graph capture a copy would be recorded, not run, and synchronising
    // would end the capture: leave the error to the program
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device).stream(), &capturing) !=
            cudaSuccess ||
        capturing != cudaStreamCaptureStatusNone) {
      (void)cudaGetLastError();
      return false;
    }
    // more than asked: the allocator maps whole pages, and what is freed may not lie in
    // one piece; and a step that outgrew the forecast (a first step, which has none)
    // asks again soon, while every error costs the allocator a device synchronisation
    // and the release of its cache: a 64th of the device per error.
    // The first error of a request asks only for what the device lacks (a settled step
    // that misses its forecast by megabytes then moves megabytes, not the whole request);
    // should that not do (free bytes in pieces the allocator cannot use), every later
    // error of the same request asks for all of it again.
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      (void)cudaGetLastError();
      free_b = total_b = 0;
    }
    note_oom(device, n, free_b);
    const int64_t extra = std::max<int64_t>(64 << 20, static_cast<int64_t>(total_b / 64));
    const int64_t want = static_cast<int64_t>(n);
    const int64_t short_by =
        attempt == 0 ? std::max<int64_t>(0, want - static_cast<int64_t>(free_b)) : want;
    if (evict(device, short_by + extra) == 0) return false;
    needed_ += static_cast<int64_t>(n);
    return true;
  }

  // Evicts slots on `device`, earliest registered first, until `need` bytes were freed
  // or nothing more can go.  Returns the bytes freed.  mu_ is held only to pick a slot
  // and to commit its move: the wait for host room (the pool's releaser is a Python
  // thread, which a thread holding the GIL and waiting for mu_ would block) and the copy
  // run without it.
  int64_t evict(int device, int64_t need) {
    std::vector<Resident> to_free;               // destroyed after mu_ is released
    std::vector<std::shared_ptr<Slot>> hold;     // (a slot may lose its last owner
    int64_t freed = 0;                           //  meanwhile)
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    size_t next = 0;  // position in slots_ to look from (slots_ only grows at its end
                      // meanwhile, or is compacted: then from the start again)
    uint64_t seen_gen = 0;
    while (freed < need) {
      std::shared_ptr<Slot> s;
      const void* src = nullptr;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (seen_gen != compactions_) {
          seen_gen = compactions_;
          next = 0;
        }
        for (; next < slots_.size(); ++next) {
          auto c = slots_[next].lock();
          if (c) hold.push_back(c);
          if (!c || c->evicted.load() || c->moving || c->device != device || !held(c->dev)) {
            continue;
          }
          if (owners_of(c->dev) != 1) {
            shared_++;
            continue;
          }
          c->moving = true;
          src = bytes_of(c->dev);
          s = std::move(c);
          ++next;
          break;
        }
      }
      if (!s) break;
      const int64_t n = s->nbytes;
      void* p = nullptr;
      bool ok = take_host(n);
      if (!ok) {
        host_refused_++;
      } else {
        p = map_populated(static_cast<size_t>(n));
        if (p == nullptr) {
          g_host_bytes -= n;
          host_refused_++;
          ok = false;
        }
      }
      if (ok) {
        // after the work that wrote the tensor (on whatever stream it was current
        // when the slot was made) and after the work queued on this stream
        cudaError_t err = cudaSuccess;
        if (s->ready != nullptr) {
          err = cudaStreamWaitEvent(stream, s->ready, 0);
        } else if (s->order_by_device) {
          err = cudaDeviceSynchronize();
        }
        if (err == cudaSuccess) {
          err = cudaMemcpyAsync(p, src, static_cast<size_t>(n), cudaMemcpyDeviceToHost, stream);
        }
        if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
        if (err != cudaSuccess) {
          (void)cudaGetLastError();
          host_free(p, static_cast<size_t>(n));
          p = nullptr;
          failed_++;
          ok = false;
        }
      }
      bool committed = false;
      {
        std::lock_guard<std::mutex> lk(mu_);
        s->moving = false;
        // someone took the tensor back while it was copied (Slot.device_tensor): it
        // stays, and the copy goes
        if (ok && held(s->dev) && owners_of(s->dev) == 1) {
          s->host = HostBuffer{p, static_cast<size_t>(n)};
          s->evicted.store(true, std::memory_order_release);
          g_resident--;
          to_free.push_back(std::move(s->dev));
          s->dev = Resident();
          committed = true;
        } else if (ok) {
          shared_++;
        }
      }
      if (!committed && p != nullptr) host_free(p, static_cast<size_t>(n));
      if (!ok) break;
      if (committed) {
        freed += n;
        evicted_count_++;
        evicted_bytes_ += n;
      }
    }
    to_free.clear();  // frees device memory: re-enters the allocator (same thread)
    hold.clear();
    return freed;
  }

  int64_t evicted_bytes() const { return evicted_bytes_.load(); }

 private:
  // What the allocator held when the net last caught an error: whether a step that
  // needed the net was short of memory (allocated near the limit) or of pieces
  // (reserved far above allocated: inactive split blocks).  Diagnostics only.
  void note_oom(int device, size_t n, size_t device_free) {
    last_request_ = static_cast<int64_t>(n);
    last_device_free_ = static_cast<int64_t>(device_free);
    try {
      const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(
          static_cast<c10::DeviceIndex>(device));
      last_allocated_ = st.allocated_bytes[0].current;  // [0]: the aggregate of all pools
      last_reserved_ = st.reserved_bytes[0].current;
      last_inactive_split_ = st.inactive_split_bytes[0].current;
    } catch (const std::exception&) {
      last_allocated_ = last_reserved_ = last_inactive_split_ = -1;
    }
  }

  struct Offer {
    int64_t id;
    void* ptr;
    int64_t size;
    int device;  // where it was pinned; -1: not pinned
  };

  bool over_limit(int64_t n) const {
    return host_limit_ >= 0 &&
           g_host_bytes.load() + host_other_.load() + releasing_.load() + n > host_limit_;
  }

  void note_host_peak() {
    const int64_t now = g_host_bytes.load() + host_other_.load() + releasing_.load();
    int64_t p = host_peak_.load();
    while (now > p && !host_peak_.compare_exchange_weak(p, now)) {
    }
  }

  // Takes `n` host bytes under the limit and the machine's floor (after host_room made
  // what room it could; no lock held while it waits), or false.  Two evicting threads
  // cannot both take the last room: the check and the count are one step.
  bool take_host(int64_t n) {
    if (!host_room(n)) return false;
    std::lock_guard<std::mutex> lk(budget_mu_);
    if (over_limit(n)) return false;
    const int64_t avail = mem_available();
    if (avail >= 0 && avail - n < min_available_) return false;
    g_host_bytes += n;
    note_host_peak();
    return true;
  }

  // Whether `n` more host bytes fit under the limit, after giving back offered chunks
  // (oldest first) and, where this thread does not hold the GIL, waiting up to 10 s for
  // the pool's releaser (a Python thread) to finish giving back what it has queued.
  bool host_room(int64_t n) {
    if (!over_limit(n)) return true;
    {
      std::lock_guard<std::mutex> lk(offers_mu_);
      while (over_limit(n) && !offers_.empty()) {
        discard(offers_.front());
        offers_.pop_front();
      }
    }
#ifndef LMS_GUARD_C10_ONLY
    if (over_limit(n) && releasing_.load() > 0 && Py_IsInitialized() && !PyGILState_Check()) {
      for (int i = 0; i < 10000 && over_limit(n) && releasing_.load() > 0; ++i) {
        usleep(1000);
      }
    }
#endif
    return !over_limit(n);
  }

  // Unpins an offered chunk and returns its pages; the pool drops it when it next asks.
  // Under offers_mu_.
  void discard(const Offer& o) {
    if (o.device >= 0) {
      int prev = -1;
      (void)cudaGetDevice(&prev);
      if (prev != o.device) (void)cudaSetDevice(o.device);
      if (cudaHostUnregister(o.ptr) != cudaSuccess) (void)cudaGetLastError();
      if (prev >= 0 && prev != o.device) (void)cudaSetDevice(prev);
    }
    madvise(o.ptr, static_cast<size_t>(o.size), MADV_DONTNEED);
    host_other_ -= o.size;
    discarded_.push_back(o.id);
    discarded_count_++;
    discarded_bytes_ += o.size;
  }

 public:

  // The net's counters by name (the Python module's stats() and the harness's C API).
  std::vector<std::pair<const char*, int64_t>> counters() {
    std::vector<std::pair<const char*, int64_t>> c = {
        {"armed", armed_.load() ? 1 : 0},
        {"ooms_caught", ooms_.load()},
        {"retries_served", served_.load()},
        {"evicted_count", evicted_count_.load()},
        {"evicted_bytes", evicted_bytes_.load()},
        {"needed_bytes", needed_.load()},
        {"shared_skipped", shared_.load()},
        {"host_refused", host_refused_.load()},
        {"pool_chunks_discarded", discarded_count_.load()},
        {"pool_bytes_discarded", discarded_bytes_.load()},
        {"host_releasing", releasing_.load()},
        {"copy_failed", failed_.load()},
        {"last_oom_request", last_request_.load()},
        {"last_oom_allocated", last_allocated_.load()},
        {"last_oom_reserved", last_reserved_.load()},
        {"last_oom_inactive_split", last_inactive_split_.load()},
        {"last_oom_device_free", last_device_free_.load()},
        {"host_bytes", g_host_bytes.load()},
        {"host_peak", host_peak_.load()},
        {"resident", g_resident.load()},
    };
    std::vector<std::shared_ptr<Slot>> hold;
    {
      std::lock_guard<std::mutex> lk(mu_);
      compact_locked(hold);
      c.emplace_back("slots", static_cast<int64_t>(slots_.size()));
    }
    return c;
  }

 private:
  // Drops expired and evicted entries; `hold` keeps the slots it looked at alive
  // until the caller has released mu_.
  void compact_locked(std::vector<std::shared_ptr<Slot>>& hold) {
    std::deque<std::weak_ptr<Slot>> keep;
    for (auto& w : slots_) {
      auto s = w.lock();
      if (!s) continue;
      hold.push_back(s);
      if (!s->evicted && held(s->dev)) keep.push_back(w);
    }
    slots_.swap(keep);
    live_hint_ = slots_.size();
    compactions_++;
  }

  std::mutex mu_;
  std::deque<std::weak_ptr<Slot>> slots_;
  size_t live_hint_ = 0;
  uint64_t compactions_ = 0;  // evict() looks from the start again after one
  std::mutex budget_mu_;      // a leaf: the check and the count of take_host
  std::atomic<int64_t> host_peak_{0};  // host bytes under the limit at their highest
  std::atomic<bool> armed_{false};
  std::atomic<int64_t> host_limit_{-1};
  std::atomic<int64_t> host_other_{0};
  std::atomic<int64_t> releasing_{0};
  std::mutex offers_mu_;              // a leaf: nothing else is taken under it
  std::deque<Offer> offers_;          // oldest first
  std::vector<int64_t> discarded_;    // ids given back, for the pool to drop
  std::atomic<int64_t> discarded_count_{0}, discarded_bytes_{0};
  std::atomic<int64_t> min_available_{0};
  std::atomic<int64_t> ooms_{0}, evicted_count_{0}, evicted_bytes_{0}, shared_{0},
      host_refused_{0}, failed_{0};
  std::atomic<int64_t> needed_{0};  // the failed requests' sizes (evictions free more)
  std::atomic<int64_t> last_request_{0}, last_device_free_{0}, last_allocated_{0},
      last_reserved_{0}, last_inactive_split_{0};

 public:
  std::atomic<int64_t> served_{0};

  // What the program is told when the net cannot make room for a request of `n` bytes:
  // the allocator's own message, then what the net had moved, why it could move no more
  // and what to change.  A raw "CUDA out of memory" after activation swapping says
  // nothing of either.
  std::string explain(const std::string& allocator_msg, size_t n) const {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    char buf[1400];
    const char* why =
        host_refused_.load() > 0
            ? "its host swap space was full (PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB or host_limit "
              "sets it)"
            : (g_resident.load() > 0
                   ? "the saved tensors still on the device are referenced elsewhere too"
                   : "no saved tensor is left on the device for it to move");
    std::snprintf(
        buf, sizeof buf,
        "\nLMS activation swapping could not make room for this request of %.2f GiB "
        "(%.2f GiB allocated when the net last tried): %s. It has moved %.2f GiB of saved "
        "tensors to host memory so far (%.2f GiB host memory in use by it). What remains "
        "on the device is held by what autograd does not save through it: parameters, "
        "gradients, optimizer state, and a model's outputs or transients (a language "
        "model's logits). To go on: a smaller batch; for a language model's loss, "
        "lms_swap's chunked_loss=True; or the allocator-level LMS, which moves any block: "
        "lms_swap.allocator.enable() as the program's first CUDA call on a stock PyTorch, "
        "or torch.cuda.set_enabled_lms(True) on a PyTorch built with the LMS patch.",
        static_cast<double>(n) / kGiB, static_cast<double>(last_allocated_.load()) / kGiB,
        why, static_cast<double>(evicted_bytes_.load()) / kGiB,
        static_cast<double>(g_host_bytes.load()) / kGiB);
    return allocator_msg + buf;
  }
};

}  // namespace
