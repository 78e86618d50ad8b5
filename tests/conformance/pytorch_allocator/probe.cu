// Tiny C binding that drives the REAL c10 CUDA caching allocator (the libc10_cuda.so built from
// the patched tree) with real kernels, for the pytest conformance suite (loaded with ctypes).
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace A = c10::cuda::CUDACachingAllocator;

// The probe builds against both shipped PyTorch tags. What differs: v2.x has a private c10 hook
// that libtorch_cuda normally calls (c10/cuda/CUDAFunctions.cpp) and keeps StatType in c10/core;
// v1.13.1 has neither (nor CUDAAllocatorConfig.h, which tells them apart).
#if __has_include(<c10/cuda/CUDAAllocatorConfig.h>)
#include <c10/cuda/CUDAAllocatorConfig.h>  // v2.x: setAllocatorSettings
#define PROBE_HAS_PRIMARY_CONTEXT_HOOK 1
namespace c10::cuda::_internal { C10_CUDA_API void setHasPrimaryContext(bool (*func)(c10::DeviceIndex)); }
using ProbeStatType = c10::CachingDeviceAllocator::StatType;
#else
using ProbeStatType = A::StatType;
#endif

static std::string g_err;
static std::vector<c10::cuda::CUDAStream> g_streams;

__host__ __device__ __forceinline__ uint32_t mix(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 31; x *= 0xBF58476D1CE4E5B9ull; x ^= x >> 29;
  return static_cast<uint32_t>(x);
}

__global__ void fill_kernel(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = mix(i, seed);
}

__global__ void check_kernel(const uint32_t* p, size_t n, uint32_t seed, uint32_t add, unsigned long long* bad) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    local += (p[i] != mix(i, seed) + add);
  if (local) atomicAdd(bad, local);
}

// out[i] = in[i] + 1 (a second stream consumer for record_stream tests)
__global__ void add_one_kernel(const uint32_t* in, uint32_t* out, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = in[i] + 1;
}

__global__ void spin_kernel(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}

// A host thread of its own that launches kernels on a stream of its own, created with the CUDA
// runtime (neither the allocator's pool nor record_stream knows it), reading and writing a block
// until it is told to stop: how a user's side thread, NCCL or TensorFlow's executor threads touch
// memory. It waits for each batch of kernels before the next, so it stops with nothing queued.
static std::thread g_foreign;
static std::atomic<bool> g_foreign_stop{false};
static std::atomic<long long> g_foreign_passes{0};
static std::atomic<int> g_foreign_error{0};

static cudaStream_t stream_of(int id) {
  if (id < 0) return c10::cuda::getCurrentCUDAStream(0).stream();
  return g_streams.at(id).stream();
}

