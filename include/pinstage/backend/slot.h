// Plugin SDK: the one error style at the slot boundary. A slot body throws SlotError (or
// any exception); guarded() turns it into a ps_status and the thread's last_error text,
// so nothing unwinds through the C ABI.
#pragma once

#include <new>
#include <string>
#include <utility>

#include "pinstage/backend/platform_abi.h"
#include "pinstage/error.h"

namespace pinstage::backend {

// A slot's failure: the status to return and the message last_error will give.
struct SlotError {
  ps_status status;
  std::string message;
};

[[noreturn]] inline void fail(ps_status status, std::string message) {
  throw SlotError{status, std::move(message)};
}

// PS_ERR_INVALID_ARGUMENT with `message` unless `ok`.
inline void require(bool ok, const char* message) {
  if (!ok) fail(PS_ERR_INVALID_ARGUMENT, message);
}

// Runs `body` (returning void); `last_error` is the plugin's thread_local message, cleared
// first. `backend` prefixes internal errors ("sim: internal error: ...").
template <class Body>
int guarded(std::string& last_error, const char* backend, Body&& body) noexcept {
  try {
    last_error.clear();
    body();
    return PS_OK;
  } catch (const SlotError& e) {
    try {
      last_error = e.message;
    } catch (...) {
    }
    return e.status;
  } catch (const Error& e) {  // from base (pages, settings): keep its meaning
    try {
      last_error = std::string(backend) + ": " + e.what();
    } catch (...) {
    }
    return static_cast<int>(status_from_error_code(e.code()));
  } catch (const std::bad_alloc&) {
    try {
      last_error = std::string(backend) + ": host memory exhausted";
    } catch (...) {
    }
    return PS_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    try {
      last_error = std::string(backend) + ": internal error: " + e.what();
    } catch (...) {
    }
    return PS_ERR_INTERNAL;
  } catch (...) {
    try {
      last_error = std::string(backend) + ": internal error: unknown exception";
    } catch (...) {
    }
    return PS_ERR_INTERNAL;
  }
}

}  // namespace pinstage::backend
