// Conformance tests of Large Model Support in TensorFlow's BFC allocator
// (patches/tensorflow/src/tensorflow/tsl/framework/bfc_allocator_lms.cc).
// Built with the patched allocator translation units of the v2.14.1 tree
// against the official wheel's headers and libtensorflow_framework.so.2, on
// the CPU (memfd page backend) and on a GPU (CUDA VMM page backend): see
// build_tools/verify/tf_allocator.
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "lms_test_support.h"
#include "tensorflow/tsl/framework/bfc_allocator.h"
#include "tensorflow/tsl/framework/lms_sub_allocator.h"
#include "tensorflow/tsl/platform/logging.h"
#include "tensorflow/tsl/platform/strcat.h"

namespace tsl {
namespace {

using PageState = LmsVirtualMemSubAllocator::PageState;

struct Fixture {
  LmsVirtualMemSubAllocator* sub = nullptr;  // owned by 'bfc'
  std::unique_ptr<BFCAllocator> bfc;
};

Fixture Make(size_t device, size_t host, bool lms, bool defrag,
             bool allow_growth = true, bool garbage_collection = false,
             size_t host_reserve = LmsVirtualMemSubAllocator::kHostReserveAuto) {
  const size_t va = 8 * device + 2 * host;
  auto sub = lms_test::MakeLmsSubAllocator(va, device, host, host_reserve);
  CHECK(sub != nullptr);
  Fixture f;
  f.sub = sub.get();
  BFCAllocator::Options o;
  o.allow_growth = allow_growth;
  o.allow_retry_on_failure = false;
  o.garbage_collection = garbage_collection;
  o.lms_enabled = lms;
  o.lms_defrag_enabled = defrag;
  // With LMS the pool is virtual: its limit is the address range; the device
  // budget is enforced by the page-mapped sub-allocator.
  f.bfc = std::make_unique<BFCAllocator>(std::move(sub), lms ? va : device,
                                         "lms_test", o);
  return f;
}

size_t Mismatches(void* p, size_t n, uint32_t seed) {
  return lms_test::CountMismatches(p, n, seed);
}

// Parameters: allow_growth (TF's GPU default is false), garbage_collection
// (TF's GPU default is true: TF_ENABLE_GPU_GARBAGE_COLLECTION).
class LmsOversubscription
    : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

// 2x the device budget, 16 allocations of 1/8 of it, served with LMS.
TEST_P(LmsOversubscription, TwiceTheDeviceServedWithLmsBytesIntact) {
  const size_t D = lms_test::DeviceBudget();
  const bool allow_growth = std::get<0>(GetParam());
  const bool gc = std::get<1>(GetParam());
  Fixture f = Make(D, 2 * D, /*lms=*/true, /*defrag=*/false, allow_growth, gc);
  ASSERT_TRUE(f.bfc->lms_enabled());
  const size_t kChunk = D / 8;
  std::vector<void*> ptrs;
  for (int i = 0; i < 16; ++i) {
    void* p = f.bfc->AllocateRaw(64, kChunk);
    ASSERT_NE(p, nullptr) << "allocation " << i << ": " << f.bfc->LmsLastError();
    lms_test::Fill(p, kChunk, 1000 + i);
    ptrs.push_back(p);
  }
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(Mismatches(ptrs[i], kChunk, 1000 + i), 0u) << "allocation " << i;
  }
  LmsStats ls = f.bfc->GetLmsStats();
  LOG(INFO) << "after 2x allocation:\n" << ls.DebugString();
  EXPECT_LE(ls.device_bytes_mapped, static_cast<int64_t>(D));
  EXPECT_LE(ls.device_bytes_reserved, static_cast<int64_t>(D));
  EXPECT_GE(ls.host_bytes_in_use + ls.device_bytes_mapped,
            static_cast<int64_t>(2 * D));
  EXPECT_GE(ls.bytes_swapped_out, static_cast<int64_t>(D) - ls.page_bytes * 2);
  EXPECT_GE(ls.num_reclaims, 1);
  EXPECT_EQ(ls.num_failures, 0);
  // The oldest allocation was the first victim (LRU).
  EXPECT_EQ(f.sub->StateOf(ptrs[0]), PageState::kHost);
  EXPECT_EQ(f.sub->StateOf(ptrs[15]), PageState::kDevice);

  absl::optional<AllocatorStats> st = f.bfc->GetStats();
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->bytes_in_use, static_cast<int64_t>(2 * D));
  EXPECT_EQ(st->peak_bytes_in_use, static_cast<int64_t>(2 * D));
  EXPECT_EQ(st->num_allocs, 16);
  EXPECT_EQ(st->largest_alloc_size, static_cast<int64_t>(kChunk));
  EXPECT_EQ(*st->bytes_limit, static_cast<int64_t>(D));

  // Free the 8 newest: the device pages they free bring the spilled back.
  for (int i = 15; i >= 8; --i) {
    EXPECT_EQ(Mismatches(ptrs[i], kChunk, 1000 + i), 0u);
    f.bfc->DeallocateRaw(ptrs[i]);
  }
  ls = f.bfc->GetLmsStats();
  LOG(INFO) << "after freeing half:\n" << ls.DebugString();
  EXPECT_GE(ls.bytes_swapped_in, static_cast<int64_t>(D) - ls.page_bytes * 2);
  EXPECT_EQ(ls.host_bytes_in_use, 0);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(f.sub->StateOf(ptrs[i]), PageState::kDevice) << i;
    EXPECT_EQ(Mismatches(ptrs[i], kChunk, 1000 + i), 0u) << "allocation " << i;
    f.bfc->DeallocateRaw(ptrs[i]);
  }
  EXPECT_EQ(f.bfc->GetStats()->bytes_in_use, 0);
}

