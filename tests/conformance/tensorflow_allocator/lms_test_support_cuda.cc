#include <atomic>
#include <cstdlib>
#include <thread>

#include "lms_test_support.h"
#include "tensorflow/core/common_runtime/gpu/gpu_lms_page_backend.h"
#include "tensorflow/tsl/platform/logging.h"
#include "third_party/gpus/cuda/include/cuda.h"

extern "C" void lms_test_fill(void* p, size_t bytes, uint32_t seed);
extern "C" size_t lms_test_count_mismatches(const void* p, size_t bytes,
                                            uint32_t seed);
extern "C" size_t lms_test_count_mismatches_add(const void* p, size_t bytes,
                                                uint32_t seed, uint32_t add);
extern "C" void* lms_test_stream_create();
extern "C" void lms_test_stream_destroy(void* stream);
extern "C" int lms_test_increment_and_wait(void* p, size_t bytes, int passes,
                                           void* stream);

namespace lms_test {
namespace {

CUcontext PrimaryContext() {
  static CUcontext ctx = [] {
    CHECK_EQ(cuInit(0), CUDA_SUCCESS);
    CUdevice dev;
    CHECK_EQ(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    CUcontext c;
    CHECK_EQ(cuDevicePrimaryCtxRetain(&c, dev), CUDA_SUCCESS);
    CHECK_EQ(cuCtxSetCurrent(c), CUDA_SUCCESS);
    return c;
  }();
  return ctx;
}

// Like DeviceMemAllocator: cuMemAlloc per region, no coalescing.
class CuMemAllocSubAllocator : public tsl::SubAllocator {
 public:
  CuMemAllocSubAllocator() : tsl::SubAllocator({}, {}) {}
  void* Alloc(size_t alignment, size_t num_bytes,
              size_t* bytes_received) override {
    if (num_bytes == 0) return nullptr;
    cuCtxSetCurrent(PrimaryContext());
    CUdeviceptr p;
    if (cuMemAlloc(&p, num_bytes) != CUDA_SUCCESS) return nullptr;
    *bytes_received = num_bytes;
    return reinterpret_cast<void*>(p);
  }
  void Free(void* ptr, size_t num_bytes) override {
    if (ptr != nullptr) cuMemFree(reinterpret_cast<CUdeviceptr>(ptr));
  }
  bool SupportsCoalescing() const override { return false; }
  tsl::AllocatorMemoryType GetMemoryType() const override {
    return tsl::AllocatorMemoryType::kDevice;
  }
};

}  // namespace

std::string BackendKind() { return "cuda"; }

size_t DeviceBudget() {
  const char* v = std::getenv("LMS_TEST_DEVICE_MB");
  size_t mb = v ? std::strtoull(v, nullptr, 10) : 4096;
  return mb << 20;
}

std::unique_ptr<tsl::LmsVirtualMemSubAllocator> MakeLmsSubAllocator(
    size_t va_bytes, size_t device_bytes, size_t host_bytes) {
  auto backend = tensorflow::CreateGpuLmsPageBackend(PrimaryContext(), 0);
  CHECK(backend.ok()) << backend.status();
  return tsl::LmsVirtualMemSubAllocator::Create(std::move(backend).value(),
                                                va_bytes, device_bytes,
                                                host_bytes);
}

std::unique_ptr<tsl::SubAllocator> PlainSubAllocator(size_t) {
  PrimaryContext();
  return std::make_unique<CuMemAllocSubAllocator>();
}

std::unique_ptr<tsl::SubAllocator> VmmSubAllocator(size_t va_bytes) {
  return MakeLmsSubAllocator(va_bytes, va_bytes, 0);
}

void Fill(void* p, size_t bytes, uint32_t seed) {
  lms_test_fill(p, bytes, seed);
}

size_t CountMismatches(const void* p, size_t bytes, uint32_t seed) {
  return lms_test_count_mismatches(p, bytes, seed);
}

size_t CountMismatchesAdd(const void* p, size_t bytes, uint32_t seed,
                          uint32_t add) {
  return lms_test_count_mismatches_add(p, bytes, seed, add);
}

struct Writers::Impl {
  std::atomic<bool> stop{false};
  std::vector<std::atomic<uint64_t>> passes;
  std::vector<std::thread> threads;
  void* stream = nullptr;  // the one compute stream, as TensorFlow's executor
  explicit Impl(size_t n) : passes(n) {
    for (auto& c : passes) c.store(0);
  }
};

constexpr int kPassesPerKernel = 4;

Writers::Writers(const std::vector<void*>& blocks, size_t bytes)
    : impl_(new Impl(blocks.size())) {
  PrimaryContext();
  impl_->stream = lms_test_stream_create();
  for (size_t b = 0; b < blocks.size(); ++b) {
    impl_->threads.emplace_back([this, b, p = blocks[b], bytes] {
      cuCtxSetCurrent(PrimaryContext());
      while (!impl_->stop.load()) {
        CHECK_EQ(lms_test_increment_and_wait(p, bytes, kPassesPerKernel,
                                             impl_->stream),
                 0);
        impl_->passes[b] += kPassesPerKernel;
      }
    });
  }
}

std::vector<uint64_t> Writers::Stop() {
  impl_->stop = true;
  for (auto& t : impl_->threads)
    if (t.joinable()) t.join();
  if (impl_->stream != nullptr) {
    lms_test_stream_destroy(impl_->stream);
    impl_->stream = nullptr;
  }
  std::vector<uint64_t> out;
  for (auto& n : impl_->passes) out.push_back(n.load());
  return out;
}

Writers::~Writers() { Stop(); }

}  // namespace lms_test
