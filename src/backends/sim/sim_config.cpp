#include "backends/sim/sim_config.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "backends/sim/dma.h"
#include "pinstage/backend/config.h"
#include "pinstage/parallel.h"

namespace pinstage::sim {

namespace {

constexpr const char* kKeys =
    "bounce_chunk, bounce_buffers, link_gbps, dma_threads, devices, numa_nodes, backed_bytes";
constexpr int kMaxDevices = 64;
constexpr int kMaxNumaNode = 1023;  // the kernel's node ids fit a 1024-bit mask here

// "0,0,1,1": one node id 0..1023 per device, comma-separated, nothing else.
std::vector<int> numa_node_list(std::string_view key, std::string_view value) {
  constexpr const char* kExpected = "one NUMA node id 0..1023 per device, comma-separated";
  std::vector<int> nodes;
  size_t begin = 0;
  for (;;) {
    const size_t comma = value.find(',', begin);
    const std::string_view item = value.substr(begin, comma - begin);
    if (item.empty()) backend::config_bad_value(key, value, kExpected, "an empty item");
    nodes.push_back(
        static_cast<int>(backend::config_integer(key, item, 0, kMaxNumaNode, kExpected)));
    if (comma == std::string_view::npos) return nodes;
    begin = comma + 1;
  }
}

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
  } else if (key == "devices") {
    config.devices = static_cast<int>(
        backend::config_integer(key, value, 1, kMaxDevices, "a whole number of devices 1..64"));
  } else if (key == "numa_nodes") {
    config.numa_nodes = numa_node_list(key, value);
  } else if (key == "backed_bytes") {
    // The capacity bounds it further at context creation (create_context).
    config.backed_bytes = backend::config_byte_count(key, value, 0, uint64_t{1} << 50,
                                                     "a byte count from 0 to 1P, e.g. 4G");
  } else {
    backend::config_refuse("unknown key '" + std::string(key) + "' (keys: " + kKeys + ")");
  }
}

}  // namespace

const char* config_keys() { return kKeys; }

int SimConfig::numa_node(int id) const {
  return id >= 0 && static_cast<size_t>(id) < numa_nodes.size() ? numa_nodes[id] : -1;
}

int resolved_dma_threads(const SimConfig& config) {
  if (config.dma_threads > 0) return config.dma_threads;
  return std::min(default_thread_count(), DmaEngine::kMaxThreads);
}

SimConfig parse_config(std::span<const ps_config_entry> entries) {
  SimConfig config;
  backend::for_each_config_entry(entries, kKeys, [&](std::string_view key, std::string_view value) {
    apply(config, key, value);
  });
  if (!config.numa_nodes.empty() && config.numa_nodes.size() != static_cast<size_t>(config.devices))
    backend::config_refuse("numa_nodes names " + std::to_string(config.numa_nodes.size()) +
                           " node(s) but devices=" + std::to_string(config.devices) +
                           ": give exactly one node per device");
  return config;
}

}  // namespace pinstage::sim
