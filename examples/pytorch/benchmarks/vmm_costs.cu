// What the allocator LMS's page moves cost on this machine, piece by piece.
//
// The allocator spills a page by copying it into a host-backed VMM handle and
// mapping that handle at the page's address. This program times each driver
// call of that path and the whole path, so a change to the spill is chosen by
// measurement:
//   create   cuMemCreate of host handles, from 1..16 threads at once
//   copy     device page -> host handle (DtoD through mapped addresses) against
//            a pinned cudaMemcpy of the same size
//   spill    the pipelined spill as the allocator does it, with the staging
//            window (map, copy, unmap) or with host handles that keep their
//            own mapping, and with remaps per page or per run of pages
// Build and run (GPU machine):
//   nvcc -O2 -std=c++17 -o /tmp/vmm_costs examples/pytorch/benchmarks/vmm_costs.cu -lcuda
//   /tmp/vmm_costs [total_gib=8] [page_mib=20]
// Prints one JSON object.

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "vmm_probe.h"

namespace {

int g_dev = 0;
int g_numa = 0;

CUmemGenericAllocationHandle create(bool host, size_t size) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  if (host) {
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    prop.location.id = g_numa;
  } else {
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = g_dev;
  }
  CUmemGenericAllocationHandle h = 0;
  CK(cuMemCreate(&h, size, &prop, 0));
  return h;
}

void set_access(CUdeviceptr va, size_t size) {
  CUmemAccessDesc d = {};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = g_dev;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(va, size, &d, 1));
}

// accumulated seconds per driver call kind
struct Calls {
  std::map<std::string, double> s;
  std::map<std::string, long> n;
  template <typename F>
  void time(const char* k, F f) {
    auto a = Clock::now();
    f();
    s[k] += secs(a, Clock::now());
    n[k] += 1;
  }
  std::string json() const {
    std::string o = "{";
    for (auto& kv : s) {
      char b[160];
      std::snprintf(b, sizeof b, "%s\"%s\": {\"total_ms\": %.2f, \"calls\": %ld, \"us_each\": %.1f}",
                    o.size() > 1 ? ", " : "", kv.first.c_str(), kv.second * 1e3,
                    n.at(kv.first), kv.second * 1e6 / n.at(kv.first));
      o += b;
    }
    return o + "}";
  }
};

double create_gbps(size_t page, size_t total, int threads) {
  size_t n = total / page;
  std::vector<CUmemGenericAllocationHandle> hs(n);
  std::atomic<size_t> next{0};
  CUcontext ctx;
  CK(cuCtxGetCurrent(&ctx));
  auto a = Clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&] {
      CK(cuCtxSetCurrent(ctx));
      for (size_t i; (i = next.fetch_add(1)) < n;) hs[i] = create(true, page);
    });
  }
  for (auto& t : ts) t.join();
  double dt = secs(a, Clock::now());
  for (auto h : hs) CK(cuMemRelease(h));
  return n * page / dt / 1e9;
}

// A segment of n device pages mapped at one reservation, filled with data.
struct Segment {
  CUdeviceptr va = 0;
  size_t page = 0, n = 0;
  std::vector<CUmemGenericAllocationHandle> h;
  Segment(size_t page_, size_t n_) : page(page_), n(n_), h(n_) {
    CK(cuMemAddressReserve(&va, page * n, 0, 0, 0));
    for (size_t i = 0; i < n; ++i) {
      h[i] = create(false, page);
      CK(cuMemMap(va + i * page, page, 0, h[i], 0));
    }
    set_access(va, page * n);
    RK(cudaMemset(reinterpret_cast<void*>(va), 0x5a, page * n));
    RK(cudaDeviceSynchronize());
  }
  ~Segment() {
    for (size_t i = 0; i < n; ++i) {
      cuMemUnmap(va + i * page, page);
      cuMemRelease(h[i]);
    }
    cuMemAddressFree(va, page * n);
  }
};

struct HostPage {
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;  // own mapping (persistent variants only)
};

// Copies n bytes with the SMs (16-byte words, grid-stride) instead of a copy
// engine.
__global__ void sm_copy(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t words) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}
bool g_sm_copy = false;

