// The activation layer's net under the CUDA caching allocator (compiled into the lms-swap wheel
// by lms-swap/setup.py, else on first use by guard.py with torch.utils.cpp_extension; any
// PyTorch >= 2.4).
//
// lms_swap decides from a forecast which saved activations go to host memory.  A wrong
// forecast must cost speed, never the job.  Every saved activation the policy keeps on
// the device is registered here as a Slot.  When the caching allocator cannot serve a
// request (it has already released its cache and raises OutOfMemoryError), the net
// copies slots to host memory, earliest saved first (backward needs them last), frees
// their device memory, and asks the allocator again, until the request is served or no
// slot is left to move; only then does the error reach the program.  lms_swap brings an
// evicted slot back when backward unpacks it.
//
// The net is one translation unit: this file and the headers it includes, one part of the
// net each (what they define has internal linkage, as when the net was one file):
//   lms_swap_guard_slot.h      a slot (one saved tensor the net may evict) and the host
//                              memory of its copy
//   lms_swap_guard_eviction.h  the registry of slots, their eviction when an allocation
//                              fails, the host budget of the copies, the net's counters
//   lms_swap_guard_hook.h      the allocator's `allocate`, redirected to the net
//   lms_swap_guard_peak.h      a per-device running peak of requested device bytes and a
//                              count of the segments the allocator released
//   lms_swap_guard_attach.h    how the net is put under the allocator (arm_once)
//   this file                  the Python module over them
// Each says which invariants it keeps.  Every build compiles this file alone, with the
// headers beside it (lms-swap's package data; torch/cuda/ in a PyTorch tree).
//
// The module's own invariants: nothing in it waits for the net's mu_ while it holds the
// GIL (every call that may is made under gil_scoped_release), and no tensor the net holds
// has a Python object.
//
// Built with LMS_GUARD_C10_ONLY, the same net compiles against c10 alone (no ATen, no
// Python): a slot then holds a c10::Storage.  The allocator's conformance harness
// includes this file so (tests/conformance/pytorch_allocator/guard_c_api.cpp) and runs
// the net over the caching allocator of a patched build, whose own LMS acts first.
//
// What the whole net includes, in the order it has always been compiled with (each part
// includes what it uses as well).
#ifdef LMS_GUARD_C10_ONLY
#include <c10/core/Storage.h>
#else
#include <torch/extension.h>
#endif

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

// the net's parts, in this order (each includes what it needs of those before it)
#include "lms_swap_guard_slot.h"
#include "lms_swap_guard_eviction.h"
#include "lms_swap_guard_hook.h"
#include "lms_swap_guard_peak.h"
#include "lms_swap_guard_attach.h"

