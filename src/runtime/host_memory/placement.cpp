// Note [Host placement]
// ~~~~~~~~~~~~~~~~~~~~~
// A worker decides once, at init, where its host memory goes and how it is faulted, and
// the runtime applies that to every segment of every source on every backend (plugins only
// pin): the NUMA node (mbind before the first touch, faults on that node's CPUs), huge
// pages, and the fault method and threads. What costs a writable first load is the faults,
// 524,288 of 4 KiB pages for 2 GiB against 1,024 of 2 MiB (docs/benchmarks.md, "The host
// memory provider"), so huge pages are the default where the kernel offers them:
//  - PINSTAGE_HOST_HUGE_PAGES=auto (default): on where THP is `always` or `madvise`; a
//    segment takes them only when /proc/buddyinfo shows free 2 MiB blocks for all of it
//    (otherwise the kernel would compact memory for each fault), and a fault slower than
//    PINSTAGE_HOST_HUGE_STALL_MS gives the rest of the segment base pages (pages.cpp).
//  - thp: on whenever THP is not `never`, free blocks or not (the stall watch still runs).
//  - off: base pages.
// File mappings keep the page cache's own folios: only a private copy is placed on the node.
#include "runtime/host_memory/placement.h"

#include <algorithm>
#include <fstream>

#include "pinstage/settings.h"

namespace pinstage::runtime {

namespace {

// The bracketed word of a sysfs choice file ("always [madvise] never"), or "".
std::string sysfs_choice(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  const size_t a = line.find('['), b = line.find(']');
  return a != std::string::npos && b > a ? line.substr(a + 1, b - a - 1) : std::string();
}

constexpr size_t kHugePage = size_t{2} << 20;
// A 2 MiB fault costs about 0.2 ms of CPU (zeroing), 512 base-page faults about 0.7 ms
// (measured here, docs/benchmarks.md, "The host memory provider"). One that costs more than
// 2 ms is compaction, or a hypervisor backing a block it had taken back (free page
// reporting: 4.5 ms a block on this VM), where base pages come out ahead.
constexpr int kDefaultStallMs = 2;

}  // namespace

HostPlacement decide_placement(int numa_node, const std::string& thp_root) {
  HostPlacement p;
  p.numa_node = numa_node;
  const std::string wanted = setting_choice(Setting::host_huge_pages).value_or("auto");
  // 0 ms: the first huge fault gives up (any cost is a stall).
  p.stall_seconds = std::max(setting_host_huge_stall_ms().value_or(kDefaultStallMs) / 1000.0, 1e-9);
  const std::string enabled = sysfs_choice(thp_root + "/enabled");
  const std::string defrag = sysfs_choice(thp_root + "/defrag");
  const std::string kernel = "transparent huge pages '" + (enabled.empty() ? "absent" : enabled) +
                             "', defrag '" + (defrag.empty() ? "absent" : defrag) + "'";
  if (wanted == "off") {
    p.huge_reason = "PINSTAGE_HOST_HUGE_PAGES=off";
  } else if (enabled != "always" && enabled != "madvise") {
    p.huge_reason = "the kernel offers none (" + kernel + ")";
  } else {
    p.huge_pages = true;
    p.huge_needs_free_blocks = wanted == "auto";
    p.huge_reason = "PINSTAGE_HOST_HUGE_PAGES=" + wanted + ", " + kernel;
  }
  return p;
}

MapOptions HostPlacement::map_options(size_t bytes, bool fault, std::string* note) const {
  MapOptions o{.prefault = fault,
               .method = method,
               .threads = fault_threads,
               .huge_pages = huge_pages && bytes >= kHugePage,
               .huge_stall_seconds = stall_seconds,
               .numa_node = numa_node};
  if (!o.huge_pages || !huge_needs_free_blocks) return o;
  // auto: only where the kernel has the free blocks, so no fault compacts memory for one.
  const uint64_t free = free_huge_page_bytes(numa_node);
  if (free == UINT64_MAX || free >= bytes) return o;
  o.huge_pages = false;
  if (note != nullptr)
    *note = "base pages: " + std::to_string(free >> 20) + " MiB free in 2 MiB blocks for " +
            std::to_string(bytes >> 20) + " MiB (PINSTAGE_HOST_HUGE_PAGES=thp takes them anyway)";
  return o;
}

}  // namespace pinstage::runtime
