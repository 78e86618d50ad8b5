#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lms_test_support.h"

namespace lms_test {
namespace gate_core {
// The shared core: its QuietRounds and Drainer quiesce the memfd backend
// below as they quiesce the CUDA backend (its CUPTI gate is unused here).
#include "tensorflow/core/common_runtime/gpu/gpu_lms_launch_gate_core.inc"
}  // namespace gate_core
namespace {

// The CPU stand-in for the CUDA backend's launch gate.  On the CPU a writer's
// "kernel" is a pass of plain stores that no CUPTI callback can see, so the
// passes go through this gate instead (AddPasses: Enter/Leave around each),
// and the page backend below closes it in Quiesce() and opens it in
// Resume(), as gpu_lms_page_backend.cc does with the CUDA API.  What the CPU
// writers test then checks is the allocator's side of the rule: every page
// move happens inside a quiesced scope, which is reopened on every path.
// TF_LMS_LAUNCH_GATE=0 turns it off, as it does the CUDA backend's gate.
class StandInGate {
 public:
  static StandInGate& Get() {
    static StandInGate* g = new StandInGate();
    return *g;
  }
  void Close() {
    if (!active_) return;
    if (t_depth_++ > 0) return;  // scopes nest on the mover's thread
    std::unique_lock<std::mutex> l(mu_);
    ++closers_;
    cv_.wait(l, [&] { return inside_ == 0; });
    ++closes_;
  }
  // Close() within 'timeout_ns', for QuietRounds: false (open again) when
  // the passes inside did not all end in time.
  bool close_within(int64_t timeout_ns) {
    if (!active_) return true;
    if (t_depth_ > 0) {
      ++t_depth_;
      return true;
    }
    std::unique_lock<std::mutex> l(mu_);
    ++closers_;
    if (!cv_.wait_for(l, std::chrono::nanoseconds(timeout_ns),
                      [&] { return inside_ == 0; })) {
      --closers_;
      cv_.notify_all();
      return false;
    }
    t_depth_ = 1;
    ++closes_;
    return true;
  }
  void open() { Open(); }
  bool active() const { return active_; }
  void Open() {
    if (!active_) return;
    if (--t_depth_ > 0) return;
    std::lock_guard<std::mutex> l(mu_);
    --closers_;
    cv_.notify_all();
  }
  void Enter() {
    if (!active_) return;
    std::unique_lock<std::mutex> l(mu_);
    if (closers_ > 0 && t_depth_ == 0) {
      ++held_;
      cv_.wait(l, [&] { return closers_ == 0; });
    }
    ++inside_;
  }
  void Leave() {
    if (!active_) return;
    std::lock_guard<std::mutex> l(mu_);
    if (--inside_ == 0) cv_.notify_all();
  }
  void Stats(tsl::LmsStats* s) {
    std::lock_guard<std::mutex> l(mu_);
    s->launch_gate_active = active_;
    s->launch_gate_inactive_reason = active_ ? 0 : 4;
    s->launch_gate_closes = closes_;
    s->launch_gate_calls_held = held_;
  }

 private:
  static thread_local int t_depth_;
  const bool active_ = tsl::LmsLaunchGateWantedFromEnv();
  std::mutex mu_;
  std::condition_variable cv_;
  int inside_ = 0, closers_ = 0;
  int64_t closes_ = 0, held_ = 0;
};
thread_local int StandInGate::t_depth_ = 0;

// A simulated device: a worker thread runs the kernels launched to it, one
// after another in launch order, as a GPU runs one stream's.  A launch passes
// the stand-in gate (held while it is closed); Drain() waits until every
// kernel launched before it ran, as a device synchronization does.
class SimDevice {
 public:
  SimDevice() : worker_([this] { Run(); }) { worker_.detach(); }
  // Returns the kernel's number (for WaitFor).
  uint64_t Launch(std::function<void()> kernel) {
    StandInGate::Get().Enter();
    uint64_t n;
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back(std::move(kernel));
      n = ++launched_;
    }
    cv_.notify_all();
    StandInGate::Get().Leave();
    return n;
  }
  // Waits for the kernels launched so far (all threads').
  void Drain() {
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t upto = launched_;
    cv_.wait(l, [&] { return ran_ >= upto; });
  }
  // Waits for kernel number 'n' (launched_ after its launch) to have run.
  void WaitFor(uint64_t n) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return ran_ >= n; });
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return !queue_.empty(); });
      std::function<void()> k = std::move(queue_.front());
      queue_.pop_front();
      l.unlock();
      k();
      l.lock();
      ++ran_;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t launched_ = 0, ran_ = 0;
  std::thread worker_;
};
constexpr int kSimDevices = 2;
SimDevice& Sim(int d) {
  static SimDevice* devices = new SimDevice[kSimDevices];  // never destroyed
  return devices[d];
}
// The handshake's marks (LaunchHandshake), one per simulated device.
std::atomic<int> g_handshake[kSimDevices];
// Per thread: the last kernel it launched on each device (Finish).
thread_local uint64_t t_last_launch[kSimDevices] = {};