INSTANTIATE_TEST_SUITE_P(AllowGrowthAndGc, LmsOversubscription,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Bool()));

// Same allocator and sub-allocator without LMS: the device budget is a hard
// limit and the request for 2x is refused.
TEST(LmsBfc, TwiceTheDeviceRefusedWithoutLms) {
  const size_t D = lms_test::DeviceBudget();
  Fixture f = Make(D, 2 * D, /*lms=*/false, /*defrag=*/false);
  ASSERT_FALSE(f.bfc->lms_enabled());
  const size_t kChunk = D / 8;
  std::vector<void*> ptrs;
  size_t served = 0;
  for (int i = 0; i < 16; ++i) {
    void* p = f.bfc->AllocateRaw(64, kChunk);
    if (p == nullptr) break;
    lms_test::Fill(p, kChunk, i);
    ptrs.push_back(p);
    served += kChunk;
  }
  LOG(INFO) << "without LMS served " << served << " of " << 2 * D;
  EXPECT_LE(served, D);
  EXPECT_LT(ptrs.size(), 16u);
  for (size_t i = 0; i < ptrs.size(); ++i) {
    EXPECT_EQ(Mismatches(ptrs[i], kChunk, i), 0u);
    f.bfc->DeallocateRaw(ptrs[i]);
  }
}

// Allocates two blocks of 'half' bytes, 'a' filled with seed 1, 'b' with 2;
// 'b_seconds': how long b's allocation took (a new region, nothing spilled).
void TwoHalves(Fixture* f, size_t half, void** a, void** b,
               double* b_seconds = nullptr) {
  *a = f->bfc->AllocateRaw(64, half);
  const auto t0 = std::chrono::steady_clock::now();
  *b = f->bfc->AllocateRaw(64, half);
  if (b_seconds != nullptr) {
    *b_seconds = std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - t0)
                     .count();
  }
  ASSERT_NE(*a, nullptr);
  ASSERT_NE(*b, nullptr);
  lms_test::Fill(*a, half, 1);
  lms_test::Fill(*b, half, 2);
}

