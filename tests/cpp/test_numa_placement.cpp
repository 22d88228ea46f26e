// NUMA placement of a worker's pinned memory (WorkerOptions::host_numa_node), verified,
// not assumed. On the real kernel: the pages of a worker placed on node 0 carry MPOL_BIND
// to node 0 and lie on node 0, as get_mempolicy(MPOL_F_ADDR) and move_pages report them.
// This machine has one node, so the 2-node case goes through the pages.h seam
// (NumaSystem): a fake 2-node host whose binds and pre-fault CPUs are recorded.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "numa_test_util.h"
#include "pinstage/pages.h"
#include "pinstage/worker.h"

namespace pinstage {
namespace {

TEST(NumaPlacement, AWorkerOnNodeZeroHasItsPagesBoundToAndOnNodeZero) {
  if (numa_node_cpus(0).empty()) GTEST_SKIP() << "no NUMA node 0 on this host";
  WorkerOptions options;
  options.host_numa_node = 0;
  options.host_cache_limit_bytes = 0;  // a segment per request
  Worker worker;
  worker.init("sim", 0, options);
  ASSERT_EQ(worker.host_numa_node(), 0);
  for (const size_t bytes : {size_t{4096}, size_t{3} << 20, size_t{17} << 20}) {
    SCOPED_TRACE(bytes);
    PinnedHostBuffer buffer = worker.alloc_pinned_host(bytes);
    const char* data = static_cast<const char*>(buffer.data());
    for (const char* at : {data, data + bytes / 2, data + bytes - 1})
      EXPECT_EQ(test::numa_policy_of(at), (test::NumaPolicy{test::kMpolBind, 1ul}));
    const std::vector<int> nodes = test::page_nodes(data, bytes);  // pre-faulted: resident
    ASSERT_EQ(nodes.size(), (bytes + page_size() - 1) / page_size()) << "move_pages failed";
    EXPECT_EQ(std::count(nodes.begin(), nodes.end(), 0), static_cast<long>(nodes.size()));
  }
  // A worker not placed keeps the default policy: the check above can fail.
  Worker plain;
  plain.init("sim");
  PinnedHostBuffer buffer = plain.alloc_pinned_host(1 << 20);
  EXPECT_EQ(test::numa_policy_of(buffer.data()).mode, test::kMpolDefault);
}

// A 2-node host: node 0 = CPU 0, node 1 = CPU 1. bind() records instead of calling mbind
// (the kernel has no node 1 here); faulted() records the CPU each pre-fault chunk ran on.
class TwoNodes final : public NumaSystem {
 public:
  struct Bind {
    uintptr_t begin, end;
    int node;
  };
  struct Fault {
    uintptr_t begin, end;
    int cpu;       // where it ran
    int only_cpu;  // the one CPU its affinity mask allowed, or -1 for any other mask
  };
  std::vector<int> node_cpus(int node) const override {
    if (node == 0 || node == 1) return {node};
    return {};
  }
  void bind(void* data, size_t bytes, int node) override {
    std::lock_guard lock(mu);
    const auto at = reinterpret_cast<uintptr_t>(data);
    binds.push_back({at, at + bytes, node});
  }
  void faulted(const void* begin, size_t bytes) override {
    std::lock_guard lock(mu);
    const auto at = reinterpret_cast<uintptr_t>(begin);
    cpu_set_t mask;
    CPU_ZERO(&mask);
    int only = -1;
    if (sched_getaffinity(0, sizeof mask, &mask) == 0 && CPU_COUNT(&mask) == 1)
      for (int c = 0; c < CPU_SETSIZE && only < 0; ++c)
        if (CPU_ISSET(c, &mask)) only = c;
    faults.push_back({at, at + bytes, sched_getcpu(), only});
  }
  std::mutex mu;
  std::vector<Bind> binds;
  std::vector<Fault> faults;
};

// Installs a NumaSystem for one test and restores the previous one.
class Installed {
 public:
  explicit Installed(NumaSystem* system) : previous_(set_numa_system(system)) {}
  ~Installed() { set_numa_system(previous_); }
  Installed(const Installed&) = delete;
  Installed& operator=(const Installed&) = delete;

