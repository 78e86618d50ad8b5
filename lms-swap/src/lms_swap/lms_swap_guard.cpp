// The activation layer's net under the CUDA caching allocator (compiled into the lms-swap wheel
// by lms-swap/setup.py, else on first use by guard.py with torch.utils.cpp_extension; any
// PyTorch >= 2.4).
//
// lms_swap decides from a forecast which saved activations go to host memory.  A wrong
// forecast must cost speed, never the job.  Every saved activation the policy keeps on
// the device is registered here as a Slot.  When the caching allocator cannot serve a
// request (it has already released its cache and raises OutOfMemoryError), the net
// copies slots to host memory, earliest saved first (backward needs them last), frees
// their device memory, and asks the allocator again, until the request is served or no
// slot is left to move; only then does the error reach the program.  lms_swap brings an
// evicted slot back when backward unpacks it.
//
// How the net sees the failing request: the allocator object's `allocate` entry is
// redirected, in a private copy of its virtual table, to a function that calls the
// original and catches its OutOfMemoryError (exact size, after the allocator's own
// retries, with no allocator lock held).  Nothing else of the allocator changes.
//
// The net also keeps, fed by the allocator's trace callbacks, a per-device running peak
// of requested device bytes, which lms_swap marks at each backward's start (backward's
// exact peak every step, without resetting the program's own max_memory_allocated), and
// a count of the segments the allocator released (how lms_swap sees a step that ran the
// allocator to its edge).
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
// Built with LMS_GUARD_C10_ONLY, the same net compiles against c10 alone (no ATen, no
// Python): a slot then holds a c10::Storage.  The allocator's conformance harness
// includes this file so (tests/conformance/pytorch_allocator/guard_c_api.cpp) and runs
// the net over the caching allocator of a patched build, whose own LMS acts first.
#ifdef LMS_GUARD_C10_ONLY
#include <c10/core/Storage.h>
#else
#include <torch/extension.h>
#endif

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace {

// What a slot keeps on the device while it is resident: its owners are the storage's
// owners, its bytes the tensor's (at its offset), and dropping it frees the memory.
#ifdef LMS_GUARD_C10_ONLY
using Resident = c10::Storage;
int64_t owners_of(const Resident& r) { return static_cast<int64_t>(r.use_count()); }
const void* bytes_of(const Resident& r) { return r.data(); }
bool held(const Resident& r) { return static_cast<bool>(r); }
#else
using Resident = at::Tensor;
int64_t owners_of(const Resident& t) { return static_cast<int64_t>(t.storage().use_count()); }
const void* bytes_of(const Resident& t) { return t.data_ptr(); }
bool held(const Resident& t) { return t.defined(); }
#endif

struct HostBuffer {
  void* ptr = nullptr;
  size_t nbytes = 0;
};

std::atomic<int64_t> g_host_bytes{0};
std::atomic<int64_t> g_resident{0};  // slots holding device memory

// Anonymous memory for `n` bytes with every page already faulted in, or nullptr.  The
// driver's copy into pages it must fault in one by one ran at 1.5 GB/s on the H100
// machine, and MAP_POPULATE, which faults them in from one thread, at 2.7 GB/s: that
// was most of what one intervention of the net cost (examples/pytorch/benchmarks/
// net_cost.py).  Here huge pages are asked for and the pages are written from several
// threads, each over its own part.
void* map_populated(size_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  (void)madvise(p, n, MADV_HUGEPAGE);  // where the kernel allows it; 4 KiB pages else
  constexpr size_t kPage = 4096, kPart = 64 << 20;
  auto touch = [p](size_t from, size_t to) {
    volatile char* c = static_cast<volatile char*>(p);
    for (size_t o = from; o < to; o += kPage) c[o] = 0;
  };
  const size_t threads = std::min<size_t>(
      std::max(1u, std::min(8u, std::thread::hardware_concurrency())), (n + kPart - 1) / kPart);
  if (threads <= 1) {
    touch(0, n);
    return p;
  }
  const size_t part = (n / threads + kPage - 1) / kPage * kPage;
  std::vector<std::thread> pool;
  try {
    for (size_t i = 1; i < threads; ++i) {
      pool.emplace_back(touch, std::min(n, i * part), std::min(n, (i + 1) * part));
    }
  } catch (const std::system_error&) {  // no thread to be had: the rest on this one
    touch(pool.size() * part + part, n);
  }
  touch(0, std::min(n, part));
  for (auto& t : pool) t.join();
  return p;
}

void host_free(void* p, size_t n) {
  if (p != nullptr) {
    munmap(p, n);
    g_host_bytes -= static_cast<int64_t>(n);
  }
}

// `dev` changes only under the net's mu_ (read it there too: Guard::resident_of); `host`
// is written before `evicted` is set (release) and never changes after it; nbytes,
// device and ready are set before the slot is registered.
struct Slot {
  Resident dev;            // while resident
  HostBuffer host;         // after an eviction
  int64_t nbytes = 0;
  int device = -1;
  std::atomic<bool> evicted{false};
  bool moving = false;     // claimed by an eviction in progress (under mu_)
  // recorded on the stream that was current when the slot was made: the net's copy
  // waits for it (the tensor may have been written on a side stream).  nullptr with
  // order_by_device: no event could be made, the copy waits for the whole device.
  cudaEvent_t ready = nullptr;
  bool order_by_device = false;
  ~Slot() {
    if (!evicted.load()) g_resident--;
    host_free(host.ptr, host.nbytes);
    if (ready != nullptr && cudaEventDestroy(ready) != cudaSuccess) (void)cudaGetLastError();
  }
};

int64_t mem_available() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t kb = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "MemAvailable: %ld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

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
        "lms_swap's chunked_loss=True; or the allocator-level LMS of a PyTorch built with "
        "the LMS patch (torch.cuda.set_enabled_lms(True)), which moves any block.",
        static_cast<double>(n) / kGiB, static_cast<double>(last_allocated_.load()) / kGiB,
        why, static_cast<double>(evicted_bytes_.load()) / kGiB,
        static_cast<double>(g_host_bytes.load()) / kGiB);
    return allocator_msg + buf;
  }
};