// One spill of every page of `seg` into `hosts` (already created), pipelined
// in chunks of 32 pages over two halves of a staging window as the allocator
// does. persistent: copy straight into each host page's own mapping (no
// window). batched: unmap/setAccess runs of contiguous pages with one call.
double spill(Segment& seg, std::vector<HostPage>& hosts, bool persistent, bool batched,
             int threads, bool unmap_own, cudaStream_t st, Calls& c) {
  CUcontext ctx;
  CK(cuCtxGetCurrent(&ctx));
  const size_t kWin = 32;
  CUdeviceptr win = 0;
  if (!persistent) CK(cuMemAddressReserve(&win, seg.page * kWin * 2, 0, 0, 0));
  struct Chunk {
    size_t first = 0, count = 0;
    CUdeviceptr win = 0;
    cudaEvent_t done = nullptr;
  };
  auto finish = [&](Chunk& ch) {
    c.time("event_sync", [&] { RK(cudaEventSynchronize(ch.done)); });
    RK(cudaEventDestroy(ch.done));
    if (!persistent) {
      for (size_t j = 0; j < ch.count; ++j)
        c.time("window_unmap", [&] { CK(cuMemUnmap(ch.win + j * seg.page, seg.page)); });
    }
    if (unmap_own) {
      for (size_t j = 0; j < ch.count; ++j)
        c.time("own_unmap", [&] { CK(cuMemUnmap(hosts[ch.first + j].va, seg.page)); });
    }
    if (threads > 1) {
      // the remaps of one chunk split over threads (pages j = t mod threads)
      auto a = Clock::now();
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
          CK(cuCtxSetCurrent(ctx));
          for (size_t j = t; j < ch.count; j += threads) {
            CUdeviceptr p = seg.va + (ch.first + j) * seg.page;
            CK(cuMemUnmap(p, seg.page));
            CK(cuMemMap(p, seg.page, 0, hosts[ch.first + j].h, 0));
            set_access(p, seg.page);
            CK(cuMemRelease(seg.h[ch.first + j]));
          }
        });
      }
      for (auto& t : ts) t.join();
      c.s["remap_threads_chunk"] += secs(a, Clock::now());
      c.n["remap_threads_chunk"] += 1;
      return;
    }
    if (batched) {
      // pages first..first+count are contiguous in the segment
      CUdeviceptr base = seg.va + ch.first * seg.page;
      for (size_t j = 0; j < ch.count; ++j)
        c.time("page_unmap", [&] { CK(cuMemUnmap(base + j * seg.page, seg.page)); });
      for (size_t j = 0; j < ch.count; ++j)
        c.time("page_map_host", [&] {
          CK(cuMemMap(base + j * seg.page, seg.page, 0, hosts[ch.first + j].h, 0));
        });
      c.time("set_access_run", [&] { set_access(base, seg.page * ch.count); });
    } else {
      for (size_t j = 0; j < ch.count; ++j) {
        CUdeviceptr p = seg.va + (ch.first + j) * seg.page;
        c.time("page_unmap", [&] { CK(cuMemUnmap(p, seg.page)); });
        c.time("page_map_host", [&] { CK(cuMemMap(p, seg.page, 0, hosts[ch.first + j].h, 0)); });
        c.time("set_access_page", [&] { set_access(p, seg.page); });
      }
    }
    for (size_t j = 0; j < ch.count; ++j)
      c.time("release_device", [&] { CK(cuMemRelease(seg.h[ch.first + j])); });
  };
  auto a = Clock::now();
  Chunk prev;
  bool have_prev = false;
  int half = 0;
  for (size_t k = 0; k < seg.n;) {
    Chunk ch;
    ch.first = k;
    ch.win = win + half * kWin * seg.page;
    for (; k < seg.n && ch.count < kWin; ++k, ++ch.count) {
      CUdeviceptr dst = hosts[k].va;
      if (!persistent) {
        dst = ch.win + ch.count * seg.page;
        c.time("window_map", [&] { CK(cuMemMap(dst, seg.page, 0, hosts[k].h, 0)); });
        c.time("window_set_access", [&] { set_access(dst, seg.page); });
      }
      c.time("memcpy_async", [&] {
        if (g_sm_copy) {
          sm_copy<<<264, 512, 0, st>>>(reinterpret_cast<const uint4*>(seg.va + k * seg.page),
                                       reinterpret_cast<uint4*>(dst), seg.page / 16);
          RK(cudaGetLastError());
        } else {
          RK(cudaMemcpyAsync(reinterpret_cast<void*>(dst),
                             reinterpret_cast<void*>(seg.va + k * seg.page), seg.page,
                             cudaMemcpyDeviceToDevice, st));
        }
      });
    }
    RK(cudaEventCreateWithFlags(&ch.done, cudaEventDisableTiming));
    RK(cudaEventRecord(ch.done, st));
    if (have_prev) finish(prev);
    prev = ch;
    have_prev = true;
    half ^= 1;
  }
  if (have_prev) finish(prev);
  double dt = secs(a, Clock::now());
  if (win) CK(cuMemAddressFree(win, seg.page * kWin * 2));
  // the segment's pages are host pages now: give each back a device handle
  // so the destructor's unmap/release stay uniform
  for (size_t i = 0; i < seg.n; ++i) {
    CK(cuMemUnmap(seg.va + i * seg.page, seg.page));
    seg.h[i] = create(false, seg.page);
    CK(cuMemMap(seg.va + i * seg.page, seg.page, 0, seg.h[i], 0));
  }
  set_access(seg.va, seg.page * seg.n);
  return seg.n * seg.page / dt / 1e9;
}

