#include <sys/mman.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "lms_test_support.h"

namespace lms_test {
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

// The memfd page backend with the stand-in gate.  Host pages made on another
// thread than the one that made the backend (the sub-allocator's filler) take
// LMS_TEST_FILLER_PAGE_DELAY_MS longer, as a GPU driver's page creation does.
class GatedPosixBackend : public tsl::LmsPageBackend {
 public:
  explicit GatedPosixBackend(size_t page_size)
      : b_(tsl::CreatePosixLmsPageBackend(page_size)),
        owner_(std::this_thread::get_id()),
        filler_delay_ms_([] {
          const char* v = std::getenv("LMS_TEST_FILLER_PAGE_DELAY_MS");
          return v ? std::atoi(v) : 0;
        }()) {}
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
  void Quiesce() override { StandInGate::Get().Close(); }
  void Resume() override { StandInGate::Get().Open(); }
  void AddLaunchGateStats(tsl::LmsStats* s) const override {
    StandInGate::Get().Stats(s);
  }
  tsl::AllocatorMemoryType GetMemoryType() const override {
    return b_->GetMemoryType();
  }

 private:
  std::unique_ptr<tsl::LmsPageBackend> b_;
  const std::thread::id owner_;
  const int filler_delay_ms_;
};

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
