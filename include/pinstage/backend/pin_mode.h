// Plugin SDK: the pin-mode settings that backends with two ways to pin host memory share
// (cuda: cudaHostAlloc or cudaHostRegister; acl: aclrtMallocHost or aclrtHostRegister),
// parsed from the context options' key/value entries ({"pinned_mode", "auto"}). Header
// only, so a plugin links base alone. docs/cuda.md and docs/acl.md have the table of keys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "pinstage/backend/config.h"
#include "pinstage/backend/platform_abi.h"
#include "pinstage/names.h"

namespace pinstage::backend {

// How host_alloc_pinned gets page-locked memory.
enum class PinnedMode {
  auto_select,  // register at or above the threshold, the runtime's host alloc below it
  alloc,        // always the runtime's host alloc (cudaHostAlloc, aclrtMallocHost)
  reg,          // always mmap + parallel pre-fault + register, in pieces
};

// "auto", "alloc" or "register".
inline const char* pinned_mode_name(PinnedMode mode) {
  static constexpr const char* kNames[] = {"auto", "alloc", "register"};  // PinnedMode order
  return enum_name(mode, kNames, "unknown");
}

// The largest register_chunk_mb (64 GiB), also its default.
inline constexpr int kMaxRegisterChunkMb = 65536;

struct PinConfig {
  PinnedMode pinned_mode = PinnedMode::auto_select;
  // auto: requests of at least this many bytes use register mode.
  uint64_t register_threshold_bytes = 64ull << 20;
  // Threads that pre-fault a register-mode buffer; 0 = one per CPU of the affinity mask,
  // at most 32.
  int prefault_threads = 0;
  // Ask for transparent huge pages on register-mode buffers: fewer faults, but with the
  // kernel's usual defrag=madvise a fault may stall on compaction (docs/benchmarks.md:
  // 16 s instead of 1.6 s for 2 GiB on the dev VM), so it is opt-in.
  bool register_thp = false;
  // Register mode registers (and unregisters) the buffer in pieces of at most this many
  // bytes: one registration of 512 GiB or more fails on current CUDA drivers, and a huge
  // one holds driver locks for seconds. Smaller values exist for tests.
  uint64_t register_chunk_bytes = uint64_t{kMaxRegisterChunkMb} << 20;
};

// The accepted keys, for messages.
inline constexpr const char* kPinConfigKeys =
    "pinned_mode, register_threshold_mb, prefault_threads, register_thp, register_chunk_mb";

namespace detail {
inline void apply_pin_option(PinConfig& config, std::string_view key, std::string_view value) {
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
                                             "1 to 65536 MiB per register call"))
        << 20;
  } else {
    config_refuse("unknown key '" + std::string(key) + "' (keys: " + kPinConfigKeys + ")");
  }
}
}  // namespace detail

// Parses the entries strictly: each key at most once, values exactly as documented (no
// whitespace trimming). Throws Error(invalid_argument) naming the bad key or value and
// listing the accepted keys or values. No entries gives the defaults.
inline PinConfig parse_pin_config(std::span<const ps_config_entry> entries) {
  PinConfig config;
  for_each_config_entry(entries, kPinConfigKeys, [&](std::string_view key, std::string_view value) {
    detail::apply_pin_option(config, key, value);
  });
  return config;
}

// The mode a request of `bytes` gets under `config` (never auto_select).
inline PinnedMode choose_pinned_mode(const PinConfig& config, size_t bytes) {
  if (config.pinned_mode != PinnedMode::auto_select) return config.pinned_mode;
  return bytes >= config.register_threshold_bytes ? PinnedMode::reg : PinnedMode::alloc;
}

}  // namespace pinstage::backend
