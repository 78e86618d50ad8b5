#pragma once
// Large Model Support: the CUDA driver entry points LMS calls, as
// c10::cuda::DriverAPI::get()->cuMemMap_(...) and C10_CUDA_DRIVER_CHECK. Every
// tag has a header of this name; v2.6.0 has upstream's (c10/cuda/driver_api.h).
#include <c10/cuda/driver_api.h>
