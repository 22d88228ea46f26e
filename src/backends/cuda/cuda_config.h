// The cuda backend's settings, parsed from the context options' config string
// ("pinned_mode=auto;register_threshold_mb=64"). No CUDA here, so tests run anywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pinstage::cuda {

// How host_alloc_pinned gets page-locked memory (see Note [Two pinned modes]).
enum class PinnedMode {
  auto_select,  // register at or above the threshold, cudaHostAlloc below it
  alloc,        // always cudaHostAlloc(portable)
  reg,          // always mmap + parallel pre-fault + cudaHostRegister
};

// "auto", "alloc" or "register".
const char* pinned_mode_name(PinnedMode mode);

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
};

// Parses "key=value;key=value" (whitespace around keys and values ignored, empty
// segments skipped). Keys: pinned_mode, register_threshold_mb, prefault_threads,
// register_thp. Returns false and sets `error` to a message naming the bad key or value
// and the accepted ones; `out` is untouched then.
bool parse_config(std::string_view text, CudaConfig& out, std::string& error);

// The mode a request of `bytes` gets under `config` (never auto_select).
PinnedMode choose_pinned_mode(const CudaConfig& config, size_t bytes);

}  // namespace pinstage::cuda
