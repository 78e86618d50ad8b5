#pragma once
// Large Model Support (LMS) for the CUDA caching allocator.
//
// LMS lets the caching allocator hand out more memory than the GPU has. It
// implies expandable (VMM-mapped) segments; under pressure (a device mapping
// fails, or device usage would pass the LMS limit) the least recently
// allocated pages of allocated blocks are copied to pooled host-backed VMM
// handles (cuMemCreate on the GPU's host NUMA node) and remapped at the SAME
// virtual address, so kernels keep reading them (over PCIe). Pages come back
// to device memory when room returns. Defragmentation releases free pages of
// partly used segments and remaps physical memory where it is needed instead
// of copying tensors. Whatever the limit, LMS keeps 1/64 of the card (at
// least 256 MiB) free for memory allocated outside the allocator (kernels the
// driver loads lazily, cuBLAS/cuDNN handles, NCCL buffers): a request that
// would map into it moves pages out first (the reserve_reclaims statistic).
//
// This header is new (only additions to libc10_cuda's ABI): no upstream class
// changes layout. Python reaches it through the extern "C" functions below
// (torch/cuda/lms.py loads them with ctypes) and through allocator settings
// keys (PYTORCH_CUDA_ALLOC_CONF / torch.cuda.memory._set_allocator_settings):
//   lms:True|False            enable / disable LMS
//   lms_limit_mb:N            device MiB at which LMS starts reclaiming (0: whole device)
//   lms_size_mb:N             smallest block (MiB, fractional allowed) worth swapping
//   lms_host_mem_limit_mb:N   host swap budget in MiB (env PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB)
//   lms_host_reserve_mb:N     host pages made ahead of need once the device is
//                             3/4 full (default: 1/8 of the LMS limit or of the
//                             device; 0: none)
//   lms_defrag:True|False     release and remap free pages before swapping
//   lms_launch_gate:True|False hold other threads' device work while live pages
//                             move (default True; False leaves CUPTI to profilers)
//   lms_page_mb:N             page of the large-pool segments made while LMS is
//                             on (MiB, a multiple of 2 up to 1024; 0: auto, see
//                             large_page_bytes)
// Off by default; with LMS off the allocator behaves exactly as upstream.

#include <c10/cuda/CUDAMacros.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace c10::cuda::CUDACachingAllocator::lms {

// ---- settings (process wide) ----
C10_CUDA_API bool enabled();
C10_CUDA_API void set_enabled(bool on);
C10_CUDA_API size_t limit(); // 0: no limit below the device size
C10_CUDA_API void set_limit(size_t bytes);
C10_CUDA_API size_t min_swap_size();
C10_CUDA_API void set_min_swap_size(size_t bytes);
C10_CUDA_API bool defrag_enabled();
C10_CUDA_API void set_defrag_enabled(bool on);
C10_CUDA_API size_t host_mem_limit();
C10_CUDA_API void set_host_mem_limit(size_t bytes);
// host pages the pool makes ahead of need (impl/LMSHostPool.cpp);
// kAutoHostReserve: none until LMS moves something, then as many as LMS has
// held on the host, at most 1/8 of the device memory LMS may use
constexpr size_t kAutoHostReserve = ~size_t(0);
C10_CUDA_API size_t host_reserve_setting();
C10_CUDA_API void set_host_reserve(size_t bytes);
// The large pool's page while LMS is on. A spill or a return pays the
// driver's remap (cuMemSetAccess of the new mapping) once per page, whatever
// its size: at 20 MiB that work outlasts the copy itself, at 64 MiB the copy
// sets the speed. Larger pages also mean more neighbouring data moves with a
// victim and memory is mapped in larger steps. set_large_page: 0 is auto.
C10_CUDA_API size_t large_page_setting();
C10_CUDA_API void set_large_page(size_t bytes);
// The page a new large-pool segment of `device` gets: the setting; else,
// with `grow`, the largest power of two of at most 1/256 of the device's
// memory, at most 64 MiB and never below the tag's own page
// (`upstream_page`); else `upstream_page`. Recorded for the stats
// (page_bytes.large).
C10_CUDA_API size_t large_page_bytes(int device, size_t upstream_page, bool grow);
// False where LMS cannot work: built without the CUDA driver API, or a driver
// older than CUDA 12.2 (host VMM allocations). True without any driver.
C10_CUDA_API bool supported();
// Lets `device` read and write the mapping [va, va + size) (cuMemSetAccess);
// returns the CUresult. Every mapping LMS makes itself is opened this way.
C10_CUDA_API int set_device_access(
    unsigned long long va,
    size_t size,
    int device);
