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

// Settings, messages and test fault injection of Large Model Support's
// page-mapped sub-allocator (lms_sub_allocator.h): what is read from the
// environment, checked and explained here, so that the sub-allocator itself
// holds only page bookkeeping.

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/tsl/framework/lms_sub_allocator.h"
#include "tensorflow/tsl/platform/errors.h"
#include "tensorflow/tsl/platform/logging.h"
#include "tensorflow/tsl/platform/strcat.h"

namespace tsl {

std::string LmsStats::DebugString() const {
  return strings::StrCat(
      "LMS enabled: ", enabled, "\nLMS defrag enabled: ", defrag_enabled,
      "\nPage bytes: ", page_bytes, "\nDevice bytes limit: ",
      device_bytes_limit, "\nDevice bytes mapped: ", device_bytes_mapped,
      "\nDevice bytes reserved: ", device_bytes_reserved,
      "\nHost bytes limit: ", host_bytes_limit,
      "\nHost bytes in use: ", host_bytes_in_use,
      "\nPeak host bytes in use: ", peak_host_bytes_in_use,
      "\nHost bytes reserved: ", host_bytes_reserved,
      "\nHost reserve bytes: ", host_reserve_bytes,
      "\nHost bytes made ahead: ", host_bytes_made_ahead,
      "\nSwap out ns: ", swap_out_ns, "\nSwap in ns: ", swap_in_ns,
      "\nBytes swapped out: ", bytes_swapped_out,
      "\nBytes swapped in: ", bytes_swapped_in,
      "\nPages swapped out: ", num_swap_outs,
      "\nPages swapped in: ", num_swap_ins, "\nReclaims: ", num_reclaims,
      "\nDefrag events: ", num_defrag_events,
      "\nBytes defragmented: ", bytes_defragmented,
      "\nFailures: ", num_failures,
      "\nDevice syncs: ", num_device_syncs,
      "\nDevice syncs on free: ", num_device_syncs_on_free,
      "\nLaunch gate active: ", launch_gate_active,
      "\nLaunch gate inactive reason: ", launch_gate_inactive_reason,
      "\nLaunch gate gated calls: ", launch_gate_gated_calls,
      "\nLaunch gate closes: ", launch_gate_closes,
      "\nLaunch gate close wait ns: ", launch_gate_close_wait_ns,
      "\nLaunch gate calls held: ", launch_gate_calls_held,
      "\nQuiesce rounds given up: ", launch_gate_quiesce_retries, "\n");
}

namespace {
// Environment variable 'name' read as a whole number of MiB: 'text' is
// nullptr when it is unset or empty, 'mb' is -1 when the text is not a
// non-negative integer, LLONG_MAX when it is one too large to hold.
struct EnvMiB {
  const char* text = nullptr;
  long long mb = -1;
};
EnvMiB ReadEnvMiB(const char* name) {
  EnvMiB e;
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return e;
  e.text = v;
  char* end = nullptr;
  errno = 0;
  long long mb = std::strtoll(v, &end, 10);
  if (errno == ERANGE && mb > 0) mb = LLONG_MAX;  // too large: capped later
  if (end != v && *end == '\0' && mb >= 0 && *v != '-') e.mb = mb;
  return e;
}
}  // namespace

size_t LmsHostMemLimitBytes(long long mb, const char* setting,
                            size_t default_bytes) {
  if (mb < 0) {
    LOG(ERROR) << setting << "=" << mb
               << " is not a number of MiB; using the default of "
               << (default_bytes >> 20) << " MiB.";
    return default_bytes;
  }
  long long cap = kLmsMaxHostMemLimitMiB;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) {
    cap = std::min<long long>(cap, static_cast<long long>(
                                       (static_cast<unsigned long long>(pages) *
                                        static_cast<unsigned long long>(page)) >>
                                       20));
  }
  if (mb > cap) {
    LOG(WARNING) << setting << "=" << mb << " MiB is more than "
                 << (cap == kLmsMaxHostMemLimitMiB ? "LMS allows"
                                                   : "this machine's memory")
                 << "; host swap space capped at " << cap << " MiB.";
    mb = cap;
  }
  return static_cast<size_t>(mb) << 20;  // mb <= 2^30: no overflow
}

