// Large Model Support: the pool of host-backed VMM pages (host_page_acquire
// and the rest of CUDALargeModelSupport.h's "pool" section).
//
// A pooled page is a pinned host handle (cuMemCreate on the GPU's host NUMA
// node) that keeps a mapping of its own, readable and writable by its device,
// so a spill copies a device page straight into it and then maps the handle at
// the page's address. What the pieces cost on the H100 (run with
// examples/pytorch/benchmarks/vmm_costs.cu):
//   * cuMemCreate of host handles: 4-5 GB/s, from 1 thread or 16;
//   * cuMemSetAccess of a host mapping: 14 us per MiB, 21-27 us per MiB while
//     copies run, serialised in the driver (more threads do not help).
// A spill through a staging window paid the second twice per page. And a page
// made on the spill path costs its creation too, so pages are made ahead of
// need: the allocator calls host_pool_prefill with the reserve it wants (see
// DeviceLms::prefill: a set lms_host_reserve_mb once the device is 3/4 full;
// automatic: what LMS has held on the host, up to 1/8 of the device memory
// LMS may use), and a filler thread makes pages until the idle pool holds it
// (at most half the host budget). It pauses while a spill runs. host_pool_trim (emptyCache) gives the
// idle pages back and stops filling until the next prefill.
//
// Invariants: every handle in the pool is charged to the host budget exactly
// once (host_reserve when made, host_release when released); `mapped_at`
// holds one entry per live handle the pool made; the pool's mutex is never
// held across a driver call.
#include <c10/cuda/CUDALargeModelSupport.h>

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#if !defined(USE_ROCM) && defined(PYTORCH_C10_DRIVER_API_SUPPORTED)
#include <c10/cuda/impl/LMSDriverAPI.h>
#endif
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace c10::cuda::CUDACachingAllocator::lms {

namespace {

#if !defined(USE_ROCM) && defined(PYTORCH_C10_DRIVER_API_SUPPORTED)
// CUDA 12.2's host allocations (the location types and the device
// attribute), named here for headers older than 12.2; the values are fixed
// in the driver's ABI.
constexpr auto kLocationHost = static_cast<CUmemLocationType>(0x2);
constexpr auto kLocationHostNuma = static_cast<CUmemLocationType>(0x3);
constexpr auto kAttrHostNumaId = static_cast<CUdevice_attribute>(134);
#endif

struct HostPage {
  unsigned long long handle = 0;
  unsigned long long mapped_at = 0; // the page's own mapping
};

struct HostPool {
  std::mutex m;
  std::condition_variable wake;
  // handles of idle pages by (device, page size)
  std::map<std::pair<int, size_t>, std::vector<unsigned long long>> idle;
  // every page the pool made: handle -> its own mapping
  std::unordered_map<unsigned long long, unsigned long long> mapped_at;
  size_t idle_bytes = 0;
  size_t total_bytes = 0;
  size_t made_ahead_bytes = 0; // made by the filler
  size_t made_on_demand_bytes = 0; // made on the spill path
  // the filler: keeps `fill_target` bytes of idle pages of (fill_device,
  // fill_page) while `paused` is 0
  std::thread filler;
  pid_t filler_pid = 0; // a forked child has the thread object, not the thread
  bool stop = false;
  int paused = 0;
  int fill_device = -1;
  size_t fill_page = 0;
  size_t fill_target = 0;
};
HostPool& host_pool() {
  static auto* p = new HostPool(); // leaked on purpose: used at exit
  return *p;
}

size_t idle_bytes_of(HostPool& p, int device, size_t page_size) {
  auto it = p.idle.find({device, page_size});
  return it == p.idle.end() ? 0 : it->second.size() * page_size;
}

#if !defined(USE_ROCM) && defined(PYTORCH_C10_DRIVER_API_SUPPORTED)

// Makes one host page with its own mapping for `device`, charged to the host
// budget. False when the budget or the host is exhausted; other driver errors
// throw (after undoing what was made).
bool make_host_page(int device, size_t page_size, HostPage* out) {
  if (!host_reserve(page_size)) {
    return false;
  }
  auto* api = c10::cuda::DriverAPI::get();
  int numa_id = -1;
  if (api->cuDeviceGetAttribute_(
          &numa_id,
          kAttrHostNumaId,
          static_cast<CUdevice>(device)) != CUDA_SUCCESS) {
    numa_id = -1;
  }
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  if (numa_id >= 0) {
    prop.location.type = kLocationHostNuma;
    prop.location.id = numa_id;
  } else {
    prop.location.type = kLocationHost;
    prop.location.id = 0;
  }
  CUmemGenericAllocationHandle h = 0;
  CUresult r = api->cuMemCreate_(&h, page_size, &prop, 0);
  if (r != CUDA_SUCCESS) {
    host_release(page_size);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      return false;
    }
    C10_CUDA_DRIVER_CHECK(r);
  }
  CUdeviceptr va = 0;
  bool reserved = false;
  bool mapped = false;
  r = api->cuMemAddressReserve_(&va, page_size, 0, 0, 0ULL);
  if (r == CUDA_SUCCESS) {
    reserved = true;
    r = api->cuMemMap_(va, page_size, 0, h, 0ULL);
  }
  if (r == CUDA_SUCCESS) {
    mapped = true;
    r = static_cast<CUresult>(set_device_access(va, page_size, device));
  }
  if (r != CUDA_SUCCESS) {
    if (mapped) {
      api->cuMemUnmap_(va, page_size);
    }
    if (reserved) {
      api->cuMemAddressFree_(va, page_size);
    }
    api->cuMemRelease_(h);
    host_release(page_size);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      return false;
    }
    C10_CUDA_DRIVER_CHECK(r);
  }
  out->handle = h;
  out->mapped_at = va;
  return true;
}

