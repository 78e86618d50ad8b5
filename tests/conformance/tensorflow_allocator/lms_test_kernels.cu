// Pattern kernels for the CUDA build of the LMS allocator conformance test.
// No TensorFlow headers here (compiled by nvcc alone).
#include <cstdint>
#include <cstdio>

#include <cuda_runtime.h>

namespace {

__device__ __forceinline__ uint32_t Pattern(uint32_t seed, size_t i) {
  uint64_t x =
      (static_cast<uint64_t>(seed) << 32) ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<uint32_t>(x);
}

__global__ void FillKernel(uint32_t* w, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    w[i] = Pattern(seed, i);
  }
}

// Counts the words that differ from the pattern plus `add` (after `add`
// increments).
__global__ void CheckKernel(const uint32_t* w, size_t n, uint32_t seed,
                            uint32_t add, unsigned long long* bad) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    local += w[i] != Pattern(seed, i) + add;
  }
  if (local) atomicAdd(bad, local);
}

__global__ void IncrementKernel(uint32_t* w, size_t n, int passes) {
  for (int r = 0; r < passes; ++r) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
      w[i] += 1;
    }
  }
}

// One side of a two-device handshake (a collective's pair of kernels):
// marks 'round' for 'device' in host memory both GPUs map, then spins until
// the other device's kernel marked it.
__global__ void HandshakeKernel(volatile int* marks, int device, int round) {
  marks[device] = round;
  __threadfence_system();
  while (marks[1 - device] < round) {
  }
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    abort();
  }
}

}  // namespace

extern "C" void lms_test_fill(void* p, size_t bytes, uint32_t seed) {
  const size_t n = bytes / 4;
  if (n == 0) return;
  FillKernel<<<512, 256>>>(static_cast<uint32_t*>(p), n, seed);
  Check(cudaGetLastError(), "FillKernel launch");
  Check(cudaDeviceSynchronize(), "FillKernel");
}


extern "C" size_t lms_test_count_mismatches_add(const void* p, size_t bytes,
                                                uint32_t seed, uint32_t add) {
  const size_t n = bytes / 4;
  if (n == 0) return 0;
  // a counter on each device (the current one counts)
  static unsigned long long* counters[64] = {};
  int device = 0;
  Check(cudaGetDevice(&device), "cudaGetDevice");
  unsigned long long*& bad = counters[device];
  if (bad == nullptr) Check(cudaMalloc(&bad, sizeof(*bad)), "cudaMalloc");
  Check(cudaMemset(bad, 0, sizeof(*bad)), "cudaMemset");
  CheckKernel<<<512, 256>>>(static_cast<const uint32_t*>(p), n, seed, add,
                            bad);
  Check(cudaGetLastError(), "CheckKernel launch");
  unsigned long long h = 0;
  Check(cudaMemcpy(&h, bad, sizeof(h), cudaMemcpyDeviceToHost), "CheckKernel");
  return static_cast<size_t>(h);
}

extern "C" void* lms_test_stream_create() {
  cudaStream_t s;
  Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  return s;
}

extern "C" void lms_test_stream_destroy(void* stream) {
  cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

// Launches `passes` increments of every word on the shared stream and waits
// for that kernel alone (an event), as an executor thread waits for its op.
extern "C" int lms_test_increment_and_wait(void* p, size_t bytes, int passes,
                                           void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  IncrementKernel<<<512, 256, 0, s>>>(static_cast<uint32_t*>(p), bytes / 4,
                                      passes);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return static_cast<int>(e);
  cudaEvent_t ev;
  e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) return static_cast<int>(e);
  cudaEventRecord(ev, s);
  e = cudaEventSynchronize(ev);
  cudaEventDestroy(ev);
  return static_cast<int>(e);
}

// Adds 1 to every word of [p, p + bytes) on 'stream', not waited for.
extern "C" int lms_test_add_async(void* p, size_t bytes, void* stream) {
  IncrementKernel<<<512, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<uint32_t*>(p), bytes / 4, 1);
  return static_cast<int>(cudaGetLastError());
}

// The handshake's marks: pinned host memory mapped for every device.
extern "C" void* lms_test_handshake_marks() {
  static int* marks = [] {
    int* m = nullptr;
    Check(cudaHostAlloc(reinterpret_cast<void**>(&m), 2 * sizeof(int),
                        cudaHostAllocPortable | cudaHostAllocMapped),
          "cudaHostAlloc");
    m[0] = m[1] = 0;
    return m;
  }();
  return marks;
}

// Launches 'device's side of handshake round 'round' on 'stream', not
// waited for.
extern "C" int lms_test_handshake_async(int device, int round, void* stream) {
  int* marks = static_cast<int*>(lms_test_handshake_marks());
  int* on_device = nullptr;
  cudaError_t e = cudaHostGetDevicePointer(
      reinterpret_cast<void**>(&on_device), marks, 0);
  if (e != cudaSuccess) return static_cast<int>(e);
  HandshakeKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      on_device, device, round);
  return static_cast<int>(cudaGetLastError());
}
