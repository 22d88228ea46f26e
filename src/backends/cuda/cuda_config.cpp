#include "backends/cuda/cuda_config.h"

#include <limits>
#include <string>
#include <string_view>

#include "pinstage/backend/config.h"
#include "pinstage/error.h"
#include "pinstage/names.h"
#include "pinstage/settings.h"

namespace pinstage::cuda {

namespace {

constexpr const char* kKeys =
    "pinned_mode, register_threshold_mb, prefault_threads, register_thp, register_chunk_mb";

using backend::config_bad_value;
using backend::config_integer;
using backend::config_refuse;

void apply(CudaConfig& config, std::string_view key, std::string_view value) {
  if (key == "pinned_mode") {
    if (value == "auto")
      config.pinned_mode = PinnedMode::auto_select;
    else if (value == "alloc")
      config.pinned_mode = PinnedMode::alloc;
    else if (value == "register")
      config.pinned_mode = PinnedMode::reg;
    else
      config_bad_value(key, value, "auto, alloc or register");
  } else if (key == "register_threshold_mb") {
    // Bounded so the byte count cannot overflow.
    const int64_t mb =
        config_integer(key, value, 0, std::numeric_limits<int64_t>::max() >> 20,
                       "a whole number of MiB (0 = register everything in auto mode)");
    config.register_threshold_bytes = static_cast<uint64_t>(mb) << 20;
  } else if (key == "prefault_threads") {
    config.prefault_threads =
        static_cast<int>(config_integer(key, value, 0, 1024, "0 (one per core) to 1024"));
  } else if (key == "register_thp") {
    if (value == "1" || value == "true" || value == "on")
      config.register_thp = true;
    else if (value == "0" || value == "false" || value == "off")
      config.register_thp = false;
    else
      config_bad_value(key, value, "0 or 1 (on/off, true/false)");
  } else if (key == "register_chunk_mb") {
    config.register_chunk_bytes =
        static_cast<uint64_t>(config_integer(key, value, 1, int64_t{kMaxRegisterChunkMb},
                                             "1 to 65536 MiB per cudaHostRegister call"))
        << 20;
  } else {
    config_refuse("unknown key '" + std::string(key) + "' (keys: " + kKeys + ")");
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
  backend::for_each_config_entry(entries, kKeys, [&](std::string_view key, std::string_view value) {
    apply(config, key, value);
  });
  return config;
}

PinnedMode choose_pinned_mode(const CudaConfig& config, size_t bytes) {
  if (config.pinned_mode != PinnedMode::auto_select) return config.pinned_mode;
  return bytes >= config.register_threshold_bytes ? PinnedMode::reg : PinnedMode::alloc;
}

}  // namespace pinstage::cuda
