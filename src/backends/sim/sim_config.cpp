#include "backends/sim/sim_config.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "backends/sim/dma.h"
#include "pinstage/backend/config.h"
#include "pinstage/parallel.h"

namespace pinstage::sim {

namespace {

constexpr const char* kKeys = "bounce_chunk, bounce_buffers, link_gbps, dma_threads";

void apply(SimConfig& config, std::string_view key, std::string_view value) {
  if (key == "bounce_chunk") {
    // At least a page (smaller only measures hand-off overhead), at most 1 GiB.
    config.bounce_chunk = backend::config_byte_count(key, value, 4096, uint64_t{1} << 30,
                                                     "a byte count from 4K to 1G, e.g. 2M");
  } else if (key == "bounce_buffers") {
    config.bounce_buffers =
        static_cast<int>(backend::config_integer(key, value, 1, 64, "a whole number 1..64"));
  } else if (key == "link_gbps") {
    config.link_gbps =
        backend::config_integer(key, value, 0, 10'000, "whole GB/s 0..10000 (0 = unpaced)");
  } else if (key == "dma_threads") {
    config.dma_threads = static_cast<int>(backend::config_integer(
        key, value, 1, DmaEngine::kMaxThreads, "a whole number 1..64 (workers per copy engine)"));
  } else {
    backend::config_refuse("unknown key '" + std::string(key) + "' (keys: " + kKeys + ")");
  }
}

}  // namespace

const char* config_keys() { return kKeys; }

int resolved_dma_threads(const SimConfig& config) {
  if (config.dma_threads > 0) return config.dma_threads;
  return std::min(default_thread_count(), DmaEngine::kMaxThreads);
}

SimConfig parse_config(std::span<const ps_config_entry> entries) {
  SimConfig config;
  backend::for_each_config_entry(entries, kKeys, [&](std::string_view key, std::string_view value) {
    apply(config, key, value);
  });
  return config;
}

}  // namespace pinstage::sim
