#include "backends/sim/sim_config.h"

#include <string>
#include <string_view>

#include "pinstage/backend/config.h"

namespace pinstage::sim {

namespace {

constexpr const char* kKeys = "bounce_chunk, bounce_buffers, link_gbps";

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
  } else {
    backend::config_refuse("unknown key '" + std::string(key) + "' (keys: " + kKeys + ")");
  }
}

}  // namespace

const char* config_keys() { return kKeys; }

SimConfig parse_config(std::span<const ps_config_entry> entries) {
  SimConfig config;
  backend::for_each_config_entry(entries, kKeys, [&](std::string_view key, std::string_view value) {
    apply(config, key, value);
  });
  return config;
}

}  // namespace pinstage::sim
