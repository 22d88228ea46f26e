// Note [One pre-fault]
// ~~~~~~~~~~~~~~~~~~~~
// Page faults are kernel work that scales with cores, while mlock or a driver's register
// call populates a range on one thread. So every path that makes memory resident (the
// runtime's host sources, sim's device memory, the fixture's population floor) faults it
// in here first, in parallel, by a write per page (it backs the page on every host, VMs
// included), by MADV_POPULATE_WRITE/READ per chunk (PrefaultMethod), or inside a load's
// reader threads chunk by chunk (a FaultPlan shared by the readers).
// Huge pages: a 2 MiB fault may stall for seconds on memory compaction (defrag=madvise,
// docs/benchmarks.md). A huge plan faults in timed 2 MiB units; the first unit slower than
// its stall limit advises the whole segment MADV_NOHUGEPAGE, so the rest takes base pages
// (the pages faulted already stay huge), and the report says so.
#include "pinstage/pages.h"

#include <linux/magic.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/parallel.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace pinstage {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kMinBytesPerThread = size_t{32} << 20;

std::atomic<bool> g_populate_supported{true};

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

// Faults [begin, begin + len) in. Returns 0 or the errno that stopped it.
int prefault_range(char* begin, size_t len, PrefaultMethod method, bool& used_populate) {
  const bool read = method == PrefaultMethod::read;
  if (method != PrefaultMethod::touch && g_populate_supported.load(std::memory_order_relaxed)) {
    if (madvise(begin, len, read ? MADV_POPULATE_READ : MADV_POPULATE_WRITE) == 0) {
      used_populate = true;
      return 0;
    }
    const int err = errno;
    if (err != EINVAL && err != ENOSYS && err != EPERM) return err;
    g_populate_supported.store(false, std::memory_order_relaxed);  // an older kernel
  }
  const size_t page = page_size();
  if (read) {
    unsigned char sink = 0;
    for (size_t off = 0; off < len; off += page) sink ^= *static_cast<volatile char*>(begin + off);
    static_cast<void>(sink);
    return 0;
  }
  for (size_t off = 0; off < len; off += page) *static_cast<volatile char*>(begin + off) = 0;
  return 0;
}

// This thread's CPU time: a fault's own cost (zeroing, compaction), not the time the thread
// spent waiting for a core on a busy machine.
int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// A huge plan's range, 2 MiB at a time, each unit timed: the first one past the stall limit
// advises the whole segment NOHUGEPAGE (once), and what is left faults base pages.
int prefault_huge_range(char* begin, size_t len, FaultPlan& plan, bool& used_populate) {
  for (size_t off = 0; off < len;) {
    const size_t n =
        std::min(kHugePage - (reinterpret_cast<uintptr_t>(begin + off) % kHugePage), len - off);
    const int64_t start = thread_cpu_ns();
    if (const int err = prefault_range(begin + off, n, plan.method, used_populate); err != 0)
      return err;
    const int64_t took = thread_cpu_ns() - start;
    int64_t slowest = plan.slowest_ns.load(std::memory_order_relaxed);
    while (took > slowest && !plan.slowest_ns.compare_exchange_weak(slowest, took)) {
    }
    off += n;
    if (plan.stall_seconds <= 0 || plan.abandoned.load(std::memory_order_relaxed) ||
        static_cast<double>(took) < plan.stall_seconds * 1e9)
      continue;
    if (!plan.abandoned.exchange(true) && plan.segment != nullptr)
      (void)madvise(plan.segment, plan.segment_bytes, MADV_NOHUGEPAGE);  // a hint, as above
  }
  return 0;
}

// The kernel's NUMA ABI (linux/mempolicy.h), by raw syscall: no libnuma needed.
constexpr int kMpolBind = 2;
constexpr unsigned long kMpolFNode = 1, kMpolFAddr = 2;
constexpr unsigned long kMaxNodes = 1024;

// Runs on `cpus` until destroyed, then restores the thread's own mask (pool threads are
// shared, so a placement never outlives its pre-fault).
class CpuScope {
 public:
  explicit CpuScope(const std::vector<int>& cpus) {
    if (cpus.empty() || pthread_getaffinity_np(pthread_self(), sizeof saved_, &saved_) != 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus) CPU_SET(c, &set);
    active_ = pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
  }
  ~CpuScope() {
    if (active_) pthread_setaffinity_np(pthread_self(), sizeof saved_, &saved_);
  }
  CpuScope(const CpuScope&) = delete;
  CpuScope& operator=(const CpuScope&) = delete;

