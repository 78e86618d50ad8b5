#include <sys/mman.h>

#include <cstdlib>

#include "lms_test_support.h"

namespace lms_test {
namespace {

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
    size_t va_bytes, size_t device_bytes, size_t host_bytes) {
  return tsl::LmsVirtualMemSubAllocator::Create(
      tsl::CreatePosixLmsPageBackend(size_t{2} << 20), va_bytes, device_bytes,
      host_bytes);
}

std::unique_ptr<tsl::SubAllocator> PlainSubAllocator(size_t) {
  return std::make_unique<MmapSubAllocator>();
}

std::unique_ptr<tsl::SubAllocator> VmmSubAllocator(size_t va_bytes) {
  return MakeLmsSubAllocator(va_bytes, va_bytes, 0);
}

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
  volatile uint32_t* w = static_cast<volatile uint32_t*>(p);
  for (size_t i = 0; i < bytes / 4; ++i) w[i] = w[i] + 1;
  return 1;
}

}  // namespace lms_test
