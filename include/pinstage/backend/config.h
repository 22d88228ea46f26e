/* Plugin SDK: the one way a backend reads its key/value configuration (ps_config_entry):
 * entries checked the same way everywhere (no NULL key or value, no repeated key) and
 * values parsed with the strict parsers of pinstage/settings.h. A bad entry is
 * Error(invalid_argument) "config: ..." naming the key, the value and what it expects;
 * the Worker reports it from init(). See docs/design/plugin-abi.md. */
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>

#include "pinstage/backend/platform_abi.h"
#include "pinstage/error.h"
#include "pinstage/settings.h"

namespace pinstage::backend {

[[noreturn]] inline void config_refuse(const std::string& message) {
  throw Error(ErrorCode::invalid_argument, "config: " + message);
}

[[noreturn]] inline void config_bad_value(std::string_view key, std::string_view value,
                                          const char* expected, const std::string& detail = {}) {
  config_refuse(std::string(key) + "='" + std::string(value) + "' is not valid: expected " +
                expected + (detail.empty() ? "" : " (" + detail + ")"));
}

// A whole number in [min, max]; the message keeps the parser's detail and adds what the
// key expects.
inline int64_t config_integer(std::string_view key, std::string_view value, int64_t min,
                              int64_t max, const char* expected) {
  try {
    return parse_integer(value, min, max, "config " + std::string(key));
  } catch (const Error& e) {
    config_bad_value(key, value, expected, e.what());
  }
}

// A byte count ("2M", "4096") in [min, max].
inline uint64_t config_byte_count(std::string_view key, std::string_view value, uint64_t min,
                                  uint64_t max, const char* expected) {
  uint64_t bytes = 0;
  try {
    bytes = parse_byte_count(value, "config " + std::string(key));
  } catch (const Error& e) {
    config_bad_value(key, value, expected, e.what());
  }
  if (bytes < min || bytes > max) config_bad_value(key, value, expected);
  return bytes;
}

// Calls apply(key, value) for every entry in order, after refusing a NULL key or value and
// a key given twice; `keys` lists the valid keys for the messages.
template <class Apply>
void for_each_config_entry(std::span<const ps_config_entry> entries, const char* keys,
                           Apply&& apply) {
  std::set<std::string_view> seen;
  for (const ps_config_entry& entry : entries) {
    if (entry.key == nullptr || entry.value == nullptr)
      config_refuse(std::string("an entry has a NULL ") + (entry.key == nullptr ? "key" : "value") +
                    " (keys: " + keys + ")");
    const std::string_view key = entry.key;
    if (!seen.insert(key).second)
      config_refuse("key '" + std::string(key) + "' is given twice (keys: " + keys + ")");
    apply(key, std::string_view(entry.value));
  }
}

}  // namespace pinstage::backend
