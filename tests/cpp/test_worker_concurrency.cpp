// Many threads allocating and releasing through one worker; also run under TSan.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "pinstage/worker.h"

namespace pinstage {
namespace {

TEST(WorkerConcurrency, EightThreadsAllocAndFreeThousandsOfBuffers) {
  Worker worker;
  worker.init("sim");
  constexpr int kThreads = 8;
  constexpr int kIterations = 2000;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<PinnedHostBuffer> held;
      for (int i = 0; i < kIterations; ++i) {
        const size_t bytes = 64 + static_cast<size_t>((i * 7919 + t * 104729) % 16384);
        PinnedHostBuffer b = worker.alloc_pinned_host(bytes);
        static_cast<unsigned char*>(b.data())[bytes - 1] = static_cast<unsigned char>(t);
        if (static_cast<unsigned char*>(b.data())[bytes - 1] != t) failures++;
        if (i % 3 == 0) held.push_back(std::move(b));  // release some later, out of order
        if (held.size() > 16) held.erase(held.begin() + (i % held.size()));
        if (i % 50 == 0) worker.alloc_device(4096 + i);  // a temporary, freed at once
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  const WorkerStats s = worker.stats();
  EXPECT_EQ(s.pinned_count, 0u);
  EXPECT_EQ(s.pinned_bytes, 0u);
  EXPECT_EQ(s.device_count, 0u);
  EXPECT_EQ(s.device_committed_bytes, 0u);
}

TEST(WorkerConcurrency, FinalizeWhileThreadsAllocateIsSafe) {
  Worker worker;
  worker.init("sim");
  std::atomic<bool> go{false};
  std::atomic<int> after_finalize{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      std::vector<PinnedHostBuffer> held;
      for (int i = 0; i < 2000; ++i) {
        try {
          held.push_back(worker.alloc_pinned_host(4096));
          if (held.size() > 8) held.erase(held.begin());
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::finalized);
          after_finalize++;
          break;
        }
      }
    });  // `held` dies after finalize in most threads: harmless no-ops
  }
  go = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  worker.finalize();
  for (auto& t : threads) t.join();
  EXPECT_FALSE(worker.initialized());
}

}  // namespace
}  // namespace pinstage
