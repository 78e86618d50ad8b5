#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>

#include "lms_test_support.h"
#include "tensorflow/core/common_runtime/gpu/gpu_lms_page_backend.h"
#include "tensorflow/tsl/platform/logging.h"
#include "third_party/gpus/cuda/include/cuda.h"

extern "C" void lms_test_fill(void* p, size_t bytes, uint32_t seed);
extern "C" size_t lms_test_count_mismatches_add(const void* p, size_t bytes,
                                                uint32_t seed, uint32_t add);
extern "C" void* lms_test_stream_create();
extern "C" void lms_test_stream_destroy(void* stream);
extern "C" int lms_test_increment_and_wait(void* p, size_t bytes, int passes,
                                           void* stream);
extern "C" int lms_test_add_async(void* p, size_t bytes, void* stream);
extern "C" int lms_test_handshake_async(int device, int round, void* stream);

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

namespace {
std::unique_ptr<tsl::LmsVirtualMemSubAllocator> MakeWithPage(
    size_t va_bytes, size_t device_bytes, size_t host_bytes,
    size_t host_reserve, size_t page_bytes) {
  auto backend =
      tensorflow::CreateGpuLmsPageBackend(PrimaryContext(), 0, page_bytes);
  CHECK(backend.ok()) << backend.status();
  return tsl::LmsVirtualMemSubAllocator::Create(
      std::move(backend).value(), va_bytes, device_bytes, host_bytes, {}, {},
      0, host_reserve);
}
}  // namespace

std::unique_ptr<tsl::LmsVirtualMemSubAllocator> MakeLmsSubAllocator(
    size_t va_bytes, size_t device_bytes, size_t host_bytes,
    size_t host_reserve) {
  const char* v = std::getenv("LMS_TEST_PAGE_MB");
  const size_t page = v ? std::strtoull(v, nullptr, 10) << 20
                        : tsl::LmsPageBytes(device_bytes);
  return MakeWithPage(va_bytes, device_bytes, host_bytes, host_reserve, page);
}

std::unique_ptr<tsl::SubAllocator> PlainSubAllocator(size_t) {
  PrimaryContext();
  return std::make_unique<CuMemAllocSubAllocator>();
}

// Stands in for upstream's GpuVirtualMemAllocator: its 2 MiB granularity.
std::unique_ptr<tsl::SubAllocator> VmmSubAllocator(size_t va_bytes) {
  return MakeWithPage(va_bytes, va_bytes, 0, 0, size_t{2} << 20);
}

double PinnedCopySeconds(size_t bytes, bool to_host) {
  cuCtxSetCurrent(PrimaryContext());
  CUdeviceptr dev;
  void* host = nullptr;
  CHECK_EQ(cuMemAlloc(&dev, bytes), CUDA_SUCCESS);
  CHECK_EQ(cuMemAllocHost(&host, bytes), CUDA_SUCCESS);
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_EQ(to_host ? cuMemcpyDtoH(host, dev, bytes)
                     : cuMemcpyHtoD(dev, host, bytes),
             CUDA_SUCCESS);
    best = std::min(best, std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - t0)
                              .count());
  }
  cuMemFreeHost(host);
  cuMemFree(dev);
  return best;
}

void Fill(void* p, size_t bytes, uint32_t seed) {
  lms_test_fill(p, bytes, seed);
}

size_t CountMismatchesAdd(const void* p, size_t bytes, uint32_t seed,
                          uint32_t add) {
  return lms_test_count_mismatches_add(p, bytes, seed, add);
}

// the one compute stream the writer threads share, as TensorFlow's executor
void* WritersBegin() {
  PrimaryContext();
  return lms_test_stream_create();
}

void WritersEnd(void* stream) { lms_test_stream_destroy(stream); }

namespace {
// The primary context of GPU 'device'.
CUcontext PrimaryContextOf(int device) {
  static std::mutex mu;
  static std::map<int, CUcontext> ctxs;
  PrimaryContext();  // cuInit
  std::lock_guard<std::mutex> l(mu);
  auto it = ctxs.find(device);
  if (it != ctxs.end()) return it->second;
  CUdevice dev;
  CHECK_EQ(cuDeviceGet(&dev, device), CUDA_SUCCESS);
  CUcontext c;
  CHECK_EQ(cuDevicePrimaryCtxRetain(&c, dev), CUDA_SUCCESS);
  ctxs[device] = c;
  return c;
}
// This thread's stream on each GPU (made on first use, never destroyed).
thread_local std::map<int, void*> t_streams;
void* ThreadStream(int device) {
  void*& s = t_streams[device];
  if (s == nullptr) {
    cuCtxSetCurrent(PrimaryContextOf(device));
    s = lms_test_stream_create();
  }
  return s;
}
}  // namespace

int Devices() {
  PrimaryContext();
  int n = 0;
  CHECK_EQ(cuDeviceGetCount(&n), CUDA_SUCCESS);
  return n;
}

bool PeerAccess(int from, int to) {
  PrimaryContext();
  CUdevice a, b;
  int can = 0;
  return cuDeviceGet(&a, from) == CUDA_SUCCESS &&
         cuDeviceGet(&b, to) == CUDA_SUCCESS &&
         cuDeviceCanAccessPeer(&can, a, b) == CUDA_SUCCESS && can != 0;
}

std::unique_ptr<tsl::LmsVirtualMemSubAllocator> MakeLmsSubAllocatorOn(
    int device, size_t va_bytes, size_t device_bytes, size_t host_bytes) {
  std::vector<int> peers;
  for (int d = 0; d < Devices(); ++d) {
    if (d != device) peers.push_back(d);
  }
  auto backend = tensorflow::CreateGpuLmsPageBackend(
      PrimaryContextOf(device), device, tsl::LmsPageBytes(device_bytes),
      peers);
  CHECK(backend.ok()) << backend.status();
  return tsl::LmsVirtualMemSubAllocator::Create(
      std::move(backend).value(), va_bytes, device_bytes, host_bytes, {}, {},
      device, 0);
}

void UseDevice(int device) { cuCtxSetCurrent(PrimaryContextOf(device)); }

void LaunchAdd(int device, void* p, size_t bytes) {
  void* s = ThreadStream(device);
  cuCtxSetCurrent(PrimaryContextOf(device));
  CHECK_EQ(lms_test_add_async(p, bytes, s), 0);
}

void LaunchHandshake(int device, int round) {
  void* s = ThreadStream(device);
  cuCtxSetCurrent(PrimaryContextOf(device));
  CHECK_EQ(lms_test_handshake_async(device, round, s), 0);
}

void Finish(int device) {
  void* s = ThreadStream(device);
  CHECK_EQ(cuStreamSynchronize(static_cast<CUstream>(s)), CUDA_SUCCESS);
}

int AddPasses(void* stream, void* p, size_t bytes) {
  constexpr int kPassesPerKernel = 4;
  cuCtxSetCurrent(PrimaryContext());
  CHECK_EQ(lms_test_increment_and_wait(p, bytes, kPassesPerKernel, stream), 0);
  return kPassesPerKernel;
}

}  // namespace lms_test
