// Errors: pinstage::Error carries a code and a message that says what to do.
#pragma once

#include <stdexcept>
#include <string>

#include "pinstage/export.h"

namespace pinstage {

// Why an operation failed. Backend status codes map onto the first group one to one.
enum class ErrorCode {
  invalid_argument,  // bad input from the caller (sizes, names, parameters)
  out_of_memory,     // device capacity or host memory exhausted
  unknown_pointer,   // free of a pointer nobody handed out
  no_device,         // no such device or no driver
  unsupported,       // the backend lacks the operation
  copy_failed,       // a host/device copy failed
  injected_fault,    // a failure requested through the fault hook
  not_found,         // no callable, backend or tensor of that name
  backend,           // any other backend failure
  internal,          // a broken invariant inside pinstage
  not_initialized,   // Worker used before init()
  finalized,         // Worker used after finalize()
  plugin_load,       // a backend plugin could not be loaded
  io,                // a file could not be read or written, or is malformed
  mismatch,          // a run's result differs from its golden
};

// Stable name of a code ("out_of_memory").
PINSTAGE_API const char* error_code_name(ErrorCode code);

// What every pinstage failure throws: a code to branch on and a message that says what
// to do.
class PINSTAGE_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// A write into read-only memory refused: a map-mode tensor (the page cache, mapped
// PROT_READ) given as an OUT or INOUT argument. Code invalid_argument; Python raises
// pinstage.ReadOnlyError, an InvalidArgumentError.
class PINSTAGE_API ReadOnlyError : public Error {
 public:
  explicit ReadOnlyError(const std::string& message);
};

// ErrorCode of a platform ABI status (ps_status); PS_OK is not an error.
PINSTAGE_API ErrorCode error_code_from_status(int status);
// The ps_status a plugin returns for an Error it caught (PS_ERR_INTERNAL for the codes
// that have no status of their own).
PINSTAGE_API int status_from_error_code(ErrorCode code);

// A program's main(): returns run(argc, argv), or 1 after "<program>: fatal error" on
// stderr when anything escapes it (setting up the command line can run out of memory
// before run's own handlers exist; an escaping exception would be std::terminate).
PINSTAGE_API int run_main(const char* program, int (*run)(int, char**), int argc, char** argv);

}  // namespace pinstage

// Internal invariant: a failure is a pinstage bug, reported as ErrorCode::internal.
#define PINSTAGE_ASSERT(cond)                                                                      \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      throw ::pinstage::Error(::pinstage::ErrorCode::internal,                                     \
                              std::string("internal invariant failed: " #cond " at ") + __FILE__ + \
                                  ":" + std::to_string(__LINE__));                                 \
  } while (0)