size_t LmsHostMemLimitFromEnv(size_t default_bytes) {
  const char* name = "TF_GPU_HOST_MEM_LIMIT_IN_MB";
  const EnvMiB e = ReadEnvMiB(name);
  if (e.text == nullptr) return default_bytes;
  if (e.mb < 0) {
    LOG(ERROR) << name << "=\"" << e.text
               << "\" is not a whole, non-negative number of MiB; using the "
                  "default of "
               << (default_bytes >> 20) << " MiB.";
    return default_bytes;
  }
  return LmsHostMemLimitBytes(e.mb, name, default_bytes);
}

int64_t LmsQuiesceWaitMsFromEnv() {
  const char* name = "TF_LMS_QUIESCE_WAIT_MS";
  const EnvMiB e = ReadEnvMiB(name);  // a whole number, read as MiB are
  if (e.text == nullptr) return kLmsQuiesceWaitMsDefault;
  if (e.mb >= 1 && e.mb <= kLmsQuiesceWaitMsMax) return e.mb;
  LOG(ERROR) << name << "=\"" << e.text
             << "\" is not a whole number of milliseconds from 1 to "
             << kLmsQuiesceWaitMsMax << "; using the default of "
             << kLmsQuiesceWaitMsDefault << " ms.";
  return kLmsQuiesceWaitMsDefault;
}

size_t LmsPageBytes(size_t device_bytes) {
  constexpr size_t kMiB = size_t{1} << 20;
  const EnvMiB e = ReadEnvMiB("TF_LMS_PAGE_IN_MB");
  if (e.text != nullptr) {
    if (e.mb >= 2 && e.mb <= 1024 && (e.mb & (e.mb - 1)) == 0) {
      return static_cast<size_t>(e.mb) * kMiB;
    }
    LOG(ERROR) << "TF_LMS_PAGE_IN_MB=\"" << e.text
               << "\" is not a power of two from 2 to 1024; using the "
                  "default for the device budget.";
  }
  size_t page = 2 * kMiB;
  while (page < 64 * kMiB && 2 * page * 256 <= device_bytes) page *= 2;
  return page;
}

size_t LmsHostReserveFromEnv() {
  const EnvMiB e = ReadEnvMiB("TF_LMS_HOST_RESERVE_IN_MB");
  if (e.text == nullptr || std::strcmp(e.text, "auto") == 0) {
    return LmsVirtualMemSubAllocator::kHostReserveAuto;
  }
  if (e.mb < 0) {
    LOG(ERROR) << "TF_LMS_HOST_RESERVE_IN_MB=\"" << e.text
               << "\" is not a number of MiB or \"auto\"; using auto (1/8 of "
                  "the device budget, at most half the host budget).";
    return LmsVirtualMemSubAllocator::kHostReserveAuto;
  }
  return static_cast<size_t>(e.mb) << 20;
}

