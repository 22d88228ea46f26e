// Note [One pre-fault]
// ~~~~~~~~~~~~~~~~~~~~
// Page faults are kernel work that scales with cores, while mlock or a driver's register
// call populates a range on one thread. So every path that makes memory resident (sim's
// pinned and device memory, cuda's register mode, the fixture's population floor) faults
// it in here first, in parallel, by a write per page (the default: it backs the page on
// every host, VMs included) or by MADV_POPULATE_WRITE per chunk (PrefaultMethod).
#include "pinstage/pages.h"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
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

// Faults [begin, begin + len) in. Returns 0 or the errno that stopped it.
int prefault_range(char* begin, size_t len, PrefaultMethod method, bool& used_populate) {
  if (method == PrefaultMethod::populate && g_populate_supported.load(std::memory_order_relaxed)) {
    if (madvise(begin, len, MADV_POPULATE_WRITE) == 0) {
      used_populate = true;
      return 0;
    }
    const int err = errno;
    if (err != EINVAL && err != ENOSYS && err != EPERM) return err;
    g_populate_supported.store(false, std::memory_order_relaxed);  // an older kernel
  }
  const size_t page = page_size();
  for (size_t off = 0; off < len; off += page) *static_cast<volatile char*>(begin + off) = 0;
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

PrefaultReport prefault(void* data, size_t bytes, int threads, size_t unit, PrefaultMethod method) {
  const std::vector<int>* cpus = t_fault_cpus;
  PrefaultReport report;
  if (data == nullptr || bytes == 0) return report;
  const Stopwatch watch;
  unit = unit == 0 ? page_size() : unit;
  report.threads = prefault_thread_count(bytes, threads);
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
          const int err =
              prefault_range(static_cast<char*>(data) + begin, end - begin, method, used);
          if (cpus != nullptr && err == 0)
            numa_system().faulted(static_cast<char*>(data) + begin, end - begin);
          if (used) populate_used = true;
          int expected = 0;
          if (err != 0) first_error.compare_exchange_strong(expected, err);
        }
      },
      report.threads);
  report.populate_write = populate_used;
  report.seconds = watch.seconds();
  if (const int err = first_error.load(); err != 0)
    throw Error(err == ENOMEM ? ErrorCode::out_of_memory : ErrorCode::backend,
                "pre-faulting " + std::to_string(bytes) + " bytes failed: " + std::strerror(err));
  return report;
}

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
    // Trimming only returns address space; a failure just keeps the slack mapped.
    if (head > 0 && munmap(base, head) == 0) {
      pages.base = reinterpret_cast<void*>(aligned);
      pages.map_bytes -= head;
    }
    if (tail > 0 && munmap(reinterpret_cast<char*>(aligned) + usable, tail) == 0)
      pages.map_bytes -= tail;
    pages.data = reinterpret_cast<void*>(aligned);
    (void)madvise(pages.data, usable, MADV_HUGEPAGE);  // a hint: 4 KiB pages where THP is off
  }
  pages.map_seconds = watch.seconds();
  try {
    std::vector<int> cpus;
    if (options.numa_node >= 0) {
      NumaSystem& numa = numa_system();
      numa.bind(pages.data, usable, options.numa_node);  // before the first touch
      cpus = numa.node_cpus(options.numa_node);
    }
    if (!options.prefault) return pages;
    t_fault_cpus = cpus.empty() ? nullptr : &cpus;
    pages.prefault =
        prefault(pages.data, usable, options.threads, huge ? kHugePage : 0, options.method);
    t_fault_cpus = nullptr;
  } catch (...) {
    t_fault_cpus = nullptr;
    munmap(pages.base, pages.map_bytes);
    throw;
  }
  return pages;
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
