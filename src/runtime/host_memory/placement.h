// Where and how a worker's host memory is placed: decided once when the Worker starts
// (Note [Host placement] in placement.cpp) and applied by the runtime for every backend.
#pragma once

#include <cstddef>
#include <string>

#include "pinstage/pages.h"

namespace pinstage::runtime {

struct HostPlacement {
  // The NUMA node every segment is bound to before its first touch (-1: the kernel's).
  int numa_node = -1;
  // Transparent huge pages for anonymous segments of 2 MiB and more (the one switch,
  // PINSTAGE_HOST_HUGE_PAGES, against the kernel's THP mode); `huge_reason` says why.
  bool huge_pages = false;
  std::string huge_reason;
  // auto: a segment takes huge pages only while enough free 2 MiB blocks exist for it.
  bool huge_needs_free_blocks = true;
  // A 2 MiB fault slower than this gives the segment's rest base pages (the stall watch).
  double stall_seconds = 0.02;
  PrefaultMethod method = PrefaultMethod::populate;
  // Anonymous segments are MADV_DONTFORK where a device copies from them (every backend
  // whose device memory is not host memory): a forked child neither shares nor
  // copy-on-writes pages the copy engine reads.
  bool dont_fork = false;
  int fault_threads = 0;  // per segment faulted at once (0: the cores of the affinity mask)

  // The map options of an anonymous segment of `bytes`, faulted now or not; `note` gets
  // why huge pages were not asked for when the placement wanted them.
  MapOptions map_options(size_t bytes, bool fault, std::string* note = nullptr) const;
};

// The placement of a worker whose memory goes to `numa_node` (-1: none), from the switch
// and /sys/kernel/mm/transparent_hugepage/{enabled,defrag}. `thp_root` is that folder
// (tests give their own). Error(invalid_argument) for a bad setting.
HostPlacement decide_placement(int numa_node,
                               const std::string& thp_root = "/sys/kernel/mm/transparent_hugepage");

}  // namespace pinstage::runtime
