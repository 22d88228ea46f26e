// The thread pool: every index once, exceptions propagate, nesting runs inline.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

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

}  // namespace
}  // namespace pinstage