namespace {
// The positive whole numbers of a comma-separated list (empty when 'v' is
// nullptr or any item is not one).
std::vector<size_t> PositiveList(const char* v) {
  std::vector<size_t> out;
  if (v == nullptr) return out;
  for (const char* p = v; *p != '\0';) {
    char* end = nullptr;
    const long long n = std::strtoll(p, &end, 10);
    if (end == p || n <= 0 || (*end != ',' && *end != '\0')) return {};
    out.push_back(static_cast<size_t>(n));
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}
}  // namespace

LmsRemapFaults::LmsRemapFaults()
    : fail_at_(PositiveList(std::getenv("TF_LMS_TEST_FAIL_REMAP"))),
      fail_create_at_([] {
        const std::vector<size_t> v =
            PositiveList(std::getenv("TF_LMS_TEST_FAIL_CREATE"));
        return v.size() == 1 ? v[0] : size_t{0};
      }()) {}

Status LmsRemapFaults::Next(const char* call) {
  ++count_;
  for (size_t n : fail_at_) {
    if (n == count_) {
      return errors::Internal(call, ": injected (TF_LMS_TEST_FAIL_REMAP)");
    }
  }
  return OkStatus();
}

Status LmsRemapFaults::Create(bool host) {
  if (host || fail_create_at_ == 0) return OkStatus();
  std::lock_guard<std::mutex> l(create_mu_);
  if (++creates_ < fail_create_at_) return OkStatus();
  return errors::ResourceExhausted(
      "creating a device page: out of memory, injected "
      "(TF_LMS_TEST_FAIL_CREATE)");
}

Status LmsRemapFailed(const Status& failed,
                      const std::vector<LmsPageBackend::Placed>& placed,
                      const Status& back) {
  size_t on_to = 0, unmapped = 0;
  for (LmsPageBackend::Placed p : placed) {
    on_to += p == LmsPageBackend::Placed::kOnTo;
    unmapped += p == LmsPageBackend::Placed::kUnmapped;
  }
  if (on_to == 0 && unmapped == 0) {
    return errors::Internal("LMS: moving pages failed (", failed.message(),
                            "); every page was put back");
  }
  return errors::Internal(
      "LMS: moving pages failed (", failed.message(),
      ") and putting pages back failed too (", back.message(), "): ", on_to,
      " page(s) stay on their new copy, ", unmapped,
      " page(s) are unmapped, their data kept on both copies until they are "
      "mapped again");
}

bool LmsLaunchGateWantedFromEnv() {
  const char* v = std::getenv("TF_LMS_LAUNCH_GATE");
  if (v == nullptr || *v == '\0') return true;
  for (const char* off : {"0", "false", "False", "FALSE", "off", "no"}) {
    if (std::strcmp(v, off) == 0) return false;
  }
  return true;
}

bool LmsUnsafeMovesWithoutGateFromEnv() {
  const char* v = std::getenv("TF_LMS_UNSAFE_MOVE_WITHOUT_GATE");
  if (v == nullptr) return false;
  for (const char* on : {"1", "true", "True", "TRUE", "on", "yes"}) {
    if (std::strcmp(v, on) == 0) return true;
  }
  return false;
}

Status LmsLiveMovesAllowed(const LmsStats& gate) {
  if (gate.launch_gate_active) return OkStatus();
  const char* why = "the page backend has no launch gate";
  const char* fix = "use a backend with a launch gate";
  switch (gate.launch_gate_inactive_reason) {
    case 1:
      why = "no CUPTI library was found";
      fix = "install CUPTI (the CUDA toolkit's extras/CUPTI, or pip's "
            "nvidia-cuda-cupti-cu12) or point LD_LIBRARY_PATH or CUDA_HOME "
            "at it";
      break;
    case 2:
      why = "CUPTI is held by another client (a profiler: tf.profiler, "
            "Nsight, compute-sanitizer)";
      fix = "run without the profiler attached";
      break;
    case 3:
      why = "CUPTI refused the gate's callbacks";
      fix = "check the CUPTI library matches the driver";
      break;
    case 4:
      why = "TF_LMS_LAUNCH_GATE=0 turned it off";
      fix = "unset TF_LMS_LAUNCH_GATE";
      break;
  }
  return errors::FailedPrecondition(
      "LMS cannot move pages of live tensors: the launch gate is inactive "
      "(reason ",
      gate.launch_gate_inactive_reason, ": ", why,
      "), and without it other threads' kernels could touch a page while it "
      "moves. To fix: ",
      fix,
      "; or set TF_LMS_UNSAFE_MOVE_WITHOUT_GATE=1 to move after a device "
      "synchronization only (unsafe: launches made during a move may fail "
      "with an illegal address or lose writes).");
}

Status LmsPageBackend::LiveMovesAllowed() const {
  LmsStats gate;
  AddLaunchGateStats(&gate);
  return LmsLiveMovesAllowed(gate);
}

}  // namespace tsl
