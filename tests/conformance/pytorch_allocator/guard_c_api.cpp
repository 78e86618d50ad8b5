// lms_swap's eviction net (lms-swap/src/lms_swap/lms_swap_guard.cpp) in its
// c10-only mode, with the C API this harness drives over ctypes (driver.py): slots and
// plain blocks allocated through the caching allocator's `allocate`, their device and
// host addresses, and the net's counters.  Compiled into the probe library with the
// guard's folder on the include path; the guard's internals are this file's own.
#ifndef LMS_GUARD_C10_ONLY
#define LMS_GUARD_C10_ONLY 1
#endif
#include "lms_swap_guard.cpp"


namespace {
std::mutex g_api_mu;
std::vector<std::shared_ptr<Slot>> g_slots;  // the harness's slots, by id (null: dropped)
std::vector<c10::DataPtr> g_blocks;          // plain allocations, by id
std::string g_api_err;

// Appends `x` to a registry of the harness and returns its id.
template <class T>
long long keep(std::vector<T>& registry, T x) {
  std::lock_guard<std::mutex> lk(g_api_mu);
  registry.push_back(std::move(x));
  return static_cast<long long>(registry.size()) - 1;
}

// Sets *oom and the error text for an exception of an allocation; returns -1.
long long failed(const std::exception& e, int* oom) {
  std::lock_guard<std::mutex> lk(g_api_mu);
  g_api_err = e.what();
  if (oom != nullptr) *oom = dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr;
  return -1;
}
}  // namespace

extern "C" {

const char* lms_guard_error() { return g_api_err.c_str(); }

// Redirects the allocator's `allocate` (once) and arms or disarms the net. The caching
// allocator must be initialised (c10::cuda::CUDACachingAllocator::init) first.
int lms_guard_arm(int on) {
  try {
    arm_once();
    Guard::get().arm(on != 0);
    return 0;
  } catch (const std::exception& e) { return static_cast<int>(failed(e, nullptr)); }
}

void lms_guard_set_host_budget(long long limit, long long other, long long min_available) {
  Guard::get().set_host_budget(limit, other, min_available);
}

// A slot of `nbytes` on the current device: a storage allocated through the allocator's
// `allocate` (so a failure is the net's to catch), registered with the net as an
// activation kept on the device is. Returns its id, or -1 (*oom = 1 for out of memory).
long long lms_guard_slot_new(unsigned long long nbytes, int* oom) {
  *oom = 0;
  try {
    c10::Storage st(c10::Storage::use_byte_size_t(), static_cast<int64_t>(nbytes),
                    c10::cuda::CUDACachingAllocator::get(), /*resizable=*/false);
    auto s = std::make_shared<Slot>();
    s->dev = std::move(st);
    s->nbytes = static_cast<int64_t>(nbytes);
    s->device = c10::cuda::current_device();
    g_resident++;
    Guard::get().add(s);
    return keep(g_slots, std::move(s));
  } catch (const std::exception& e) { return failed(e, oom); }
}

// The slot's device address while it is resident, else 0.
unsigned long long lms_guard_slot_device(long long id) {
  std::lock_guard<std::mutex> lk(g_api_mu);
  const auto& s = g_slots.at(static_cast<size_t>(id));
  if (!s || s->evicted || !held(s->dev)) return 0;
  return reinterpret_cast<unsigned long long>(bytes_of(s->dev));
}

// The host copy's address once the net evicted the slot, else 0.
unsigned long long lms_guard_slot_host(long long id) {
  std::lock_guard<std::mutex> lk(g_api_mu);
  const auto& s = g_slots.at(static_cast<size_t>(id));
  return (s && s->evicted) ? reinterpret_cast<unsigned long long>(s->host.ptr) : 0;
}

void lms_guard_slot_drop(long long id) {
  std::shared_ptr<Slot> gone;  // destroyed after g_api_mu (it may free device memory)
  std::lock_guard<std::mutex> lk(g_api_mu);
  gone.swap(g_slots.at(static_cast<size_t>(id)));
}

// A plain allocation through the allocator's `allocate` (what a tensor the net does not
// hold would take). Returns its id, or -1 (*oom = 1 for out of memory).
long long lms_guard_block_new(unsigned long long nbytes, int* oom) {
  *oom = 0;
  try {
    return keep(g_blocks, c10::cuda::CUDACachingAllocator::get()->allocate(nbytes));
  } catch (const std::exception& e) { return failed(e, oom); }
}

unsigned long long lms_guard_block_device(long long id) {
  std::lock_guard<std::mutex> lk(g_api_mu);
  return reinterpret_cast<unsigned long long>(g_blocks.at(static_cast<size_t>(id)).get());
}

void lms_guard_block_drop(long long id) {
  c10::DataPtr gone;
  std::lock_guard<std::mutex> lk(g_api_mu);
  gone = std::move(g_blocks.at(static_cast<size_t>(id)));
}

// Maps `nbytes` the way the net maps its host copies (map_populated: faulted in from
// several threads) and returns how many of its pages were not resident right after,
// by mincore(); -1 when the mapping or the query failed.  Unmaps it again.
long long lms_guard_unpopulated_pages(unsigned long long nbytes) {
  void* p = map_populated(static_cast<size_t>(nbytes));
  if (p == nullptr) return -1;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((static_cast<size_t>(nbytes) + page - 1) / page);
  long long missing = -1;
  if (mincore(p, static_cast<size_t>(nbytes), resident.data()) == 0) {
    missing = 0;
    for (unsigned char r : resident) missing += (r & 1) ? 0 : 1;
  }
  munmap(p, static_cast<size_t>(nbytes));
  return missing;
}

// "name=value" lines of the net's counters into buf (NUL-terminated); returns the length
// needed, as snprintf does.
int lms_guard_counters(char* buf, int size) {
  std::string out;
  for (const auto& kv : Guard::get().counters()) {
    out += kv.first;
    out += '=';
    out += std::to_string(kv.second);
    out += '\n';
  }
  out += "allocations_seen=" + std::to_string(g_allocations.load()) + "\n";
  if (buf != nullptr && size > 0) {
    std::snprintf(buf, static_cast<size_t>(size), "%s", out.c_str());
  }
  return static_cast<int>(out.size());
}

}  // extern "C"