// ---- the allocator's `allocate`, redirected -----------------------------------------
using AllocateFn = c10::DataPtr (*)(c10::Allocator*, size_t);
AllocateFn g_allocate = nullptr;   // the allocator's own
std::vector<void*> g_vtable;       // the private copy of its virtual table

// Itanium C++ ABI: a member function is called with the hidden return-slot pointer first
// and `this` second, exactly as this free function with `self` first is.
std::atomic<int64_t> g_allocations{0};

c10::DataPtr guarded_allocate(c10::Allocator* self, size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  for (int attempt = 0;; ++attempt) {
    try {
      c10::DataPtr p = g_allocate(self, n);
      if (attempt > 0) Guard::get().served_++;
      return p;
    } catch (const c10::OutOfMemoryError& e) {
      Guard& g = Guard::get();
      if (attempt < 16 && g.on_oom(c10::cuda::current_device(), n, attempt)) continue;
      if (!g.armed()) throw;
      TORCH_CHECK_WITH(OutOfMemoryError, false, g.explain(e.msg(), n));
    }
  }
}

// The slot of c10::Allocator::allocate in a virtual table (Itanium ABI member pointer).
size_t allocate_slot() {
  auto pmf = &c10::Allocator::allocate;
  struct {
    uintptr_t ptr;
    ptrdiff_t adj;
  } raw{};
  static_assert(sizeof(pmf) == sizeof(raw), "unexpected member pointer layout");
  std::memcpy(&raw, &pmf, sizeof raw);
#if defined(__aarch64__) || defined(__arm__)
  TORCH_CHECK(raw.adj & 1, "LMS guard: allocate is not virtual");
  return raw.ptr / sizeof(void*);
#else
  TORCH_CHECK((raw.ptr & 1) && raw.adj == 0, "LMS guard: allocate is not virtual");
  return (raw.ptr - 1) / sizeof(void*);
#endif
}

