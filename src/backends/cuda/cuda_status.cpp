#include "backends/cuda/cuda_status.h"

namespace pinstage::cuda {

ps_status status_from_cuda(cudaError_t error, ps_status fallback) {
  switch (error) {
    case cudaSuccess:
      return PS_OK;
    case cudaErrorMemoryAllocation:
      return PS_ERR_OUT_OF_MEMORY;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorStubLibrary:
    case cudaErrorDeviceUninitialized:
    case cudaErrorSystemNotReady:
      return PS_ERR_NO_DEVICE;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorInvalidResourceHandle:
      return PS_ERR_INVALID_ARGUMENT;
    case cudaErrorHostMemoryNotRegistered:
      return PS_ERR_UNKNOWN_POINTER;
    case cudaErrorNotSupported:
      return PS_ERR_UNSUPPORTED;
    default:
      return fallback;
  }
}

bool is_sticky(cudaError_t error) {
  switch (error) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
    case cudaErrorAssert:
      return true;
    default:
      return false;
  }
}

std::string cuda_error_text(cudaError_t error) {
  const char* text = cudaGetErrorString(error);
  const char* name = cudaGetErrorName(error);
  return std::string(text ? text : "unknown CUDA error") + " (" +
         (name ? name : ("cudaError " + std::to_string(static_cast<int>(error))).c_str()) + ")";
}

}  // namespace pinstage::cuda