// The memfd page backend with the stand-in gate.  Host pages made on another
// thread than the one that made the backend (the sub-allocator's filler) take
// LMS_TEST_FILLER_PAGE_DELAY_MS longer, as a GPU driver's page creation does.
class GatedPosixBackend : public tsl::LmsPageBackend {
 public:
  // 'drains': the simulated devices a quiesce drains (this allocator's
  // device and its peers; none for a single-device test).
  explicit GatedPosixBackend(size_t page_size, std::vector<int> drains = {})
      : b_(tsl::CreatePosixLmsPageBackend(page_size)),
        owner_(std::this_thread::get_id()),
        filler_delay_ms_([] {
          const char* v = std::getenv("LMS_TEST_FILLER_PAGE_DELAY_MS");
          return v ? std::atoi(v) : 0;
        }()),
        drains_(std::move(drains)),
        first_wait_ns_(tsl::LmsQuiesceWaitMsFromEnv() * 1000000),
        drainer_([this] {
          for (int d : drains_) Sim(d).Drain();
        }) {}
  std::string Name() const override { return b_->Name() + "+stand-in gate"; }
  size_t page_size() const override { return b_->page_size(); }
  void* ReserveAddressRange(size_t bytes) override {
    return b_->ReserveAddressRange(bytes);
  }
  void ReleaseAddressRange(void* base, size_t bytes) override {
    b_->ReleaseAddressRange(base, bytes);
  }
  tsl::Status CreatePage(bool host, PageHandle* handle) override {
    if (host && filler_delay_ms_ > 0 && std::this_thread::get_id() != owner_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(filler_delay_ms_));
    }
    return b_->CreatePage(host, handle);
  }
  void DestroyPage(bool host, PageHandle handle) override {
    b_->DestroyPage(host, handle);
  }
  tsl::Status Map(void* va, bool host, PageHandle handle) override {
    return b_->Map(va, host, handle);
  }
  tsl::Status Unmap(void* va) override { return b_->Unmap(va); }
  tsl::Status Remap(void* va, size_t n, bool to_host,
                    const std::vector<PageHandle>& from,
                    const std::vector<PageHandle>& to,
                    std::vector<Placed>* placed) override {
    return b_->Remap(va, n, to_host, from, to, placed);
  }
  // As the CUDA backend: the outermost scope of a thread closes the
  // stand-in gate and drains this device and its peers in QuietRounds'
  // bounded rounds; a nested one finds that done.
  void Quiesce() override {
    if (t_quiet_depth_++ > 0) return;
    StandInGate& g = StandInGate::Get();
    gate_core::QuietRounds::get().begin(g.active() ? &g : nullptr, drainer_,
                                        first_wait_ns_, 64 * first_wait_ns_);
  }
  void Resume() override {
    if (--t_quiet_depth_ > 0) return;
    StandInGate& g = StandInGate::Get();
    gate_core::QuietRounds::get().end(g.active() ? &g : nullptr);
  }
  void AddLaunchGateStats(tsl::LmsStats* s) const override {
    StandInGate::Get().Stats(s);
    s->launch_gate_quiesce_retries =
        gate_core::QuietRounds::get().counters().retries;
  }
  tsl::AllocatorMemoryType GetMemoryType() const override {
    return b_->GetMemoryType();
  }

 private:
  static thread_local int t_quiet_depth_;
  std::unique_ptr<tsl::LmsPageBackend> b_;
  const std::thread::id owner_;
  const int filler_delay_ms_;
  const std::vector<int> drains_;
  const int64_t first_wait_ns_;
  gate_core::Drainer drainer_;  // last: its thread reads drains_
};
thread_local int GatedPosixBackend::t_quiet_depth_ = 0;

inline uint32_t Pattern(uint32_t seed, size_t i) {
  uint64_t x = (static_cast<uint64_t>(seed) << 32) ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<uint32_t>(x);
}