 private:
  NumaSystem* previous_;
};

bool may_run_on(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 && CPU_ISSET(cpu, &set);
}

// The sim's options for two devices, device 0 on node 0 and device 1 on node 1.
WorkerOptions two_node_sim() {
  WorkerOptions options;
  options.config = {{"devices", "2"}, {"numa_nodes", "0,1"}};
  return options;
}

TEST(NumaPlacement, ThroughTheSeamAWorkerOfNodeOneBindsAndFaultsEverySegmentThere) {
  if (!may_run_on(0) || !may_run_on(1)) GTEST_SKIP() << "needs CPUs 0 and 1";
  TwoNodes host;
  const Installed installed(&host);
  WorkerOptions options = two_node_sim();
  options.host_cache_limit_bytes = 0;  // a segment per request
  const DeviceInfo device = list_devices("sim", options)[1];
  ASSERT_EQ(device.numa_node, 1);
  options.host_numa_node = device.numa_node;  // as a group builds a worker per device
  Worker worker;
  worker.init("sim", device.id, options);
  ASSERT_EQ(worker.host_numa_node(), 1);
  std::vector<PinnedHostBuffer> buffers;
  for (const size_t bytes : {size_t{5000}, size_t{1} << 20, size_t{70} << 20})  // 70M: 2 threads
    buffers.push_back(worker.alloc_pinned_host(bytes));

  const HostMemoryStats stats = worker.host_memory_stats();
  ASSERT_EQ(host.binds.size(), stats.segments);  // one bind per segment, nothing else
  uint64_t bound = 0;
  for (const auto& b : host.binds) {
    EXPECT_EQ(b.node, 1);
    bound += b.end - b.begin;
    uint64_t faulted = 0;  // the chunks pre-faulted inside this segment, all on CPU 1
    for (const auto& f : host.faults)
      if (f.begin >= b.begin && f.end <= b.end) {
        EXPECT_EQ(f.cpu, 1);
        EXPECT_EQ(f.only_cpu, 1) << "the pre-fault thread was not held to node 1's CPUs";
        faulted += f.end - f.begin;
      }
    EXPECT_EQ(faulted, b.end - b.begin);
  }
  EXPECT_EQ(bound, stats.reserved_bytes);
  for (const auto& buffer : buffers) {  // every buffer lies inside one bound segment
    const auto at = reinterpret_cast<uintptr_t>(buffer.data());
    EXPECT_EQ(
        std::count_if(host.binds.begin(), host.binds.end(),
                      [&](const auto& b) { return at >= b.begin && at + buffer.size() <= b.end; }),
        1);
  }
  const auto big = reinterpret_cast<uintptr_t>(buffers.back().data());
  EXPECT_GE(std::count_if(
                host.faults.begin(), host.faults.end(),
                [&](const auto& f) { return f.begin >= big && f.end <= big + (size_t{70} << 20); }),
            2)
      << "the 70 MiB segment is pre-faulted in one chunk per thread, two or more";
}

// The same host, the other device: its worker's memory goes to node 0, faulted on CPU 0;
// an unplaced worker binds nothing.
TEST(NumaPlacement, ThroughTheSeamEachWorkerGoesToItsOwnNode) {
  if (!may_run_on(0) || !may_run_on(1)) GTEST_SKIP() << "needs CPUs 0 and 1";
  TwoNodes host;
  const Installed installed(&host);
  WorkerOptions options = two_node_sim();
  Worker unplaced;
  unplaced.init("sim", 0, options);
  PinnedHostBuffer a = unplaced.alloc_pinned_host(1 << 20);
  EXPECT_TRUE(host.binds.empty());
  EXPECT_TRUE(host.faults.empty());
  options.host_numa_node = 0;
  Worker zero;
  zero.init("sim", 0, options);
  PinnedHostBuffer b = zero.alloc_pinned_host(1 << 20);
  ASSERT_EQ(host.binds.size(), 1u);
  EXPECT_EQ(host.binds[0].node, 0);
  ASSERT_FALSE(host.faults.empty());
  for (const auto& f : host.faults) {
    EXPECT_EQ(f.cpu, 0);
    EXPECT_EQ(f.only_cpu, 0);
  }
}

}  // namespace
}  // namespace pinstage