// Bytes readable from `p` on in its mapping (bounds the copy of the virtual table).
size_t readable_from(const void* p) {
  FILE* f = std::fopen("/proc/self/maps", "r");
  TORCH_CHECK(f != nullptr, "LMS guard: cannot read /proc/self/maps");
  uintptr_t a = reinterpret_cast<uintptr_t>(p), lo = 0, hi = 0;
  char perms[8];
  size_t out = 0;
  while (std::fscanf(f, "%lx-%lx %7s %*[^\n]", &lo, &hi, perms) == 3) {
    if (a >= lo && a < hi && perms[0] == 'r') {
      out = hi - a;
      break;
    }
  }
  std::fclose(f);
  return out;
}

void redirect_allocate() {
  c10::Allocator* alloc = c10::cuda::CUDACachingAllocator::get();
  TORCH_CHECK(alloc != nullptr, "LMS guard: no CUDA caching allocator");
  void** vtable = *reinterpret_cast<void***>(alloc);
  const size_t slot = allocate_slot();
  // entries from offset-to-top and typeinfo (two before the address point) on
  const size_t avail = readable_from(vtable - 2) / sizeof(void*);
  const size_t count = std::min<size_t>(avail, 2 + 1024);
  TORCH_CHECK(count > 2 + slot, "LMS guard: virtual table too short");
  g_vtable.assign(vtable - 2, vtable - 2 + count);
  g_allocate = reinterpret_cast<AllocateFn>(g_vtable[2 + slot]);
  g_vtable[2 + slot] = reinterpret_cast<void*>(&guarded_allocate);
  // one aligned pointer store: callers see the old table or the new one, both valid
  __atomic_store_n(reinterpret_cast<void***>(alloc), g_vtable.data() + 2, __ATOMIC_RELEASE);
}

// ---- a running peak of requested bytes per device ------------------------------------
// Fed by the allocator's trace callbacks (called under that device's allocator lock for
// every allocation and free request; nothing else is recorded unless the program turns
// the allocator's history on).  Levels count from the moment of attachment, so only
// differences mean anything: peak_growth() is the highest level since mark_peak() less
// the level at the mark.
constexpr int kMaxDevices = 64;
std::atomic<int64_t> g_level[kMaxDevices];
std::atomic<int64_t> g_peak[kMaxDevices];
std::atomic<int64_t> g_mark[kMaxDevices];
std::atomic<int64_t> g_released[kMaxDevices];  // segments the allocator gave back

