// pinstage info: the backends found and the facts about this machine that decide how
// fast staging can be (pinned memory really locked? how much may be locked?).
#include <sys/resource.h>

#include <cstdio>
#include <string>

#include "commands.h"
#include "pinstage/backend/platform_abi.h"
#include "pinstage/pages.h"
#include "pinstage/parallel.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"

namespace pinstage::cli {
namespace {

std::string limit_text(rlim_t value) {
  return value == RLIM_INFINITY ? "unlimited" : format_thousands(value) + " bytes";
}

void run_info() {
  std::printf("pinstage 0.1.0 (platform API %u)\n", PINSTAGE_PLATFORM_API_VERSION);
  std::printf("library folder: %s\n\nbackends:\n", library_dir().c_str());
  for (const std::string& path : discover_backends()) {
    const std::string file = path.substr(path.rfind('/') + 1);
    const std::string name = file.substr(20, file.size() - 20 - 3);  // libpinstage_backend_X.so
    try {
      const BackendInfo info = load_backend(name, path);
      std::printf("  %-6s api %u  %s\n", info.name.c_str(), info.api_version, path.c_str());
    } catch (const Error& e) {
      std::printf("  %-6s unusable: %s\n", name.c_str(), e.what());
    }
  }

  std::printf("\nmachine:\n  cores: %d\n", default_thread_count());
  std::printf("  physical memory: %s bytes\n", format_thousands(physical_memory_bytes()).c_str());
  std::printf("  available memory: %s bytes\n", format_thousands(available_memory_bytes()).c_str());
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
  std::printf("  async copies: %s, host callables: %s\n", caps.async_copy ? "yes" : "no",
              caps.execute ? "yes" : "no");
  std::printf("  device memory is host RAM: %s\n", caps.device_memory_is_host ? "yes" : "no");
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Backends found and this machine's memory facts");
  cmd->callback(run_info);
}

}  // namespace pinstage::cli
