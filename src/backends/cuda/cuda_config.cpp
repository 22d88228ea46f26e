#include "backends/cuda/cuda_config.h"

#include <limits>
#include <set>
#include <string>
#include <string_view>

#include "pinstage/error.h"
#include "pinstage/names.h"
#include "pinstage/settings.h"

namespace pinstage::cuda {

namespace {

constexpr const char* kKeys = "pinned_mode, register_threshold_mb, prefault_threads, register_thp";

[[noreturn]] void refuse(const std::string& message) {
  throw Error(ErrorCode::invalid_argument, "config: " + message);
}

[[noreturn]] void bad_value(std::string_view key, std::string_view value, const char* expected,
                            const std::string& detail = {}) {
  refuse(std::string(key) + "='" + std::string(value) + "' is not valid: expected " + expected +
         (detail.empty() ? "" : " (" + detail + ")"));
}

// A whole number in [min, max] through the one strict parser; the message keeps its
// detail and adds what the key expects.
int64_t number(std::string_view key, std::string_view value, int64_t min, int64_t max,
               const char* expected) {
  try {
    return parse_integer(value, min, max, "config " + std::string(key));
  } catch (const Error& e) {
    bad_value(key, value, expected, e.what());
  }
}

void apply(CudaConfig& config, std::string_view key, std::string_view value) {
  if (key == "pinned_mode") {
    if (value == "auto")
      config.pinned_mode = PinnedMode::auto_select;
    else if (value == "alloc")
      config.pinned_mode = PinnedMode::alloc;
    else if (value == "register")
      config.pinned_mode = PinnedMode::reg;
    else
      bad_value(key, value, "auto, alloc or register");
  } else if (key == "register_threshold_mb") {
    // Bounded so the byte count cannot overflow.
    const int64_t mb = number(key, value, 0, std::numeric_limits<int64_t>::max() >> 20,
                              "a whole number of MiB (0 = register everything in auto mode)");
    config.register_threshold_bytes = static_cast<uint64_t>(mb) << 20;
  } else if (key == "prefault_threads") {
    config.prefault_threads =
        static_cast<int>(number(key, value, 0, 1024, "0 (one per core) to 1024"));
  } else if (key == "register_thp") {
    if (value == "1" || value == "true" || value == "on")
      config.register_thp = true;
    else if (value == "0" || value == "false" || value == "off")
      config.register_thp = false;
    else
      bad_value(key, value, "0 or 1 (on/off, true/false)");
  } else {
    refuse("unknown key '" + std::string(key) + "' (keys: " + kKeys + ")");
  }
}

}  // namespace

const char* pinned_mode_name(PinnedMode mode) {
  static constexpr const char* kNames[] = {"auto", "alloc", "register"};  // PinnedMode order
  return enum_name(mode, kNames, "unknown");
}

const char* config_keys() { return kKeys; }

CudaConfig parse_config(std::span<const ps_config_entry> entries) {
  CudaConfig config;
  std::set<std::string_view> seen;
  for (const ps_config_entry& entry : entries) {
    if (entry.key == nullptr || entry.value == nullptr)
      refuse(std::string("an entry has a NULL ") + (entry.key == nullptr ? "key" : "value") +
             " (keys: " + kKeys + ")");
    const std::string_view key = entry.key;
    if (!seen.insert(key).second)
      refuse("key '" + std::string(key) + "' is given twice (keys: " + kKeys + ")");
    apply(config, key, entry.value);
  }
  return config;
}

PinnedMode choose_pinned_mode(const CudaConfig& config, size_t bytes) {
  if (config.pinned_mode != PinnedMode::auto_select) return config.pinned_mode;
  return bytes >= config.register_threshold_bytes ? PinnedMode::reg : PinnedMode::alloc;
}

}  // namespace pinstage::cuda