void track(const c10::cuda::CUDACachingAllocator::TraceEntry& te) {
  using TE = c10::cuda::CUDACachingAllocator::TraceEntry;
  const int d = static_cast<int>(te.device_);
  if (d < 0 || d >= kMaxDevices) return;
  if (te.action_ == TE::ALLOC) {
    const int64_t now =
        g_level[d].fetch_add(static_cast<int64_t>(te.size_), std::memory_order_relaxed) +
        static_cast<int64_t>(te.size_);
    int64_t p = g_peak[d].load(std::memory_order_relaxed);
    while (now > p && !g_peak[d].compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  } else if (te.action_ == TE::FREE_REQUESTED) {
    g_level[d].fetch_sub(static_cast<int64_t>(te.size_), std::memory_order_relaxed);
  } else if (te.action_ == TE::SEGMENT_FREE || te.action_ == TE::SEGMENT_UNMAP) {
    // the allocator released cached memory: to serve a request it could not (a
    // retry, which synchronises the device), or at the program's empty_cache()
    g_released[d].fetch_add(1, std::memory_order_relaxed);
  }
}

void attach_tracker() {
  for (int d = 0; d < kMaxDevices; ++d) {
    g_level[d] = 0;
    g_peak[d] = 0;
    g_mark[d] = 0;
    g_released[d] = 0;
  }
  c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(&track);
}

// Whether `fn` lies in the shared object that holds `anchor` (unknown: true).
bool same_object(const void* fn, const void* anchor) {
  Dl_info a{}, b{};
  if (dladdr(fn, &a) == 0 || dladdr(anchor, &b) == 0) return true;
  return a.dli_fbase == b.dli_fbase;
}

std::mutex g_arm_mu;
c10::Allocator* g_redirected = nullptr;  // the allocator whose table is ours (under g_arm_mu)

// Puts the net under the CUDA allocator, once; later calls check that nothing changed.
// Refused (an error, nothing changed) for any allocator but PyTorch's native caching
// allocator: a pluggable allocator has no trace trackers, and redirecting a table that
// is not the native one's (a wrapper's, or one already redirected) would make every
// allocation call itself.  The tracker is attached before the table is redirected, so a
// failure leaves the allocator as it was.
void arm_once() {
  std::lock_guard<std::mutex> lk(g_arm_mu);
  auto* alloc = c10::cuda::CUDACachingAllocator::get();
  TORCH_CHECK(alloc != nullptr, "LMS guard: no CUDA caching allocator");
  void** vtable = *reinterpret_cast<void***>(alloc);
  if (g_redirected != nullptr) {
    TORCH_CHECK(g_redirected == alloc && vtable == g_vtable.data() + 2,
                "LMS guard: the CUDA allocator changed since the net was armed");
    return;
  }
  const std::string name = alloc->name();
  TORCH_CHECK(name == "native", "LMS guard: the CUDA allocator is '", name,
              "', not PyTorch's native caching allocator");
  const void* entry = vtable[allocate_slot()];
  TORCH_CHECK(entry != reinterpret_cast<const void*>(&guarded_allocate) &&
                  same_object(entry, &c10::cuda::CUDACachingAllocator::allocator),
              "LMS guard: the CUDA allocator's allocate is not the caching allocator's own "
              "(wrapped or redirected already)");
  attach_tracker();
  redirect_allocate();
  g_redirected = alloc;
}

}  // namespace