extern "C" {

// libtorch_cuda normally registers this hook (c10 only has a throwing dummy). probe_init creates the
// primary context of device 0 first (cudaFree(0)), so it exists for the only device we use.
[[maybe_unused]] static bool probe_has_primary_context(c10::DeviceIndex idx) { return idx == 0; }

int probe_init(int nstreams) {
  try {
    C10_CUDA_CHECK(cudaSetDevice(0));
    C10_CUDA_CHECK(cudaFree(nullptr));
#ifdef PROBE_HAS_PRIMARY_CONTEXT_HOOK
    c10::cuda::_internal::setHasPrimaryContext(probe_has_primary_context);
#endif
    A::init(1);
    c10::cuda::set_device(0);
    g_streams.clear();
    for (int i = 0; i < nstreams; ++i) g_streams.push_back(c10::cuda::getStreamFromPool(false, 0));
    return 0;
  } catch (const std::exception& e) { g_err = e.what(); return -1; }
}

const char* probe_error() { return g_err.c_str(); }

// returns pointer or 0; *oom = 1 when the allocator raised OutOfMemoryError
unsigned long long probe_alloc(unsigned long long n, int stream, int* oom) {
  *oom = 0;
  try {
    return (unsigned long long)A::raw_alloc_with_stream(n, stream_of(stream));
  } catch (const c10::OutOfMemoryError& e) {
    g_err = e.what(); *oom = 1; return 0;
  } catch (const std::exception& e) { g_err = e.what(); return 0; }
}

int probe_free(unsigned long long p) {
  try { A::raw_delete((void*)p); return 0; } catch (const std::exception& e) { g_err = e.what(); return -1; }
}

int probe_record_stream(unsigned long long p, int stream) {
  try {
    c10::DataPtr dp((void*)p, c10::Device(c10::DeviceType::CUDA, 0));
    A::recordStream(dp, g_streams.at(stream));
    return 0;
  } catch (const std::exception& e) { g_err = e.what(); return -1; }
}

int probe_fill(unsigned long long p, unsigned long long nbytes, unsigned seed, int stream) {
  fill_kernel<<<1024, 256, 0, stream_of(stream)>>>((uint32_t*)p, nbytes / 4, seed);
  return (int)cudaGetLastError();
}

// host seconds of n back-to-back launches of a 1-block fill of p (4 KiB), synchronized at
// the end: the per-launch price of whatever intercepts a launch (the LMS launch gate)
double probe_launch_loop(unsigned long long p, unsigned long long n, int stream) {
  cudaStream_t s = stream_of(stream);
  auto t0 = std::chrono::steady_clock::now();
  for (unsigned long long i = 0; i < n; ++i) {
    fill_kernel<<<1, 256, 0, s>>>((uint32_t*)p, 1024, (unsigned)i);
  }
  if (cudaStreamSynchronize(s) != cudaSuccess) return -1.0;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// blocking check that p holds pattern(seed) + add; returns number of wrong 32-bit words, or -1
long long probe_check_add(unsigned long long p, unsigned long long nbytes, unsigned seed, unsigned add, int stream) {
  unsigned long long* bad = nullptr;
  if (cudaMallocHost(&bad, sizeof(*bad)) != cudaSuccess) return -1;
  *bad = 0;
  cudaStream_t s = stream_of(stream);
  check_kernel<<<1024, 256, 0, s>>>((const uint32_t*)p, nbytes / 4, seed, add, bad);
  if (cudaStreamSynchronize(s) != cudaSuccess) { g_err = cudaGetErrorString(cudaGetLastError()); cudaFreeHost(bad); return -1; }
  long long r = (long long)*bad;
  cudaFreeHost(bad);
  return r;
}

long long probe_check(unsigned long long p, unsigned long long nbytes, unsigned seed, int stream) {
  return probe_check_add(p, nbytes, seed, 0, stream);
}

// the same check on host memory (a copy the eviction net made): wrong 32-bit words
long long probe_check_host(unsigned long long p, unsigned long long nbytes, unsigned seed) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(p);
  long long bad = 0;
  for (size_t i = 0; i < nbytes / 4; ++i) bad += (w[i] != mix(i, seed));
  return bad;
}

int probe_add_one(unsigned long long in, unsigned long long out, unsigned long long nbytes, int stream) {
  add_one_kernel<<<1024, 256, 0, stream_of(stream)>>>((const uint32_t*)in, (uint32_t*)out, nbytes / 4);
  return (int)cudaGetLastError();
}

int probe_spin(long long cycles, int stream) {
  spin_kernel<<<1, 1, 0, stream_of(stream)>>>(cycles);
  return (int)cudaGetLastError();
}

// stream `waiter` waits for all work queued so far on stream `waitee`
int probe_wait(int waiter, int waitee) {
  cudaEvent_t e;
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  cudaEventRecord(e, stream_of(waitee));
  cudaStreamWaitEvent(stream_of(waiter), e, 0);
  cudaEventDestroy(e);
  return (int)cudaGetLastError();
}

int probe_sync() { return (int)cudaDeviceSynchronize(); }

// starts the foreign thread on [p, p + nbytes): `passes` in-place add_one kernels (a read-modify-write
// the allocator is not told about), then a wait, again and again
int probe_foreign_start(unsigned long long p, unsigned long long nbytes, int passes) {
  if (g_foreign.joinable()) return -1;
  g_foreign_stop = false;
  g_foreign_passes = 0;
  g_foreign_error = 0;
  g_foreign = std::thread([p, nbytes, passes] {
    cudaSetDevice(0);
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) { g_foreign_error = 1; return; }
    while (!g_foreign_stop.load()) {
      for (int r = 0; r < passes; ++r)
        add_one_kernel<<<1024, 256, 0, s>>>((const uint32_t*)p, (uint32_t*)p, nbytes / 4);
      cudaError_t e = cudaStreamSynchronize(s);
      if (e != cudaSuccess) { g_foreign_error = (int)e; break; }
      g_foreign_passes += passes;
    }
    cudaStreamDestroy(s);
  });
  return 0;
}

// stops the foreign thread; the increments it completed, or -(CUDA error) when one failed
long long probe_foreign_stop() {
  g_foreign_stop = true;
  if (g_foreign.joinable()) g_foreign.join();
  int e = g_foreign_error.load();
  return e ? -(long long)e : g_foreign_passes.load();
}

