// The host memory pool from many threads at once (run under TSan in CI, label
// concurrency): alloc, free, trim and stats race; every byte a thread wrote is its own.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <latch>
#include <thread>
#include <vector>

#include "pinstage/worker.h"

namespace pinstage {
namespace {

TEST(HostPoolConcurrency, AllocFreeTrimFromManyThreads) {
  Worker worker;
  WorkerOptions options;
  options.host_cache_limit_bytes = size_t{8} << 20;
  worker.init("sim", 0, options);
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  std::latch start(kThreads + 1);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int r = 0; r < kRounds; ++r) {
        const size_t n = 4096 * (1 + (r * 7 + t) % 300);
        PinnedHostBuffer b = worker.alloc_pinned_host(n);
        std::memset(b.data(), t + 1, n);
        const auto* p = static_cast<const unsigned char*>(b.data());
        if (p[0] != t + 1 || p[n - 1] != t + 1) ++wrong;
      }
    });
  start.arrive_and_wait();
  for (int r = 0; r < 50; ++r) {
    worker.trim_host_cache(size_t{1} << 20);
    (void)worker.host_memory_stats();
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  const HostMemoryStats s = worker.host_memory_stats();
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.hits + s.misses, uint64_t{kThreads} * kRounds);
  EXPECT_LE(s.cached_bytes, size_t{8} << 20);
}

}  // namespace
}  // namespace pinstage
