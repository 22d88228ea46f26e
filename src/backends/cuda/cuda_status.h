// CUDA runtime errors as platform ABI statuses and messages.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "pinstage/backend/platform_abi.h"

namespace pinstage::cuda {

// The ps_status for a CUDA error: out of memory, no device/driver, bad argument, unknown
// registered pointer and unsupported map to their own codes; anything else gets
// `fallback` (PS_ERR_COPY_FAILED for copies, PS_ERR_BACKEND elsewhere).
ps_status status_from_cuda(cudaError_t error, ps_status fallback);

// "<cudaGetErrorString> (<cudaGetErrorName>)", e.g.
// "out of memory (cudaErrorMemoryAllocation)".
std::string cuda_error_text(cudaError_t error);

}  // namespace pinstage::cuda
