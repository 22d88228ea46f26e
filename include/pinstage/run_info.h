// The "run" block every JSON report carries (bench, scene, fixture, load), so that two
// reports can be compared later: which pinstage, when, on what machine, with which backend
// and options. See docs/cli.md ("Reports").
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "pinstage/export.h"

namespace pinstage {

class Worker;

struct RunInfo {
  std::string pinstage_version;  // pinstage::version()
  std::string utc_time;          // ISO 8601, "2026-11-30T23:59:59Z"
  std::string host;              // gethostname
  std::string cpu_model;         // /proc/cpuinfo "model name" ("unknown" when absent)
  int cores = 0;                 // threads pinstage uses for parallel work
  uint64_t memory_bytes = 0;     // physical memory
  std::string kernel;            // uname release
  std::string thp;               // transparent huge pages mode ("madvise", "unknown")
  std::string backend;           // the worker's backend; empty when none was used
  std::string device;            // "sim device 0"
  std::string driver;            // what the backend says of its driver/runtime, or
                                 // "not reported by the backend"
  std::vector<std::pair<std::string, std::string>> options;  // every option, as given
  // The backend's copy-engine model (backend_model); empty on a real device.
  std::vector<std::pair<std::string, int64_t>> model;
};

// The parameters of the backend's copy-engine model: on sim, dma_threads,
// bounce_chunk_bytes, bounce_buffers and link_gbps (from sim.stats, docs/worker.md "sim
// semantics"); empty for a backend without one (a real device).
PINSTAGE_API std::vector<std::pair<std::string, int64_t>> backend_model(const Worker& worker);

// Machine facts now; backend facts from `worker` when it is not null and initialized.
PINSTAGE_API RunInfo collect_run_info(const Worker* worker,
                                      std::vector<std::pair<std::string, std::string>> options);

// The block as a JSON object (text), the one serialisation every report embeds.
PINSTAGE_API std::string run_info_json(const RunInfo& info);

}  // namespace pinstage