 private:
  cpu_set_t saved_{};
  bool active_ = false;
};

}  // namespace

std::vector<int> NumaSystem::node_cpus(int node) const {
  std::vector<int> cpus;
  std::ifstream in("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
  std::string list;
  if (node < 0 || !std::getline(in, list)) return cpus;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const bool masked = sched_getaffinity(0, sizeof allowed, &allowed) == 0;
  std::stringstream items(list);
  std::string item;
  while (std::getline(items, item, ',')) {
    int lo = 0, hi = 0;
    const int got = std::sscanf(item.c_str(), "%d-%d", &lo, &hi);
    if (got < 1) continue;
    if (got == 1) hi = lo;
    for (int c = lo; c <= hi && c < CPU_SETSIZE; ++c)
      if (!masked || CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  return cpus;
}

void NumaSystem::bind(void* data, size_t bytes, int node) {
  if (node < 0 || static_cast<unsigned long>(node) >= kMaxNodes || node_cpus(node).empty())
    throw Error(ErrorCode::invalid_argument, "NUMA node " + std::to_string(node) +
                                                 " does not exist or has no CPU this " +
                                                 "process may use (/sys/devices/system/node)");
  unsigned long mask[kMaxNodes / (8 * sizeof(unsigned long))] = {};
  mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
  if (syscall(SYS_mbind, data, bytes, kMpolBind, mask, kMaxNodes + 1, 0) != 0)
    throw Error(ErrorCode::backend, "mbind of " + std::to_string(bytes) + " bytes to NUMA node " +
                                        std::to_string(node) + " failed: " + std::strerror(errno));
}

namespace {
NumaSystem g_live_numa;
std::atomic<NumaSystem*> g_numa{&g_live_numa};
}  // namespace

NumaSystem& numa_system() noexcept { return *g_numa.load(std::memory_order_acquire); }

NumaSystem* set_numa_system(NumaSystem* system) noexcept {
  return g_numa.exchange(system != nullptr ? system : &g_live_numa, std::memory_order_acq_rel);
}

int numa_node_of(const void* addr) noexcept {
  int node = -1;
  if (syscall(SYS_get_mempolicy, &node, nullptr, 0, addr, kMpolFNode | kMpolFAddr) != 0) return -1;
  return node;
}

std::vector<int> numa_node_cpus(int node) { return numa_system().node_cpus(node); }

size_t page_size() noexcept {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

size_t file_page_bytes(int fd) noexcept {
  struct statfs sf {};
  if (::fstatfs(fd, &sf) == 0 && sf.f_type == HUGETLBFS_MAGIC && sf.f_bsize > 0)
    return static_cast<size_t>(sf.f_bsize);
  return page_size();
}

uint64_t physical_memory_bytes() noexcept {
  static const uint64_t bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * page_size();
  return bytes;
}

uint64_t available_memory_bytes() noexcept {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return physical_memory_bytes();
  char line[256];
  uint64_t kib = 0;
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long v = 0;
    if (std::sscanf(line, "MemAvailable: %llu kB", &v) == 1) {
      kib = v;
      found = true;
    }
  }
  std::fclose(f);
  return found ? kib * 1024 : physical_memory_bytes();
}

size_t round_up_to_pages(size_t bytes) {
  const size_t page = page_size();
  if (bytes > SIZE_MAX - page)
    throw Error(ErrorCode::invalid_argument,
                "a request of " + std::to_string(bytes) + " bytes is too large to map");
  return (bytes + page - 1) / page * page;
}

bool populate_for_write(void* data, size_t bytes) noexcept {
  if (!g_populate_supported.load(std::memory_order_relaxed) || data == nullptr) return false;
  const uintptr_t page = page_size();
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + page - 1) & ~(page - 1);
  const uintptr_t last = (begin + bytes) & ~(page - 1);
  if (last <= first) return false;
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE) == 0) return true;
  if (errno == EINVAL) g_populate_supported.store(false, std::memory_order_relaxed);
  return false;
}

int prefault_thread_count(size_t bytes, int threads) {
  if (threads <= 0) threads = std::clamp(usable_cpu_count(), 1, 32);  // the affinity mask
  const size_t by_size = std::max<size_t>(1, bytes / kMinBytesPerThread);
  return static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), by_size));
}

