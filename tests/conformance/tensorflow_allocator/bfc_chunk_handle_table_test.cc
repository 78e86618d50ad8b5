// Conformance test of the BFC allocator's chunk handle table
// (patches/tensorflow/src/tensorflow/tsl/framework/bfc_chunk_handle_table.h),
// built into the same program as lms_bfc_allocator_test.cc.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <unistd.h>

#include "tensorflow/tsl/framework/bfc_chunk_handle_table.h"

namespace tsl {
namespace {

// Resident memory of this process (Linux: /proc/self/statm), in bytes.
size_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * static_cast<size_t>(sysconf(_SC_PAGESIZE)) : 0;
}

// A region's table reads "no chunk" (SIZE_MAX) wherever nothing was written,
// keeps what was written when the region grows, and takes host memory only
// for the slots written: here the table of a 32 GiB region (1 GiB of slots)
// grown to 64 GiB, one handle per 64 MiB, stays within a few MiB resident.
// A std::vector filled with SIZE_MAX took all of it, and copied it to grow.
TEST(BfcChunkHandleTable, OnlyWrittenSlotsTakeMemoryAndGrowthKeepsThem) {
  const size_t n = size_t{1} << 27;
  const size_t stride = size_t{1} << 18;  // 64 MiB of region per slot written
  const size_t before = ResidentBytes();
  ASSERT_GT(before, 0u);

  BfcChunkHandleTable t(n);
  EXPECT_EQ(t.size(), n);
  for (size_t i = 0; i < n; i += stride) t.Set(i, i / stride);
  for (size_t i = 0; i < n; i += stride) {
    ASSERT_EQ(t.Get(i), i / stride) << i;
    ASSERT_EQ(t.Get(i + 1), SIZE_MAX) << i + 1;
  }

  t.Resize(2 * n);
  EXPECT_EQ(t.size(), 2 * n);
  t.Resize(n);  // never shrinks
  EXPECT_EQ(t.size(), 2 * n);
  for (size_t i = 0; i < n; i += stride) ASSERT_EQ(t.Get(i), i / stride) << i;
  for (size_t i = n; i < 2 * n; i += stride) ASSERT_EQ(t.Get(i), SIZE_MAX) << i;
  t.Set(2 * n - 1, 7);
  EXPECT_EQ(t.Get(2 * n - 1), 7u);
  t.Set(0, SIZE_MAX);  // what AllocationRegion::erase writes
  EXPECT_EQ(t.Get(0), SIZE_MAX);

  const size_t grown = ResidentBytes() - before;
  EXPECT_LT(grown, size_t{64} << 20)
      << "resident memory grew by " << (grown >> 20) << " MiB for a table of "
      << ((2 * n * sizeof(size_t)) >> 20) << " MiB";

  BfcChunkHandleTable moved(std::move(t));
  EXPECT_EQ(moved.size(), 2 * n);
  EXPECT_EQ(moved.Get(2 * n - 1), 7u);
  EXPECT_EQ(moved.Get(stride), 1u);
}

// The VmFlags of the mapping of exactly 'bytes' (Linux: /proc/self/smaps);
// "" when there is none.
std::string VmFlagsOfMappingOf(size_t bytes) {
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return "";
  char line[512];
  bool in = false;
  std::string flags;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo, hi;
    if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's line
      in = hi - lo == bytes;
    } else if (in && std::strncmp(line, "VmFlags:", 8) == 0) {
      flags = line + 8;
      break;
    }
  }
  std::fclose(f);
  return flags;
}

// The table is address space, not a commitment: its mmap says MAP_NORESERVE
// (VmFlags "nr"), so a large table cannot fail for want of swap under strict
// overcommit, and keeps it when grown.  Sizes are odd so that the mapping is
// found by its size.
TEST(BfcChunkHandleTable, MappedWithoutReservingSwap) {
  const size_t n = 12345679, page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto bytes = [&](size_t slots) {
    return (slots * sizeof(size_t) + page - 1) / page * page;
  };
  BfcChunkHandleTable t(n);
  t.Set(3, 3);
  std::string flags = VmFlagsOfMappingOf(bytes(n));
  ASSERT_FALSE(flags.empty()) << "no mapping of " << bytes(n) << " bytes";
  EXPECT_NE(flags.find(" nr"), std::string::npos) << flags;
  t.Resize(3 * n);
  flags = VmFlagsOfMappingOf(bytes(3 * n));
  ASSERT_FALSE(flags.empty());
  EXPECT_NE(flags.find(" nr"), std::string::npos) << flags;
  EXPECT_EQ(t.Get(3), 3u);
}

}  // namespace
}  // namespace tsl
