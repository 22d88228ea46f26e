// The cuda backend's settings, parsed from the context options' key/value entries
// ({"pinned_mode", "auto"}, {"register_threshold_mb", "64"}). No CUDA here, so tests run
// anywhere. docs/cuda.md has the table of keys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "pinstage/backend/platform_abi.h"

namespace pinstage::cuda {

// How host_alloc_pinned gets page-locked memory (see Note [Two pinned modes]).
enum class PinnedMode {
  auto_select,  // register at or above the threshold, cudaHostAlloc below it
  alloc,        // always cudaHostAlloc(portable)
  reg,          // always mmap + parallel pre-fault + cudaHostRegister
};

// "auto", "alloc" or "register".
const char* pinned_mode_name(PinnedMode mode);

// The largest register_chunk_mb (64 GiB), also its default.
inline constexpr int kMaxRegisterChunkMb = 65536;

struct CudaConfig {
  PinnedMode pinned_mode = PinnedMode::auto_select;
  // auto: requests of at least this many bytes use register mode.
  uint64_t register_threshold_bytes = 64ull << 20;
  // Threads that pre-fault a register-mode buffer; 0 = one per online core, at most 32.
  int prefault_threads = 0;
  // Ask for transparent huge pages on register-mode buffers: fewer faults, but with the
  // kernel's usual defrag=madvise a fault may stall on compaction (docs/benchmarks.md:
  // 16 s instead of 1.6 s for 2 GiB on the dev VM), so it is opt-in.
  bool register_thp = false;
  // Register mode registers (and unregisters) the buffer in pieces of at most this many
  // bytes: one cudaHostRegister of 512 GiB or more fails on current drivers, and a huge
  // one holds driver locks for seconds. Smaller values exist for tests.
  uint64_t register_chunk_bytes = uint64_t{kMaxRegisterChunkMb} << 20;
};

// The accepted keys, for messages: "pinned_mode, register_threshold_mb, ...".
const char* config_keys();

// Parses the entries strictly: keys pinned_mode, register_threshold_mb,
// prefault_threads, register_thp, register_chunk_mb, each at most once, values exactly as
// documented (no whitespace trimming). Throws Error(invalid_argument) naming the bad key or value
// and listing the accepted keys or values. No entries gives the defaults.
CudaConfig parse_config(std::span<const ps_config_entry> entries);

// The mode a request of `bytes` gets under `config` (never auto_select).
PinnedMode choose_pinned_mode(const CudaConfig& config, size_t bytes);

}  // namespace pinstage::cuda