// Maps handle `to` at [va, va + size) in place of `from`, which is mapped
// there now, and opens it to `devices` (n of them). Returns 0 (CUDA_SUCCESS),
// or the failing call's CUresult with `from` mapped there again and opened
// as before: a page of live data is never left unmapped (a kernel touching
// it would kill the context). Throws only if putting `from` back fails too.
// PYTORCH_LMS_TEST_FAIL_REMAP=N (tests) fails the Nth call of the process
// after its unmap, as an out-of-memory cuMemMap would.
C10_CUDA_API int remap_page(
    unsigned long long va,
    size_t size,
    unsigned long long from,
    unsigned long long to,
    const int* devices,
    size_t n);

// Parses one "lms..." option of an allocator settings string starting at
// config[i] (the key). Returns true and sets *last to the index of the last
// consumed token when the key is an LMS key; false otherwise.
C10_CUDA_API bool parse_setting(
    const std::vector<std::string>& config,
    size_t i,
    size_t* last);

// ---- the launch gate (impl/LMSLaunchGate.cpp) ----
// While a QuietDevice lives, no other thread of the process submits device
// work (its kernel launches, copies and memsets wait at entry; CUPTI API
// callbacks), and work queued before has finished (device synchronize). LMS
// moves pages of live blocks only inside one. Without the gate (CUPTI missing
// or held by another tool, or lms_launch_gate:False) only the synchronize
// holds. start: subscribes once, false when it cannot (launch_gate_stats
// says why). Set it once, before the program's threads run: turning the gate
// off and on again while other threads are inside CUDA calls loses their
// exits, and the next close would wait for them.
C10_CUDA_API bool launch_gate_start();
C10_CUDA_API void launch_gate_stop();
C10_CUDA_API bool launch_gate_active();
C10_CUDA_API std::string launch_gate_stats();
class C10_CUDA_API QuietDevice {
 public:
  explicit QuietDevice(int device);
  ~QuietDevice();
  QuietDevice(const QuietDevice&) = delete;
  QuietDevice& operator=(const QuietDevice&) = delete;

 private:
  bool gated_ = false;
};

// ---- host budget shared by the allocator's host handles and Python's
// activation swapping (torch/cuda/lms.py _host_reserve/_host_release) ----
C10_CUDA_API bool host_reserve(size_t bytes);
C10_CUDA_API void host_release(size_t bytes);
C10_CUDA_API size_t host_used();

// ---- statistics, per device ----
enum Stat : int {
  kSwapOutBytes = 0,
  kSwapOutPages,
  kSwapInBytes,
  kSwapInPages,
  kHostBytes, // bytes of this device's pages that live in host memory now
  kReclaimEvents,
  kAllocFreeList,
  kAllocNewDevice,
  kAllocLmsReclaim,
  kAllocDefrag,
  kSwapOutNs,
  kSwapInNs,
  kHostPagesDropped, // host pages released because their blocks were freed
  kDefragReleasedBytes,
  kOoms,
  kSwapOutQuiesceNs, // of kSwapOutNs: closing the gate, device synchronize
  kSwapOutCopyWaitNs, // of kSwapOutNs: waiting for copies (the rest: remaps)
  kReturnsHeld, // returns after frees held back: too little room to keep them
  kLimitSpills, // requests that mapped past the LMS limit and spilled after the fact
  kLimitSpillBytes, // bytes those spills moved out
  kReserveReclaims, // requests that moved pages out to keep the foreign reserve free
  kNumStats
};
C10_CUDA_API const char* stat_name(int s);
C10_CUDA_API void stat_add(int device, int s, int64_t v);
C10_CUDA_API int64_t stat_get(int device, int s);
C10_CUDA_API int64_t host_bytes_peak(int device);
C10_CUDA_API void reset_peak(int device);
C10_CUDA_API void reset_accumulated(int device);
// "key=value\n" lines of the lms.* statistics of device (without "lms." prefix)
C10_CUDA_API std::string stats_text(int device);

