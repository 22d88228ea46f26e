// Plugin SDK: the one error style at the slot boundary. A slot body throws SlotError (or
// any exception); guarded() turns it into a ps_status and the thread's last_error text,
// so nothing unwinds through the C ABI.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <new>
#include <string>
#include <string_view>
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

// PS_ERR_INVALID_ARGUMENT with `message` unless `ok`. Two blocks, the throw out of line: a
// body this small is inlined by clang-tidy's shallow analyzer (scripts/tidy.py), which then
// knows that what follows a require runs only when it held.
[[noreturn]] inline void fail_invalid_argument(const char* message) {
  fail(PS_ERR_INVALID_ARGUMENT, message);
}
inline void require(bool ok, const char* message) {
  if (!ok) fail_invalid_argument(message);
}

// A thread's last slot error, for a plugin's `thread_local`. A fixed buffer with no
// destructor: a thread_local destructor in a dlopen'd plugin runs at thread exit, and TSan
// cannot order it against glibc freeing that thread's TLS from the thread that reuses its
// stack (google/sanitizers#414), so exits of detached (Python) threads reported races.
// Setting it never allocates or throws; text past kCapacity is cut and ends in "...".
class LastError {
 public:
  static constexpr std::size_t kCapacity = 4096;

  void clear() noexcept { text_[0] = '\0'; }
  // The concatenation of the parts.
  void set(std::string_view a, std::string_view b = {}, std::string_view c = {}) noexcept {
    std::size_t n = 0;
    bool cut = false;
    for (const std::string_view part : {a, b, c}) {
      const std::size_t take = std::min(part.size(), kCapacity - 1 - n);
      if (take != 0) std::memcpy(text_ + n, part.data(), take);  // an empty view's data() is null
      n += take;
      cut = cut || take < part.size();
    }
    if (cut) std::memcpy(text_ + kCapacity - 4, "...", 3);
    text_[n] = '\0';
  }
  const char* c_str() const noexcept { return text_; }

 private:
  char text_[kCapacity] = {};
};

// Runs `body` (returning void); `last_error` is the plugin's thread_local message, cleared
// first. `backend` prefixes internal errors ("sim: internal error: ...").
template <class Body>
int guarded(LastError& last_error, const char* backend, Body&& body) noexcept {
  try {
    last_error.clear();
    body();
    return PS_OK;
  } catch (const SlotError& e) {
    last_error.set(e.message);
    return e.status;
  } catch (const Error& e) {  // from base (pages, settings): keep its meaning
    last_error.set(backend, ": ", e.what());
    return static_cast<int>(status_from_error_code(e.code()));
  } catch (const std::bad_alloc&) {
    last_error.set(backend, ": host memory exhausted");
    return PS_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    last_error.set(backend, ": internal error: ", e.what());
    return PS_ERR_INTERNAL;
  } catch (...) {
    last_error.set(backend, ": internal error: unknown exception");
    return PS_ERR_INTERNAL;
  }
}

}  // namespace pinstage::backend
