// Many threads allocating and releasing through one worker, and finalize racing them;
// every racing call's outcome is checked, not only the state after the race. Also run
// under TSan (label concurrency).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "pinstage/worker.h"

namespace pinstage {
namespace {

// Fills the buffer with the byte `tag`; intact: it still holds only `tag`.
void stamp(PinnedHostBuffer& b, unsigned char tag) { std::memset(b.data(), tag, b.size()); }
bool intact(const PinnedHostBuffer& b, unsigned char tag) {
  const auto* p = static_cast<const unsigned char*>(b.data());
  for (size_t i = 0; i < b.size(); ++i)
    if (p[i] != tag) return false;
  return true;
}

TEST(WorkerConcurrency, EightThreadsAllocAndFreeThousandsOfBuffers) {
  Worker worker;
  worker.init("sim");
  constexpr int kThreads = 8;
  constexpr int kIterations = 2000;
  std::atomic<int> overwritten{0};  // a buffer another thread wrote into: aliasing
  std::atomic<int> device_ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const auto tag = static_cast<unsigned char>(t + 1);
      std::vector<PinnedHostBuffer> held;
      for (int i = 0; i < kIterations; ++i) {
        const size_t bytes = 64 + static_cast<size_t>((i * 7919 + t * 104729) % 16384);
        PinnedHostBuffer b = worker.alloc_pinned_host(bytes);
        stamp(b, tag);
        if (i % 3 == 0) held.push_back(std::move(b));  // release some later, out of order
        if (held.size() > 16) {
          const size_t k = static_cast<size_t>(i) % held.size();
          if (!intact(held[k], tag)) overwritten++;
          held.erase(held.begin() + static_cast<ptrdiff_t>(k));
        }
        if (i % 50 == 0 && worker.alloc_device(4096 + i).size() == 4096u + i) device_ok++;
      }
      for (const auto& b : held)
        if (!intact(b, tag)) overwritten++;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(overwritten.load(), 0);
  EXPECT_EQ(device_ok.load(), kThreads * (kIterations / 50));
  const WorkerStats s = worker.stats();
  EXPECT_EQ(s.pinned_count, 0u);
  EXPECT_EQ(s.pinned_bytes, 0u);
  EXPECT_EQ(s.device_count, 0u);
  EXPECT_EQ(s.device_committed_bytes, 0u);
  EXPECT_EQ(s.free_failures, 0u);
}

// What one allocating thread saw while finalize ran.
struct Outcome {
  int allocated = 0;         // successful calls, each with usable memory
  int bad_buffer = 0;        // a success that returned an empty or short buffer
  int finalized_errors = 0;  // Error(finalized): must end the thread's run, once
  int other_errors = 0;      // anything else: a bug
  bool terminal = false;     // a call after the first refusal is refused too
};

TEST(WorkerConcurrency, FinalizeWhileThreadsAllocateIsSafe) {
  Worker worker;
  worker.init("sim");
  constexpr int kThreads = 4;
  constexpr int kBeforeFinalize = 50;  // each thread allocates this many before finalize
  std::atomic<int> ready{0};
  std::vector<Outcome> outcomes(kThreads);
  std::vector<std::vector<PinnedHostBuffer>> held(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Outcome& out = outcomes[t];
      for (;;) {  // until finalize refuses: each call either succeeds or is refused
        try {
          // A success is a whole buffer. Its memory is not touched: finalize may reclaim
          // it as soon as the call returns (docs/worker.md), which is the caller's race.
          PinnedHostBuffer b = worker.alloc_pinned_host(4096);
          if (!b || b.size() != 4096u) out.bad_buffer++;
          if (++out.allocated == kBeforeFinalize) ready++;
          held[t].push_back(std::move(b));
          if (held[t].size() > 8) held[t].erase(held[t].begin());  // releases race too
        } catch (const Error& e) {
          (e.code() == ErrorCode::finalized ? out.finalized_errors : out.other_errors)++;
          break;
        } catch (...) {
          out.other_errors++;
          break;
        }
      }
      try {
        worker.alloc_device(4096);
      } catch (const Error& e) {
        out.terminal = e.code() == ErrorCode::finalized;
      }
    });
  }
  while (ready.load() < kThreads) std::this_thread::yield();  // the race is real
  worker.finalize();
  for (auto& t : threads) t.join();
  EXPECT_FALSE(worker.initialized());
  for (int t = 0; t < kThreads; ++t) {
    SCOPED_TRACE("thread " + std::to_string(t));
    const Outcome& out = outcomes[t];
    EXPECT_GE(out.allocated, kBeforeFinalize);
    EXPECT_EQ(out.bad_buffer, 0);
    EXPECT_EQ(out.finalized_errors, 1);
    EXPECT_EQ(out.other_errors, 0);
    EXPECT_TRUE(out.terminal);
    // Finalize reclaimed what the thread still held: no buffer claims to be valid, and
    // releasing it now is a harmless no-op.
    for (auto& b : held[t]) {
      EXPECT_FALSE(b.valid());
      b.reset();
    }
  }
  EXPECT_EQ(worker.free_failures(), 0u);
}

}  // namespace
}  // namespace pinstage
