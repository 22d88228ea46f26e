// Test helpers for memory locking: the real lock as the kernel reports it (VmLck), whether
// this process may lock, and dropping that right in a child process.
#pragma once

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace pinstage::test {

// A field of /proc/self/status as text ("VmLck:" -> "    8 kB"); read here, not through
// pinstage, so a bug in pinstage's reader cannot hide one in the locking.
inline std::string proc_status_field(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return line.substr(key.size());
  return {};
}

// ASan and TSan (GCC's __SANITIZE_*__, clang's __has_feature).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PINSTAGE_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PINSTAGE_TEST_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define PINSTAGE_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PINSTAGE_TEST_TSAN 1
#endif
#endif

// The sanitizers' runtimes intercept mlock as an always-successful no-op, so VmLck never
// moves in an ASan or TSan build: lock checks skip there (they run in every other build).
#if defined(PINSTAGE_TEST_SANITIZED)
inline constexpr bool kVmLckTracksMlock = false;
#else
inline constexpr bool kVmLckTracksMlock = true;
#endif

// TSan writes shadow memory beside every store, and its pages fault in too: page-fault
// counts then measure the sanitizer, so fault checks skip there.
#if defined(PINSTAGE_TEST_TSAN)
inline constexpr bool kFaultsAreOnlyOurs = false;
#else
inline constexpr bool kFaultsAreOnlyOurs = true;
#endif

// Memory this process has locked now, in bytes.
inline uint64_t vmlck_bytes() {
  const std::string kib = proc_status_field("VmLck:");
  return kib.empty() ? 0 : std::stoull(kib) * 1024;
}

// True when this process may lock `bytes` more: CAP_IPC_LOCK or room under the rlimit.
inline bool can_lock(uint64_t bytes) {
  const std::string eff = proc_status_field("CapEff:");
  if (!eff.empty() && ((std::stoull(eff, nullptr, 16) >> CAP_IPC_LOCK) & 1) != 0) return true;
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return false;
  return limit.rlim_cur == RLIM_INFINITY || vmlck_bytes() + bytes <= limit.rlim_cur;
}

// Drops CAP_IPC_LOCK and sets RLIMIT_MEMLOCK to `limit` bytes: mlock(2) is then bound by
// the rlimit, as for an ordinary user. For a child process (death test) only.
inline bool drop_lock_rights(uint64_t limit) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct caps[2]{};
  if (syscall(SYS_capget, &header, caps) != 0) return false;
  caps[0].effective &= ~(1u << CAP_IPC_LOCK);
  caps[0].permitted &= ~(1u << CAP_IPC_LOCK);
  if (syscall(SYS_capset, &header, caps) != 0) return false;
  const rlimit rl{limit, limit};
  return setrlimit(RLIMIT_MEMLOCK, &rl) == 0;
}

// Anonymous memory resident now (RssAnon), in bytes: a leaked, faulted segment shows here.
inline uint64_t rss_anon_bytes() {
  const std::string kib = proc_status_field("RssAnon:");
  return kib.empty() ? 0 : std::stoull(kib) * 1024;
}

// Open file descriptors of this process (/proc/self/fd), for leak checks.
inline size_t count_fds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Mappings of files under `dir` (/proc/self/maps; a sanitizer's allocator maps memory of its
// own at any time, so only those files' mappings are counted).
inline size_t count_maps(const std::string& dir) {
  std::ifstream in("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(dir) != std::string::npos;
  return n;
}

// A field ("AnonHugePages", "Locked", ...) of the /proc/self/smaps entry of the mapping that
// holds `addr`, in bytes, and its permissions ("rw-p"); 0 / "" when no mapping holds it.
struct SmapsEntry {
  std::string perms;
  uint64_t anon_huge = 0, locked = 0, rss = 0;
};
inline SmapsEntry smaps_of(const void* addr) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  std::ifstream in("/proc/self/smaps");
  SmapsEntry e;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    unsigned long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s", &lo, &hi, perms) == 3) {
      if (inside) break;
      inside = a >= lo && a < hi;
      if (inside) e.perms = perms;
      continue;
    }
    if (!inside) continue;
    std::istringstream fields(line);
    std::string key;
    uint64_t kib = 0;
    fields >> key >> kib;
    if (key == "AnonHugePages:") e.anon_huge = kib * 1024;
    if (key == "Locked:") e.locked = kib * 1024;
    if (key == "Rss:") e.rss = kib * 1024;
  }
  return e;
}

}  // namespace pinstage::test
