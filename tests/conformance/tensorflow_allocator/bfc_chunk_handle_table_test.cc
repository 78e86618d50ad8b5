// Conformance test of the BFC allocator's chunk handle table
// (patches/tensorflow/src/tensorflow/tsl/framework/bfc_chunk_handle_table.h),
// built into the same program as lms_bfc_allocator_test.cc.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
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

// The mappings of this process (Linux: /proc/self/smaps) of at least
// 'min_bytes': "lo-hi" -> VmFlags.
std::map<std::string, std::string> BigMappings(size_t min_bytes) {
  std::map<std::string, std::string> out;
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return out;
  char line[512];
  std::string range;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo, hi;
    if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's line
      range = hi - lo >= min_bytes ? std::string(line, std::strchr(line, ' '))
                                   : std::string();
    } else if (!range.empty() && std::strncmp(line, "VmFlags:", 8) == 0) {
      out[range] = line + 8;
    }
  }
  std::fclose(f);
  return out;
}

// The mappings that 'after' has and 'before' had not (new or grown ones).
std::map<std::string, std::string> Added(
    const std::map<std::string, std::string>& before,
    const std::map<std::string, std::string>& after) {
  std::map<std::string, std::string> out;
  for (const auto& m : after) {
    if (before.count(m.first) == 0) out.insert(m);
  }
  return out;
}

// The table is address space, not a commitment: its mmap says MAP_NORESERVE
// (VmFlags "nr"), so a large table cannot fail for want of swap under strict
// overcommit, and keeps it when grown.  The table's mapping is told apart as
// the one of its size or more that appears (the kernel may merge it with a
// neighbour of the same flags).
TEST(BfcChunkHandleTable, MappedWithoutReservingSwap) {
  const size_t n = 12345679;  // 94 MiB of slots
  const size_t bytes = n * sizeof(size_t);
  auto before = BigMappings(bytes);
  BfcChunkHandleTable t(n);
  t.Set(3, 3);
  auto added = Added(before, BigMappings(bytes));
  ASSERT_FALSE(added.empty()) << "no new mapping of " << bytes << " bytes";
  for (const auto& m : added) {
    EXPECT_NE(m.second.find(" nr"), std::string::npos) << m.first << m.second;
  }
  before = BigMappings(3 * bytes);
  t.Resize(3 * n);
  added = Added(before, BigMappings(3 * bytes));
  ASSERT_FALSE(added.empty());
  for (const auto& m : added) {
    EXPECT_NE(m.second.find(" nr"), std::string::npos) << m.first << m.second;
  }
  EXPECT_EQ(t.Get(3), 3u);
}

}  // namespace
}  // namespace tsl
