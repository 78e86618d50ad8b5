// What growing an allocator's pool by one region costs, piece by piece:
// device pages made, mapped and given access one by one (the TF LMS backend
// today), mapped one by one with one access call for the region, and the
// BFC allocator's per-256-byte handle table for the region (host memory).
// Build and run (GPU machine):
//   nvcc -O2 -std=c++17 -o /tmp/region_costs examples/pytorch/benchmarks/region_costs.cu -lcuda
//   /tmp/region_costs [total_gib=8] [page_mib=64]
// Prints one JSON object (three rounds).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "vmm_probe.h"

static double since(Clock::time_point a) { return secs(a, Clock::now()); }

int main(int argc, char** argv) {
  const size_t total = size_t((argc > 1 ? std::atof(argv[1]) : 8.0) * (1 << 30));
  const size_t page = size_t((argc > 2 ? std::atof(argv[2]) : 64.0) * (1 << 20));
  const size_t n = total / page;
  cudaSetDevice(0); cudaFree(nullptr);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemAccessDesc acc = {};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE; acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  std::vector<CUmemGenericAllocationHandle> h(n);
  std::printf("{\"total_gib\": %.1f, \"page_mib\": %zu, \"rounds\": [\n", total / double(1 << 30), page >> 20);
  for (int round = 0; round < 3; ++round) {
    auto t = Clock::now();
    for (size_t i = 0; i < n; ++i) CK(cuMemCreate(&h[i], page, &prop, 0));
    const double create = since(t);
    CUdeviceptr a = 0, b = 0;
    CK(cuMemAddressReserve(&a, total, page, 0, 0));
    CK(cuMemAddressReserve(&b, total, page, 0, 0));
    t = Clock::now();
    for (size_t i = 0; i < n; ++i) { CK(cuMemMap(a + i * page, page, 0, h[i], 0)); CK(cuMemSetAccess(a + i * page, page, &acc, 1)); }
    const double map_access_each = since(t);
    cudaMemset((void*)a, 1, total); cudaDeviceSynchronize();
    t = Clock::now();
    for (size_t i = 0; i < n; ++i) CK(cuMemUnmap(a + i * page, page));
    const double unmap_each = since(t);
    t = Clock::now();
    for (size_t i = 0; i < n; ++i) CK(cuMemMap(b + i * page, page, 0, h[i], 0));
    const double map_only = since(t);
    t = Clock::now();
    CK(cuMemSetAccess(b, total, &acc, 1));
    const double access_once = since(t);
    cudaMemset((void*)b, 2, total); cudaDeviceSynchronize();
    CK(cuMemUnmap(b, total));
    // BFC's AllocationRegion: one ChunkHandle (size_t) per 256 bytes, all
    // set to kInvalidChunkHandle; against a zeroed table (calloc, lazily
    // backed) with one entry written per page.
    t = Clock::now();
    { std::vector<size_t> table(total / 256, ~size_t{0}); if (table[n] != ~size_t{0}) std::abort(); }
    const double table_filled = since(t);
    t = Clock::now();
    { size_t* z = static_cast<size_t*>(std::calloc(total / 256, sizeof(size_t)));
      for (size_t i = 0; i < n; ++i) z[i * (page / 256)] = i + 1;
      if (z[page / 256] != 2) std::abort(); std::free(z); }
    const double table_zeroed = since(t);
    t = Clock::now();
    for (size_t i = 0; i < n; ++i) CK(cuMemRelease(h[i]));
    const double release = since(t);
    CK(cuMemAddressFree(a, total)); CK(cuMemAddressFree(b, total));
    std::printf("  {\"create_s\": %.4f, \"map_and_access_each_s\": %.4f, \"unmap_each_s\": %.4f, \"map_only_s\": %.4f, \"access_once_s\": %.4f, \"bfc_table_filled_s\": %.4f, \"table_zeroed_touched_per_page_s\": %.4f, \"release_s\": %.4f}%s\n",
                create, map_access_each, unmap_each, map_only, access_once, table_filled, table_zeroed, release, round == 2 ? "" : ",");
    std::fflush(stdout);
  }
  std::printf("]}\n");
}
