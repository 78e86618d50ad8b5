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

#ifndef TENSORFLOW_CORE_COMMON_RUNTIME_GPU_GPU_LMS_ALLOCATOR_H_
#define TENSORFLOW_CORE_COMMON_RUNTIME_GPU_GPU_LMS_ALLOCATOR_H_

#include <memory>
#include <vector>

#include "tensorflow/core/protobuf/config.pb.h"
#include "tensorflow/tsl/framework/allocator.h"
#include "tensorflow/tsl/framework/device_id.h"

namespace tensorflow {

// Large Model Support for the GPU BFC allocator.  When
// options.experimental().lms_enabled() is set (tf.config.experimental.
// set_lms_enabled(True) or the session ConfigProto), returns a page-mapped
// sub-allocator (CUDA VMM: device pages + host pages remapped at the same
// virtual addresses) that maps at most 'device_bytes' of device memory and at
// most TF_GPU_HOST_MEM_LIMIT_IN_MB (or gpu_host_mem_limit_in_mb) of host
// memory, and sets '*bfc_total_bytes' to the size of its virtual address
// range: the BFC allocator's pool limit.  Returns nullptr (LMS off) otherwise
// or when the GPU/driver lacks the needed VMM features (logged).
// 'peer_gpu_ids' are the other TF GPUs, as GPUProcessState::GetGPUAllocator
// receives them: the pages under tensors are mapped for those that can
// access this GPU's memory (as upstream's GpuVirtualMemAllocator maps its
// memory), and a page move drains them too.
std::unique_ptr<tsl::SubAllocator> MaybeCreateGpuLmsSubAllocator(
    const GPUOptions& options, tsl::PlatformDeviceId platform_device_id,
    const std::vector<tsl::SubAllocator::Visitor>& alloc_visitors,
    size_t device_bytes, const std::vector<tsl::TfDeviceId>& peer_gpu_ids,
    size_t* bfc_total_bytes);

}  // namespace tensorflow

#endif  // TENSORFLOW_CORE_COMMON_RUNTIME_GPU_GPU_LMS_ALLOCATOR_H_