// Like DeviceMemAllocator: each Alloc is a separate mapping, no coalescing.
class MmapSubAllocator : public tsl::SubAllocator {
 public:
  MmapSubAllocator() : tsl::SubAllocator({}, {}) {}
  void* Alloc(size_t alignment, size_t num_bytes,
              size_t* bytes_received) override {
    if (num_bytes == 0) return nullptr;
    void* p = mmap(nullptr, num_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    *bytes_received = num_bytes;
    return p;
  }
  void Free(void* ptr, size_t num_bytes) override {
    if (ptr != nullptr) munmap(ptr, num_bytes);
  }
  bool SupportsCoalescing() const override { return false; }
};

}  // namespace

std::string BackendKind() { return "cpu"; }

size_t DeviceBudget() { return size_t{64} << 20; }


std::unique_ptr<tsl::LmsVirtualMemSubAllocator> MakeLmsSubAllocator(
    size_t va_bytes, size_t device_bytes, size_t host_bytes,
    size_t host_reserve) {
  return tsl::LmsVirtualMemSubAllocator::Create(
      std::make_unique<GatedPosixBackend>(tsl::LmsPageBytes(device_bytes)),
      va_bytes,
      device_bytes, host_bytes, {}, {}, 0, host_reserve);
}

std::unique_ptr<tsl::SubAllocator> PlainSubAllocator(size_t) {
  return std::make_unique<MmapSubAllocator>();
}

// Stands in for upstream's GpuVirtualMemAllocator: its 2 MiB granularity.
std::unique_ptr<tsl::SubAllocator> VmmSubAllocator(size_t va_bytes) {
  return tsl::LmsVirtualMemSubAllocator::Create(
      std::make_unique<GatedPosixBackend>(size_t{2} << 20), va_bytes, va_bytes,
      0, {}, {}, 0, /*host_reserve_bytes=*/0);
}

double PinnedCopySeconds(size_t, bool) { return -1; }

void Fill(void* p, size_t bytes, uint32_t seed) {
  uint32_t* w = static_cast<uint32_t*>(p);
  for (size_t i = 0; i < bytes / 4; ++i) w[i] = Pattern(seed, i);
}

size_t CountMismatchesAdd(const void* p, size_t bytes, uint32_t seed,
                          uint32_t add) {
  const uint32_t* w = static_cast<const uint32_t*>(p);
  size_t bad = 0;
  for (size_t i = 0; i < bytes / 4; ++i) bad += w[i] != Pattern(seed, i) + add;
  return bad;
}

int Devices() { return kSimDevices; }

bool PeerAccess(int, int) { return true; }

std::unique_ptr<tsl::LmsVirtualMemSubAllocator> MakeLmsSubAllocatorOn(
    int device, size_t va_bytes, size_t device_bytes, size_t host_bytes) {
  std::vector<int> drains = {device};
  for (int d = 0; d < kSimDevices; ++d) {
    if (d != device) drains.push_back(d);
  }
  return tsl::LmsVirtualMemSubAllocator::Create(
      std::make_unique<GatedPosixBackend>(tsl::LmsPageBytes(device_bytes),
                                          std::move(drains)),
      va_bytes, device_bytes, host_bytes, {}, {}, device, 0);
}

void UseDevice(int) {}

void LaunchAdd(int device, void* p, size_t bytes) {
  t_last_launch[device] = Sim(device).Launch([p, bytes] {
    volatile uint32_t* w = static_cast<volatile uint32_t*>(p);
    for (size_t i = 0; i < bytes / 4; ++i) w[i] = w[i] + 1;
  });
}

void LaunchHandshake(int device, int round) {
  t_last_launch[device] = Sim(device).Launch([device, round] {
    g_handshake[device].store(round);
    while (g_handshake[1 - device].load() < round) std::this_thread::yield();
  });
}

void Finish(int device) { Sim(device).WaitFor(t_last_launch[device]); }

void* WritersBegin() { return nullptr; }

void WritersEnd(void*) {}

int AddPasses(void*, void* p, size_t bytes) {
  StandInGate::Get().Enter();  // a "launch": waits while pages move
  volatile uint32_t* w = static_cast<volatile uint32_t*>(p);
  for (size_t i = 0; i < bytes / 4; ++i) w[i] = w[i] + 1;
  StandInGate::Get().Leave();
  return 1;
}

}  // namespace lms_test
