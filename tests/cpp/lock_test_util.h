// Test helpers for memory locking: the real lock as the kernel reports it (VmLck), whether
// this process may lock, and dropping that right in a child process.
#pragma once

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
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

}  // namespace pinstage::test