void destroy_host_page(size_t page_size, const HostPage& hp) {
  auto* api = c10::cuda::DriverAPI::get();
  C10_CUDA_DRIVER_CHECK(api->cuMemUnmap_(hp.mapped_at, page_size));
  C10_CUDA_DRIVER_CHECK(api->cuMemAddressFree_(hp.mapped_at, page_size));
  C10_CUDA_DRIVER_CHECK(api->cuMemRelease_(hp.handle));
}
#else // LMS cannot be enabled here (supported())
bool make_host_page(int, size_t, HostPage*) {
  return false;
}
void destroy_host_page(size_t, const HostPage&) {}
#endif

void filler_loop() {
  auto& p = host_pool();
  std::unique_lock<std::mutex> lk(p.m);
  int current_device = -1;
  while (!p.stop) {
    const bool want = p.fill_target > 0 && p.paused == 0 &&
        idle_bytes_of(p, p.fill_device, p.fill_page) < p.fill_target;
    if (!want) {
      p.wake.wait(lk);
      continue;
    }
    const int device = p.fill_device;
    const size_t page_size = p.fill_page;
    lk.unlock();
    HostPage hp;
    bool made = false;
    try {
      if (device != current_device) {
        C10_CUDA_CHECK(cudaSetDevice(device));
        current_device = device;
      }
      made = make_host_page(device, page_size, &hp);
    } catch (const std::exception& e) {
      TORCH_WARN(
          "Large Model Support stopped making host pages ahead of need: ",
          e.what());
    }
    lk.lock();
    if (!made) {
      p.fill_target = 0; // budget or host exhausted: wait for the next prefill
      continue;
    }
    p.idle[{device, page_size}].push_back(hp.handle);
    p.mapped_at[hp.handle] = hp.mapped_at;
    p.idle_bytes += page_size;
    p.total_bytes += page_size;
    p.made_ahead_bytes += page_size;
  }
}

void stop_filler() {
  auto& p = host_pool();
  if (p.filler_pid != getpid()) {
    return; // exit() in a forked child: the thread was never there
  }
  {
    std::lock_guard<std::mutex> g(p.m);
    p.stop = true;
  }
  p.wake.notify_all();
  if (p.filler.joinable()) {
    p.filler.join();
  }
}

} // namespace

