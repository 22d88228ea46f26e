// pinstage info: the backends found and the facts about this machine that decide how
// fast staging can be (pinned memory really locked? how much may be locked?).
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "commands.h"
#include "pinstage/parallel.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"
#include "runtime/plugin.h"

namespace pinstage::cli {
namespace {

std::string limit_text(rlim_t value) {
  return value == RLIM_INFINITY ? "unlimited" : format_thousands(value) + " bytes";
}

// MemAvailable from /proc/meminfo, in bytes (0 if unreadable).
uint64_t mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

void run_info() {
  std::printf("pinstage 0.1.0 (platform API %u)\n", PINSTAGE_PLATFORM_API_VERSION);
  std::printf("library folder: %s\n\nbackends:\n", detail::library_dir().c_str());
  for (const std::string& path : detail::discover_plugins()) {
    const std::string file = path.substr(path.rfind('/') + 1);
    const std::string name = file.substr(20, file.size() - 20 - 3);  // libpinstage_backend_X.so
    try {
      const detail::Plugin plugin = detail::load_plugin(name, path);
      std::printf("  %-6s api %u  %s\n", plugin.info.name.c_str(), plugin.info.api_version,
                  path.c_str());
    } catch (const Error& e) {
      std::printf("  %-6s unusable: %s\n", name.c_str(), e.what());
    }
  }

  std::printf("\nmachine:\n  cores: %d\n", default_thread_count());
  const uint64_t physical = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  std::printf("  physical memory: %s bytes\n", format_thousands(physical).c_str());
  std::printf("  available memory: %s bytes\n", format_thousands(mem_available()).c_str());
  rlimit memlock{};
  getrlimit(RLIMIT_MEMLOCK, &memlock);
  std::printf("  RLIMIT_MEMLOCK: soft %s, hard %s\n", limit_text(memlock.rlim_cur).c_str(),
              limit_text(memlock.rlim_max).c_str());

  Worker worker;
  worker.init("sim");
  // Lock a real buffer bigger than a typical RLIMIT_MEMLOCK so the answer is what
  // staging will see, not what a single page gets.
  PinnedHostBuffer probe = worker.alloc_pinned_host(size_t{64} << 20);
  const Capabilities caps = worker.capabilities();
  const WorkerStats stats = worker.stats();
  std::printf("\nsim backend:\n  device capacity: %s bytes\n",
              format_thousands(stats.device_capacity_bytes).c_str());
  std::printf("  pinned memory page-locked: %s\n",
              caps.pinned_is_page_locked
                  ? "yes"
                  : "no (mlock refused: raise RLIMIT_MEMLOCK or grant CAP_IPC_LOCK)");
  std::printf("  async copies: %s, host register: %s, callables: %s\n",
              caps.async_copy ? "yes" : "no", caps.host_register ? "yes" : "no",
              caps.execute ? "yes" : "no");
  std::printf("  device memory is host RAM: %s\n", caps.device_memory_is_host ? "yes" : "no");
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Backends found and this machine's memory facts");
  cmd->callback(run_info);
}

}  // namespace pinstage::cli