#ifndef LMS_GUARD_C10_ONLY
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "lms_swap's eviction net under the CUDA caching allocator";
  py::class_<Slot, std::shared_ptr<Slot>>(m, "Slot")
      .def(py::init([](const at::Tensor& t) {
             TORCH_CHECK(t.is_cuda(), "Slot: a CUDA tensor");
             auto s = std::make_shared<Slot>();
             // an alias with no autograd history and no Python object: detach()
             // would be a view that keeps `t` (and so the storage) alive, and
             // destroying a tensor with a Python object needs the GIL
             s->dev = t.variable_data();
             s->nbytes = static_cast<int64_t>(t.numel()) * t.element_size();
             s->device = t.get_device();
             // the stream current now (the one `t` was written on, or ordered after
             // it) is not the one an eviction copies on: remember where it stands
             {
               c10::cuda::CUDAGuard on(t.device());
               cudaEvent_t ev = nullptr;
               if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess &&
                   cudaEventRecord(ev, c10::cuda::getCurrentCUDAStream(s->device).stream()) ==
                       cudaSuccess) {
                 s->ready = ev;
               } else {
                 (void)cudaGetLastError();
                 if (ev != nullptr) (void)cudaEventDestroy(ev);
                 s->order_by_device = true;
               }
             }
             g_resident++;
             {
               py::gil_scoped_release nogil;  // mu_ (see the invariants)
               Guard::get().add(s);
             }
             return s;
           }),
           "keep `t` (dense: its bytes are [data_ptr, data_ptr + nbytes)) evictable")
      .def_property_readonly("evicted", [](const Slot& s) { return s.evicted.load(); })
      .def_property_readonly("nbytes", [](const Slot& s) { return s.nbytes; })
      .def_property_readonly("owners", [](const Slot& s) -> int64_t {
             // owners of the storage (1: only this slot; what the net requires to evict)
             py::gil_scoped_release nogil;  // mu_ may be held by an eviction's commit
             return Guard::get().owners(s);
           })
      .def("device_tensor", [](const Slot& s) -> py::object {
             Resident r;
             {
               py::gil_scoped_release nogil;
               r = Guard::get().resident_of(s);
             }
             if (!r.defined()) return py::none();
             return py::cast(r.variable_data());  // s.dev stays Python-free
           })
      .def("host_bytes", [](std::shared_ptr<Slot> s) -> py::object {
             // a uint8 CPU tensor over the evicted bytes; keeps the slot alive
             if (!s->evicted.load(std::memory_order_acquire)) return py::none();
             auto keep = s;
             auto t = torch::from_blob(
                 s->host.ptr, {s->nbytes}, [keep](void*) {},
                 torch::TensorOptions().dtype(torch::kUInt8));
             return py::cast(t);
           });
  m.def("arm", [](bool on) {
    // the caching allocator creates its per-device parts at CUDA's lazy init; a trace
    // tracker attached before that reaches none of them
    py::module_::import("torch.cuda").attr("init")();
    arm_once();
    Guard::get().arm(on);
  });
  m.def("armed", []() { return Guard::get().armed(); });
  m.def("set_host_budget", [](int64_t limit, int64_t other, int64_t min_available) {
    Guard::get().set_host_budget(limit, other, min_available);
  });
  m.def("host_bytes", []() { return g_host_bytes.load(); });
  m.def("offer", [](int64_t id, uintptr_t ptr, int64_t size, int device) {
    Guard::get().offer(id, reinterpret_cast<void*>(ptr), size, device);
  }, "the pool's idle chunk `id` at [ptr, ptr+size), pinned on `device` (-1: not pinned) "
     "is the net's to give back until withdrawn");
  m.def("withdraw", [](int64_t id) { return Guard::get().withdraw(id); },
        "True: chunk `id` is the pool's again; False: the net gave it back");
  m.def("take_discarded", []() { return Guard::get().take_discarded(); },
        "ids of the offered chunks the net gave back since the last call");
  m.def("add_releasing", [](int64_t delta) { Guard::get().add_releasing(delta); },
        "host bytes the pool's releaser is giving back (counted under the limit)");
  m.def("evicted_bytes", []() { return Guard::get().evicted_bytes(); },
        "bytes evicted since the process began (cheap: one atomic read)");
  m.def("evict", [](int device, int64_t need) {
    py::gil_scoped_release nogil;
    return Guard::get().evict(device, need);
  }, "evict slots of `device` until `need` bytes were freed (tests and diagnostics)");
  m.def("mark_peak", [](int device) {
    TORCH_CHECK(device >= 0 && device < kMaxDevices, "mark_peak: bad device ", device);
    const int64_t now = g_level[device].load();
    g_mark[device] = now;
    g_peak[device] = now;
  }, "start a new running peak on `device` at its current level (the net must be armed)");
  m.def("peak_growth", [](int device) -> int64_t {
    TORCH_CHECK(device >= 0 && device < kMaxDevices, "peak_growth: bad device ", device);
    return std::max<int64_t>(0, g_peak[device].load() - g_mark[device].load());
  }, "requested bytes on `device` at their highest since mark_peak, less those at the mark");
  m.def("released", [](int device) -> int64_t {
    TORCH_CHECK(device >= 0 && device < kMaxDevices, "released: bad device ", device);
    return g_released[device].load();
  }, "segments the allocator released on `device` since the net was armed");
  m.def("stats", []() {
    py::dict d;
    std::vector<std::pair<const char*, int64_t>> counters;
    {
      py::gil_scoped_release nogil;
      counters = Guard::get().counters();
    }
    for (const auto& kv : counters) {
      if (std::strcmp(kv.first, "armed") == 0) {
        d[kv.first] = kv.second != 0;
      } else {
        d[kv.first] = kv.second;
      }
    }
    d["allocations_seen"] = g_allocations.load();
    return d;
  });
}
#endif