// What backs each `step` bytes of [ptr, ptr + bytes): the location type of the physical
// allocation (VMM handle) mapped there, from cuMemRetainAllocationHandle +
// cuMemGetAllocationPropertiesFromHandle (driver API, looked up with dlsym: the probe links only
// the runtime). counts[0]: device, [1]: host, [2]: host NUMA, [3]: host NUMA current,
// [4]: anything else, [5]: no VMM allocation there (not mapped through VMM: cudaMalloc'd,
// pageable or unmapped). Returns 0, or -1 with probe_error() set.
int probe_location_types(unsigned long long ptr, unsigned long long bytes, unsigned long long step,
                         unsigned long long* counts) {
  using Retain = CUresult (*)(CUmemGenericAllocationHandle*, void*);
  using Props = CUresult (*)(CUmemAllocationProp*, CUmemGenericAllocationHandle);
  using Release = CUresult (*)(CUmemGenericAllocationHandle);
  static void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) { g_err = "dlopen libcuda.so.1 failed"; return -1; }
  auto retain = reinterpret_cast<Retain>(dlsym(lib, "cuMemRetainAllocationHandle"));
  auto props = reinterpret_cast<Props>(dlsym(lib, "cuMemGetAllocationPropertiesFromHandle"));
  auto release = reinterpret_cast<Release>(dlsym(lib, "cuMemRelease"));
  if (!retain || !props || !release) { g_err = "driver VMM entry points not found"; return -1; }
  if (cudaDeviceSynchronize() != cudaSuccess) { g_err = "cudaDeviceSynchronize failed"; return -1; }
  for (int i = 0; i < 6; ++i) counts[i] = 0;
  for (unsigned long long a = ptr; a < ptr + bytes; a += step) {
    CUmemGenericAllocationHandle h;
    if (retain(&h, reinterpret_cast<void*>(a)) != CUDA_SUCCESS) { counts[5]++; continue; }
    CUmemAllocationProp prop;
    std::memset(&prop, 0, sizeof(prop));
    CUresult r = props(&prop, h);
    release(h);
    if (r != CUDA_SUCCESS) { g_err = "cuMemGetAllocationPropertiesFromHandle failed"; return -1; }
    // CU_MEM_LOCATION_TYPE_DEVICE 1, _HOST 2, _HOST_NUMA 3, _HOST_NUMA_CURRENT 4 (CUDA 12.2+)
    int t = static_cast<int>(prop.location.type);
    counts[(t >= 1 && t <= 4) ? t - 1 : 4]++;
  }
  return 0;
}

int probe_empty_cache() {
  try { A::emptyCache(); return 0; } catch (const std::exception& e) { g_err = e.what(); return -1; }
}

int probe_settings(const char* s) {
  try { A::setAllocatorSettings(s); return 0; } catch (const std::exception& e) { g_err = e.what(); return -1; }
}

// upstream stats: allocated/reserved/active current+peak (aggregate)
int probe_stats(long long* out) {
  auto st = A::getDeviceStats(0);
  auto agg = static_cast<size_t>(ProbeStatType::AGGREGATE);
  out[0] = st.allocated_bytes[agg].current; out[1] = st.allocated_bytes[agg].peak;
  out[2] = st.reserved_bytes[agg].current;  out[3] = st.reserved_bytes[agg].peak;
  out[4] = st.num_ooms; out[5] = st.num_alloc_retries;
  return 0;
}

void probe_reset_peak() { A::resetPeakStats(0); }

unsigned long long probe_device_total() {
  size_t f = 0, t = 0; cudaMemGetInfo(&f, &t); return t;
}
unsigned long long probe_device_free() {
  size_t f = 0, t = 0; cudaMemGetInfo(&f, &t); return f;
}

// copy bandwidth reference: pinned host <-> device, GB/s, for nbytes
double probe_pcie_gbps(unsigned long long nbytes, int to_device) {
  void* h = nullptr; void* d = nullptr;
  if (cudaMallocHost(&h, nbytes) != cudaSuccess) return -1;
  if (cudaMalloc(&d, nbytes) != cudaSuccess) { cudaFreeHost(h); return -1; }
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int rep = 0; rep < 2; ++rep) {
    cudaEventRecord(a);
    if (to_device) cudaMemcpyAsync(d, h, nbytes, cudaMemcpyHostToDevice); else cudaMemcpyAsync(h, d, nbytes, cudaMemcpyDeviceToHost);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
  }
  float ms = 0; cudaEventElapsedTime(&ms, a, b);
  cudaFree(d); cudaFreeHost(h); cudaEventDestroy(a); cudaEventDestroy(b);
  return nbytes / (ms * 1e-3) / 1e9;
}
}
