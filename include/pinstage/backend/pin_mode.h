// Plugin SDK: the pinning settings that backends registering host memory in pieces share
// (cuda: cudaHostRegister; acl keeps one registration per range), parsed from the context
// options' key/value entries ({"register_chunk_mb", "1024"}). The runtime makes and places
// host memory (docs/worker.md, "Host sources"); a plugin only pins it. Header only, so a
// plugin links base alone. docs/cuda.md and docs/acl.md have the table of keys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "pinstage/backend/config.h"
#include "pinstage/backend/platform_abi.h"

namespace pinstage::backend {

// The largest register_chunk_mb (64 GiB), also its default.
inline constexpr int kMaxRegisterChunkMb = 65536;

struct PinConfig {
  // host_register registers (and unregisters) a range in pieces of at most this many
  // bytes: one registration of 512 GiB or more fails on current CUDA drivers, and a huge
  // one holds driver locks for seconds. Smaller values exist for tests.
  uint64_t register_chunk_bytes = uint64_t{kMaxRegisterChunkMb} << 20;
};

// The accepted keys, for messages.
inline constexpr const char* kPinConfigKeys = "register_chunk_mb";

// Keys of the backends that made host memory themselves (before ABI v8): refused naming
// where their job went, not as typos.
inline bool is_gone_pin_key(std::string_view key) {
  return key == "pinned_mode" || key == "register_threshold_mb" || key == "prefault_threads" ||
         key == "register_thp";
}

namespace detail {
inline void apply_pin_option(PinConfig& config, std::string_view key, std::string_view value) {
  if (key == "register_chunk_mb") {
    config.register_chunk_bytes =
        static_cast<uint64_t>(config_integer(key, value, 1, int64_t{kMaxRegisterChunkMb},
                                             "1 to 65536 MiB per register call"))
        << 20;
  } else if (is_gone_pin_key(key)) {
    config_refuse("key '" + std::string(key) +
                  "' is gone: the runtime makes, places and faults pinned host memory for every "
                  "backend now (PINSTAGE_HOST_HUGE_PAGES, PINSTAGE_NUM_THREADS; docs/worker.md, "
                  "\"Host sources\"); the backend only pins it (keys: " +
                  kPinConfigKeys + ")");
  } else {
    config_refuse("unknown key '" + std::string(key) + "' (keys: " + kPinConfigKeys + ")");
  }
}
}  // namespace detail

// Parses the entries strictly: each key at most once, values exactly as documented (no
// whitespace trimming). Throws Error(invalid_argument) naming the bad key or value and
// listing the accepted keys. No entries gives the defaults.
inline PinConfig parse_pin_config(std::span<const ps_config_entry> entries) {
  PinConfig config;
  for_each_config_entry(entries, kPinConfigKeys, [&](std::string_view key, std::string_view value) {
    detail::apply_pin_option(config, key, value);
  });
  return config;
}

}  // namespace pinstage::backend
