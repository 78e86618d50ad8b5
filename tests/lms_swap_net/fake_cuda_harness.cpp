// The eviction net (lms_swap_guard.cpp, c10-only mode) on a machine without CUDA: the
// CUDA runtime calls it makes are stood in for here (a device->host copy is a memcpy
// that can be held back), so that its locking can be checked on CPU.  Slots hold CPU
// storages.  Prints one JSON line.  Built and run by tests/test_lms_swap_net_threads.py.
#ifndef LMS_GUARD_C10_ONLY
#define LMS_GUARD_C10_ONLY 1
#endif
#include "lms_swap_guard.cpp"

#include <c10/core/CPUAllocator.h>

#include <chrono>
#include <condition_variable>

namespace {
std::mutex fk_mu;
std::condition_variable fk_cv;
bool fk_hold = false;   // copies wait while true
int fk_copies = 0;      // copies begun
}  // namespace

extern "C" {
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t) {
  std::unique_lock<std::mutex> lk(fk_mu);
  fk_copies++;
  fk_cv.notify_all();
  fk_cv.wait(lk, [] { return !fk_hold; });
  std::memcpy(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t* f, size_t* t) { *f = 0; *t = 0; return cudaSuccess; }
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* s) {
  *s = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void*) { return cudaSuccess; }
cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
}

namespace c10::cuda {
CUDAStream getCurrentCUDAStream(DeviceIndex) {
  return CUDAStream(CUDAStream::UNCHECKED, Stream(Stream::UNSAFE, Device(DeviceType::CUDA, 0), 0));
}
cudaStream_t CUDAStream::stream() const { return nullptr; }
DeviceIndex current_device() { return 0; }
namespace CUDACachingAllocator {
std::atomic<CUDAAllocator*> allocator;
}
}  // namespace c10::cuda

namespace {
std::shared_ptr<Slot> cpu_slot(size_t n, uint8_t fill) {
  c10::Storage st(c10::Storage::use_byte_size_t(), static_cast<int64_t>(n), c10::GetCPUAllocator(),
                  /*resizable=*/false);
  std::memset(st.mutable_data(), fill, n);
  auto s = std::make_shared<Slot>();
  s->dev = std::move(st);
  s->nbytes = static_cast<int64_t>(n);
  s->device = 0;
  g_resident++;
  Guard::get().add(s);
  return s;
}
}  // namespace

int main() {
  constexpr size_t kN = 4 << 20;
  std::vector<std::shared_ptr<Slot>> slots;
  for (int i = 0; i < 3; ++i) slots.push_back(cpu_slot(kN, static_cast<uint8_t>(i + 1)));
  { std::lock_guard<std::mutex> lk(fk_mu); fk_hold = true; }
  int64_t freed = -1;
  std::thread evictor([&] { freed = Guard::get().evict(0, static_cast<int64_t>(kN)); });
  {
    std::unique_lock<std::mutex> lk(fk_mu);
    fk_cv.wait(lk, [] { return fk_copies > 0; });  // the eviction is inside its copy
  }
  // another thread registers a slot and reads the counters meanwhile
  std::atomic<bool> done{false};
  std::thread other([&] {
    slots.push_back(cpu_slot(kN, 9));
    (void)Guard::get().counters();
    done = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  while (!done && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const bool blocked = !done;
  { std::lock_guard<std::mutex> lk(fk_mu); fk_hold = false; }
  fk_cv.notify_all();
  evictor.join();
  other.join();
  bool exact = true;
  int evicted = 0;
  for (size_t i = 0; i < 3; ++i) {
    if (!slots[i]->evicted) continue;
    evicted++;
    const auto* p = static_cast<const uint8_t*>(slots[i]->host.ptr);
    for (size_t k = 0; k < kN; k += 4096) exact = exact && p[k] == i + 1;
  }
  std::printf("{\"blocked_while_copying\": %s, \"freed\": %lld, \"evicted\": %d, \"exact\": %s}\n",
              blocked ? "true" : "false", static_cast<long long>(freed), evicted,
              exact ? "true" : "false");
  return 0;
}
