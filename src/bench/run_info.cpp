// The "run" block of every JSON report: machine, build and backend facts.
#include "pinstage/run_info.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "pinstage/backend/sim_ext.h"
#include "pinstage/pages.h"
#include "pinstage/parallel.h"
#include "pinstage/version.h"
#include "pinstage/worker.h"

namespace pinstage {
namespace {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
  }
  return "unknown";
}

// The selected mode is the bracketed word: "always [madvise] never".
std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string text;
  std::getline(in, text);
  const size_t open = text.find('[');
  const size_t close = text.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "unknown";
  return text.substr(open + 1, close - open - 1);
}

}  // namespace

std::vector<std::pair<std::string, int64_t>> backend_model(const Worker& worker) {
  if (!worker.initialized()) return {};
  const auto stats_fn =
      reinterpret_cast<ps_sim_stats_fn>(worker.backend_extension(PS_SIM_STATS_NAME));
  ps_sim_stats s{};
  if (stats_fn == nullptr || stats_fn(worker.native_context(), &s) != PS_OK) return {};
  return {{"dma_threads", s.dma_threads},
          {"bounce_chunk_bytes", static_cast<int64_t>(s.bounce_chunk_bytes)},
          {"bounce_buffers", s.bounce_buffers},
          {"link_gbps", s.link_gbps}};
}

RunInfo collect_run_info(const Worker* worker,
                         std::vector<std::pair<std::string, std::string>> options) {
  RunInfo info;
  info.pinstage_version = version();
  info.utc_time = utc_now();
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) info.host = host;
  info.cpu_model = cpu_model();
  info.cores = default_thread_count();
  info.memory_bytes = physical_memory_bytes();
  utsname uts{};
  if (uname(&uts) == 0) info.kernel = uts.release;
  info.thp = thp_mode();
  if (worker != nullptr && worker->initialized()) {
    info.backend = worker->backend().name;
    info.device = info.backend + " device " + std::to_string(worker->device_id());
    info.driver = "not reported by the backend";
    info.model = backend_model(*worker);
  }
  info.options = std::move(options);
  return info;
}

std::string run_info_json(const RunInfo& info) {
  nlohmann::ordered_json options = nlohmann::ordered_json::object();
  for (const auto& [key, value] : info.options) options[key] = value;
  nlohmann::ordered_json model = nlohmann::ordered_json::object();
  for (const auto& [key, value] : info.model) model[key] = value;
  const nlohmann::ordered_json doc = {
      {"pinstage_version", info.pinstage_version},
      {"utc_time", info.utc_time},
      {"host", info.host},
      {"cpu_model", info.cpu_model},
      {"cores", info.cores},
      {"memory_bytes", info.memory_bytes},
      {"kernel", info.kernel},
      {"transparent_hugepages", info.thp},
      {"backend", info.backend},
      {"device", info.device},
      {"driver", info.driver},
      {"options", options},
      {"model", model},
  };
  return doc.dump();
}

}  // namespace pinstage
