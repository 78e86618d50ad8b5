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

// CUDA virtual memory (VMM) pages for Large Model Support: device pages are
// cuMemCreate'd on the GPU, host pages are cuMemCreate'd in pinned host memory
// (CU_MEM_LOCATION_TYPE_HOST_NUMA, CUDA >= 12.2) and mapped at the same
// virtual address when a device page is spilled, so the GPU keeps reading and
// writing the data through the same pointer.
//
// Before pages that may hold live data move, Quiesce() closes the launch gate
// (CUPTI callbacks hold every other thread's kernel launches and copies at the
// CUDA API) and synchronizes this GPU and its peers, in bounded rounds (with
// collectives across GPUs, queued work may wait for a held launch); Resume()
// opens it (see the .cc).
// The gate starts with the first backend; TF_LMS_LAUNCH_GATE=0 leaves it off.

#ifndef TENSORFLOW_CORE_COMMON_RUNTIME_GPU_GPU_LMS_PAGE_BACKEND_H_
#define TENSORFLOW_CORE_COMMON_RUNTIME_GPU_GPU_LMS_PAGE_BACKEND_H_

#include <memory>
#include <vector>

#include "tensorflow/tsl/framework/lms_sub_allocator.h"
#include "tensorflow/tsl/platform/statusor.h"

#if GOOGLE_CUDA
#include "third_party/gpus/cuda/include/cuda.h"

namespace tensorflow {

// Creates the CUDA VMM page backend for 'device_ordinal' in 'context'
// (the TF GPU device's context; the primary context in tests), with pages of
// 'page_bytes' (tsl::LmsPageBytes; rounded up to the driver's granularity).
// 'peer_ordinals': the other GPUs of the process (CUDA ordinals) that may
// touch this GPU's tensors; those that can access this GPU's memory get
// access to its pages under tensors, and a page move drains them too.
tsl::StatusOr<std::unique_ptr<tsl::LmsPageBackend>> CreateGpuLmsPageBackend(
    CUcontext context, int device_ordinal, size_t page_bytes,
    const std::vector<int>& peer_ordinals = {});

}  // namespace tensorflow

#endif  // GOOGLE_CUDA
#endif  // TENSORFLOW_CORE_COMMON_RUNTIME_GPU_GPU_LMS_PAGE_BACKEND_H_
