// The one page module: page size, physical memory, and the one pre-fault. Every part of
// pinstage that maps, populates or sizes host memory goes through here.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pinstage/export.h"

namespace pinstage {

// The kernel's base page size (sysconf), read once.
PINSTAGE_API size_t page_size() noexcept;
// The page size the open file `fd` is mapped (and must be unmapped) in: a hugetlbfs file's
// huge page size (its statfs f_bsize), else page_size() (a larger st_blksize, NFS's, is no
// page; a tmpfs mounted huge= still maps in base-page units). page_size() when fstatfs fails.
PINSTAGE_API size_t file_page_bytes(int fd) noexcept;
// Physical memory of this machine in bytes (sysconf), read once.
PINSTAGE_API uint64_t physical_memory_bytes() noexcept;
// Memory the kernel reports available now (MemAvailable), or physical memory when
// /proc/meminfo cannot be read.
PINSTAGE_API uint64_t available_memory_bytes() noexcept;
// `bytes` rounded up to whole pages; Error(invalid_argument) when that overflows.
PINSTAGE_API size_t round_up_to_pages(size_t bytes);

// Asks the kernel to fault in the whole pages inside [data, data + bytes) for writing in
// one call (MADV_POPULATE_WRITE). A hint: does nothing where the kernel lacks it.
// Returns true when the kernel did the population.
PINSTAGE_API bool populate_for_write(void* data, size_t bytes) noexcept;

// How prefault() makes a page resident.
//  touch: write one byte per page (anonymous memory: it stays zero). Guaranteed to back
//         the page everywhere, including VMs whose host backs guest memory lazily
//         (docs/benchmarks.md: there a page populated by madvise still costs a fault-sized
//         stall on its first write).
//  populate: MADV_POPULATE_WRITE per chunk (Linux 5.14+; a touch where the kernel lacks
//         it): fewer kernel entries, the cheapest population on bare metal. On a private
//         writable file mapping it breaks copy-on-write up front: the kernel copies each
//         page-cache page into a fresh page, with no zero fill (file_private).
//  read:  MADV_POPULATE_READ (a read of one byte per page where the kernel lacks it): a
//         read-only file mapping faulted in, which reads the file through the page cache.
enum class PrefaultMethod { touch, populate, read };

// What a pre-fault did, for reports.
struct PrefaultReport {
  double seconds = 0;
  int threads = 0;
  bool populate_write = false;  // MADV_POPULATE_WRITE/READ did the faulting (else a touch)
  // Huge pages (FaultPlan::huge): a 2 MiB unit slower than the plan's stall limit (memory
  // compaction) made the rest of the segment use base pages (MADV_NOHUGEPAGE).
  bool huge_abandoned = false;
  double slowest_unit_seconds = 0;  // CPU seconds of the costliest 2 MiB unit (huge plans)
};

// How one segment is faulted in, shared by every call that faults part of it (the reader
// threads of a load each fault their own chunk): a stall one of them sees switches the
// whole segment to base pages, once. Not copyable (it holds that state).
struct FaultPlan {
  PrefaultMethod method = PrefaultMethod::touch;
  int threads = 0;  // threads per prefault() call (0 = automatic, see prefault_thread_count)
  // The segment was advised MADV_HUGEPAGE: fault it in 2 MiB units, each timed.
  bool huge = false;
  // A huge unit that costs its thread more CPU time than this (compaction, a host backing
  // guest memory lazily; waiting for a core does not count) abandons huge pages for the rest
  // of [segment, segment + segment_bytes); 0 = never.
  double stall_seconds = 0;
  void* segment = nullptr;
  size_t segment_bytes = 0;
  std::atomic<bool> abandoned{false};
  std::atomic<int64_t> slowest_ns{0};
};

// Threads prefault() uses for `bytes` when asked for `threads` (0 = one per CPU of the
// affinity mask, at most 32): at least 1, at most one per 32 MiB so small buffers do not pay for
// thread start-up.
PINSTAGE_API int prefault_thread_count(size_t bytes, int threads);

// The one pre-fault: faults every page of [data, data + bytes) in for writing, split
// across threads in chunks of `unit` bytes (0 = a page; 2 MiB for huge pages, so no two
// threads fault the same page), by `method`. Fresh anonymous memory stays zero. Throws
// Error(out_of_memory) when the kernel cannot back the range.
PINSTAGE_API PrefaultReport prefault(void* data, size_t bytes, int threads = 0, size_t unit = 0,
                                     PrefaultMethod method = PrefaultMethod::touch);
// The same under `plan` (its method, threads and huge-page stall watch): [data, data +
// bytes) lies inside the plan's segment.
PINSTAGE_API PrefaultReport prefault(void* data, size_t bytes, FaultPlan& plan);

// One private anonymous mapping. `data` is what the caller uses; `base`/`map_bytes` is
// what munmap needs (they differ when the data was aligned to a huge page).
struct MappedPages {
  void* base = nullptr;
  size_t map_bytes = 0;
  void* data = nullptr;
  size_t bytes = 0;  // usable bytes at data (the request rounded up to whole pages)
  PrefaultReport prefault;
  double map_seconds = 0;
};

struct MapOptions {
  bool prefault = true;  // pre-fault every page in parallel before returning
  PrefaultMethod method = PrefaultMethod::touch;
  int threads = 0;          // pre-fault threads (0 = automatic, see prefault_thread_count)
  bool huge_pages = false;  // align to 2 MiB and ask for transparent huge pages
  // Huge pages: a 2 MiB unit that takes longer than this to fault gives up huge pages for
  // the rest of the mapping (FaultPlan::stall_seconds); 0 = never.
  double huge_stall_seconds = 0;
  // NUMA placement: the range is bound to this node (mbind MPOL_BIND) before the first
  // touch, and the pre-fault threads run on that node's CPUs. -1 = the kernel's choice.
  int numa_node = -1;
};

// Maps `bytes` (> 0) of anonymous memory, pre-faulted unless told otherwise. Throws
// Error(out_of_memory) or Error(invalid_argument); on failure nothing stays mapped. With
// huge pages the data starts on a 2 MiB boundary and base == data.
PINSTAGE_API MappedPages map_pages(size_t bytes, const MapOptions& options = {});
// Maps the first `bytes` (> 0) of the open file `fd`: read-only and shared (the page
// cache itself; faulted with PrefaultMethod::read when options.prefault), or, when
// `private_writable`, a private writable copy-on-write mapping whose pre-fault (populate,
// forced) copies the page cache into fresh pages without zeroing them. huge_pages is
// ignored (the page cache's folios decide); numa_node binds a private mapping's copies.
// Error(io) naming `what` when mmap refuses; on failure nothing stays mapped.
PINSTAGE_API MappedPages map_file_pages(int fd, size_t bytes, bool private_writable,
                                        const MapOptions& options, const std::string& what);
// Free memory in blocks of 2 MiB or more that transparent huge pages can take without
// compaction (/proc/buddyinfo, orders >= 9), on `node` (-1: every node); UINT64_MAX when
// it cannot be read.
PINSTAGE_API uint64_t free_huge_page_bytes(int node = -1);
// The NUMA node holding the page at `addr` now (get_mempolicy MPOL_F_NODE|MPOL_F_ADDR), or
// -1 when the kernel cannot say. Placement checks read it; it never faults the page in.
PINSTAGE_API int numa_node_of(const void* addr) noexcept;
// numa_system().node_cpus(node): the CPUs of NUMA node `node` that this process may run
// on; empty when the node does not exist or has none of them.
PINSTAGE_API std::vector<int> numa_node_cpus(int node);

// The NUMA facts and the one placement call that map_pages and the runtime use: a seam.
// The default reads sysfs and calls mbind(2). A test installs its own (set_numa_system)
// to stand up a topology this host lacks, a 2-node machine on a 1-node one, and to record
// what was bound and where it was pre-faulted (docs/worker.md, "NUMA placement").
class PINSTAGE_API NumaSystem {
 public:
  virtual ~NumaSystem() = default;
  // The CPUs of `node` this process may run on (sysfs cpulist and the affinity mask);
  // empty when the node does not exist or has none of them.
  virtual std::vector<int> node_cpus(int node) const;
  // Binds [data, data + bytes) to `node` (mbind MPOL_BIND) before its first touch.
  // Error(invalid_argument) for a node without CPUs here, Error(backend) on refusal.
  virtual void bind(void* data, size_t bytes, int node);
  // Called by each pre-fault thread of a placed mapping after faulting its chunk
  // [begin, begin + bytes) on the node's CPUs; the default does nothing.
  virtual void faulted(const void* /*begin*/, size_t /*bytes*/) {}
};
// The system in force (the live one unless a test installed another).
PINSTAGE_API NumaSystem& numa_system() noexcept;
// Installs `system` (nullptr = the live one again) and returns the one it replaces. For
// tests: call it while no mapping is in progress; `system` must outlive its use.
PINSTAGE_API NumaSystem* set_numa_system(NumaSystem* system) noexcept;

// Undoes map_pages; false (with `error`) when munmap refuses. Never throws.
PINSTAGE_API bool unmap_pages(const MappedPages& pages, std::string* error = nullptr) noexcept;

}  // namespace pinstage
