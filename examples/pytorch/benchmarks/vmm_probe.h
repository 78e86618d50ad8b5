// What the CUDA driver probes here (vmm_costs.cu, region_costs.cu) share:
// calls that exit with file, line and the driver's message when they fail,
// and seconds between two clock readings.
#ifndef LMS_BENCHMARKS_VMM_PROBE_H_
#define LMS_BENCHMARKS_VMM_PROBE_H_

#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                              \
  do {                                                                     \
    CUresult r_ = (x);                                                     \
    if (r_ != CUDA_SUCCESS) {                                              \
      const char* s_ = nullptr;                                            \
      cuGetErrorString(r_, &s_);                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_);  \
      std::exit(2);                                                        \
    }                                                                      \
  } while (0)
#define RK(x)                                                              \
  do {                                                                     \
    cudaError_t r_ = (x);                                                  \
    if (r_ != cudaSuccess) {                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,       \
                   cudaGetErrorString(r_));                                \
      std::exit(2);                                                        \
    }                                                                      \
  } while (0)

using Clock = std::chrono::steady_clock;
inline double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

#endif  // LMS_BENCHMARKS_VMM_PROBE_H_