namespace {
thread_local const std::vector<int>* t_fault_cpus = nullptr;  // map_pages' NUMA placement
}  // namespace

PrefaultReport prefault(void* data, size_t bytes, FaultPlan& plan) {
  const std::vector<int>* cpus = t_fault_cpus;
  PrefaultReport report;
  if (data == nullptr || bytes == 0) return report;
  const Stopwatch watch;
  const size_t unit = plan.huge ? kHugePage : page_size();
  report.threads = prefault_thread_count(bytes, plan.threads);
  const size_t units = (bytes + unit - 1) / unit;
  const size_t per_thread = (units + report.threads - 1) / report.threads;
  std::atomic<int> first_error{0};
  std::atomic<bool> populate_used{false};
  parallel_for(
      static_cast<size_t>(report.threads), 1,
      [&](size_t t0, size_t t1) {
        for (size_t t = t0; t < t1; ++t) {
          const size_t begin = std::min(bytes, t * per_thread * unit);
          const size_t end = std::min(bytes, begin + per_thread * unit);
          if (begin >= end) continue;
          bool used = false;
          const CpuScope placed(cpus != nullptr ? *cpus : std::vector<int>{});
          char* from = static_cast<char*>(data) + begin;
          const int err = plan.huge ? prefault_huge_range(from, end - begin, plan, used)
                                    : prefault_range(from, end - begin, plan.method, used);
          if (cpus != nullptr && err == 0) numa_system().faulted(from, end - begin);
          if (used) populate_used = true;
          int expected = 0;
          if (err != 0) first_error.compare_exchange_strong(expected, err);
        }
      },
      report.threads);
  report.populate_write = populate_used;
  report.huge_abandoned = plan.abandoned.load();
  report.slowest_unit_seconds = static_cast<double>(plan.slowest_ns.load()) / 1e9;
  report.seconds = watch.seconds();
  if (const int err = first_error.load(); err != 0)
    throw Error(err == ENOMEM ? ErrorCode::out_of_memory : ErrorCode::backend,
                "pre-faulting " + std::to_string(bytes) + " bytes failed: " + std::strerror(err));
  return report;
}

PrefaultReport prefault(void* data, size_t bytes, int threads, size_t unit, PrefaultMethod method) {
  FaultPlan plan;
  plan.method = method;
  plan.threads = threads;
  plan.huge = unit == kHugePage;
  return prefault(data, bytes, plan);
}

namespace {

// Binds [data, data + bytes) to options.numa_node (before any touch) and pre-faults it
// under `plan` on that node's CPUs, as options ask. Unmaps [base, base + map_bytes) and
// rethrows on failure.
void place_and_fault(MappedPages& pages, const MapOptions& options, FaultPlan& plan) {
  try {
    std::vector<int> cpus;
    if (options.numa_node >= 0) {
      NumaSystem& numa = numa_system();
      numa.bind(pages.data, pages.bytes, options.numa_node);  // before the first touch
      cpus = numa.node_cpus(options.numa_node);
    }
    if (!options.prefault) return;
    t_fault_cpus = cpus.empty() ? nullptr : &cpus;
    pages.prefault = prefault(pages.data, pages.bytes, plan);
    t_fault_cpus = nullptr;
  } catch (...) {
    t_fault_cpus = nullptr;
    munmap(pages.base, pages.map_bytes);
    throw;
  }
}

}  // namespace

