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

#ifndef TENSORFLOW_TSL_FRAMEWORK_BFC_CHUNK_HANDLE_TABLE_H_
#define TENSORFLOW_TSL_FRAMEWORK_BFC_CHUNK_HANDLE_TABLE_H_

#include <cstddef>

namespace tsl {

// The chunk handles of one BFC allocation region, one slot per
// kMinAllocationSize (256) bytes of the region, every slot "no chunk starts
// here" (SIZE_MAX) until written.
//
// A std::vector filled with SIZE_MAX costs 1/32 of the region in host memory,
// every byte of it written when the region is made; and growing a coalesced
// region copies the whole table.  Large Model Support grows the pool's one
// coalesced region at each spill that needs fresh addresses, so that cost
// grew with the pool, not with the spill (0.3-0.4 s for 8 GiB of 16 on an
// H100 host, more than the spill's copies).  Here slots hold handle + 1 in
// zero-filled anonymous memory: the kernel backs only the pages a handle was
// written to, and on Linux growing remaps the pages instead of copying them.
// (SIZE_MAX + 1 wraps to 0, so a zero slot reads back as SIZE_MAX.)
class BfcChunkHandleTable {
 public:
  BfcChunkHandleTable() = default;
  // 'n' slots, none written.  Dies when the memory cannot be had, as the
  // std::vector it replaces did.
  explicit BfcChunkHandleTable(size_t n) { Resize(n); }
  ~BfcChunkHandleTable();
  BfcChunkHandleTable(BfcChunkHandleTable&& other) noexcept { Swap(&other); }
  BfcChunkHandleTable& operator=(BfcChunkHandleTable&& other) noexcept {
    Swap(&other);
    return *this;
  }
  BfcChunkHandleTable(const BfcChunkHandleTable&) = delete;
  BfcChunkHandleTable& operator=(const BfcChunkHandleTable&) = delete;

  // Grows to 'n' slots (never shrinks), keeping the slots written so far.
  void Resize(size_t n);
  size_t size() const { return size_; }
  size_t Get(size_t i) const { return slots_[i] - 1; }
  void Set(size_t i, size_t handle) { slots_[i] = handle + 1; }

 private:
  void Swap(BfcChunkHandleTable* other);

  size_t* slots_ = nullptr;  // MappedBytes(size_) of zero-filled memory
  size_t size_ = 0;
};

}  // namespace tsl

#endif  // TENSORFLOW_TSL_FRAMEWORK_BFC_CHUNK_HANDLE_TABLE_H_
