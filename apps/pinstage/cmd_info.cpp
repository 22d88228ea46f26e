// pinstage info: the backends found and the facts about this machine that decide how
// fast staging can be (pinned memory really locked? how much may be locked?).
#include <sys/resource.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "pinstage/backend/platform_abi.h"
#include "pinstage/pages.h"
#include "pinstage/parallel.h"
#include "pinstage/tensor.h"
#include "pinstage/version.h"
#include "pinstage/worker.h"

namespace pinstage::cli {
namespace {

// Whether a worker can start on the backend, and why not: the plugin may load and still
// find no driver or no device.
nlohmann::ordered_json probe_backend(const std::string& name, const std::string& path) {
  nlohmann::ordered_json entry = {{"name", name}, {"path", path}};
  try {
    const BackendInfo info = load_backend(name, path);
    entry["api_version"] = info.api_version;
  } catch (const Error& e) {
    entry["usable"] = false;
    entry["why"] = e.what();
    return entry;
  }
  // Every device with its topology (no context needed), before a worker tries device 0.
  entry["devices"] = nlohmann::ordered_json::array();
  try {
    WorkerOptions options;
    options.plugin_path = path;
    for (const DeviceInfo& d : list_devices(name, options))
      entry["devices"].push_back({{"id", d.id},
                                  {"name", d.name},
                                  {"memory_bytes", d.memory_bytes},
                                  {"pci_bus_id", d.pci_bus_id},
                                  {"numa_node", d.numa_node},
                                  {"usable", d.usable},
                                  {"reason", d.reason}});
  } catch (const Error& e) {
    entry["devices_error"] = e.what();
  }
  try {
    Worker worker;
    worker.init(name);
    entry["usable"] = true;
    entry["device_capacity_bytes"] = worker.stats().device_capacity_bytes;
    entry["pinned_is_page_locked"] = worker.capabilities().pinned_is_page_locked;
  } catch (const Error& e) {
    entry["usable"] = false;
    entry["why"] = e.what();
  }
  return entry;
}

nlohmann::ordered_json machine_json() {
  rlimit memlock{};
  getrlimit(RLIMIT_MEMLOCK, &memlock);
  const auto limit = [](rlim_t v) -> nlohmann::ordered_json {
    if (v == RLIM_INFINITY) return "unlimited";
    return static_cast<uint64_t>(v);
  };
  return {{"cores", default_thread_count()},
          {"physical_memory_bytes", physical_memory_bytes()},
          {"available_memory_bytes", available_memory_bytes()},
          {"rlimit_memlock_soft", limit(memlock.rlim_cur)},
          {"rlimit_memlock_hard", limit(memlock.rlim_max)}};
}

// One line per device: id, name, memory, PCI bus id, NUMA node, and why not usable.
void print_devices(FILE* out, const nlohmann::ordered_json& backend) {
  if (backend.contains("devices_error"))
    std::fprintf(out, "         devices: not listed: %s\n",
                 backend["devices_error"].get<std::string>().c_str());
  if (!backend.contains("devices")) return;
  for (const auto& d : backend["devices"]) {
    const uint64_t memory = d["memory_bytes"];
    const int node = d["numa_node"];
    const std::string pci = d["pci_bus_id"];
    std::fprintf(
        out, "         device %d: %s, memory %s, PCI %s, NUMA node %s%s\n", d["id"].get<int>(),
        d["name"].get<std::string>().c_str(), memory > 0 ? format_bytes(memory).c_str() : "unknown",
        pci.empty() ? "none" : pci.c_str(), node >= 0 ? std::to_string(node).c_str() : "unknown",
        d["usable"].get<bool>() ? "" : (", not usable: " + d["reason"].get<std::string>()).c_str());
  }
}

void print_info(FILE* out, const nlohmann::ordered_json& doc) {
  std::fprintf(out, "pinstage %s (platform API %u)\n", version(), PINSTAGE_PLATFORM_API_VERSION);
  std::fprintf(out, "library folder: %s\n\nbackends:\n", library_dir().c_str());
  for (const auto& b : doc["backends"]) {
    const std::string name = b["name"];
    if (b["usable"].get<bool>())
      std::fprintf(out, "  %-6s usable: device 0, capacity %s  (%s)\n", name.c_str(),
                   format_bytes(b["device_capacity_bytes"].get<uint64_t>()).c_str(),
                   b["path"].get<std::string>().c_str());
    else
      std::fprintf(out, "  %-6s not usable: %s\n", name.c_str(),
                   b["why"].get<std::string>().c_str());
    print_devices(out, b);
  }
  const auto& m = doc["machine"];
  const auto limit = [](const nlohmann::ordered_json& v) {
    return v.is_string() ? v.get<std::string>() : format_bytes(v.get<uint64_t>());
  };
  std::fprintf(out, "\nmachine:\n  cores: %d\n", m["cores"].get<int>());
  std::fprintf(out, "  physical memory: %s\n",
               format_bytes(m["physical_memory_bytes"].get<uint64_t>()).c_str());
  std::fprintf(out, "  available memory: %s\n",
               format_bytes(m["available_memory_bytes"].get<uint64_t>()).c_str());
  std::fprintf(out, "  RLIMIT_MEMLOCK: soft %s, hard %s\n", limit(m["rlimit_memlock_soft"]).c_str(),
               limit(m["rlimit_memlock_hard"]).c_str());
  const auto& sim = doc["sim"];
  const std::string probe = sim["pinned_probe"];
  std::fprintf(out, "\nsim backend:\n  pinned memory page-locked: %s\n",
               probe != "pinned" ? ("no: a " + format_bytes(sim["pinned_probe_bytes"]) +
                                    " probe was refused: " + probe)
                                       .c_str()
               : sim["pinned_is_page_locked"].get<bool>()
                   ? "yes"
                   : "no (mlock refused: raise RLIMIT_MEMLOCK or grant CAP_IPC_LOCK)");
  std::fprintf(out, "  async copies: %s, host callables: %s\n",
               sim["async_copy"].get<bool>() ? "yes" : "no",
               sim["execute"].get<bool>() ? "yes" : "no");
}

// A test-only backend (twin in a build tree) is left out unless PINSTAGE_TEST_BACKENDS=on,
// as from every list a user sees; a plugin with no or a malformed description is shown
// (probing it says what is wrong).
bool offered(const std::string& name) {
  for (const BackendDescription& b : described_backends())
    if (b.name == name) return backend_choice_error(name).empty();
  return true;
}

void run_info(const ReportArgs& report, const CLI::App& cmd) {
  check_report_args(report);
  nlohmann::ordered_json doc;
  doc["backends"] = nlohmann::ordered_json::array();
  for (const std::string& path : discover_backends()) {
    const std::string file = path.substr(path.rfind('/') + 1);
    const std::string name = file.substr(20, file.size() - 20 - 3);  // libpinstage_backend_X.so
    if (offered(name)) doc["backends"].push_back(probe_backend(name, path));
  }
  doc["machine"] = machine_json();
  Worker worker;
  worker.init("sim");
  // Lock a real buffer bigger than a typical RLIMIT_MEMLOCK so the answer is what
  // staging will see, not what a single page gets. A refusal is part of the answer, not
  // a failure of the report: it is what a user under that limit needs to read.
  constexpr size_t kProbeBytes = size_t{64} << 20;
  std::string probe_refused;
  try {
    PinnedHostBuffer probe = worker.alloc_pinned_host(kProbeBytes);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::out_of_memory) throw;
    probe_refused = e.what();
  }
  const Capabilities caps = worker.capabilities();
  doc["sim"] = {{"pinned_probe_bytes", kProbeBytes},
                {"pinned_probe", probe_refused.empty() ? "pinned" : probe_refused},
                {"pinned_is_page_locked", caps.pinned_is_page_locked && probe_refused.empty()},
                {"async_copy", caps.async_copy},
                {"execute", caps.execute},
                {"device_memory_is_host", caps.device_memory_is_host}};
  print_info(text_out(report), doc);
  write_report(report, doc, collect_run_info(&worker, command_options(cmd)));
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "info", "Backends found (and whether a device is usable) and this machine's memory facts");
  auto report = command_values<ReportArgs>();
  add_report_options(*cmd, *report);
  cmd->callback([cmd, report] { run_info(*report, *cmd); });
}

}  // namespace pinstage::cli
