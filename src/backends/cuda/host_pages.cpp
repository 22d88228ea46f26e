#include "backends/cuda/host_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

// Linux 5.14+; older kernels (and some sandboxes) answer EINVAL and we touch pages instead.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace pinstage::cuda {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kMinBytesPerThread = size_t{32} << 20;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Faults [begin, begin + len) in: one madvise when the kernel has it, else a write per
// page. Returns 0 or the errno that stopped it.
int prefault_range(char* begin, size_t len, size_t page, bool& used_populate) {
  if (madvise(begin, len, MADV_POPULATE_WRITE) == 0) {
    used_populate = true;
    return 0;
  }
  const int err = errno;
  if (err != EINVAL && err != ENOSYS && err != EPERM) return err;
  for (size_t off = 0; off < len; off += page) *static_cast<volatile char*>(begin + off) = 0;
  return 0;
}

}  // namespace

int prefault_thread_count(size_t bytes, const HostPagesOptions& options) {
  int threads = options.threads;
  if (threads <= 0) {
    const unsigned hw = std::thread::hardware_concurrency();
    threads = static_cast<int>(std::clamp(hw == 0 ? 1u : hw, 1u, 32u));
  }
  const size_t by_size = std::max<size_t>(1, bytes / kMinBytesPerThread);
  return static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), by_size));
}

PagesStatus map_prefaulted(size_t bytes, const HostPagesOptions& options, MappedPages& out,
                           PrefaultReport& report, std::string& error) {
  if (bytes == 0) {
    error = "cannot map 0 bytes";
    return PagesStatus::failed;
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (bytes > SIZE_MAX - kHugePage - page) {
    error = "request of " + std::to_string(bytes) + " bytes is too large to map";
    return PagesStatus::out_of_memory;
  }
  const size_t usable = (bytes + page - 1) / page * page;
  const bool huge = options.huge_pages && usable >= kHugePage;
  // With huge pages, over-map by 2 MiB and trim so the data starts on a 2 MiB boundary.
  const size_t map_bytes = huge ? usable + kHugePage : usable;

  const auto t0 = std::chrono::steady_clock::now();
  void* base = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    error = "mmap of " + std::to_string(map_bytes) + " bytes failed: " + std::strerror(err);
    return err == ENOMEM ? PagesStatus::out_of_memory : PagesStatus::failed;
  }
  MappedPages pages{base, map_bytes, base, usable};
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
    // A hint: where THP is off or unsupported the pages are simply 4 KiB.
    (void)madvise(pages.data, usable, MADV_HUGEPAGE);
  }
  report.map_seconds = seconds_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  const int threads = prefault_thread_count(usable, options);
  // Chunks are whole huge pages so no two threads fault the same 2 MiB page.
  const size_t unit = huge ? kHugePage : page;
  const size_t units = (usable + unit - 1) / unit;
  const size_t per_thread = (units + threads - 1) / threads;
  std::atomic<int> first_error{0};
  std::atomic<bool> populate_used{false};
  auto work = [&](int t) {
    const size_t begin = std::min(usable, static_cast<size_t>(t) * per_thread * unit);
    const size_t end = std::min(usable, begin + per_thread * unit);
    if (begin >= end) return;
    bool used = false;
    const int err = prefault_range(static_cast<char*>(pages.data) + begin, end - begin, page, used);
    if (used) populate_used = true;
    int expected = 0;
    if (err != 0) first_error.compare_exchange_strong(expected, err);
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(work, t);
    } catch (const std::system_error&) {
      work(t);  // no thread to spare: do that share here
    }
  }
  work(0);
  for (auto& th : pool) th.join();
  report.prefault_seconds = seconds_since(t1);
  report.threads = threads;
  report.populate_write = populate_used;

  if (const int err = first_error.load(); err != 0) {
    error = "pre-faulting " + std::to_string(usable) + " bytes failed: " + std::strerror(err);
    munmap(pages.base, pages.map_bytes);
    return err == ENOMEM ? PagesStatus::out_of_memory : PagesStatus::failed;
  }
  out = pages;
  return PagesStatus::ok;
}

bool unmap_pages(const MappedPages& pages, std::string& error) {
  if (pages.base == nullptr) return true;
  if (munmap(pages.base, pages.map_bytes) != 0) {
    error = std::string("munmap failed: ") + std::strerror(errno);
    return false;
  }
  return true;
}

}  // namespace pinstage::cuda
