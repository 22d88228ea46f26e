#include "pinstage/error.h"

#include <cstdio>
#include <iterator>

#include "pinstage/backend/platform_abi.h"
#include "pinstage/names.h"

namespace pinstage {

namespace {
// In ErrorCode order.
constexpr const char* kCodeNames[] = {
    "invalid_argument", "out_of_memory",  "unknown_pointer", "no_device", "unsupported",
    "copy_failed",      "injected_fault", "not_found",       "backend",   "internal",
    "not_initialized",  "finalized",      "plugin_load",     "io",        "mismatch"};
static_assert(std::size(kCodeNames) == static_cast<size_t>(ErrorCode::mismatch) + 1);
}  // namespace

const char* error_code_name(ErrorCode code) { return enum_name(code, kCodeNames, "unknown"); }

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

ReadOnlyError::ReadOnlyError(const std::string& message)
    : Error(ErrorCode::invalid_argument, message) {}

// The statuses PS_ERR_INVALID_ARGUMENT (-1) .. PS_ERR_BACKEND (-9) are the first nine
// codes, in order; anything else is internal.
ErrorCode error_code_from_status(int status) {
  static_assert(PS_ERR_INVALID_ARGUMENT == -1 && PS_ERR_BACKEND == -9 &&
                static_cast<int>(ErrorCode::backend) == 8);
  return status <= PS_ERR_INVALID_ARGUMENT && status >= PS_ERR_BACKEND
             ? static_cast<ErrorCode>(-status - 1)
             : ErrorCode::internal;
}

int run_main(const char* program, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (...) {
    std::fprintf(stderr, "%s: fatal error\n", program);
    return 1;
  }
}

int status_from_error_code(ErrorCode code) {
  const int index = static_cast<int>(code);
  return index <= static_cast<int>(ErrorCode::backend) ? -index - 1 : PS_ERR_INTERNAL;
}

}  // namespace pinstage
