// The sim backend's settings, parsed from the context options' key/value entries
// ({"bounce_chunk", "2M"}, {"link_gbps", "55"}). docs/settings.md has the table of keys and
// docs/worker.md ("sim semantics") what each stands for.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "pinstage/backend/platform_abi.h"

namespace pinstage::sim {

struct SimConfig {
  // Bytes the driver stages per step of a pageable copy (one bounce buffer).
  uint64_t bounce_chunk = uint64_t{2} << 20;
  // Pinned bounce buffers per direction: 2 = double buffering (CPU copy overlaps DMA).
  int bounce_buffers = 2;
  // Link rate in GB/s (1e9 bytes per second, per direction); 0 = unpaced (memcpy speed).
  int64_t link_gbps = 0;
  // Workers per copy engine, each copying a slice of every chunk; 0 = the process's thread
  // count (PINSTAGE_NUM_THREADS, else the CPUs in the affinity mask), at most 64.
  int dma_threads = 0;
  // Devices this sim has (ids 0..devices-1), each with its own pool and copy engines.
  int devices = 1;
  // Host NUMA node of each device (numa_nodes=0,0,1,1); empty = unknown (-1) for all.
  std::vector<int> numa_nodes;
  // Bytes of each device's pool backed when its context is made, as a card's memory exists
  // before its first allocation (a timed load then pays no first touch); 0 = on first use.
  uint64_t backed_bytes = 0;

  // Device `id`'s node from numa_nodes, or -1.
  int numa_node(int id) const;
};

// The engine's workers: config.dma_threads, or the default it stands for.
int resolved_dma_threads(const SimConfig& config);

// The accepted keys, for messages: "bounce_chunk, bounce_buffers, ...".
const char* config_keys();

// Parses the entries strictly: each key at most once, values exactly as documented;
// numa_nodes must name exactly `devices` nodes.
// Throws Error(invalid_argument) naming the bad key or value ("config: link_gbps='x' is
// not valid: ...") and listing the accepted keys. No entries gives the defaults.
SimConfig parse_config(std::span<const ps_config_entry> entries);

}  // namespace pinstage::sim
