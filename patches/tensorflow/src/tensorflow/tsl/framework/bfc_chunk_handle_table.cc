/* Copyright 2026 The LMS Project Authors. All Rights Reserved.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
==============================================================================*/

#include "tensorflow/tsl/framework/bfc_chunk_handle_table.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "tensorflow/tsl/platform/logging.h"

namespace tsl {
namespace {

// The memory that holds 'n' slots: whole host pages.
size_t MappedBytes(size_t n) {
#if defined(__linux__)
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
#else
  constexpr size_t page = 4096;
#endif
  return (n * sizeof(size_t) + page - 1) / page * page;
}

// Zero-filled memory of 'bytes' that starts with the 'old_bytes' at 'old'
// (nullptr: none) and replaces them; nullptr (and 'old' kept) on failure.
void* GrowZeroed(void* old, size_t old_bytes, size_t bytes) {
#if defined(__linux__)
  // Fresh anonymous pages read as zero and take no memory until written;
  // mremap moves the old pages instead of copying them (and keeps
  // MAP_NORESERVE: the table is address space, 1/32 of the region's, not a
  // commitment that strict overcommit would have to reserve swap for).
  void* p = old == nullptr ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                                  -1, 0)
                           : mremap(old, old_bytes, bytes, MREMAP_MAYMOVE);
  return p == MAP_FAILED ? nullptr : p;
#else
  void* p = std::calloc(bytes, 1);
  if (p != nullptr && old != nullptr) {
    std::memcpy(p, old, old_bytes);
    std::free(old);
  }
  return p;
#endif
}

void FreeZeroed(void* p, size_t bytes) {
  if (p == nullptr) return;
#if defined(__linux__)
  munmap(p, bytes);
#else
  std::free(p);
#endif
}

}  // namespace

BfcChunkHandleTable::~BfcChunkHandleTable() {
  FreeZeroed(slots_, MappedBytes(size_));
}

void BfcChunkHandleTable::Resize(size_t n) {
  if (n <= size_) return;
  const size_t old_bytes = MappedBytes(size_);
  const size_t bytes = MappedBytes(n);
  if (bytes > old_bytes) {
    void* p = GrowZeroed(slots_, old_bytes, bytes);
    CHECK(p != nullptr) << "BFC allocator: no host memory for the chunk "
                           "handles of a region of "
                        << (n >> 12) << " MiB (" << bytes << " bytes)";
    slots_ = static_cast<size_t*>(p);
  }
  size_ = n;
}

void BfcChunkHandleTable::Swap(BfcChunkHandleTable* other) {
  std::swap(slots_, other->slots_);
  std::swap(size_, other->size_);
}

}  // namespace tsl
