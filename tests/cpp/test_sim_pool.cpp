// The sim device pool (src/backends/sim/device_pool.h): alignment, best fit, coalescing,
// capacity, and that a freed range is reused without faulting again. Through the Worker,
// that device allocations come from the pool and are counted at their granule.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <cstring>
#include <string>
#include <vector>

#include "backends/sim/device_pool.h"
#include "extension_test_util.h"
#include "lock_test_util.h"
#include "pinstage/backend/sim_ext.h"
#include "pinstage/error.h"
#include "pinstage/pages.h"
#include "pinstage/worker.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

using sim::DevicePool;
using test::error_of;
using test::sim_stats;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

uint64_t offset(const DevicePool& pool, const void* p) {
  return static_cast<uint64_t>(static_cast<const char*>(p) - static_cast<const char*>(pool.base()));
}

// Page faults of the whole process so far (every thread, including pre-fault helpers).
long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Resident pages of [p, p + bytes) by mincore.
size_t resident_pages(const void* p, size_t bytes) {
  std::vector<unsigned char> vec(bytes / page_size());
  EXPECT_EQ(mincore(const_cast<void*>(p), bytes, vec.data()), 0) << std::strerror(errno);
  size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

TEST(SimPool, BlocksAre256ByteAlignedAndDisjoint) {
  DevicePool pool(1 * kMiB);
  uint64_t end = 0, used = 0;
  for (size_t bytes :
       {size_t{1}, size_t{255}, size_t{256}, size_t{257}, size_t{1000}, size_t{4097}}) {
    void* p = pool.allocate(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << bytes;
    EXPECT_GE(offset(pool, p), end) << "blocks overlap at " << bytes;  // lowest-first
    end = offset(pool, p) + bytes;
    used += (bytes + 255) / 256 * 256;
    std::memset(p, 0x5a, bytes);  // writable to the last byte
  }
  EXPECT_EQ(pool.used(), used);
}

TEST(SimPool, FreedNeighboursCoalesceAndBestFitPicksTheSmallestHole) {
  DevicePool pool(1 * kMiB);
  std::vector<void*> quarter;
  for (int i = 0; i < 4; ++i) quarter.push_back(pool.allocate(256 * kKiB));
  EXPECT_EQ(error_of([&] { pool.allocate(1); }).code(), ErrorCode::out_of_memory);
  pool.release(quarter[1], 256 * kKiB);
  pool.release(quarter[3], 256 * kKiB);
  // Half is free, but fragmented: 300 KiB does not fit and the message says why.
  const Error e = error_of([&] { pool.allocate(300 * kKiB); });
  EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
  EXPECT_NE(std::string(e.what()).find("524288 bytes of 1048576 bytes free"), std::string::npos)
      << e.what();
  EXPECT_NE(std::string(e.what()).find("largest free block is 262144 bytes"), std::string::npos)
      << e.what();
  EXPECT_EQ(pool.stats().free_blocks, 2u);
  pool.release(quarter[2], 256 * kKiB);  // joins both free neighbours: one 768 KiB range
  EXPECT_EQ(pool.stats().free_blocks, 1u);
  EXPECT_EQ(pool.stats().largest_free, 768 * kKiB);
  void* big = pool.allocate(700 * kKiB);
  EXPECT_EQ(big, quarter[1]);
  pool.release(big, 700 * kKiB);
  pool.release(quarter[0], 256 * kKiB);
  EXPECT_EQ(pool.stats().free_blocks, 1u);
  EXPECT_EQ(pool.stats().largest_free, 1 * kMiB);
  EXPECT_EQ(pool.used(), 0u);
}

TEST(SimPool, BestFitTakesTheTightestHoleNotTheFirst) {
  DevicePool pool(64 * kKiB);
  void* a = pool.allocate(4 * kKiB);
  void* b = pool.allocate(256);
  void* c = pool.allocate(1 * kKiB);
  void* d = pool.allocate(256);
  pool.release(a, 4 * kKiB);
  pool.release(c, 1 * kKiB);
  EXPECT_EQ(pool.allocate(1 * kKiB), c);  // the 1 KiB hole, though a's comes first
  EXPECT_EQ(pool.allocate(3 * kKiB), a);
  (void)b;
  (void)d;
}

TEST(SimPool, CapacityIsWholeGranulesAndAFailedAllocationChangesNothing) {
  DevicePool pool(10'000);  // 39 whole granules: 9,984 bytes
  EXPECT_EQ(pool.stats().span, 9'984u);
  EXPECT_EQ(error_of([&] { pool.allocate(9'985); }).code(), ErrorCode::out_of_memory);
  void* all = pool.allocate(9'984);
  const sim::PoolStats before = pool.stats();
  EXPECT_EQ(error_of([&] { pool.allocate(1); }).code(), ErrorCode::out_of_memory);
  EXPECT_EQ(error_of([&] { pool.allocate(SIZE_MAX); }).code(), ErrorCode::out_of_memory);
  const sim::PoolStats after = pool.stats();
  EXPECT_EQ(after.used, before.used);
  EXPECT_EQ(after.free_blocks, before.free_blocks);
  pool.release(all, 9'984);
  EXPECT_EQ(pool.used(), 0u);
}

TEST(SimPool, PagesAreBackedOnFirstUseAndAReusedRangeDoesNotFault) {
  constexpr size_t kBytes = 16 * kMiB;
  DevicePool pool(1024 * kMiB);  // reserved, not backed
  EXPECT_EQ(pool.stats().backed, 0u);
  EXPECT_EQ(resident_pages(pool.base(), kBytes), 0u);

  long before = minor_faults();
  void* first = pool.allocate(kBytes);
  const long first_faults = minor_faults() - before;
  EXPECT_EQ(pool.stats().backed, kBytes);
  EXPECT_EQ(resident_pages(first, kBytes), kBytes / page_size());        // backed when it returns
  EXPECT_GE(first_faults, static_cast<long>(kBytes / page_size() / 2));  // the counter works
  pool.release(first, kBytes);
  EXPECT_EQ(resident_pages(first, kBytes), kBytes / page_size());  // a free keeps the pages

  if (!test::kFaultsAreOnlyOurs) GTEST_SKIP() << "TSan build: its shadow memory faults too";
  before = minor_faults();
  void* again = pool.allocate(kBytes);
  std::memset(again, 0x33, kBytes);
  const long reuse_faults = minor_faults() - before;
  EXPECT_EQ(again, first);
  EXPECT_LT(reuse_faults, 64) << "a reused range faulted again (first use: " << first_faults << ")";
  EXPECT_EQ(pool.stats().backed, kBytes);  // no new backing
}

// A sim worker whose device holds 64 MiB, with these backend options.
void init_sim(Worker& worker, BackendConfig config = {}) {
  WorkerOptions options;
  options.device_capacity_bytes = 64 * kMiB;
  options.config = std::move(config);
  worker.init("sim", 0, options);
}

TEST(SimPool, WorkerDeviceMemoryComesFromThePool) {
  Worker worker;
  init_sim(worker);
  ps_sim_stats s = sim_stats(worker);
  EXPECT_EQ(s.pool_span_bytes, 64 * kMiB);
  EXPECT_EQ(s.pool_backed_bytes, 0u);  // reserved at creation, nothing backed yet
  {
    DeviceBuffer a = worker.alloc_device(1000);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 256, 0u);
    EXPECT_EQ(worker.stats().device_committed_bytes, 1024u);  // the 256-byte granule
    DeviceBuffer b = worker.alloc_device(8 * kMiB);
    EXPECT_EQ(sim_stats(worker).pool_used_bytes, 1024u + 8 * kMiB);
  }
  s = sim_stats(worker);
  EXPECT_EQ(s.pool_used_bytes, 0u);
  EXPECT_EQ(s.pool_backed_bytes, round_up_to_pages(1024 + 8 * kMiB));  // stays backed
  EXPECT_EQ(s.pool_free_blocks, 1u);                                   // coalesced again
  auto stats_fn = reinterpret_cast<ps_sim_stats_fn>(worker.backend_extension(PS_SIM_STATS_NAME));
  EXPECT_EQ(stats_fn(worker.native_context(), nullptr), PS_ERR_INVALID_ARGUMENT);
  const Error e = error_of([&] { worker.alloc_device(65 * kMiB); });
  EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
  EXPECT_NE(std::string(e.what()).find("device out of memory"), std::string::npos) << e.what();
}

// backed_bytes (config): the pool's first bytes are resident before any allocation, so a
// timed load's allocation there faults nothing; more than the capacity is refused.
TEST(SimPool, BackedBytesAreResidentBeforeTheFirstAllocation) {
  Worker worker;
  init_sim(worker, {{"backed_bytes", "8M"}});
  EXPECT_EQ(sim_stats(worker).pool_backed_bytes, 8 * kMiB);
  const long before = minor_faults();
  DeviceBuffer a = worker.alloc_device(8 * kMiB);
  const long faults = minor_faults() - before;
  EXPECT_EQ(resident_pages(a.data(), 8 * kMiB), 8 * kMiB / page_size());
  if (test::kFaultsAreOnlyOurs) {
    EXPECT_LT(faults, 64) << "the allocation faulted pages backed_bytes should have backed";
  }

  for (const char* bad : {"65M", "x", "-1"}) {
    Worker other;
    const Error e = error_of([&] { init_sim(other, {{"backed_bytes", bad}}); });
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << bad;
    EXPECT_NE(std::string(e.what()).find("backed_bytes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pinstage