MappedPages map_pages(size_t bytes, const MapOptions& options) {
  if (bytes == 0) throw Error(ErrorCode::invalid_argument, "cannot map 0 bytes");
  if (bytes > SIZE_MAX - kHugePage - page_size())
    throw Error(ErrorCode::out_of_memory,
                "a request of " + std::to_string(bytes) + " bytes is too large to map");
  const size_t usable = round_up_to_pages(bytes);
  const bool huge = options.huge_pages && usable >= kHugePage;
  // With huge pages, over-map by 2 MiB and trim so the data starts on a 2 MiB boundary.
  const size_t map_bytes = huge ? usable + kHugePage : usable;
  const Stopwatch watch;
  void* base = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    throw Error(err == ENOMEM ? ErrorCode::out_of_memory : ErrorCode::backend,
                "mmap of " + std::to_string(map_bytes) + " bytes failed: " + std::strerror(err));
  }
  MappedPages pages{base, map_bytes, base, usable, {}, 0};
  if (huge) {
    const auto addr = reinterpret_cast<uintptr_t>(base);
    const uintptr_t aligned = (addr + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
    const size_t head = aligned - addr;
    const size_t tail = map_bytes - head - usable;
    // Trimmed, so base == data: a segment is released by its (data, bytes) alone.
    if ((head > 0 && munmap(base, head) != 0) ||
        (tail > 0 && munmap(reinterpret_cast<char*>(aligned) + usable, tail) != 0)) {
      const int err = errno;
      munmap(base, map_bytes);  // the whole of it, whatever the trims left
      throw Error(ErrorCode::out_of_memory,
                  std::string("trimming a huge-page mapping failed: ") + std::strerror(err));
    }
    pages.base = pages.data = reinterpret_cast<void*>(aligned);
    pages.map_bytes = usable;
    (void)madvise(pages.data, usable, MADV_HUGEPAGE);  // a hint: 4 KiB pages where THP is off
  }
  pages.map_seconds = watch.seconds();
  FaultPlan plan;
  plan.method = options.method;
  plan.threads = options.threads;
  plan.huge = huge;
  plan.stall_seconds = options.huge_stall_seconds;
  plan.segment = pages.data;
  plan.segment_bytes = usable;
  place_and_fault(pages, options, plan);
  return pages;
}

MappedPages map_file_pages(int fd, size_t bytes, bool private_writable, const MapOptions& options,
                           const std::string& what) {
  if (bytes == 0) throw Error(ErrorCode::invalid_argument, "cannot map 0 bytes of " + what);
  const size_t page = file_page_bytes(fd);  // a hugetlbfs file (the restart cache's): huge
  const size_t usable = (bytes + page - 1) / page * page;
  const Stopwatch watch;
  void* base = mmap(nullptr, usable, private_writable ? PROT_READ | PROT_WRITE : PROT_READ,
                    private_writable ? MAP_PRIVATE : MAP_SHARED, fd, 0);
  if (base == MAP_FAILED)
    throw Error(ErrorCode::io, "cannot map " + what + ": mmap: " + std::strerror(errno));
  MappedPages pages{base, usable, base, usable, {}, 0};
  pages.map_seconds = watch.seconds();
  MapOptions placed = options;
  placed.numa_node = private_writable ? options.numa_node : -1;  // the page cache is shared
  FaultPlan plan;
  // A private copy must be made by the kernel (a touch would write a zero into the data).
  plan.method = private_writable ? PrefaultMethod::populate : PrefaultMethod::read;
  plan.threads = options.threads;
  if (private_writable && !g_populate_supported.load()) placed.prefault = false;  // see below
  place_and_fault(pages, placed, plan);
  if (private_writable && !placed.prefault && options.prefault) {
    // No MADV_POPULATE_WRITE: break copy-on-write by writing each page's own first byte.
    const size_t page = page_size();
    auto* p = static_cast<volatile unsigned char*>(pages.data);
    for (size_t off = 0; off < usable; off += page) p[off] = p[off];
  }
  return pages;
}

uint64_t free_huge_page_bytes(int node) {
  FILE* f = std::fopen("/proc/buddyinfo", "r");
  if (f == nullptr) return UINT64_MAX;
  char line[512];
  uint64_t bytes = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    int at_node = -1, used = 0;
    char zone[32];
    if (std::sscanf(line, "Node %d, zone %31s%n", &at_node, zone, &used) != 2) continue;
    if (node >= 0 && at_node != node) continue;
    const char* p = line + used;
    for (int order = 0; order < 32; ++order) {
      char* end = nullptr;
      const unsigned long long count = std::strtoull(p, &end, 10);
      if (end == p) break;
      p = end;
      if (order >= 9) bytes += count * (uint64_t{page_size()} << order);
    }
  }
  std::fclose(f);
  return bytes;
}

bool unmap_pages(const MappedPages& pages, std::string* error) noexcept {
  if (pages.base == nullptr) return true;
  if (munmap(pages.base, pages.map_bytes) == 0) return true;
  if (error != nullptr) {
    try {
      *error = std::string("munmap failed: ") + std::strerror(errno);
    } catch (...) {
    }
  }
  return false;
}

}  // namespace pinstage
