#pragma once
// The pluggable LMS allocator, one per GPU (lms_pluggable_allocator.cpp): the
// calls lms_pluggable_module.cpp connects to PyTorch. Every call takes the
// device's mutex.
#include "lms_pluggable_map_costs.h"

#include <cuda_runtime_api.h>

#include <cstddef>

namespace lms_pluggable {

struct Counters {
  size_t allocated = 0; // bytes asked for by live allocations
  size_t peak_allocated = 0;
  size_t reserved = 0; // bytes of all segments, on the device or on host
  size_t device_reserved = 0; // of those, on the device
  size_t peak_device_reserved = 0; // since the last reset_peak
  size_t segments = 0;
  size_t device_allocated = 0; // allocated, less the pages LMS moved to host
  size_t peak_device_allocated = 0; // since the last reset_peak
  size_t cached_free = 0;
  size_t live = 0; // allocations not yet freed
  MapCosts mapping; // what the cache's own maps, unmaps and releases cost
};

// Every call but malloc leaves a GPU alone that this process never allocated
// on (no CUDA context is made there by asking).
int devices();
// `size` bytes for use on `stream`; raises c10::OutOfMemoryError (with LMS's
// report when it is on) where they cannot be had.
void* malloc(int device, size_t size, cudaStream_t stream);
void free(int device, void* ptr);
// false where ptr is not a live allocation of this device
bool record_stream(int device, void* ptr, cudaStream_t stream);
// Host pages come back where there is room; segments without an allocated
// block go back to the driver.
void empty_cache(int device);
Counters counters(int device);
void reset_peak(int device);
// A running peak apart from the program's: mark_peak sets it to the allocated
// bytes now; peak_growth is the highest allocated since, less that level.
void mark_peak(int device);
size_t peak_growth(int device);
// How many times segments or spans of pages went back to the driver (to serve
// a request, or at empty_cache): each such release waits for the device.
size_t released(int device);

} // namespace lms_pluggable
