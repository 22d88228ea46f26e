// Note [Pin budget]
// ~~~~~~~~~~~~~~~~~
// Pinned memory cannot be swapped or reclaimed, so a request that does not fit the
// machine's limits fails late and badly: mlock returns ENOMEM part-way, the cgroup's OOM
// killer ends the process, or the host starts swapping everything else. Before pinning,
// the Worker checks the page-rounded request (what the kernel really locks) against:
//  - RLIMIT_MEMLOCK minus VmLck, where it applies: the backend locks with mlock(2) (its
//    device memory is host memory, as sim's; a GPU driver pins outside the rlimit) and
//    the process lacks CAP_IPC_LOCK;
//  - the lowest cgroup v2 memory.max along this process's cgroup and its ancestors,
//    minus that cgroup's memory.current;
//  - MemAvailable.
// The check is advisory against concurrent pins (two requests may both pass); the
// backend still handles a refused lock (sim: unlocked, capability says so).
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>

#include "pinstage/pages.h"
#include "pinstage/worker.h"

namespace pinstage {
namespace {

constexpr int kCapIpcLock = 14;  // linux/capability.h

// The value of `key` ("VmLck:") in /proc/self/status, as text; empty when absent.
std::string status_field(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix(key);
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
  return {};
}

bool has_cap_ipc_lock() {
  const std::string eff = status_field("CapEff:");
  if (eff.empty()) return false;
  return ((std::stoull(eff, nullptr, 16) >> kCapIpcLock) & 1) != 0;
}

// A cgroup file holding one number or "max"; nullopt-like UINT64_MAX for max or absent.
uint64_t read_cgroup_number(const std::string& file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text) || text == "max") return UINT64_MAX;
  try {
    return std::stoull(text);
  } catch (const std::exception&) {
    return UINT64_MAX;
  }
}

// This process's cgroup v2 path ("/user.slice/x"), or empty without a v2 hierarchy.
std::string cgroup_v2_path(const std::string& proc_self_cgroup) {
  std::ifstream in(proc_self_cgroup);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return {};
}

void read_cgroup_limit(PinBudget& budget, const PinBudgetFiles& files) {
  std::string dir = cgroup_v2_path(files.proc_self_cgroup);
  if (dir.empty()) return;
  for (;;) {
    const std::string base = files.cgroup_root + (dir == "/" ? std::string() : dir);
    const uint64_t limit = read_cgroup_number(base + "/memory.max");
    if (limit < budget.cgroup_limit_bytes) {
      budget.cgroup_limit_bytes = limit;
      const uint64_t used = read_cgroup_number(base + "/memory.current");
      budget.cgroup_used_bytes = used == UINT64_MAX ? 0 : used;
      budget.cgroup_path = base;
    }
    if (dir == "/" || dir.empty()) return;
    const size_t slash = dir.rfind('/');
    dir = slash == 0 ? "/" : dir.substr(0, slash);
  }
}

std::string request_text(uint64_t bytes, uint64_t need) {
  return "pinned host request of " + std::to_string(bytes) + " bytes (" + std::to_string(need) +
         " in whole pages)";
}

constexpr const char* kFallbackHint =
    "; or set PINSTAGE_PIN_POLICY=fallback to get pageable memory instead";

}  // namespace

namespace {
std::mutex g_source_mu;
std::function<PinBudget(bool)> g_source;  // set_pin_budget_source's; empty = live
}  // namespace

void set_pin_budget_source(std::function<PinBudget(bool)> source) {
  std::lock_guard lock(g_source_mu);
  g_source = std::move(source);
}

namespace detail {
PinBudget current_pin_budget(bool memlock_applies) {
  {
    std::lock_guard lock(g_source_mu);
    if (g_source) return g_source(memlock_applies);
  }
  return read_pin_budget(memlock_applies);
}
}  // namespace detail

uint64_t locked_memory_bytes() {
  const std::string text = status_field("VmLck:");
  return text.empty() ? 0 : std::stoull(text) * 1024;  // "   12 kB"
}

PinBudget read_pin_budget(bool memlock_applies, const PinBudgetFiles& files) {
  PinBudget budget;
  budget.locked_bytes = locked_memory_bytes();
  rlimit limit{};
  if (memlock_applies && getrlimit(RLIMIT_MEMLOCK, &limit) == 0 &&
      limit.rlim_cur != RLIM_INFINITY && !has_cap_ipc_lock())
    budget.memlock_limit_bytes = limit.rlim_cur;
  read_cgroup_limit(budget, files);
  budget.available_bytes = available_memory_bytes();
  return budget;
}

std::string pin_budget_refusal(uint64_t bytes, const PinBudget& budget) {
  const uint64_t need = round_up_to_pages(bytes);
  const auto over = [need](uint64_t used, uint64_t limit) {
    return limit != UINT64_MAX && (used > limit || need > limit - used);
  };
  if (over(budget.locked_bytes, budget.memlock_limit_bytes))
    return request_text(bytes, need) +
           " does not fit RLIMIT_MEMLOCK: " + std::to_string(budget.locked_bytes) + " of its " +
           std::to_string(budget.memlock_limit_bytes) + " bytes are locked already, " +
           std::to_string(std::min(budget.worker_locked_bytes, budget.locked_bytes)) +
           " of them by this worker's pinned memory and the rest by other workers, the "
           "backend's own buffers or the program. Raise it (ulimit -l, LimitMEMLOCK= in a systemd "
           "unit, "
           "docker run --ulimit memlock=-1) or grant CAP_IPC_LOCK" +
           kFallbackHint;
  if (over(budget.cgroup_used_bytes, budget.cgroup_limit_bytes))
    return request_text(bytes, need) +
           " does not fit the cgroup memory limit: " + budget.cgroup_path + "/memory.max is " +
           std::to_string(budget.cgroup_limit_bytes) + " bytes and " +
           std::to_string(budget.cgroup_used_bytes) +
           " are in use. Raise memory.max (MemoryMax= in systemd, docker run --memory)" +
           kFallbackHint;
  if (over(0, budget.available_bytes))
    return request_text(bytes, need) + " is more than the memory available now (MemAvailable " +
           std::to_string(budget.available_bytes) + " bytes). Free memory or ask for less" +
           kFallbackHint;
  return {};
}

}  // namespace pinstage
