#pragma once
// Large Model Support: the rule for the host budget's default, written once,
// and the budget's peak for the statistics (defined in
// impl/LMSHostBudget.cpp). Not an installed header.
//
// The budget is PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB MiB per process when that is
// set (not blank), else 80% of the host's memory shared equally by the
// processes on the node (torchrun's LOCAL_WORLD_SIZE), so that pinned swap
// space can never push the node into the kernel's OOM killer. The allocator
// applies it to MemAvailable when LMS first needs the budget; Python asks the
// same rule through c10_lms_host_budget_rule (torch/cuda/lms.py
// _host_budget_rule), so lms_swap on a patched build follows it too.
#include <cstddef>
#include <string>

namespace c10::cuda::CUDACachingAllocator::lms::impl {

// Processes sharing the node's host memory for a LOCAL_WORLD_SIZE value:
// its number when it is all decimal digits and above 0, else 1 (nullptr:
// unset).
size_t parse_local_world_size(const char* value);
// The same for this process's environment.
size_t local_world_size();

// The budget in bytes for the values of PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB
// (`limit_mb`) and LOCAL_WORLD_SIZE (nullptr: unset) on a host of
// `host_bytes`: int(limit_mb * 2^20) when limit_mb is not blank, else
// int(host_bytes * 0.8) / local world size (both rounded down, in double
// precision as Python's int(x * 0.8)). False, with *err naming the variable
// and its value, when limit_mb is not a finite number >= 0 (decimal, with
// surrounding blanks and '_' between digits allowed, as Python's float()).
bool host_budget_rule(
    const char* limit_mb,
    const char* local_world_size,
    size_t host_bytes,
    size_t* bytes,
    std::string* err);

// The most host budget in use at once since the last reset
// (host_budget.peak of stats_text), and its reset to what is in use now
// (reset_peak).
size_t host_budget_peak();
void reset_host_budget_peak();

} // namespace c10::cuda::CUDACachingAllocator::lms::impl
