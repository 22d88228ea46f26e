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

// The pinning keys, listed once: X(type, member, default, key, min, max, shift, doc). Each
// key takes a whole number in [min, max] (config_integer) and the PinConfig member holds it
// << shift; doc is what the key expects, for its error. PinConfig, kPinConfigKeys, the
// parser, docs/cuda.md's and docs/acl.md's key tables (tests/python/test_py_fields.py)
// follow the list.
//  register_chunk_mb: host_register registers (and unregisters) a range in pieces of at
//    most this many MiB: one registration of 512 GiB or more fails on current CUDA
//    drivers, and a huge one holds driver locks for seconds. Smaller values exist for tests.
#define PINSTAGE_PIN_CONFIG_FIELDS(X)                                                         \
  X(uint64_t, register_chunk_bytes, uint64_t{::pinstage::backend::kMaxRegisterChunkMb} << 20, \
    "register_chunk_mb", 1, ::pinstage::backend::kMaxRegisterChunkMb, 20,                     \
    "1 to 65536 MiB per register call")

// One member of PinConfig from its list entry.
#define PINSTAGE_PIN_CONFIG_MEMBER(type, member, value, key, min, max, shift, doc) \
  type member = value;

// The pinning settings a backend's context keeps: the list above.
struct PinConfig {
  PINSTAGE_PIN_CONFIG_FIELDS(PINSTAGE_PIN_CONFIG_MEMBER)
};

// The accepted keys, for messages: "a, b" (each entry adds ", key"; the first ", " skipped).
#define PINSTAGE_PIN_CONFIG_KEY_(type, member, value, key, min, max, shift, doc) ", " key
inline constexpr const char* kPinConfigKeys =
    (PINSTAGE_PIN_CONFIG_FIELDS(PINSTAGE_PIN_CONFIG_KEY_)) + 2;
#undef PINSTAGE_PIN_CONFIG_KEY_

// Whether `key` is one of the list's keys (a backend with keys of its own hands these on).
inline bool is_pin_config_key(std::string_view key) {
#define PINSTAGE_PIN_CONFIG_IS_KEY_(type, member, value, key_, min, max, shift, doc) \
  if (key == key_) return true;
  PINSTAGE_PIN_CONFIG_FIELDS(PINSTAGE_PIN_CONFIG_IS_KEY_)
#undef PINSTAGE_PIN_CONFIG_IS_KEY_
  return false;
}

// Keys of the backends that made host memory themselves (before ABI v8): refused naming
// where their job went, not as typos.
inline bool is_gone_pin_key(std::string_view key) {
  return key == "pinned_mode" || key == "register_threshold_mb" || key == "prefault_threads" ||
         key == "register_thp";
}

namespace detail {
inline void apply_pin_option(PinConfig& config, std::string_view key, std::string_view value) {
#define PINSTAGE_PIN_CONFIG_APPLY_(type, member, value_, key_, min, max, shift, doc)       \
  if (key == key_) {                                                                       \
    config.member = static_cast<type>(config_integer(key, value, min, max, doc)) << shift; \
    return;                                                                                \
  }
  PINSTAGE_PIN_CONFIG_FIELDS(PINSTAGE_PIN_CONFIG_APPLY_)
#undef PINSTAGE_PIN_CONFIG_APPLY_
  if (is_gone_pin_key(key))
    config_refuse("key '" + std::string(key) +
                  "' is gone: the runtime makes, places and faults pinned host memory for every "
                  "backend now (PINSTAGE_HOST_HUGE_PAGES, PINSTAGE_NUM_THREADS; docs/worker.md, "
                  "\"Host sources\"); the backend only pins it (keys: " +
                  kPinConfigKeys + ")");
  config_refuse("unknown key '" + std::string(key) + "' (keys: " + kPinConfigKeys + ")");
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
