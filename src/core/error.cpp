#include "pinstage/error.h"

#include "pinstage/platform_abi.h"

namespace pinstage {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument:
      return "invalid_argument";
    case ErrorCode::out_of_memory:
      return "out_of_memory";
    case ErrorCode::unknown_pointer:
      return "unknown_pointer";
    case ErrorCode::no_device:
      return "no_device";
    case ErrorCode::unsupported:
      return "unsupported";
    case ErrorCode::copy_failed:
      return "copy_failed";
    case ErrorCode::injected_fault:
      return "injected_fault";
    case ErrorCode::not_found:
      return "not_found";
    case ErrorCode::backend:
      return "backend";
    case ErrorCode::internal:
      return "internal";
    case ErrorCode::not_initialized:
      return "not_initialized";
    case ErrorCode::finalized:
      return "finalized";
    case ErrorCode::plugin_load:
      return "plugin_load";
    case ErrorCode::io:
      return "io";
    case ErrorCode::mismatch:
      return "mismatch";
  }
  return "unknown";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

ErrorCode error_code_from_status(int status) {
  switch (status) {
    case PS_ERR_INVALID_ARGUMENT:
      return ErrorCode::invalid_argument;
    case PS_ERR_OUT_OF_MEMORY:
      return ErrorCode::out_of_memory;
    case PS_ERR_UNKNOWN_POINTER:
      return ErrorCode::unknown_pointer;
    case PS_ERR_NO_DEVICE:
      return ErrorCode::no_device;
    case PS_ERR_UNSUPPORTED:
      return ErrorCode::unsupported;
    case PS_ERR_COPY_FAILED:
      return ErrorCode::copy_failed;
    case PS_ERR_INJECTED_FAULT:
      return ErrorCode::injected_fault;
    case PS_ERR_NOT_FOUND:
      return ErrorCode::not_found;
    case PS_ERR_BACKEND:
      return ErrorCode::backend;
    default:
      return ErrorCode::internal;
  }
}

}  // namespace pinstage