// Waits until the filler made 'bytes' of host pages ahead; false after 60 s.
bool WaitMadeAhead(Fixture* f, int64_t bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  while (f->bfc->GetLmsStats().host_bytes_made_ahead < bytes) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Once 3/4 of the device budget is in use, host pages are made ahead of need
// (off the allocator's lock), a spill takes them instead of making its own,
// and made-ahead pages never take the host budget past its limit.
TEST(LmsBfc, HostPagesMadeAheadWithinTheHostBudget) {
  const size_t D = lms_test::DeviceBudget();
  const size_t half = D / 2;
  {
    // Without growth the pool maps the whole budget at its first
    // allocation: mapped is not in use, nothing is made.
    Fixture g = Make(D, D, true, false, /*allow_growth=*/false, false, half);
    void* p = g.bfc->AllocateRaw(64, 1 << 20);
    ASSERT_NE(p, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const LmsStats s = g.bfc->GetLmsStats();
    EXPECT_GE(s.device_bytes_mapped, static_cast<int64_t>(3 * D / 4));
    EXPECT_EQ(s.host_bytes_reserved, 0);
    g.bfc->DeallocateRaw(p);
  }
  const size_t ps = Make(D, D, true, false).sub->page_size();
  const size_t host = half + 2 * ps;
  Fixture f = Make(D, host, true, false, true, false, /*host_reserve=*/half);
  void* a = f.bfc->AllocateRaw(64, half);
  ASSERT_NE(a, nullptr);
  lms_test::Fill(a, half, 1);
  // Half the budget mapped: nothing is made yet.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(f.bfc->GetLmsStats().host_bytes_reserved, 0);
  void* b = f.bfc->AllocateRaw(64, half);
  ASSERT_NE(b, nullptr);
  lms_test::Fill(b, half, 2);
  ASSERT_TRUE(WaitMadeAhead(&f, half)) << f.bfc->GetLmsStats().DebugString();
  LmsStats s = f.bfc->GetLmsStats();
  EXPECT_EQ(s.host_reserve_bytes, static_cast<int64_t>(half));
  EXPECT_EQ(s.host_bytes_in_use, 0);
  EXPECT_GE(s.host_bytes_reserved, static_cast<int64_t>(half));
  // The spill takes made-ahead pages: none is made on its path.
  void* c = f.bfc->AllocateRaw(64, half);
  ASSERT_NE(c, nullptr) << f.bfc->LmsLastError();
  lms_test::Fill(c, half, 3);
  s = f.bfc->GetLmsStats();
  EXPECT_EQ(s.bytes_swapped_out, static_cast<int64_t>(half));
  EXPECT_EQ(s.host_bytes_reserved, s.host_bytes_made_ahead);
  // The filler tops the pool up to what the host budget has left (2 pages),
  // and no further.
  const auto t0 = std::chrono::steady_clock::now();
  while (f.bfc->GetLmsStats().host_bytes_reserved < static_cast<int64_t>(host) &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  s = f.bfc->GetLmsStats();
  EXPECT_EQ(s.host_bytes_reserved, static_cast<int64_t>(host));
  EXPECT_LE(s.host_bytes_reserved, s.host_bytes_limit);
  EXPECT_EQ(Mismatches(a, half, 1), 0u);
  EXPECT_EQ(Mismatches(b, half, 2), 0u);
  EXPECT_EQ(Mismatches(c, half, 3), 0u);
  f.bfc->DeallocateRaw(c);
  EXPECT_EQ(Mismatches(a, half, 1), 0u);
  EXPECT_EQ(f.bfc->GetLmsStats().host_bytes_in_use, 0);
  f.bfc->DeallocateRaw(a);
  f.bfc->DeallocateRaw(b);
}

// A spill that needs the host budget's last pages while the filler is still
// making one of them waits for it instead of failing.  (CPU: the filler's
// pages take LMS_TEST_FILLER_PAGE_DELAY_MS=100; CUDA: the driver's own time.)
TEST(LmsBfc, SpillAtTheHostLimitWaitsForThePageBeingMade) {
  const size_t D = lms_test::DeviceBudget();
  const size_t half = D / 2;
  setenv("LMS_TEST_FILLER_PAGE_DELAY_MS", "100", 1);
  Fixture f = Make(D, half, true, false, true, false, /*host_reserve=*/half);
  unsetenv("LMS_TEST_FILLER_PAGE_DELAY_MS");
  void *a, *b;
  ASSERT_NO_FATAL_FAILURE(TwoHalves(&f, half, &a, &b));  // the filler starts
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // Spills 'a': the whole host budget, the filler's page in flight included.
  void* c = f.bfc->AllocateRaw(64, half);
  ASSERT_NE(c, nullptr) << f.bfc->LmsLastError();
  lms_test::Fill(c, half, 3);
  const LmsStats s = f.bfc->GetLmsStats();
  EXPECT_EQ(s.bytes_swapped_out, static_cast<int64_t>(half));
  EXPECT_EQ(s.num_failures, 0);
  EXPECT_LE(s.host_bytes_reserved, s.host_bytes_limit);
  EXPECT_EQ(Mismatches(a, half, 1), 0u);
  EXPECT_EQ(Mismatches(b, half, 2), 0u);
  EXPECT_EQ(Mismatches(c, half, 3), 0u);
  f.bfc->DeallocateRaw(c);
  f.bfc->DeallocateRaw(a);
  f.bfc->DeallocateRaw(b);
}

// Spilled data stays readable and writable at the same pointer and comes
// back to the device when memory is freed.
TEST(LmsBfc, SpilledDataUsableInPlaceAndBroughtBack) {
  const size_t D = lms_test::DeviceBudget();
  Fixture f = Make(D, D, true, false);
  const size_t half = D / 2;
  void *a, *b;
  ASSERT_NO_FATAL_FAILURE(TwoHalves(&f, half, &a, &b));
  void* c = f.bfc->AllocateRaw(64, half);
  ASSERT_NE(c, nullptr) << f.bfc->LmsLastError();
  lms_test::Fill(c, half, 3);
  EXPECT_EQ(f.sub->CountPages(a, half, PageState::kHost),
            half / f.sub->page_size());
  EXPECT_EQ(f.sub->StateOf(b), PageState::kDevice);
  // Read and rewrite 'a' where it lies now (host pages, same address).
  EXPECT_EQ(Mismatches(a, half, 1), 0u);
  lms_test::Fill(a, half, 11);
  EXPECT_EQ(Mismatches(a, half, 11), 0u);
  f.bfc->DeallocateRaw(c);
  EXPECT_EQ(f.sub->StateOf(a), PageState::kDevice);
  EXPECT_EQ(Mismatches(a, half, 11), 0u);
  EXPECT_EQ(Mismatches(b, half, 2), 0u);
  LmsStats ls = f.bfc->GetLmsStats();
  EXPECT_EQ(ls.bytes_swapped_out, static_cast<int64_t>(half));
  EXPECT_EQ(ls.bytes_swapped_in, static_cast<int64_t>(half));
  EXPECT_EQ(ls.host_bytes_in_use, 0);
  EXPECT_EQ(ls.peak_host_bytes_in_use, static_cast<int64_t>(half));
  f.bfc->DeallocateRaw(a);
  f.bfc->DeallocateRaw(b);
}

// The safety rule, TensorFlow's executor pattern: several host threads write
// their tensors (on a GPU: kernels on one compute stream) while allocations by
// another thread make LMS move those tensors' pages out and back; no write may
// be lost.  The allocator moves pages only in a quiesced scope, where the
// launch gate holds the other threads' submissions (CUDA: CUPTI callbacks on
// the writers' kernel launches; CPU: the stand-in gate of
// lms_test_support_cpu.cc around each writer's pass) and the device is
// synchronized.  Without the gate (no CUPTI, CUPTI taken by a profiler,
// TF_LMS_LAUNCH_GATE=0) LMS fails closed: the pressure's allocations are
// refused and the test is skipped; LMS_TEST_RACE_WITHOUT_GATE=1 runs it
// anyway (it fails on the refusal), and with TF_LMS_UNSAFE_MOVE_WITHOUT_GATE=1
// too it shows what the gate prevents: the writers are not held back and
// their writes are lost (CUDA: error 700, an illegal address).  LMS_TEST_RACE_SECONDS (default 5) is how long the
// pressure runs.
TEST(LmsBfc, WritersOnOtherThreadsWhilePagesMove) {
  const size_t D = lms_test::DeviceBudget();
  Fixture f = Make(D, D, true, false);
  const LmsStats before = f.bfc->GetLmsStats();
  const char* without = std::getenv("LMS_TEST_RACE_WITHOUT_GATE");
  const bool race_without_gate = without != nullptr && std::atoi(without) != 0;
  if (!before.launch_gate_active && !race_without_gate) {
    GTEST_SKIP() << "launch gate inactive (reason "
                 << before.launch_gate_inactive_reason
                 << ": 1 no CUPTI library, 2 CUPTI taken by another client, "
                    "3 CUPTI refused, 4 TF_LMS_LAUNCH_GATE=0): nothing holds "
                    "the writers back while pages move";
  }
  const size_t n = D / 8;
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) {
    void* p = f.bfc->AllocateRaw(64, n);
    ASSERT_NE(p, nullptr);
    lms_test::Fill(p, n, 900 + i);
    blocks.push_back(p);
  }
  const char* env = std::getenv("LMS_TEST_RACE_SECONDS");
  const double seconds = env ? std::atof(env) : 5.0;
  lms_test::Writers writers(blocks, n);
  int rounds = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
             .count() < seconds) {
    // 4 + 6 blocks of D/8: the two oldest (blocks 0 and 1) go to host pages,
    // and come back when these are freed
    std::vector<void*> pressure;
    for (int k = 0; k < 6; ++k) {
      void* q = f.bfc->AllocateRaw(64, n);
      ASSERT_NE(q, nullptr) << f.bfc->LmsLastError();
      pressure.push_back(q);
    }
    for (void* q : pressure) f.bfc->DeallocateRaw(q);
    ++rounds;
  }
  const std::vector<uint64_t> passes = writers.Stop();
  LmsStats ls = f.bfc->GetLmsStats();
  LOG(INFO) << "writers: " << rounds << " rounds of pressure\n"
            << ls.DebugString();
  EXPECT_GT(ls.bytes_swapped_out, 0);
  EXPECT_GT(ls.bytes_swapped_in, 0);
  if (before.launch_gate_active) {
    // The gate acted: every round closed it, and writers' submissions waited.
    EXPECT_TRUE(ls.launch_gate_active);
    EXPECT_GE(ls.launch_gate_closes - before.launch_gate_closes, rounds);
    EXPECT_GT(ls.launch_gate_calls_held, before.launch_gate_calls_held);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_GT(passes[i], 0u);
    EXPECT_EQ(lms_test::CountMismatchesAdd(blocks[i], n, 900 + i,
                                           static_cast<uint32_t>(passes[i])),
              0u)
        << "block " << i << " after " << passes[i] << " passes, " << rounds
        << " rounds of pressure";
  }
  for (void* p : blocks) f.bfc->DeallocateRaw(p);
}

// LmsTouch makes an allocation the most recently used: the other one is
// spilled instead.
TEST(LmsBfc, TouchChangesTheVictim) {
  const size_t D = lms_test::DeviceBudget();
  Fixture f = Make(D, D, true, false);
  const size_t half = D / 2;
  void* a = f.bfc->AllocateRaw(64, half);
  void* b = f.bfc->AllocateRaw(64, half);
  lms_test::Fill(a, half, 1);
  lms_test::Fill(b, half, 2);
  f.bfc->LmsTouch(a);
  void* c = f.bfc->AllocateRaw(64, half);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(f.sub->StateOf(a), PageState::kDevice);
  EXPECT_EQ(f.sub->StateOf(b), PageState::kHost);
  EXPECT_EQ(Mismatches(a, half, 1), 0u);
  EXPECT_EQ(Mismatches(b, half, 2), 0u);
  f.bfc->DeallocateRaw(a);
  f.bfc->DeallocateRaw(b);
  f.bfc->DeallocateRaw(c);
}

// Fills the device with one-page allocations and frees every other one: the
// free memory is fragmented into single pages.
std::vector<void*> Fragment(Fixture* f, size_t D) {
  const size_t ps = f->sub->page_size();
  std::vector<void*> ptrs;
  for (size_t i = 0; i < D / ps; ++i) {
    void* p = f->bfc->AllocateRaw(64, ps);
    CHECK(p != nullptr) << i;
    lms_test::Fill(p, ps, 500 + i);
    ptrs.push_back(p);
  }
  CHECK_EQ(f->sub->DevicePagesAvailable(), 0u) << "device not full";
  for (size_t i = 0; i < ptrs.size(); i += 2) {
    f->bfc->DeallocateRaw(ptrs[i]);
    ptrs[i] = nullptr;
  }
  return ptrs;
}

// Defragmentation: the request is served from remapped free pages; nothing is
// swapped out and no live allocation moves.
TEST(LmsBfc, DefragRemapsFreePagesWithoutMovingTensors) {
  const size_t D = lms_test::DeviceBudget();
  Fixture f = Make(D, /*host=*/0, true, /*defrag=*/true);
  const size_t ps = f.sub->page_size();
  std::vector<void*> ptrs = Fragment(&f, D);
  const size_t big = 4 * ps;
  void* p = f.bfc->AllocateRaw(64, big);
  ASSERT_NE(p, nullptr) << f.bfc->LmsLastError();
  lms_test::Fill(p, big, 77);
  // And the released single pages are usable again.
  void* q = f.bfc->AllocateRaw(64, ps);
  ASSERT_NE(q, nullptr) << f.bfc->LmsLastError();
  lms_test::Fill(q, ps, 78);
  LmsStats ls = f.bfc->GetLmsStats();
  LOG(INFO) << "defrag:\n" << ls.DebugString();
  EXPECT_EQ(ls.bytes_swapped_out, 0);
  EXPECT_GE(ls.num_defrag_events, 1);
  EXPECT_GE(ls.bytes_defragmented, static_cast<int64_t>(big));
  EXPECT_LE(ls.device_bytes_mapped, static_cast<int64_t>(D));
  for (size_t i = 1; i < ptrs.size(); i += 2) {
    EXPECT_EQ(Mismatches(ptrs[i], ps, 500 + i), 0u) << i;
  }
  EXPECT_EQ(Mismatches(p, big, 77), 0u);
  EXPECT_EQ(Mismatches(q, ps, 78), 0u);
}

// Without defrag (and no host swap space) the fragmentation case fails with
// the hint to enable defragmentation.
TEST(LmsBfc, FragmentationWithoutDefragHintsToEnableIt) {
  const size_t D = lms_test::DeviceBudget();
  Fixture f = Make(D, /*host=*/0, true, /*defrag=*/false);
  const size_t ps = f.sub->page_size();
  std::vector<void*> ptrs = Fragment(&f, D);
  EXPECT_EQ(f.bfc->AllocateRaw(64, 4 * ps), nullptr);
  const std::string err = f.bfc->LmsLastError();
  LOG(INFO) << "error: " << err;
  EXPECT_NE(err.find("fragmented"), std::string::npos) << err;
  EXPECT_NE(err.find("tf.config.experimental.set_lms_defrag_enabled(True)"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("lms_defrag_enabled"), std::string::npos) << err;
  EXPECT_EQ(f.bfc->GetLmsStats().num_failures, 1);
}

// Without defrag but with host swap space: served by spilling instead.
TEST(LmsBfc, FragmentationWithoutDefragIsServedBySpilling) {
  const size_t D = lms_test::DeviceBudget();
  Fixture f = Make(D, D, true, false);
  const size_t ps = f.sub->page_size();
  std::vector<void*> ptrs = Fragment(&f, D);
  void* p = f.bfc->AllocateRaw(64, 4 * ps);
  ASSERT_NE(p, nullptr) << f.bfc->LmsLastError();
  EXPECT_GE(f.bfc->GetLmsStats().bytes_swapped_out,
            static_cast<int64_t>(4 * ps));
  for (size_t i = 1; i < ptrs.size(); i += 2) {
    EXPECT_EQ(Mismatches(ptrs[i], ps, 500 + i), 0u) << i;
  }
}

// Host swap space is bounded by TF_GPU_HOST_MEM_LIMIT_IN_MB; reaching it
// gives an error naming the variable and a value to try.
TEST(LmsBfc, HostLimitErrorNamesTheVariable) {
  const size_t D = lms_test::DeviceBudget();
  const size_t limit_mb = (D / 2) >> 20;
  setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", std::to_string(limit_mb).c_str(), 1);
  const size_t host = LmsHostMemLimitFromEnv(size_t{1} << 36);
  unsetenv("TF_GPU_HOST_MEM_LIMIT_IN_MB");
  ASSERT_EQ(host, limit_mb << 20);
  Fixture f = Make(D, host, true, false);
  const size_t kChunk = D / 8;
  std::vector<void*> ptrs;
  for (int i = 0; i < 16; ++i) {
    void* p = f.bfc->AllocateRaw(64, kChunk);
    if (p == nullptr) break;
    lms_test::Fill(p, kChunk, 900 + i);
    ptrs.push_back(p);
  }
  EXPECT_EQ(ptrs.size(), 12u);  // D on the device + D/2 on the host.
  const std::string err = f.bfc->LmsLastError();
  LOG(INFO) << "error: " << err;
  EXPECT_NE(err.find("TF_GPU_HOST_MEM_LIMIT_IN_MB=" + std::to_string(limit_mb)),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("Set the environment variable TF_GPU_HOST_MEM_LIMIT_IN_MB="),
            std::string::npos)
      << err;
  LmsStats ls = f.bfc->GetLmsStats();
  EXPECT_EQ(ls.host_bytes_in_use, static_cast<int64_t>(host));
  EXPECT_EQ(ls.num_failures, 1);
  for (size_t i = 0; i < ptrs.size(); ++i) {
    EXPECT_EQ(Mismatches(ptrs[i], kChunk, 900 + i), 0u) << i;
  }
}

// A driver error partway through a page move leaves every page on its old
// memory.  TF_LMS_TEST_FAIL_REMAP=N makes the backend's Nth page remap fail
// after its unmap, as an out-of-memory cuMemMap would: in a spill, the
// allocation is refused with the error and the next one spills and is
// served; in a return (on a free), the data stays on the host.  Every byte is
// checked in both.
TEST(LmsBfc, AFailedPageMoveLosesNothing) {
  const size_t D = lms_test::DeviceBudget();
  const size_t kChunk = D / 8;
  struct Run {
    bool first_served = false, retry_served = false;
    int64_t pages_out = 0, pages_in_first_free = 0, pages_in = 0;
    size_t bad = 0;
    std::string err;
  };
  auto run = [&](size_t fail_at) {
    if (fail_at > 0) {
      setenv("TF_LMS_TEST_FAIL_REMAP", std::to_string(fail_at).c_str(), 1);
    }
    Fixture f = Make(D, 2 * D, true, false);
    unsetenv("TF_LMS_TEST_FAIL_REMAP");
    Run r;
    std::vector<void*> ptrs;
    for (int i = 0; i < 8; ++i) {  // the device budget, nothing spilled
      void* p = f.bfc->AllocateRaw(64, kChunk);
      CHECK(p != nullptr);
      lms_test::Fill(p, kChunk, 1300 + i);
      ptrs.push_back(p);
    }
    CHECK_EQ(f.bfc->GetLmsStats().num_swap_outs, 0);
    void* q = f.bfc->AllocateRaw(64, kChunk);  // spills the oldest
    r.first_served = q != nullptr;
    r.pages_out = f.bfc->GetLmsStats().num_swap_outs;
    r.err = f.bfc->LmsLastError();
    for (int i = 0; i < 8; ++i) r.bad += Mismatches(ptrs[i], kChunk, 1300 + i);
    if (q == nullptr) q = f.bfc->AllocateRaw(64, kChunk);
    r.retry_served = q != nullptr;
    if (q != nullptr) lms_test::Fill(q, kChunk, 1399);
    f.bfc->DeallocateRaw(ptrs[7]);  // frees as much as is spilled: a return
    r.pages_in_first_free = f.bfc->GetLmsStats().num_swap_ins;
    for (int i = 6; i >= 4; --i) f.bfc->DeallocateRaw(ptrs[i]);
    r.pages_in = f.bfc->GetLmsStats().num_swap_ins;
    for (int i = 0; i < 4; ++i) r.bad += Mismatches(ptrs[i], kChunk, 1300 + i);
    if (q != nullptr) r.bad += Mismatches(q, kChunk, 1399);
    for (int i = 0; i < 4; ++i) f.bfc->DeallocateRaw(ptrs[i]);
    if (q != nullptr) f.bfc->DeallocateRaw(q);
    LOG(INFO) << "fail_at " << fail_at << ": first spill "
              << (r.first_served ? "served" : "refused") << ", pages out "
              << r.pages_out << ", in " << r.pages_in_first_free << " then "
              << r.pages_in << ", mismatches "
              << r.bad << ", error: " << r.err;
    return r;
  };
  const Run clean = run(0);
  ASSERT_TRUE(clean.first_served) << clean.err;
  ASSERT_GE(clean.pages_out, 2);
  ASSERT_GE(clean.pages_in_first_free, 2);
  EXPECT_EQ(clean.bad, 0u);

  const Run spill = run(2);  // the first spill's second page
  EXPECT_FALSE(spill.first_served);
  EXPECT_EQ(spill.pages_out, 0);  // a move is all or nothing
  EXPECT_NE(spill.err.find("every page was put back"), std::string::npos)
      << spill.err;
  EXPECT_EQ(spill.bad, 0u);
  EXPECT_TRUE(spill.retry_served);

  const Run back = run(clean.pages_out + 2);  // the first return's second page
  EXPECT_TRUE(back.first_served) << back.err;
  EXPECT_EQ(back.bad, 0u);
  // that return put its pages back on the host (a move is all or nothing);
  // a later one brought them
  EXPECT_LT(back.pages_in_first_free, clean.pages_in_first_free);
  EXPECT_EQ(back.pages_in, clean.pages_in);
}

// Random allocations and frees up to ~1.75x the device: every byte checked.
TEST(LmsBfc, RandomWorkloadBytesIntact) {
  const size_t D = lms_test::DeviceBudget();
  Fixture f = Make(D, 2 * D, true, /*defrag=*/true);
  std::mt19937_64 rng(1234);
  struct Live {
    void* p;
    size_t n;
    uint32_t seed;
  };
  std::vector<Live> live;
  size_t live_bytes = 0;
  const int kOps = lms_test::BackendKind() == "cpu" ? 600 : 400;
  for (int op = 0; op < kOps; ++op) {
    const bool alloc = live.empty() || (live_bytes < D * 7 / 4 && rng() % 3 != 0);
    if (alloc) {
      const size_t n = ((rng() % (D / 6)) + 1024) & ~size_t{3};
      void* p = f.bfc->AllocateRaw(64, n);
      ASSERT_NE(p, nullptr) << "op " << op << ": " << f.bfc->LmsLastError();
      lms_test::Fill(p, n, op);
      live.push_back({p, n, static_cast<uint32_t>(op)});
      live_bytes += n;
    } else {
      const size_t k = rng() % live.size();
      ASSERT_EQ(Mismatches(live[k].p, live[k].n, live[k].seed), 0u) << op;
      f.bfc->DeallocateRaw(live[k].p);
      live_bytes -= live[k].n;
      live[k] = live.back();
      live.pop_back();
    }
    if (op % 100 == 99) {
      for (const Live& l : live) {
        ASSERT_EQ(Mismatches(l.p, l.n, l.seed), 0u) << "op " << op;
      }
    }
  }
  LmsStats ls = f.bfc->GetLmsStats();
  LOG(INFO) << "random workload:\n" << ls.DebugString();
  EXPECT_GT(ls.bytes_swapped_out, 0);
  EXPECT_GT(ls.bytes_swapped_in, 0);
  EXPECT_EQ(ls.num_failures, 0);
  for (const Live& l : live) {
    EXPECT_EQ(Mismatches(l.p, l.n, l.seed), 0u);
    f.bfc->DeallocateRaw(l.p);
  }
  EXPECT_EQ(f.bfc->GetLmsStats().host_bytes_in_use, 0);
  EXPECT_EQ(f.bfc->GetStats()->bytes_in_use, 0);
}

// A training step's pattern: weights, then activations allocated past the
// device budget (the oldest spill), then freed newest first while spilled data
// comes back.  Bringing data back needs a synchronized device; frees do it in
// batches, a few times per step, not once per freed activation while anything
// is spilled.  Every byte is checked before it is freed.
TEST(LmsBfc, BackwardFreesReturnSpilledDataInBatches) {
  const size_t D = lms_test::DeviceBudget();
  Fixture f = Make(D, 2 * D, true, false);
  const size_t w = D / 4, a = D / 16;
  const int kActs = 24;  // 1.5x the device budget, with the weights 1.75x
  void* weights = f.bfc->AllocateRaw(64, w);
  ASSERT_NE(weights, nullptr);
  lms_test::Fill(weights, w, 7);
  for (int step = 0; step < 3; ++step) {
    const LmsStats start = f.bfc->GetLmsStats();
    std::vector<void*> acts;
    for (int i = 0; i < kActs; ++i) {
      void* p = f.bfc->AllocateRaw(64, a);
      ASSERT_NE(p, nullptr) << f.bfc->LmsLastError();
      lms_test::Fill(p, a, 1000 * step + i);
      acts.push_back(p);
    }
    const LmsStats forward = f.bfc->GetLmsStats();
    ASSERT_GT(forward.host_bytes_in_use, 0) << "nothing spilled";
    for (int i = kActs - 1; i >= 0; --i) {
      ASSERT_EQ(Mismatches(acts[i], a, 1000 * step + i), 0u) << step << " " << i;
      f.bfc->DeallocateRaw(acts[i]);
    }
    ASSERT_EQ(Mismatches(weights, w, 7), 0u) << step;
    const LmsStats end = f.bfc->GetLmsStats();
    const int64_t syncs = end.num_device_syncs - forward.num_device_syncs;
    LOG(INFO) << "step " << step << ": device syncs in forward "
              << forward.num_device_syncs - start.num_device_syncs
              << ", in backward " << syncs << " (on free "
              << end.num_device_syncs_on_free - forward.num_device_syncs_on_free
              << ") for " << kActs << " frees; host bytes at the end "
              << end.host_bytes_in_use << ", swapped in "
              << end.bytes_swapped_in - forward.bytes_swapped_in;
    EXPECT_LE(syncs, kActs / 4) << "step " << step;
    EXPECT_GT(end.bytes_swapped_in, forward.bytes_swapped_in) << step;
    EXPECT_EQ(end.host_bytes_in_use, 0) << "spilled data left behind";
  }
  f.bfc->DeallocateRaw(weights);
}

// Spill and return speed, as fractions of a pinned copy of the same size
// measured in the same process: half the device spilled by an allocation
// (round 0: host pages created on the way; later rounds spill into the
// pages the last return left pooled), then brought back by the free that
// makes room.  Printed, and held to the floors below where there is a pinned
// copy to compare with (CUDA; on the CPU backend only every byte is checked).
// Host pages made ahead (the default) and made on the spill's path.
class LmsBandwidth : public ::testing::TestWithParam<bool> {};

// Floors by page (fractions of the pinned copy; < 0: none). Recorded on the
// H100 (examples/pytorch/benchmarks/results/h100-run142, h100-run169): 64 MiB
// pages (16 GiB budget) warm spill 0.83-0.91, first spill with host pages
// made ahead 0.86-0.88 end to end, return 0.84-0.99; 16 MiB pages (the
// default 4 GiB budget) warm 0.54-0.61, a first spill's moves with pages made
// ahead 0.58-0.65, return 0.76-0.92. Smaller pages (2-8 MiB) move at
// 0.27-0.50 and get no floor.
struct BandwidthFloors {
  double warm_spill, first_spill_made_ahead, first_moves_made_ahead, ret;
};
BandwidthFloors FloorsForPage(size_t page) {
  constexpr size_t kMiB = size_t{1} << 20;
  if (page >= 64 * kMiB) return {0.70, 0.65, 0.65, 0.70};
  if (page >= 16 * kMiB) return {0.40, -1, 0.40, 0.60};
  return {-1, -1, -1, -1};
}

TEST_P(LmsBandwidth, SpillAndReturnBandwidth) {
  const size_t D = lms_test::DeviceBudget();
  const size_t half = D / 2;
  const bool ahead = GetParam();
  Fixture f = Make(D, D, true, false, true, false, ahead ? half : 0);
  void *a, *b;
  double new_region = 0;
  ASSERT_NO_FATAL_FAILURE(TwoHalves(&f, half, &a, &b, &new_region));
  LOG(INFO) << "allocating half the budget in a new region, nothing spilled: "
            << new_region << " s";
  if (ahead) ASSERT_TRUE(WaitMadeAhead(&f, half));
  const double out_ref = lms_test::PinnedCopySeconds(half, true);
  const double in_ref = lms_test::PinnedCopySeconds(half, false);
  auto secs = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
        .count();
  };
  for (int round = 0; round < 3; ++round) {
    const LmsStats s0 = f.bfc->GetLmsStats();
    auto t0 = std::chrono::steady_clock::now();
    void* c = f.bfc->AllocateRaw(64, half);
    const double spill = secs(t0);
    ASSERT_NE(c, nullptr) << f.bfc->LmsLastError();
    const LmsStats s1 = f.bfc->GetLmsStats();
    lms_test::Fill(c, half, 3);
    t0 = std::chrono::steady_clock::now();
    f.bfc->DeallocateRaw(c);
    const double back = secs(t0);
    const LmsStats s2 = f.bfc->GetLmsStats();
    const double out_b = s1.bytes_swapped_out - s0.bytes_swapped_out;
    const double in_b = s2.bytes_swapped_in - s1.bytes_swapped_in;
    EXPECT_EQ(out_b, static_cast<double>(half)) << round;
    EXPECT_EQ(in_b, static_cast<double>(half)) << round;
    EXPECT_EQ(Mismatches(a, half, 1), 0u) << round;
    EXPECT_EQ(Mismatches(b, half, 2), 0u) << round;
    std::string frac;
    if (out_ref > 0 && in_ref > 0) {
      frac = strings::StrCat("; of pinned: spill ",
                             (out_b / spill) / (half / out_ref), ", return ",
                             (in_b / back) / (half / in_ref), " (pinned out ",
                             half / out_ref / 1e9, " GB/s, in ",
                             half / in_ref / 1e9, " GB/s)");
    }
    const double moves_out = (s1.swap_out_ns - s0.swap_out_ns) * 1e-9;
    const double moves_in = (s2.swap_in_ns - s1.swap_in_ns) * 1e-9;
    if (out_ref > 0 && in_ref > 0 && moves_out > 0 && moves_in > 0) {
      frac += strings::StrCat("; the moves alone: spill ",
                              (out_b / moves_out) / (half / out_ref),
                              ", return ", (in_b / moves_in) / (half / in_ref));
    }
    if (out_ref > 0 && in_ref > 0) {
      const BandwidthFloors fl = FloorsForPage(f.sub->page_size());
      const double spill_f = (out_b / spill) / (half / out_ref);
      const double ret_f = (in_b / back) / (half / in_ref);
      const double moves_f =
          moves_out > 0 ? (out_b / moves_out) / (half / out_ref) : 0;
      const std::string at = strings::StrCat(
          "round ", round, ", host pages made ", ahead ? "ahead" : "on the way",
          ", ", f.sub->page_size() >> 20, " MiB pages", frac);
      if (round > 0 && fl.warm_spill >= 0) {
        EXPECT_GE(spill_f, fl.warm_spill) << "warm spill: " << at;
      }
      if (round == 0 && ahead && fl.first_spill_made_ahead >= 0) {
        EXPECT_GE(spill_f, fl.first_spill_made_ahead)
            << "first spill, end to end: " << at;
      }
      if (round == 0 && ahead && fl.first_moves_made_ahead >= 0) {
        EXPECT_GE(moves_f, fl.first_moves_made_ahead)
            << "first spill, the moves alone: " << at;
      }
      if (fl.ret >= 0) EXPECT_GE(ret_f, fl.ret) << "return: " << at;
    }
    LOG(INFO) << "bandwidth (host pages made "
              << (ahead ? "ahead" : "on the way") << ") round " << round
              << ", " << spill << " s to allocate, " << moves_out
              << " s of it moving"
              << ", " << f.sub->page_size() / (1 << 20) << " MiB pages"
              << ": spill " << out_b / spill / 1e9
              << " GB/s, return " << in_b / back / 1e9 << " GB/s" << frac;
  }
  f.bfc->DeallocateRaw(a);
  f.bfc->DeallocateRaw(b);
}

INSTANTIATE_TEST_SUITE_P(HostPagesMadeAhead, LmsBandwidth, ::testing::Bool());

// The page grows with the device budget (at least 256 pages, 2 to 64 MiB);
// TF_LMS_PAGE_IN_MB overrides it, and a bad value is refused with the default
// kept.  Likewise TF_LMS_HOST_RESERVE_IN_MB.
TEST(LmsBfc, PageAndReserveSettings) {
  constexpr size_t kMiB = size_t{1} << 20;
  unsetenv("TF_LMS_PAGE_IN_MB");
  EXPECT_EQ(LmsPageBytes(64 * kMiB), 2 * kMiB);
  EXPECT_EQ(LmsPageBytes(2048 * kMiB), 8 * kMiB);
  EXPECT_EQ(LmsPageBytes(4096 * kMiB), 16 * kMiB);
  EXPECT_EQ(LmsPageBytes(80 * 1024 * kMiB), 64 * kMiB);
  setenv("TF_LMS_PAGE_IN_MB", "4", 1);
  EXPECT_EQ(LmsPageBytes(80 * 1024 * kMiB), 4 * kMiB);
  for (const char* bad : {"3", "1", "2048", "16MB", "-8"}) {
    setenv("TF_LMS_PAGE_IN_MB", bad, 1);
    EXPECT_EQ(LmsPageBytes(80 * 1024 * kMiB), 64 * kMiB) << bad;
  }
  unsetenv("TF_LMS_PAGE_IN_MB");
  unsetenv("TF_LMS_HOST_RESERVE_IN_MB");
  EXPECT_EQ(LmsHostReserveFromEnv(), LmsVirtualMemSubAllocator::kHostReserveAuto);
  setenv("TF_LMS_HOST_RESERVE_IN_MB", "0", 1);
  EXPECT_EQ(LmsHostReserveFromEnv(), 0u);
  setenv("TF_LMS_HOST_RESERVE_IN_MB", "512", 1);
  EXPECT_EQ(LmsHostReserveFromEnv(), 512 * kMiB);
  setenv("TF_LMS_HOST_RESERVE_IN_MB", "lots", 1);
  EXPECT_EQ(LmsHostReserveFromEnv(), LmsVirtualMemSubAllocator::kHostReserveAuto);
  unsetenv("TF_LMS_HOST_RESERVE_IN_MB");
}

// An allocator whose sub-allocator is not page-mapped keeps LMS off.
TEST(LmsBfc, PlainSubAllocatorKeepsLmsOff) {
  BFCAllocator::Options o;
  o.lms_enabled = true;
  BFCAllocator a(lms_test::PlainSubAllocator(0), size_t{64} << 20, "plain", o);
  EXPECT_FALSE(a.lms_enabled());
  EXPECT_FALSE(a.GetLmsStats().enabled);
  void* p = a.AllocateRaw(64, 1 << 20);
  ASSERT_NE(p, nullptr);
  a.DeallocateRaw(p);
}

}  // namespace
}  // namespace tsl
