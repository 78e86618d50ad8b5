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

#include "tensorflow/core/common_runtime/gpu/gpu_lms_allocator.h"

#include <algorithm>

#include <utility>

#include "tensorflow/tsl/framework/lms_sub_allocator.h"
#include "tensorflow/tsl/platform/logging.h"

#if GOOGLE_CUDA
#include "tensorflow/compiler/xla/stream_executor/cuda/cuda_driver.h"
#include "tensorflow/compiler/xla/stream_executor/device_id_utils.h"
#include "tensorflow/compiler/xla/stream_executor/gpu/gpu_init.h"
#include "tensorflow/compiler/xla/stream_executor/stream_executor.h"
#include "tensorflow/core/common_runtime/gpu/gpu_id_manager.h"
#include "tensorflow/core/common_runtime/gpu/gpu_lms_page_backend.h"
#endif

namespace tensorflow {

std::unique_ptr<tsl::SubAllocator> MaybeCreateGpuLmsSubAllocator(
    const GPUOptions& options, tsl::PlatformDeviceId platform_device_id,
    const std::vector<tsl::SubAllocator::Visitor>& alloc_visitors,
    size_t device_bytes, const std::vector<tsl::TfDeviceId>& peer_gpu_ids,
    size_t* bfc_total_bytes) {
  if (!options.experimental().lms_enabled()) return nullptr;
#if GOOGLE_CUDA
  namespace se = ::stream_executor;
  se::StreamExecutor* executor =
      se::DeviceIdUtil::ExecutorForPlatformDeviceId(se::GPUMachineManager(),
                                                    platform_device_id)
          .value();
  auto* gpu_context = reinterpret_cast<se::gpu::GpuContext*>(
      executor->implementation()->GpuContextHack());
  // The peers' CUDA ordinals (TF ids mapped as upstream's
  // CreateSubAllocator maps them for GpuVirtualMemAllocator).
  std::vector<int> peers;
  for (const tsl::TfDeviceId tf_peer : peer_gpu_ids) {
    tsl::PlatformDeviceId platform_peer;
    if (!GpuIdManager::TfToPlatformDeviceId(tf_peer, &platform_peer).ok()) {
      continue;
    }
    if (std::find(peers.begin(), peers.end(), platform_peer.value()) ==
        peers.end()) {
      peers.push_back(platform_peer.value());
    }
  }
  auto backend = CreateGpuLmsPageBackend(
      gpu_context->context(), platform_device_id.value(),
      tsl::LmsPageBytes(device_bytes), peers);
  if (!backend.ok()) {
    LOG(ERROR) << "Large Model Support is not available on GPU "
               << platform_device_id.value() << ": " << backend.status();
    return nullptr;
  }
  // Host swap space: gpu_host_mem_limit_in_mb, else TF_GPU_HOST_MEM_LIMIT_IN_MB,
  // else the gpu_host_bfc allocator's default (128 GiB).
  // Both are checked and capped (tsl::LmsHostMemLimitBytes: no overflow of
  // MiB to bytes), and the one in force is named in LMS's errors.
  constexpr size_t kDefaultHostBytes = size_t{1} << 37;
  const char* kConfigOption = "gpu_options.experimental.gpu_host_mem_limit_in_mb";
  const bool from_config = options.experimental().gpu_host_mem_limit_in_mb() > 0;
  const size_t host_bytes =
      from_config
          ? tsl::LmsHostMemLimitBytes(
                // a float: converted only once within range
                std::min<double>(options.experimental().gpu_host_mem_limit_in_mb(),
                                 tsl::kLmsMaxHostMemLimitMiB + 1.0),
                kConfigOption, kDefaultHostBytes)
          : tsl::LmsHostMemLimitFromEnv(kDefaultHostBytes);
  // Address space for the device pages, the spilled pages and the holes left
  // by defragmentation.
  const size_t va_bytes = 4 * device_bytes + 2 * host_bytes;
  auto sub = tsl::LmsVirtualMemSubAllocator::Create(
      std::move(backend).value(), va_bytes, device_bytes, host_bytes,
      alloc_visitors, {}, platform_device_id.value(),
      tsl::LmsHostReserveFromEnv());
  if (sub == nullptr) return nullptr;
  if (from_config) sub->set_host_limit_setting(kConfigOption);
  *bfc_total_bytes = va_bytes;
  return sub;
#else
  LOG(ERROR) << "Large Model Support needs a CUDA build of TensorFlow.";
  return nullptr;
#endif
}

}  // namespace tensorflow