// ---- pool of host-backed VMM pages (impl/LMSHostPool.cpp) ----
// Every pooled page keeps a mapping of its own that its device may read and
// write (*mapped_at): the allocator copies a device page straight into it.
// acquire: a pooled page of page_size bytes, or a new one charged to the host
// budget; false when the budget or the host is exhausted.
C10_CUDA_API bool host_page_acquire(
    int device,
    size_t page_size,
    unsigned long long* handle,
    unsigned long long* mapped_at);
C10_CUDA_API void host_page_release(
    int device,
    size_t page_size,
    unsigned long long handle);
// Asks the pool's filler thread to keep reserve_bytes of idle pages of
// page_size ready for device (at most half the host budget), made in the
// background.
C10_CUDA_API void host_pool_prefill(
    int device,
    size_t page_size,
    size_t reserve_bytes);
// While a spill runs the filler makes no driver calls (they would contend).
C10_CUDA_API void host_pool_pause();
C10_CUDA_API void host_pool_resume();
// Releases every idle pooled page and stops filling until the next prefill;
// returns bytes given back to the host.
C10_CUDA_API size_t host_pool_trim();
// "host_pool.<key>=<value>\n" lines for stats_text
C10_CUDA_API std::string host_pool_stats();

} // namespace c10::cuda::CUDACachingAllocator::lms

// ---- C API for ctypes (torch/cuda/lms.py) ----
extern "C" {
C10_CUDA_API int c10_lms_abi_version();
C10_CUDA_API int c10_lms_supported();
C10_CUDA_API void c10_lms_set_enabled(int on);
C10_CUDA_API int c10_lms_get_enabled();
C10_CUDA_API void c10_lms_set_limit(unsigned long long bytes);
C10_CUDA_API unsigned long long c10_lms_get_limit();
C10_CUDA_API void c10_lms_set_size(unsigned long long bytes);
C10_CUDA_API unsigned long long c10_lms_get_size();
C10_CUDA_API void c10_lms_set_host_mem_limit(unsigned long long bytes);
C10_CUDA_API unsigned long long c10_lms_get_host_mem_limit();
C10_CUDA_API void c10_lms_set_defrag(int on);
C10_CUDA_API int c10_lms_get_defrag();
C10_CUDA_API int c10_lms_host_reserve(unsigned long long bytes);
C10_CUDA_API void c10_lms_host_release(unsigned long long bytes);
C10_CUDA_API unsigned long long c10_lms_host_used();
// writes the stats text of device into buf (NUL-terminated, truncated to
// cap); returns the full length needed without the NUL.
C10_CUDA_API unsigned long long c10_lms_stats(
    int device,
    char* buf,
    unsigned long long cap);
C10_CUDA_API void c10_lms_reset_peak_stats(int device);
C10_CUDA_API void c10_lms_reset_accumulated_stats(int device);
// The host budget's default for these values of
// PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB and LOCAL_WORLD_SIZE (NULL: unset) on a
// host of host_bytes (the rule of impl/LMSHostBudget.h; the allocator applies
// it to MemAvailable). 0 and *bytes on success; -1 with the error in err (cap
// bytes) for a limit that is not a finite number >= 0. Never throws.
C10_CUDA_API int c10_lms_host_budget_rule(
    const char* limit_mb,
    const char* local_world_size,
    unsigned long long host_bytes,
    unsigned long long* bytes,
    char* err,
    unsigned long long cap);
// Parses an allocator settings string that holds only lms keys; 0 on
// success, else writes the error to err (cap bytes) and returns -1.
C10_CUDA_API int c10_lms_parse_settings(
    const char* settings,
    char* err,
    unsigned long long cap);
}
