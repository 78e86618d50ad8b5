// LMS in TensorFlow's BFC allocator on its failure paths: no gate, driver
// errors in a move, a failed page creation, a failed swap-in, garbage
// collection's unmaps, bad host limits and quiesce bounds, and several devices
// in one process (LmsMultiDevice: moves while each device's kernels write the
// other's memory and a collective-like pair of kernels waits across them; on
// the program's own backends: simulated devices on the CPU, GPUs on CUDA).  The allocators here use the memfd
// page backend directly (host memory, patterns written by the CPU), so these
// tests mean the same on the CPU and on a GPU machine, except
// GarbageCollectionUnmapsInAQuietScope, which runs on the program's own
// backend (CUDA there) with writers on another allocator.  Faults are
// injected with TF_LMS_TEST_FAIL_REMAP / TF_LMS_TEST_FAIL_CREATE
// (LmsRemapFaults), read when a backend is made.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "lms_test_support.h"
#include "tensorflow/tsl/framework/bfc_allocator.h"
#include "tensorflow/tsl/framework/lms_sub_allocator.h"
#include "tensorflow/tsl/platform/logging.h"

namespace tsl {
namespace {

using PageState = LmsVirtualMemSubAllocator::PageState;
constexpr size_t kD = size_t{64} << 20;  // device budget: 32 pages of 2 MiB

// Sets (or, with nullptr, unsets) an environment variable for its lifetime.
class Env {
 public:
  Env(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~Env() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_;
  std::string old_;
};

struct Raw {
  LmsVirtualMemSubAllocator* sub = nullptr;  // owned by 'bfc'
  std::unique_ptr<BFCAllocator> bfc;
};

// A BFC allocator with LMS over the memfd backend alone: no launch gate
// (launch_gate_inactive_reason 5), no host pages made ahead.
Raw MakeRaw(size_t host, bool gc = false, bool lms = true) {
  const size_t va = 8 * kD + 2 * host;
  auto sub = LmsVirtualMemSubAllocator::Create(
      CreatePosixLmsPageBackend(LmsPageBytes(kD)), va, kD, host, {}, {}, 0,
      /*host_reserve_bytes=*/0);
  CHECK(sub != nullptr);
  Raw r;
  r.sub = sub.get();
  BFCAllocator::Options o;
  o.allow_growth = true;
  o.allow_retry_on_failure = false;
  o.garbage_collection = gc;
  o.lms_enabled = lms;
  r.bfc = std::make_unique<BFCAllocator>(std::move(sub), lms ? va : kD,
                                         "lms_failure_test", o);
  return r;
}

uint32_t Word(uint32_t seed, size_t i) {
  return seed * 2654435761u ^ static_cast<uint32_t>(i * 40503u);
}
void Fill(void* p, size_t n, uint32_t seed) {
  uint32_t* w = static_cast<uint32_t*>(p);
  for (size_t i = 0; i < n / 4; ++i) w[i] = Word(seed, i);
}
size_t Bad(const void* p, size_t n, uint32_t seed) {
  const uint32_t* w = static_cast<const uint32_t*>(p);
  size_t bad = 0;
  for (size_t i = 0; i < n / 4; ++i) bad += w[i] != Word(seed, i);
  return bad;
}

// Fills the device budget with 8 blocks of kD/8 (nothing moves).
std::vector<void*> FillDevice(Raw* r, uint32_t seed0) {
  std::vector<void*> v;
  for (int i = 0; i < 8; ++i) {
    void* p = r->bfc->AllocateRaw(64, kD / 8);
    CHECK(p != nullptr) << r->bfc->LmsLastError();
    Fill(p, kD / 8, seed0 + i);
    v.push_back(p);
  }
  return v;
}

// (1) Without an active launch gate LMS fails closed: pages of live tensors do
// not move, and the allocation that needed a spill fails saying why and what
// to do.  TF_LMS_UNSAFE_MOVE_WITHOUT_GATE=1 is the documented opt-in.
TEST(LmsFailure, NoGateRefusesToMovePagesOfLiveTensors) {
  {
    Env unsafe("TF_LMS_UNSAFE_MOVE_WITHOUT_GATE", nullptr);
    Raw r = MakeRaw(kD);
    ASSERT_FALSE(r.bfc->GetLmsStats().launch_gate_active);
    std::vector<void*> v = FillDevice(&r, 10);
    void* q = r.bfc->AllocateRaw(64, kD / 8);
    const std::string err = r.bfc->LmsLastError();
    LOG(INFO) << "no gate: " << err;
    EXPECT_EQ(q, nullptr) << "a spill moved live pages with no gate";
    EXPECT_EQ(r.bfc->GetLmsStats().num_swap_outs, 0);
    EXPECT_NE(err.find("launch gate is inactive"), std::string::npos) << err;
    EXPECT_NE(err.find("TF_LMS_UNSAFE_MOVE_WITHOUT_GATE=1"), std::string::npos)
        << err;
    for (int i = 0; i < 8; ++i) EXPECT_EQ(Bad(v[i], kD / 8, 10 + i), 0u);
    if (q) r.bfc->DeallocateRaw(q);
    for (void* p : v) r.bfc->DeallocateRaw(p);
  }
  Env unsafe("TF_LMS_UNSAFE_MOVE_WITHOUT_GATE", "1");
  Raw r = MakeRaw(kD);
  std::vector<void*> v = FillDevice(&r, 20);
  void* q = r.bfc->AllocateRaw(64, kD / 8);
  EXPECT_NE(q, nullptr) << r.bfc->LmsLastError();
  EXPECT_GT(r.bfc->GetLmsStats().num_swap_outs, 0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(Bad(v[i], kD / 8, 20 + i), 0u);
}

// (2) A double fault in a spill: the second page's map fails, and putting the
// first page back fails too.  That page stays on its new (host) copy, the
// other goes back; no page is recycled while still mapped, so the tensors
// spilled and allocated afterwards (up to twice the device) never share
// memory with it: every byte of every block is checked at the end.
TEST(LmsFailure, DoubleFaultDuringAMoveSharesNoPage) {
  Env unsafe("TF_LMS_UNSAFE_MOVE_WITHOUT_GATE", "1");
  Raw r;
  {
    // map 2 (the run's second page) fails, then put-back map 3 (page one)
    Env fault("TF_LMS_TEST_FAIL_REMAP", "2,3");
    r = MakeRaw(2 * kD);
  }
  std::vector<void*> v = FillDevice(&r, 100);
  void* q = r.bfc->AllocateRaw(64, kD / 8);
  const std::string err = r.bfc->LmsLastError();
  LOG(INFO) << "double fault: " << err;
  EXPECT_EQ(q, nullptr) << "the injected faults did not fire";
  EXPECT_NE(err.find("stay on their new copy"), std::string::npos) << err;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(Bad(v[i], kD / 8, 100 + i), 0u) << i;
  if (q != nullptr) r.bfc->DeallocateRaw(q);
  // The next spill takes another block, whose pages land on the host pages
  // the failed move gave back: had one of them still been mapped under
  // block 0, block 1's bytes would now show there.
  r.bfc->LmsTouch(v[0]);
  // Up to twice the device, each block written after it is served.
  for (int i = 8; i < 16; ++i) {
    void* p = r.bfc->AllocateRaw(64, kD / 8);
    ASSERT_NE(p, nullptr) << i << ": " << r.bfc->LmsLastError();
    Fill(p, kD / 8, 100 + i);
    v.push_back(p);
  }
  for (int i = 0; i < 16; ++i) EXPECT_EQ(Bad(v[i], kD / 8, 100 + i), 0u) << i;
  const LmsStats s = r.bfc->GetLmsStats();
  EXPECT_LE(s.device_bytes_mapped, static_cast<int64_t>(kD));
  EXPECT_EQ(s.device_bytes_mapped + s.host_bytes_in_use,
            static_cast<int64_t>(2 * kD));
  for (void* p : v) r.bfc->DeallocateRaw(p);
}

// (2) Device page creation fails (the driver is out of memory): the process
// does not abort; the allocation fails naming the driver's error or, with
// data to spill, is served by spilling instead of counting on pages that
// cannot be made.
TEST(LmsFailure, FailedPageCreationFailsTheAllocationNotTheProcess) {
  Env unsafe("TF_LMS_UNSAFE_MOVE_WITHOUT_GATE", "1");
  {
    Raw r;
    {
      Env fault("TF_LMS_TEST_FAIL_CREATE", "1");  // every device page
      r = MakeRaw(kD);
    }
    void* p = r.bfc->AllocateRaw(64, kD / 8);
    const std::string err = r.bfc->LmsLastError();
    LOG(INFO) << "no device page: " << err;
    EXPECT_EQ(p, nullptr);
    EXPECT_NE(err.find("injected (TF_LMS_TEST_FAIL_CREATE)"), std::string::npos)
        << err;
    if (p) r.bfc->DeallocateRaw(p);
  }
  Raw r;
  {
    Env fault("TF_LMS_TEST_FAIL_CREATE", "9");  // after 8 pages (16 MiB)
    r = MakeRaw(kD);
  }
  std::vector<void*> v;
  for (int i = 0; i < 4; ++i) {  // twice what the driver gives
    void* p = r.bfc->AllocateRaw(64, kD / 8);
    ASSERT_NE(p, nullptr) << i << ": " << r.bfc->LmsLastError();
    Fill(p, kD / 8, 300 + i);
    v.push_back(p);
  }
  const LmsStats s = r.bfc->GetLmsStats();
  LOG(INFO) << "8 device pages:\n" << s.DebugString();
  EXPECT_LE(s.device_bytes_reserved, static_cast<int64_t>(8 * s.page_bytes));
  EXPECT_GT(s.num_swap_outs, 0);
  EXPECT_EQ(r.sub->StateOf(v[0]), PageState::kHost);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Bad(v[i], kD / 8, 300 + i), 0u) << i;
  for (void* p : v) r.bfc->DeallocateRaw(p);
}

// (2) A swap-in whose move fails and whose put-back fails twice (back, and
// keeping the new copy): the page is left unmapped with both copies kept, the
// error is reported with the driver's message, nothing is allocated over the
// hole until it is mapped again (the next allocation does that first), and no
// byte is lost.
TEST(LmsFailure, FailedSwapInReportsTheErrorAndLosesNothing) {
  Env unsafe("TF_LMS_UNSAFE_MOVE_WITHOUT_GATE", "1");
  auto run = [](const char* faults, int64_t* pages_out, std::string* err) {
    Raw r;
    {
      Env fault("TF_LMS_TEST_FAIL_REMAP", faults);
      r = MakeRaw(2 * kD);
    }
    std::vector<void*> v = FillDevice(&r, 500);
    void* q = r.bfc->AllocateRaw(64, kD / 8);  // spills the oldest block
    CHECK(q != nullptr) << r.bfc->LmsLastError();
    Fill(q, kD / 8, 599);
    *pages_out = r.bfc->GetLmsStats().num_swap_outs;
    r.bfc->DeallocateRaw(v[7]);  // a return: the spilled block comes back
    *err = r.bfc->LmsLastError();
    size_t bad = Bad(q, kD / 8, 599);
    void* again = r.bfc->AllocateRaw(64, kD / 16);  // repairs, then serves
    EXPECT_NE(again, nullptr) << r.bfc->LmsLastError();
    for (int i = 0; i < 7; ++i) bad += Bad(v[i], kD / 8, 500 + i);
    if (again) r.bfc->DeallocateRaw(again);
    r.bfc->DeallocateRaw(q);
    for (int i = 0; i < 7; ++i) r.bfc->DeallocateRaw(v[i]);
    return bad;
  };
  int64_t out = 0;
  std::string err;
  ASSERT_EQ(run("", &out, &err), 0u);
  ASSERT_GE(out, 2);
  // The return's 2nd page fails, then page one's put-back and its keep.
  const std::string f = std::to_string(out + 2) + "," + std::to_string(out + 3) +
                        "," + std::to_string(out + 4);
  EXPECT_EQ(run(f.c_str(), &out, &err), 0u);
  LOG(INFO) << "failed swap-in: " << err;
  EXPECT_NE(err.find("swap-in failed"), std::string::npos) << err;
  EXPECT_NE(err.find("injected (TF_LMS_TEST_FAIL_REMAP)"), std::string::npos)
      << err;
  EXPECT_NE(err.find("1 page(s) are unmapped"), std::string::npos) << err;
}

// (3) Garbage collection (upstream's DeallocateFreeRegions, on by default for
// GPUs) gives whole free regions back to the sub-allocator, whose Free unmaps
// their pages: queued work may still read them, so that happens in a quiesced
// scope (the gate closes while another allocator's writers run), like every
// other unmap of memory that was handed out.  LMS is off here so that no LMS
// path opens a scope of its own.
TEST(LmsFailure, GarbageCollectionUnmapsInAQuietScope) {
  const size_t D = lms_test::DeviceBudget();
  auto sub = lms_test::MakeLmsSubAllocator(D, D, 0, 0);
  LmsVirtualMemSubAllocator* s = sub.get();
  BFCAllocator::Options o;
  o.allow_growth = true;
  o.allow_retry_on_failure = false;
  o.garbage_collection = true;
  BFCAllocator gc(std::move(sub), D, "lms_gc_test", o);
  auto wsub = lms_test::MakeLmsSubAllocator(D, D, 0, 0);
  BFCAllocator other(std::move(wsub), D, "lms_gc_writers", o);
  const size_t n = D / 16;
  void* w = other.AllocateRaw(64, n);
  ASSERT_NE(w, nullptr);
  lms_test::Fill(w, n, 700);
  lms_test::Writers writers({w}, n);

  void* a = gc.AllocateRaw(64, D / 2);
  ASSERT_NE(a, nullptr);
  gc.DeallocateRaw(a);  // its region is free now, its pages still mapped
  const size_t scopes = s->quiet_scopes();
  LmsStats before;
  s->AddLaunchGateStats(&before);
  // Larger than the free region and than the pages left: only after GC frees
  // that region does the pool grow.
  void* b = gc.AllocateRaw(64, 7 * D / 8);
  ASSERT_NE(b, nullptr) << "garbage collection did not free the region";
  LmsStats after;
  s->AddLaunchGateStats(&after);
  const std::vector<uint64_t> passes = writers.Stop();
  EXPECT_GE(s->quiet_scopes(), scopes + 1) << "GC unmapped outside a scope";
  if (before.launch_gate_active) {
    EXPECT_GT(after.launch_gate_closes, before.launch_gate_closes);
  }
  EXPECT_EQ(lms_test::CountMismatchesAdd(w, n, 700,
                                         static_cast<uint32_t>(passes[0])),
            0u);
  gc.DeallocateRaw(b);
  other.DeallocateRaw(w);
}

// (4) Pinned host pages are given back after a spike: a step that spilled the
// whole device keeps its pages for the next step (creating pinned pages is
// slow), but once a later step needed only two blocks' worth, the idle pages
// above that go back to the system when everything has come back.
TEST(LmsFailure, PinnedHostPagesGivenBackAfterASpike) {
  Env unsafe("TF_LMS_UNSAFE_MOVE_WITHOUT_GATE", "1");
  Raw r = MakeRaw(2 * kD);
  std::vector<void*> v = FillDevice(&r, 800);
  auto step = [&](int blocks, uint32_t seed) {
    std::vector<void*> extra;
    for (int i = 0; i < blocks; ++i) {
      void* p = r.bfc->AllocateRaw(64, kD / 8);
      CHECK(p != nullptr) << r.bfc->LmsLastError();
      Fill(p, kD / 8, seed + i);
      extra.push_back(p);
    }
    for (int i = blocks - 1; i >= 0; --i) {
      EXPECT_EQ(Bad(extra[i], kD / 8, seed + i), 0u);
      r.bfc->DeallocateRaw(extra[i]);
    }
    return r.bfc->GetLmsStats();
  };
  LmsStats s = step(8, 900);  // the spike: the whole device spilled
  ASSERT_EQ(s.host_bytes_in_use, 0);
  const int64_t spike = s.host_bytes_reserved;
  EXPECT_GE(spike, static_cast<int64_t>(kD / 2));  // kept for the next step
  // A step that spills two blocks (freeing them is a batch: a return).
  s = step(2, 950);
  LOG(INFO) << "after a small step:\n" << s.DebugString();
  ASSERT_EQ(s.host_bytes_in_use, 0);
  // (what that step had on the host at most: its blocks and a neighbour)
  EXPECT_LE(s.host_bytes_reserved, static_cast<int64_t>(3 * kD / 8))
      << "the spike's pinned pages were not given back";
  EXPECT_LT(s.host_bytes_reserved, spike);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(Bad(v[i], kD / 8, 800 + i), 0u) << i;
  for (void* p : v) r.bfc->DeallocateRaw(p);
}

// (4) TF_GPU_HOST_MEM_LIMIT_IN_MB: bad and negative values are refused (the
// default is used), huge ones capped: 'mb << 20' never wraps around.
TEST(LmsFailure, HostMemLimitBadNegativeAndHugeValues) {
  const size_t def = size_t{1} << 37;
  auto read = [&](const char* v) {
    Env e("TF_GPU_HOST_MEM_LIMIT_IN_MB", v);
    return LmsHostMemLimitFromEnv(def);
  };
  EXPECT_EQ(read("1024"), size_t{1} << 30);
  EXPECT_EQ(read("0"), 0u);
  EXPECT_EQ(read("-5"), def);
  EXPECT_EQ(read("12abc"), def);
  EXPECT_EQ(read(" "), def);
  // 2^44 MiB is 2^64 bytes: wraps to 0 without a bound.
  for (const char* huge : {"17592186044416", "17592186044417",
                           "99999999999999999999999"}) {
    const size_t b = read(huge);
    EXPECT_GT(b, size_t{1} << 30) << huge;
    EXPECT_LE(b, size_t{1} << 50) << huge;  // 1 PiB at most
    EXPECT_EQ(b % (size_t{1} << 20), 0u) << huge;
  }
}

// TF_LMS_QUIESCE_WAIT_MS, the first bound of a quiesce round: a whole number
// of milliseconds from 1 to 60000; anything else is refused (an error naming
// the variable) and the default used.
TEST(LmsFailure, QuiesceWaitSettingBoundedAndChecked) {
  auto read = [](const char* v) {
    Env e("TF_LMS_QUIESCE_WAIT_MS", v);
    return LmsQuiesceWaitMsFromEnv();
  };
  EXPECT_EQ(read(nullptr), kLmsQuiesceWaitMsDefault);
  EXPECT_EQ(read("1"), 1);
  EXPECT_EQ(read("250"), 250);
  EXPECT_EQ(read("60000"), 60000);
  for (const char* bad : {"0", "60001", "-5", "10ms", " ", "99999999999999999999"}) {
    EXPECT_EQ(read(bad), kLmsQuiesceWaitMsDefault) << bad;
  }
}

// ---------------------------------------------------------------------------
// Several devices in one process.

// Ends the program with a failure when the scope it guards outlives
// 'seconds': a hang cannot fail a test otherwise (its threads are stuck).
class Watchdog {
 public:
  Watchdog(const char* what, double seconds) : what_(what) {
    thread_ = std::thread([this, seconds] {
      std::unique_lock<std::mutex> l(mu_);
      if (!cv_.wait_for(l, std::chrono::duration<double>(seconds),
                        [&] { return done_; })) {
        std::fprintf(stderr,
                     "[  FAILED  ] watchdog: %s did not finish within %.0f s "
                     "(a hang)\n",
                     what_, seconds);
        std::fflush(stderr);
        std::_Exit(3);
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  const char* what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

double EnvSeconds(const char* name, double def) {
  const char* v = std::getenv(name);
  return v ? std::atof(v) : def;
}

// Two devices move pages of tensors (a mover thread each spills and returns
// them) while a kernel on each adds 1 to every word of the other's tensors
// (through the peer mapping of its pages) and a pair of handshake kernels,
// one per device, each waiting for the other as a collective's kernels do,
// is launched round after round from two threads, device 1's late.  A move
// holds every launch and drains its device and its peer: when it closes the
// gate while device 0's handshake kernel waits for device 1's, which the
// gate holds, that drain cannot end.  The quiesce gives such a round up
// within its bound, lets the launch go and starts over (QuietRounds), so
// the test ends (a watchdog fails it otherwise: TF_LMS_QUIESCE_WAIT_MS=60000
// makes the bound longer than the watchdog, as an unbounded wait is) and no
// add is lost (every word of every shared tensor checked against the adds
// made).  Skipped with fewer than 2 devices.  LMS_TEST_RACE_SECONDS (default
// 5): how long the movers run; LMS_TEST_WATCHDOG_SECONDS (default 120).
TEST(LmsMultiDevice, TwoDevicesMoveWhileEachWritesTheOthersMemory) {
  const int devices = lms_test::Devices();
  if (devices < 2) {
    GTEST_SKIP() << "needs 2 devices in the process; " << devices << " found";
  }
  if (!lms_test::PeerAccess(0, 1) || !lms_test::PeerAccess(1, 0)) {
    GTEST_SKIP() << "needs 2 devices with peer access to each other";
  }
  const double seconds = EnvSeconds("LMS_TEST_RACE_SECONDS", 5);
  Watchdog watchdog("TwoDevicesMoveWhileEachWritesTheOthersMemory",
                    EnvSeconds("LMS_TEST_WATCHDOG_SECONDS", 120));
  const size_t D = lms_test::DeviceBudget();
  const size_t va = 8 * D + 4 * D;
  std::unique_ptr<BFCAllocator> bfc[2];
  for (int d = 0; d < 2; ++d) {
    auto sub = lms_test::MakeLmsSubAllocatorOn(d, va, D, 2 * D);
    ASSERT_NE(sub, nullptr);
    BFCAllocator::Options o;
    o.allow_growth = true;
    o.allow_retry_on_failure = false;
    o.lms_enabled = true;
    bfc[d] = std::make_unique<BFCAllocator>(
        std::move(sub), va, d == 0 ? "lms_dev0" : "lms_dev1", o);
  }
  const LmsStats before = bfc[0]->GetLmsStats();
  if (!before.launch_gate_active) {
    GTEST_SKIP() << "launch gate inactive (reason "
                 << before.launch_gate_inactive_reason
                 << "): pages of live tensors do not move";
  }
  // Two tensors per device, allocated first: the least recently used, spilled
  // by each round of its mover and brought back when the round frees.
  const size_t n = D / 8;
  void* shared[2][2];
  auto seed = [](int d, int k) { return static_cast<uint32_t>(1000 + 2 * d + k); };
  for (int d = 0; d < 2; ++d) {
    lms_test::UseDevice(d);
    for (int k = 0; k < 2; ++k) {
      shared[d][k] = bfc[d]->AllocateRaw(64, n);
      ASSERT_NE(shared[d][k], nullptr);
      lms_test::Fill(shared[d][k], n, seed(d, k));
    }
  }
  std::atomic<bool> stop{false};
  // Device d's kernels add to device 1-d's tensors: adds[d] rounds of them.
  std::atomic<uint64_t> adds[2] = {{0}, {0}};
  std::vector<std::thread> threads;
  for (int d = 0; d < 2; ++d) {
    threads.emplace_back([&, d] {
      while (!stop.load()) {
        for (int k = 0; k < 2; ++k) lms_test::LaunchAdd(d, shared[1 - d][k], n);
        lms_test::Finish(d);
        ++adds[d];
      }
    });
  }
  // The handshake pair: both threads run the same rounds (a round is
  // launched on one device only while the other has launched it or will).
  std::mutex round_mu;
  int launched[2] = {0, 0};
  for (int d = 0; d < 2; ++d) {
    threads.emplace_back([&, d] {
      for (;;) {
        int r;
        {
          std::lock_guard<std::mutex> l(round_mu);
          if (stop.load() && launched[d] >= launched[1 - d]) return;
          r = ++launched[d];
        }
        if (d == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        lms_test::LaunchHandshake(d, r);
        lms_test::Finish(d);
      }
    });
  }
  // The movers: 8 tensors of D/8 beside the 2 shared ones: the shared
  // tensors are spilled, and come back when these are freed.
  std::atomic<int> refused{0};
  std::atomic<uint64_t> rounds[2] = {{0}, {0}};
  std::string last_error[2];
  std::vector<std::thread> movers;
  for (int d = 0; d < 2; ++d) {
    movers.emplace_back([&, d] {
      while (!stop.load()) {
        std::vector<void*> pressure;
        for (int k = 0; k < 8; ++k) {
          void* q = bfc[d]->AllocateRaw(64, n);
          if (q == nullptr) {
            ++refused;
            last_error[d] = bfc[d]->LmsLastError();
            break;
          }
          pressure.push_back(q);
        }
        for (void* q : pressure) bfc[d]->DeallocateRaw(q);
        ++rounds[d];
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : movers) t.join();
  for (auto& t : threads) t.join();
  EXPECT_EQ(refused.load(), 0) << last_error[0] << " / " << last_error[1];
  for (int d = 0; d < 2; ++d) {
    const LmsStats ls = bfc[d]->GetLmsStats();
    LOG(INFO) << "device " << d << ": " << rounds[d].load()
              << " mover rounds, " << adds[d].load()
              << " add rounds on the other device, " << launched[d]
              << " handshake rounds\n"
              << ls.DebugString();
    EXPECT_GT(rounds[d].load(), 0u);
    EXPECT_GT(adds[d].load(), 0u);
    EXPECT_GT(ls.bytes_swapped_out, 0) << "device " << d;
    EXPECT_GT(ls.bytes_swapped_in, 0) << "device " << d;
  }
  for (int d = 0; d < 2; ++d) {
    lms_test::UseDevice(d);
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(lms_test::CountMismatchesAdd(
                    shared[d][k], n, seed(d, k),
                    static_cast<uint32_t>(adds[1 - d].load())),
                0u)
          << "device " << d << " tensor " << k << " after "
          << adds[1 - d].load() << " adds by the other device";
      bfc[d]->DeallocateRaw(shared[d][k]);
    }
  }
}

}  // namespace
}  // namespace tsl
