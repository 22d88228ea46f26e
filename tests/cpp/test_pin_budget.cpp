// The pin budget (docs/worker.md): a pinned request is checked against RLIMIT_MEMLOCK,
// the cgroup's memory.max and MemAvailable before anything is locked. The refusal names
// the limit and how to raise it; PINSTAGE_PIN_POLICY=fallback serves pageable memory
// with a warning and a stat instead. The real limits are tested in a child process that
// drops CAP_IPC_LOCK and lowers RLIMIT_MEMLOCK.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "lock_test_util.h"
#include "pinstage/error.h"
#include "pinstage/worker.h"

namespace pinstage {
namespace {

uint64_t page() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

bool has(const std::string& text, const char* needle) {
  return text.find(needle) != std::string::npos;
}

TEST(PinBudget, MemlockRefusalNamesTheLimitAndHowToRaiseIt) {
  PinBudget b;
  b.memlock_limit_bytes = 16 * page();
  b.locked_bytes = 15 * page();
  // One page fits exactly; one byte more is a second page and does not: the request is
  // rounded to the page, never further.
  EXPECT_EQ(pin_budget_refusal(page(), b), "");
  EXPECT_EQ(pin_budget_refusal(1, b), "");
  const std::string why = pin_budget_refusal(page() + 1, b);
  ASSERT_NE(why, "");
  EXPECT_TRUE(has(why, "RLIMIT_MEMLOCK")) << why;
  EXPECT_TRUE(has(why, "ulimit -l")) << why;
  EXPECT_TRUE(has(why, "CAP_IPC_LOCK")) << why;
  EXPECT_TRUE(has(why, "PINSTAGE_PIN_POLICY=fallback")) << why;
  EXPECT_TRUE(has(why, (std::to_string(page() + 1) + " bytes (" + std::to_string(2 * page()) +
                        " in whole pages)")
                           .c_str()))
      << why;
  b.locked_bytes = 17 * page();  // over already (locked before the limit was lowered)
  EXPECT_NE(pin_budget_refusal(1, b), "");
}

TEST(PinBudget, CgroupAndAvailableMemoryRefusals) {
  PinBudget b;
  b.cgroup_limit_bytes = 1 << 20;
  b.cgroup_used_bytes = (1 << 20) - 2 * page();
  b.cgroup_path = "/sys/fs/cgroup/test.slice";
  EXPECT_EQ(pin_budget_refusal(2 * page(), b), "");
  const std::string cg = pin_budget_refusal(2 * page() + 1, b);
  EXPECT_TRUE(has(cg, "/sys/fs/cgroup/test.slice/memory.max")) << cg;
  EXPECT_TRUE(has(cg, "MemoryMax=")) << cg;
  PinBudget a;
  a.available_bytes = 10 * page();
  EXPECT_EQ(pin_budget_refusal(10 * page(), a), "");
  const std::string av = pin_budget_refusal(10 * page() + 1, a);
  EXPECT_TRUE(has(av, "MemAvailable")) << av;
  EXPECT_EQ(pin_budget_refusal(1 << 30, PinBudget{}), "");  // no limit known: it fits
}

TEST(PinBudget, TheMachinesBudgetIsRead) {
  const PinBudget b = read_pin_budget(true);
  EXPECT_EQ(b.locked_bytes, test::vmlck_bytes());
  EXPECT_GT(b.available_bytes, 0u);
  EXPECT_NE(b.available_bytes, UINT64_MAX);
  if (test::can_lock(UINT64_MAX / 2)) {
    EXPECT_EQ(b.memlock_limit_bytes, UINT64_MAX);
  }
  // A GPU-like backend (memory not host memory) is not bound by RLIMIT_MEMLOCK.
  EXPECT_EQ(read_pin_budget(false).memlock_limit_bytes, UINT64_MAX);
}

// In the child: RLIMIT_MEMLOCK = 16 pages without CAP_IPC_LOCK. Returns a bit per failed
// check (0 = all passed), printing each failure.
int low_memlock_child(bool fallback) {
  int failed = 0;
  const auto check = [&](bool ok, int bit, const std::string& what) {
    if (!ok) {
      failed |= bit;
      std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    }
  };
  if (!test::drop_lock_rights(16 * page())) return 64;
  if (fallback) setenv("PINSTAGE_PIN_POLICY", "fallback", 1);
  Worker worker;
  worker.init("sim");
  const uint64_t base = test::vmlck_bytes();
  PinnedHostBuffer small = worker.alloc_pinned_host(2 * page() + 1);  // fits
  if (test::kVmLckTracksMlock)  // a sanitizer's mlock is a no-op: VmLck does not move
    check(test::vmlck_bytes() == base + 3 * page(), 1,
          "VmLck " + std::to_string(test::vmlck_bytes()) + " after 3 pages");
  try {
    PinnedHostBuffer big = worker.alloc_pinned_host(1 << 20);
    check(fallback, 2, "a 1 MiB pin over a 16-page RLIMIT_MEMLOCK was not refused");
    std::memset(big.data(), 0x5a, big.size());  // usable memory
    const WorkerStats s = worker.stats();
    check(s.pageable_fallback_count == 1 && s.pageable_fallback_bytes == (1u << 20) &&
              s.pageable_fallbacks == 1 && s.pinned_count == 1,
          4, "fallback stats");
    check(test::vmlck_bytes() <= base + 3 * page(), 8, "the fallback locked memory");
  } catch (const Error& e) {
    check(!fallback, 16, std::string("fallback refused: ") + e.what());
    check(e.code() == ErrorCode::out_of_memory && has(e.what(), "RLIMIT_MEMLOCK") &&
              has(e.what(), "ulimit -l"),
          32, std::string("unclear refusal: ") + e.what());
    std::fprintf(stderr, "%s\n", e.what());
  }
  const WorkerStats after = worker.stats();
  check(after.pinned_count == 1 && after.pageable_fallback_count == 0, 128,
        "something of the big request is left in the table");
  check(after.pageable_fallbacks == (fallback ? 1u : 0u), 256, "fallback count");
  small.reset();
  worker.finalize();
  check(test::vmlck_bytes() == base, 512, "VmLck not back to its baseline");
  return failed;
}

// A common default: RLIMIT_MEMLOCK 8 MiB without CAP_IPC_LOCK. sim's bounce buffers must
// leave the budget to the worker's own pinned memory, and a refusal says who holds what.
int typical_memlock_child() {
  if (!test::drop_lock_rights(8u << 20)) return 64;
  int failed = 0;
  Worker worker;
  worker.init("sim");
  if (test::kVmLckTracksMlock && test::vmlck_bytes() > (2u << 20)) {
    std::fprintf(stderr, "FAILED: VmLck %llu after init: the backend took the budget\n",
                 static_cast<unsigned long long>(test::vmlck_bytes()));
    failed |= 1;
  }
  try {
    PinnedHostBuffer small = worker.alloc_pinned_host(4096);
    std::memset(small.data(), 1, 4096);
    PinnedHostBuffer big = worker.alloc_pinned_host(16u << 20);
    std::fprintf(stderr, "FAILED: 16 MiB pinned under an 8 MiB limit\n");
    failed |= 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    if (!has(e.what(), "of them by this worker's pinned memory")) failed |= 4;
  }
  worker.finalize();
  return failed;
}

TEST(PinBudgetDeathTest, ATypicalEightMiBLimitLeavesRoomForTheWorkersOwnMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(_exit(typical_memlock_child()), ::testing::ExitedWithCode(0),
              "does not fit RLIMIT_MEMLOCK: [0-9]+ of its 8388608 bytes are locked already, "
              "[0-9]+ of them by this worker's pinned memory");
}

// The cgroup reader follows /proc/self/cgroup's path up a tree it is given: the lowest
// memory.max along the ancestors is the limit, with that cgroup's memory.current.
TEST(PinBudget, TheCgroupLimitIsTheLowestAlongTheAncestorsOfAGivenTree) {
  const std::string root = ::testing::TempDir() + "cgroup-" + std::to_string(::getpid());
  const auto put = [](const std::string& file, const std::string& text) {
    FILE* f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr) << file;
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  ASSERT_EQ(std::system(("mkdir -p " + root + "/sys/a/b/c").c_str()), 0);
  put(root + "/self", "1:name=systemd:/elsewhere\n0::/a/b/c\n");
  put(root + "/sys/a/b/c/memory.max", "max\n");
  put(root + "/sys/a/b/memory.max", "1048576\n");
  put(root + "/sys/a/b/memory.current", "4096\n");
  put(root + "/sys/a/memory.max", "2097152\n");
  put(root + "/sys/memory.max", "max\n");
  PinBudgetFiles files{root + "/self", root + "/sys"};
  const PinBudget b = read_pin_budget(false, files);
  EXPECT_EQ(b.cgroup_limit_bytes, 1048576u);
  EXPECT_EQ(b.cgroup_used_bytes, 4096u);
  EXPECT_EQ(b.cgroup_path, root + "/sys/a/b");
  EXPECT_NE(pin_budget_refusal(1048576, b).find(root + "/sys/a/b/memory.max"), std::string::npos);
  put(root + "/self", "0::/\n");  // the root cgroup: its own memory.max only
  EXPECT_EQ(read_pin_budget(false, files).cgroup_limit_bytes, UINT64_MAX);
  ASSERT_EQ(std::system(("rm -rf " + root).c_str()), 0);
}

TEST(PinBudgetDeathTest, StrictRefusesOverRlimitMemlock) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // _exit: LSan cannot trace the process without the dropped rights.
  EXPECT_EXIT(_exit(low_memlock_child(false)), ::testing::ExitedWithCode(0),
              "does not fit RLIMIT_MEMLOCK: [0-9]+ of its [0-9]+ bytes are locked already");
}

TEST(PinBudgetDeathTest, FallbackServesPageableMemoryWithAWarning) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(_exit(low_memlock_child(true)), ::testing::ExitedWithCode(0),
              "PINSTAGE_PIN_POLICY=fallback: serving it with pageable memory");
}

}  // namespace
}  // namespace pinstage
