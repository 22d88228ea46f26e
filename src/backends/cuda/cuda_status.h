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

// True for the errors that leave the CUDA context unusable (an illegal address, a failed
// launch, an uncorrectable ECC error, ...): every later call of the process fails with
// them. The backend also treats as sticky any error still reported after it was cleared.
bool is_sticky(cudaError_t error);

// "<cudaGetErrorString> (<cudaGetErrorName>)", e.g.
// "out of memory (cudaErrorMemoryAllocation)".
std::string cuda_error_text(cudaError_t error);

}  // namespace pinstage::cuda
