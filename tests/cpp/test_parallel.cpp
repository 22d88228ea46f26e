// The thread pool: every index once, exceptions propagate, nesting runs inline.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "lock_test_util.h"  // PINSTAGE_TEST_SANITIZED
#include "pinstage/error.h"
#include "pinstage/parallel.h"

namespace pinstage {
namespace {

TEST(ParallelFor, CoversEveryIndexExactlyOnce) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{100003}}) {
    for (size_t grain : {size_t{1}, size_t{64}, size_t{100000}}) {
      std::vector<std::atomic<int>> hits(n);
      parallel_for(n, grain, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << grain << " " << i;
    }
  }
}

TEST(ParallelFor, RethrowsTheBodysException) {
  EXPECT_THROW(parallel_for(1000, 1,
                            [](size_t b, size_t) {
                              if (b > 0) throw std::runtime_error("chunk failed");
                            }),
               std::runtime_error);
  // The pool is still usable afterwards.
  std::atomic<size_t> sum{0};
  parallel_for(100, 1, [&](size_t b, size_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 100u);
}

TEST(ParallelFor, NestedCallsRunInline) {
  std::atomic<size_t> total{0};
  parallel_for(8, 1, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      parallel_for(100, 1, [&](size_t ib, size_t ie) { total += ie - ib; });
  });
  EXPECT_EQ(total.load(), 800u);
}

TEST(ParallelMemcpy, CopiesOddSizesExactly) {
  for (size_t n : {size_t{0}, size_t{1}, (size_t{9} << 20) + 13}) {
    std::vector<unsigned char> src(n), dst(n, 0);
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<unsigned char>(i * 37 + 1);
    parallel_memcpy(dst.data(), src.data(), n);
    EXPECT_EQ(dst, src);
  }
}

// VmSize of this process in bytes, from /proc/self/status.
uint64_t address_space_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  uint64_t kib = 0;
  while (status >> key) {
    if (key == "VmSize:") {
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 12, '\n');
  }
  return 0;
}

// In a fresh child: 4096 threads under an address-space limit that fits a few dozen
// thread stacks. Exits 0 when both attempts fail with Error(out_of_memory).
[[noreturn]] void start_pool_under_a_memory_limit() {
  alarm(120);  // the bug was a hang: make it a failure (SIGALRM), not a stuck test
  setenv("PINSTAGE_NUM_THREADS", "4096", 1);
  const rlim_t limit = address_space_bytes() + (rlim_t{256} << 20);
  const rlimit rl{limit, limit};
  if (setrlimit(RLIMIT_AS, &rl) != 0) std::_Exit(3);
  int failures = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      parallel_for(100000, 1, [](size_t, size_t) {});
    } catch (const Error& e) {
      if (e.code() == ErrorCode::out_of_memory) ++failures;
      std::fprintf(stderr, "%s\n", e.what());
    }
  }
  std::_Exit(failures == 2 ? 0 : 4);
}

// Issue 14, defect 6: the pool must fail with a clear error (twice: the second call
// retries and fails the same way), not hang or terminate while unwinding. Runs in a
// fresh child (threadsafe death test) so the pool is not built yet.
// Streaming stores write whole 64-byte lines: every size and misalignment of either
// side around a line must still land byte for byte, touching nothing outside the range.
TEST(StreamCopy, IsBitExactAtEverySizeAndAlignment) {
  std::vector<unsigned char> src(4096 + 192), dst(src.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t n : {0, 1, 15, 63, 64, 65, 127, 128, 129, 200, 1000, 4096}) {
    for (size_t s_off : {0, 1, 17, 63}) {
      for (size_t d_off : {0, 1, 31, 63}) {
        std::fill(dst.begin(), dst.end(), 0xcc);
        stream_copy(dst.data() + d_off, src.data() + s_off, n);
        ASSERT_EQ(std::memcmp(dst.data() + d_off, src.data() + s_off, n), 0)
            << n << " bytes from +" << s_off << " to +" << d_off;
        for (size_t i = 0; i < dst.size(); ++i)
          if (i < d_off || i >= d_off + n) ASSERT_EQ(dst[i], 0xcc) << "byte " << i << " touched";
      }
    }
  }
}

TEST(ParallelForDeathTest, APartialPoolStartIsAClearErrorNotAHang) {
#if defined(PINSTAGE_TEST_SANITIZED)
  GTEST_SKIP() << "sanitizer runtimes reserve address space: RLIMIT_AS cannot model this";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(start_pool_under_a_memory_limit(), testing::ExitedWithCode(0),
              "could not start thread [0-9]+ of 4095 .*lower PINSTAGE_NUM_THREADS \\(now 4096");
}

}  // namespace
}  // namespace pinstage