#ifndef LMS_GUARD_C10_ONLY
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "lms_swap's eviction net under the CUDA caching allocator";
  py::class_<Slot, std::shared_ptr<Slot>>(m, "Slot")
      .def(py::init([](const at::Tensor& t) {
             TORCH_CHECK(t.is_cuda(), "Slot: a CUDA tensor");
             auto s = std::make_shared<Slot>();
             // an alias with no autograd history and no Python object: detach()
             // would be a view that keeps `t` (and so the storage) alive, and
             // destroying a tensor with a Python object needs the GIL
             s->dev = t.variable_data();
             s->nbytes = static_cast<int64_t>(t.numel()) * t.element_size();
             s->device = t.get_device();
             // the stream current now (the one `t` was written on, or ordered after
             // it) is not the one an eviction copies on: remember where it stands
             {
               c10::cuda::CUDAGuard on(t.device());
               cudaEvent_t ev = nullptr;
               if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess &&
                   cudaEventRecord(ev, c10::cuda::getCurrentCUDAStream(s->device).stream()) ==
                       cudaSuccess) {
                 s->ready = ev;
               } else {
                 (void)cudaGetLastError();
                 if (ev != nullptr) (void)cudaEventDestroy(ev);
                 s->order_by_device = true;
               }
             }
             g_resident++;
             {
               py::gil_scoped_release nogil;  // mu_ (see the invariants)
               Guard::get().add(s);
             }
             return s;
           }),
           "keep `t` (dense: its bytes are [data_ptr, data_ptr + nbytes)) evictable")
      .def_property_readonly("evicted", [](const Slot& s) { return s.evicted.load(); })
      .def_property_readonly("nbytes", [](const Slot& s) { return s.nbytes; })
      .def_property_readonly("owners", [](const Slot& s) -> int64_t {
             // owners of the storage (1: only this slot; what the net requires to evict)
             py::gil_scoped_release nogil;  // mu_ may be held by an eviction's commit
             return Guard::get().owners(s);
           })
      .def("device_tensor", [](const Slot& s) -> py::object {
             Resident r;
             {
               py::gil_scoped_release nogil;
               r = Guard::get().resident_of(s);
             }
             if (!r.defined()) return py::none();
             return py::cast(r.variable_data());  // s.dev stays Python-free
           })
      .def("host_bytes", [](std::shared_ptr<Slot> s) -> py::object {
             // a uint8 CPU tensor over the evicted bytes; keeps the slot alive
             if (!s->evicted.load(std::memory_order_acquire)) return py::none();
             auto keep = s;
             auto t = torch::from_blob(
                 s->host.ptr, {s->nbytes}, [keep](void*) {},
                 torch::TensorOptions().dtype(torch::kUInt8));
             return py::cast(t);
           });
  m.def("arm", [](bool on) {
    // the caching allocator creates its per-device parts at CUDA's lazy init; a trace
    // tracker attached before that reaches none of them
    py::module_::import("torch.cuda").attr("init")();
    arm_once();
    Guard::get().arm(on);
  });
  m.def("armed", []() { return Guard::get().armed(); });
  m.def("set_host_budget", [](int64_t limit, int64_t other, int64_t min_available) {
    Guard::get().set_host_budget(limit, other, min_available);
  });
  m.def("host_bytes", []() { return g_host_bytes.load(); });
  m.def("offer", [](int64_t id, uintptr_t ptr, int64_t size, int device) {
    Guard::get().offer(id, reinterpret_cast<void*>(ptr), size, device);
  }, "the pool's idle chunk `id` at [ptr, ptr+size), pinned on `device` (-1: not pinned) "
     "is the net's to give back until withdrawn");
  m.def("withdraw", [](int64_t id) { return Guard::get().withdraw(id); },
        "True: chunk `id` is the pool's again; False: the net gave it back");
  m.def("take_discarded", []() { return Guard::get().take_discarded(); },
        "ids of the offered chunks the net gave back since the last call");
  m.def("add_releasing", [](int64_t delta) { Guard::get().add_releasing(delta); },
        "host bytes the pool's releaser is giving back (counted under the limit)");
  m.def("evicted_bytes", []() { return Guard::get().evicted_bytes(); },
        "bytes evicted since the process began (cheap: one atomic read)");
  m.def("evict", [](int device, int64_t need) {
    py::gil_scoped_release nogil;
    return Guard::get().evict(device, need);
  }, "evict slots of `device` until `need` bytes were freed (tests and diagnostics)");
  m.def("mark_peak", [](int device) {
    TORCH_CHECK(device >= 0 && device < kMaxDevices, "mark_peak: bad device ", device);
    const int64_t now = g_level[device].load();
    g_mark[device] = now;
    g_peak[device] = now;
  }, "start a new running peak on `device` at its current level (the net must be armed)");
  m.def("peak_growth", [](int device) -> int64_t {
    TORCH_CHECK(device >= 0 && device < kMaxDevices, "peak_growth: bad device ", device);
    return std::max<int64_t>(0, g_peak[device].load() - g_mark[device].load());
  }, "requested bytes on `device` at their highest since mark_peak, less those at the mark");
  m.def("released", [](int device) -> int64_t {
    TORCH_CHECK(device >= 0 && device < kMaxDevices, "released: bad device ", device);
    return g_released[device].load();
  }, "segments the allocator released on `device` since the net was armed");
  m.def("stats", []() {
    py::dict d;
    std::vector<std::pair<const char*, int64_t>> counters;
    {
      py::gil_scoped_release nogil;
      counters = Guard::get().counters();
    }
    for (const auto& kv : counters) {
      if (std::strcmp(kv.first, "armed") == 0) {
        d[kv.first] = kv.second != 0;
      } else {
        d[kv.first] = kv.second;
      }
    }
    d["allocations_seen"] = g_allocations.load();
    return d;
  });
}
#endif