bool host_page_acquire(
    int device,
    size_t page_size,
    unsigned long long* handle,
    unsigned long long* mapped_at) {
  auto& p = host_pool();
  {
    std::lock_guard<std::mutex> g(p.m);
    auto& v = p.idle[{device, page_size}];
    if (!v.empty()) {
      *handle = v.back();
      *mapped_at = p.mapped_at.at(*handle);
      v.pop_back();
      p.idle_bytes -= page_size;
      p.wake.notify_all(); // below the reserve now: the filler tops it up
      return true;
    }
  }
  HostPage hp;
  if (!make_host_page(device, page_size, &hp)) {
    return false;
  }
  std::lock_guard<std::mutex> g(p.m);
  p.mapped_at[hp.handle] = hp.mapped_at;
  p.total_bytes += page_size;
  p.made_on_demand_bytes += page_size;
  *handle = hp.handle;
  *mapped_at = hp.mapped_at;
  return true;
}

void host_page_release(int device, size_t page_size, unsigned long long handle) {
  auto& p = host_pool();
  std::lock_guard<std::mutex> g(p.m);
  TORCH_INTERNAL_ASSERT(p.mapped_at.count(handle), "LMS: unknown host page");
  p.idle[{device, page_size}].push_back(handle);
  p.idle_bytes += page_size;
}

void host_pool_prefill(int device, size_t page_size, size_t reserve_bytes) {
  size_t want = std::min(reserve_bytes, host_mem_limit() / 2);
  want = want / page_size * page_size;
  auto& p = host_pool();
  {
    std::lock_guard<std::mutex> g(p.m);
    if (want == 0 || p.stop) {
      return;
    }
    p.fill_device = device;
    p.fill_page = page_size;
    p.fill_target = want;
    if (!p.filler.joinable()) {
      p.filler = std::thread(filler_loop);
      p.filler_pid = getpid();
      // joined before CUDA's own exit handlers run (registered earlier)
      std::atexit(stop_filler);
    }
  }
  p.wake.notify_all();
}

void host_pool_pause() {
  auto& p = host_pool();
  std::lock_guard<std::mutex> g(p.m);
  ++p.paused;
}
void host_pool_resume() {
  auto& p = host_pool();
  {
    std::lock_guard<std::mutex> g(p.m);
    --p.paused;
  }
  p.wake.notify_all();
}

size_t host_pool_trim() {
  auto& p = host_pool();
  std::vector<std::pair<size_t, HostPage>> drop;
  size_t freed = 0;
  {
    std::lock_guard<std::mutex> g(p.m);
    p.fill_target = 0;
    for (auto& kv : p.idle) {
      for (unsigned long long h : kv.second) {
        auto it = p.mapped_at.find(h);
        drop.emplace_back(kv.first.second, HostPage{h, it->second});
        p.mapped_at.erase(it);
        freed += kv.first.second;
      }
      kv.second.clear();
    }
    p.idle_bytes -= freed;
    p.total_bytes -= freed;
  }
  for (const auto& d : drop) {
    destroy_host_page(d.first, d.second);
  }
  host_release(freed);
  return freed;
}

std::string host_pool_stats() {
  auto& p = host_pool();
  std::lock_guard<std::mutex> g(p.m);
  std::ostringstream o;
  o << "host_pool.total_bytes=" << p.total_bytes << "\n";
  o << "host_pool.idle_bytes=" << p.idle_bytes << "\n";
  o << "host_pool.reserve_bytes=" << p.fill_target << "\n";
  o << "host_pool.made_ahead_bytes=" << p.made_ahead_bytes << "\n";
  o << "host_pool.made_on_demand_bytes=" << p.made_on_demand_bytes << "\n";
  return o.str();
}

} // namespace c10::cuda::CUDACachingAllocator::lms