std::vector<HostPage> make_hosts(size_t page, size_t n, bool persistent) {
  std::vector<HostPage> v(n);
  for (auto& p : v) {
    p.h = create(true, page);
    if (persistent) {
      CK(cuMemAddressReserve(&p.va, page, 0, 0, 0));
      CK(cuMemMap(p.va, page, 0, p.h, 0));
      set_access(p.va, page);
    }
  }
  return v;
}
void free_hosts(std::vector<HostPage>& v, size_t page, bool unmapped = false) {
  for (auto& p : v) {
    if (p.va) {
      if (!unmapped) CK(cuMemUnmap(p.va, page));
      CK(cuMemAddressFree(p.va, page));
    }
    CK(cuMemRelease(p.h));
  }
  v.clear();
}

double pinned_gbps(size_t bytes, bool d2h, cudaStream_t st) {
  void* h = nullptr;
  void* d = nullptr;
  RK(cudaMallocHost(&h, bytes));
  RK(cudaMalloc(&d, bytes));
  RK(cudaMemcpyAsync(d2h ? h : d, d2h ? d : h, bytes, d2h ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, st));
  RK(cudaStreamSynchronize(st));
  auto a = Clock::now();
  RK(cudaMemcpyAsync(d2h ? h : d, d2h ? d : h, bytes, d2h ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, st));
  RK(cudaStreamSynchronize(st));
  double dt = secs(a, Clock::now());
  RK(cudaFreeHost(h));
  RK(cudaFree(d));
  return bytes / dt / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t gib = size_t(1) << 30, mib = size_t(1) << 20;
  const size_t total = (argc > 1 ? std::atof(argv[1]) : 8.0) * gib;
  const size_t page = (argc > 2 ? std::atof(argv[2]) : 20.0) * mib;
  RK(cudaSetDevice(0));
  RK(cudaFree(nullptr));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  if (cuDeviceGetAttribute(&g_numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev) != CUDA_SUCCESS ||
      g_numa < 0)
    g_numa = 0;
  cudaStream_t st;
  RK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t n = total / page;

  std::printf("{\"page_mib\": %.0f, \"total_gib\": %.2f,\n", double(page) / mib,
              double(n * page) / gib);
  std::printf(" \"pinned_d2h_gbps\": %.1f, \"pinned_h2d_gbps\": %.1f,\n",
              pinned_gbps(2 * gib, true, st), pinned_gbps(2 * gib, false, st));
  std::printf(" \"host_create_gbps\": {");
  for (int t : {1, 2, 4, 8, 16}) {
    std::printf("%s\"%d\": %.2f", t == 1 ? "" : ", ", t, create_gbps(page, std::min(total, 4 * gib), t));
    std::fflush(stdout);
  }
  std::printf("},\n");

  // copy only: device page -> persistent host mapping, all pages queued
  {
    Segment seg(page, n);
    auto hosts = make_hosts(page, n, true);
    RK(cudaStreamSynchronize(st));
    auto a = Clock::now();
    for (size_t k = 0; k < n; ++k)
      RK(cudaMemcpyAsync(reinterpret_cast<void*>(hosts[k].va),
                         reinterpret_cast<void*>(seg.va + k * page), page,
                         cudaMemcpyDeviceToDevice, st));
    RK(cudaStreamSynchronize(st));
    std::printf(" \"copy_to_host_handles_gbps\": %.1f,\n", n * page / secs(a, Clock::now()) / 1e9);
    a = Clock::now();
    for (size_t k = 0; k < n; ++k)
      sm_copy<<<264, 512, 0, st>>>(reinterpret_cast<const uint4*>(seg.va + k * page),
                                   reinterpret_cast<uint4*>(hosts[k].va), page / 16);
    RK(cudaStreamSynchronize(st));
    std::printf(" \"sm_copy_to_host_handles_gbps\": %.1f,\n", n * page / secs(a, Clock::now()) / 1e9);
    free_hosts(hosts, page);
  }

  // may one cuMemUnmap cover several adjacent mappings?
  {
    CUdeviceptr va = 0;
    CK(cuMemAddressReserve(&va, 2 * page, 0, 0, 0));
    auto h0 = create(false, page), h1 = create(false, page);
    CK(cuMemMap(va, page, 0, h0, 0));
    CK(cuMemMap(va + page, page, 0, h1, 0));
    set_access(va, 2 * page);
    CUresult r = cuMemUnmap(va, 2 * page);
    if (r != CUDA_SUCCESS) {
      cuMemUnmap(va, page);
      cuMemUnmap(va + page, page);
    }
    std::printf(" \"unmap_over_two_mappings\": %d,\n", int(r));
    CK(cuMemRelease(h0));
    CK(cuMemRelease(h1));
    CK(cuMemAddressFree(va, 2 * page));
  }

  struct Variant {
    const char* name;
    bool persistent, batched;
    int threads;
    bool unmap_own;
    bool sm;
  } vs[] = {{"window_per_page", false, false, 1, false, false},   // the allocator today
            {"persistent_per_page", true, false, 1, false, false},
            {"persistent_per_page_sm_copy", true, false, 1, false, true},
            {"own_mapping_dropped_first_sm_copy", true, false, 1, true, true},
            {"persistent_batched", true, true, 1, false, false},
            {"persistent_4_threads", true, false, 4, false, false},
            {"own_mapping_dropped_first", true, false, 1, true, false},
            {"own_mapping_dropped_first_batched", true, true, 1, true, false}};
  std::printf(" \"spill\": {\n");
  for (size_t i = 0; i < sizeof vs / sizeof vs[0]; ++i) {
    for (int rep = 0; rep < 2; ++rep) {
      Segment seg(page, n);
      g_sm_copy = vs[i].sm;
      auto f0 = Clock::now();
      auto hosts = make_hosts(page, n, vs[i].persistent);
      double fill = n * page / secs(f0, Clock::now()) / 1e9;
      Calls c;
      double g = spill(seg, hosts, vs[i].persistent, vs[i].batched, vs[i].threads, vs[i].unmap_own, st, c);
      std::printf("  \"%s_%d\": {\"gbps\": %.1f, \"host_fill_gbps\": %.2f, \"calls\": %s}%s\n", vs[i].name, rep, g, fill,
                  c.json().c_str(), (i + 1 == sizeof vs / sizeof vs[0] && rep == 1) ? "" : ",");
      std::fflush(stdout);
      free_hosts(hosts, page, vs[i].unmap_own);
    }
  }
  std::printf(" },\n");
  // cuMemSetAccess of a host handle's mapping, by what the handle went through
  // before: never mapped; mapped, accessed and unmapped once; mapped at another
  // address right now; unmapped after a previous unmap/remap cycle
  {
    const size_t m = std::min<size_t>(n, 64);
    std::vector<CUmemGenericAllocationHandle> hs(m);
    std::vector<CUdeviceptr> a(m), b(m);
    for (size_t i = 0; i < m; ++i) {
      hs[i] = create(true, page);
      CK(cuMemAddressReserve(&a[i], page, 0, 0, 0));
      CK(cuMemAddressReserve(&b[i], page, 0, 0, 0));
    }
    auto run = [&](const char* name, bool unmap_a_after, bool map_b) {
      Calls c;
      for (size_t i = 0; i < m; ++i) {
        CUdeviceptr va = map_b ? b[i] : a[i];
        CK(cuMemMap(va, page, 0, hs[i], 0));
        c.time("set_access", [&] { set_access(va, page); });
        if (map_b) {
          c.time("unmap", [&] { CK(cuMemUnmap(b[i], page)); });
        } else if (unmap_a_after) {
          c.time("unmap", [&] { CK(cuMemUnmap(a[i], page)); });
        }
      }
      std::printf("  \"%s\": %s,\n", name, c.json().c_str());
    };
    std::printf(" \"set_access_by_history\": {\n");
    run("first_mapping_then_unmapped", true, false);
    run("second_time_no_other_mapping", false, false);        // a[i] stays mapped
    run("while_mapped_elsewhere", false, true);               // b[i] beside a[i]
    for (size_t i = 0; i < m; ++i) CK(cuMemUnmap(a[i], page));
    run("third_time_no_other_mapping", true, false);
    std::printf("  \"pages\": %zu},\n", m);
    for (size_t i = 0; i < m; ++i) {
      CK(cuMemRelease(hs[i]));
      CK(cuMemAddressFree(a[i], page));
      CK(cuMemAddressFree(b[i], page));
    }
  }
  std::printf(" \"done\": 1}\n");
  return 0;
}
