// The node level (issue 24): a WorkerGroup over sim devices=N. Device lists and the thread
// split are strict; every member runs at once on a thread team of its own (seen by the
// threads each team's parallel_for used, and by members that meet inside run_each); a group
// bind's bytes arrive on each device (sim's own copy counters and an execute step per
// device); a member that fails leaves every device and its memory clean and is named; a
// fault sweep over a group bind; a tensor-parallel load onto the devices is byte-exact
// against the host load and reads the checkpoint once. Labelled concurrency: TSan runs it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "extension_test_util.h"
#include "pinstage/backend/sim_ext.h"
#include "pinstage/bind.h"
#include "pinstage/checkpoint.h"
#include "pinstage/load_plan.h"
#include "pinstage/pages.h"
#include "pinstage/parallel.h"
#include "pinstage/worker_group.h"
#include "temp_dir_test_util.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

using test::error_of;
namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

WorkerGroupOptions sim_node(int devices, const std::string& numa = "", int threads = 4) {
  WorkerGroupOptions o;
  o.worker.config = {{"devices", std::to_string(devices)}};
  if (!numa.empty()) o.worker.config.emplace_back("numa_nodes", numa);
  o.worker.device_capacity_bytes = 64 << 20;
  o.threads = threads;
  return o;
}

uint64_t sim_h2d(const Worker& w) {
  const ps_sim_stats s = test::sim_stats(w);
  return s.h2d_direct_bytes + s.h2d_bounced_bytes;
}

// Every member waits here until all `n` have come, or gives up after a minute (a failure,
// not a hang): members that meet ran at the same time.
class Meeting {
 public:
  explicit Meeting(size_t n) : n_(n) {}
  bool arrive() {
    std::unique_lock lock(mu_);
    if (++here_ == n_) cv_.notify_all();
    return cv_.wait_for(lock, std::chrono::minutes(1), [&] { return here_ >= n_; });
  }

 private:
  size_t n_, here_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
};

TEST(DeviceList, AllAndIdsAndEveryRefusal) {
  WorkerOptions o;
  o.config = {{"devices", "4"}};
  const auto devices = list_devices("sim", o);
  EXPECT_EQ(parse_device_list("all", devices), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(parse_device_list("3,1", devices), (std::vector<int>{3, 1}));
  auto message = [&](const char* text) {
    return std::string(error_of([&] { parse_device_list(text, devices); }).what());
  };
  EXPECT_TRUE(contains(message(""), "empty")) << message("");
  EXPECT_TRUE(contains(message("0,,1"), "''")) << message("0,,1");
  EXPECT_TRUE(contains(message("0,x"), "'x'")) << message("0,x");
  EXPECT_TRUE(contains(message("1,1"), "device 1 is given twice")) << message("1,1");
  EXPECT_TRUE(contains(message("4"), "device 4 does not exist: the backend has 4 devices"))
      << message("4");
  EXPECT_TRUE(contains(message("-1"), "'-1'")) << message("-1");
  EXPECT_EQ(error_of([&] { parse_device_list("0x1", devices); }).code(),
            ErrorCode::invalid_argument);
  // A device that is present but not usable is refused by name.
  std::vector<DeviceInfo> one_down = devices;
  one_down[2].usable = false;
  one_down[2].reason = "held by another process";
  EXPECT_EQ(parse_device_list("all", one_down), (std::vector<int>{0, 1, 3}));
  const std::string down = error_of([&] { parse_device_list("2", one_down); }).what();
  EXPECT_TRUE(contains(down, "device 2 (sim device 2) is not usable: held by another process"))
      << down;
}

TEST(DeviceList, ThreadsAreSplitWithTheRemainderFirstAndOneAtLeast) {
  EXPECT_EQ(split_threads(7, 3), (std::vector<int>{3, 2, 2}));
  EXPECT_EQ(split_threads(8, 4), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(split_threads(1, 3), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(split_threads(0, 1), (std::vector<int>{process_thread_count()}));
  EXPECT_TRUE(split_threads(5, 0).empty());
}

TEST(ThreadTeam, SizesAreCheckedAndATeamOfOneRunsInline) {
  EXPECT_EQ(error_of([] { ThreadTeam t(0); }).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(error_of([] { ThreadTeam t(1025); }).code(), ErrorCode::invalid_argument);
  ThreadTeam one(1);
  std::set<std::thread::id> used;
  one.run([&] {
    parallel_for(16, 1, [&](size_t, size_t) { used.insert(std::this_thread::get_id()); });
  });
  EXPECT_EQ(used, std::set<std::thread::id>{std::this_thread::get_id()});
}

TEST(WorkerGroup, EachDeviceGetsItsWorkerItsNodeAndItsShareOfTheThreads) {
  WorkerGroup group("sim", {}, sim_node(4, "0,0,1,1", 7));
  EXPECT_EQ(group.level(), WorkerLevel::node);
  ASSERT_EQ(group.size(), 4u);
  EXPECT_EQ(group.device_ids(), (std::vector<int>{0, 1, 2, 3}));
  int threads = 0;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(group.worker(i).device_id(), static_cast<int>(i));
    EXPECT_EQ(group.worker(i).device_info().numa_node, i < 2 ? 0 : 1);
    threads += group.team_threads(i);
  }
  EXPECT_EQ(threads, 7);
  EXPECT_EQ(group.team_threads(0), 2);
  EXPECT_EQ(group.team_threads(3), 1);
  // Node 0 exists on every host: its workers place their memory there. Node 1 only where
  // the host has it (else the worker places nothing, and says so once).
  EXPECT_EQ(group.worker(0).host_numa_node(), 0);
  EXPECT_EQ(group.worker(2).host_numa_node(), numa_node_cpus(1).empty() ? -1 : 1);
  EXPECT_EQ(error_of([&] { group.worker(4); }).code(), ErrorCode::invalid_argument);
  group.finalize();
  EXPECT_TRUE(group.worker(1).finalized());
}

TEST(WorkerGroup, AGivenListKeepsItsOrderAndBadListsBuildNothing) {
  WorkerGroup group("sim", {2, 0}, sim_node(3));
  EXPECT_EQ(group.device_ids(), (std::vector<int>{2, 0}));
  EXPECT_EQ(group.device_id(0), 2);
  const Error twice = error_of([] { WorkerGroup g("sim", {1, 1}, sim_node(3)); });
  EXPECT_TRUE(contains(twice.what(), "device 1 is given twice")) << twice.what();
  // The third device fails to start: the two made before it are finalized, and the
  // error names it.
  const Error missing = error_of([] { WorkerGroup g("sim", {0, 1, 5}, sim_node(3)); });
  EXPECT_TRUE(contains(missing.what(), "device 5: device 5 does not exist")) << missing.what();
}

TEST(WorkerGroup, MembersRunAtOnceEachInsideItsOwnTeam) {
  WorkerGroup group("sim", {}, sim_node(3, "", 6));
  Meeting meeting(3);
  std::mutex mu;
  std::vector<std::set<std::thread::id>> used(3);
  std::vector<int> defaults(3);
  std::vector<int> met(3);  // not vector<bool>: its bits share words across threads
  group.run_each([&](size_t i, Worker& w) {
    EXPECT_EQ(w.device_id(), static_cast<int>(i));
    met[i] = meeting.arrive();  // all three are inside run_each at the same time
    defaults[i] = default_thread_count();
    parallel_for(64, 1, [&](size_t, size_t) {
      std::lock_guard lock(mu);
      used[i].insert(std::this_thread::get_id());
    });
  });
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(met[i]) << "member " << i << " never met the others";
    EXPECT_EQ(defaults[i], 2);  // inside a team, its size is the default
    EXPECT_GE(group.team_jobs(i), 1u);
    EXPECT_LE(used[i].size(), 2u);
    for (size_t j = 0; j < i; ++j)
      for (const auto& id : used[i]) EXPECT_EQ(used[j].count(id), 0u) << i << " and " << j;
  }
  EXPECT_EQ(default_thread_count(), process_thread_count());  // outside again
}

TEST(WorkerGroup, AFailingMemberIsNamedAfterTheOthersFinished) {
  WorkerGroup group("sim", {}, sim_node(3));
  std::vector<int> finished(3);
  const Error e = error_of([&] {
    group.run_each([&](size_t i, Worker&) {
      if (i >= 1) throw Error(ErrorCode::io, "member " + std::to_string(i) + " broke");
      finished[i] = 1;
    });
  });
  EXPECT_EQ(e.code(), ErrorCode::io);
  EXPECT_STREQ(e.what(), "device 1: member 1 broke");  // the first in group order
  EXPECT_EQ(finished[0], 1);
  try {
    group.run_each([](size_t i, Worker&) {
      if (i == 2) throw std::runtime_error("not an Error");
    });
    FAIL() << "no throw";
  } catch (const GroupError& g) {
    EXPECT_EQ(g.index(), 2u);
    EXPECT_EQ(g.device(), 2);
    EXPECT_EQ(g.code(), ErrorCode::internal);
  }
}

// ---- group bind ----

constexpr const char* kPlusDevice = "group_test.plus_device";

// y[i] = x[i] + 1 on every device: each device's result depends on its own input.
void plus_one(std::span<const ExecArg> args) {
  auto* x = static_cast<const unsigned char*>(args[0].device_ptr);
  auto* y = static_cast<unsigned char*>(args[1].device_ptr);
  for (uint64_t i = 0; i < args[1].bytes; ++i) y[i] = static_cast<unsigned char>(x[i] + 1);
}

const bool registered = [] {
  register_host_callable(kPlusDevice, plus_one);
  return true;
}();

std::vector<TaskArgs> args_per_device(WorkerGroup& group, size_t bytes) {
  std::vector<TaskArgs> all;
  for (size_t d = 0; d < group.size(); ++d) {
    PinnedAllocator pinned(group.worker(d));
    TaskArgs args;
    args.add(Tensor::empty("x", DType::u8, {static_cast<int64_t>(bytes)}, Direction::in, pinned));
    args.add(Tensor::empty("y", DType::u8, {static_cast<int64_t>(bytes)}, Direction::out, pinned));
    auto* x = static_cast<unsigned char*>(args.at(0).data());
    for (size_t i = 0; i < bytes; ++i) x[i] = static_cast<unsigned char>(i * 7 + d * 31);
    std::memset(args.at(1).data(), 0, bytes);
    all.push_back(std::move(args));
  }
  return all;
}

BindOptions plus_options() {
  BindOptions o;
  o.execute_callable = kPlusDevice;
  o.chunk_bytes = 64 << 10;
  return o;
}

void expect_clean(WorkerGroup& group) {
  for (size_t d = 0; d < group.size(); ++d) {
    EXPECT_EQ(group.worker(d).stats().device_count, 0u) << "device " << d;
    EXPECT_EQ(group.worker(d).stats().device_bytes, 0u) << "device " << d;
  }
}

TEST(GroupBind, EveryDeviceGetsItsOwnBytesAndTheReportAddsThemUp) {
  WorkerGroup group("sim", {}, sim_node(2, "0,1"));
  constexpr size_t kBytes = 1 << 20;
  const std::vector<TaskArgs> args = args_per_device(group, kBytes);
  std::vector<uint64_t> before;
  for (size_t d = 0; d < 2; ++d) before.push_back(sim_h2d(group.worker(d)));
  GroupBinder binder(group, plus_options());
  const GroupBindReport r = binder.run(args);
  ASSERT_EQ(r.reports.size(), 2u);
  EXPECT_EQ(r.devices, (std::vector<int>{0, 1}));
  for (size_t d = 0; d < 2; ++d) {
    // sim's own counter: exactly this device's input went to this device.
    EXPECT_EQ(sim_h2d(group.worker(d)) - before[d], kBytes) << "device " << d;
    const auto* x = static_cast<const unsigned char*>(args[d].at(0).data());
    const auto* y = static_cast<const unsigned char*>(args[d].at(1).data());
    size_t wrong = 0;
    for (size_t i = 0; i < kBytes; ++i) wrong += y[i] != static_cast<unsigned char>(x[i] + 1);
    EXPECT_EQ(wrong, 0u) << "device " << d;
    EXPECT_TRUE(r.reports[d].executed);
    EXPECT_EQ(r.reports[d].uploaded_bytes, kBytes);
  }
  EXPECT_EQ(r.uploaded_bytes, 2 * kBytes);
  EXPECT_EQ(r.downloaded_bytes, 2 * kBytes);
  EXPECT_EQ(r.longest_upload_s,
            std::max(r.reports[0].phase(BindPhase::upload), r.reports[1].phase(BindPhase::upload)));
  EXPECT_TRUE(contains(r.to_string(), "2 devices")) << r.to_string();
  EXPECT_TRUE(contains(r.to_string(), "device 1: 1 of 2 tensors uploaded")) << r.to_string();
  expect_clean(group);
  EXPECT_EQ(error_of([&] { binder.run({}); }).code(), ErrorCode::invalid_argument);
}

TEST(GroupBind, ADeviceFailingMidBindLeavesEveryDeviceCleanAndIsNamed) {
  WorkerGroup group("sim", {}, sim_node(3));
  const std::vector<TaskArgs> args = args_per_device(group, 256 << 10);
  GroupBinder binder(group, plus_options());
  group.worker(1).inject_fault(FaultKind::copy_h2d, 2);  // its second upload chunk
  try {
    binder.run(args);
    FAIL() << "no throw";
  } catch (const GroupError& e) {
    EXPECT_EQ(e.device(), 1);
    EXPECT_TRUE(contains(e.what(), "device 1: ")) << e.what();
    EXPECT_TRUE(contains(e.what(), "'x'")) << e.what();  // the BindError's tensor
  }
  expect_clean(group);
  // The others finished theirs: their results are there.
  const auto* y0 = static_cast<const unsigned char*>(args[0].at(1).data());
  const auto* x0 = static_cast<const unsigned char*>(args[0].at(0).data());
  EXPECT_EQ(y0[100], static_cast<unsigned char>(x0[100] + 1));
  group.worker(1).inject_fault(FaultKind::copy_h2d, 0);
  EXPECT_EQ(binder.run(args).uploaded_bytes, 3u * (256 << 10));  // the binders are reusable
  expect_clean(group);
}

// Every backend call of member 1's bind fails in turn, for each kind: the run names
// device 1 or succeeds (a refused free is counted, not raised), and no device keeps memory.
TEST(GroupBind, FaultSweepOverAGroupBind) {
  const FaultKind kinds[] = {FaultKind::device_malloc, FaultKind::copy_h2d, FaultKind::copy_d2h,
                             FaultKind::execute, FaultKind::device_free};
  for (const FaultKind kind : kinds) {
    uint64_t reached = 0;
    for (uint64_t nth = 1; nth <= 64; ++nth) {
      SCOPED_TRACE(std::string(fault_kind_name(kind)) + " #" + std::to_string(nth));
      WorkerGroup group("sim", {}, sim_node(2));
      const std::vector<TaskArgs> args = args_per_device(group, 200 << 10);
      BindOptions o = plus_options();
      o.layout = DeviceLayout::per_tensor;
      GroupBinder binder(group, o);
      group.worker(1).inject_fault(kind, nth);
      std::string failure;
      try {
        binder.run(args);
      } catch (const GroupError& e) {
        failure = e.what();
        EXPECT_EQ(e.device(), 1);
      }
      expect_clean(group);
      const WorkerStats s0 = group.worker(0).stats();
      EXPECT_EQ(s0.free_failures, 0u);
      const bool hit = !failure.empty() || group.worker(1).stats().free_failures > 0;
      if (!hit) break;  // past the last call of this kind
      ++reached;
      group.worker(1).inject_fault(kind, 0);
      EXPECT_EQ(binder.run(args).uploaded_bytes, 2u * (200 << 10));
    }
    EXPECT_GE(reached, 1u) << fault_kind_name(kind) << " was never reached";
  }
}

// ---- tensor-parallel load onto the devices ----

class TpDevices : public test::TempDirTest {
 protected:
  TpDevices() : TempDirTest("tpdev") {}
  void SetUp() override {
    TempDirTest::SetUp();
    PageableAllocator pageable;
    TaskArgs args;
    const std::vector<std::pair<std::string, std::vector<int64_t>>> specs = {
        {"layers.0.q_proj.weight", {24, 10}},  // rows
        {"layers.0.o_proj.weight", {9, 13}},   // columns, uneven
        {"layers.0.norm.weight", {10}},        // replicated
        {"layers.0.up_proj.weight", {9, 5}}};  // rows, uneven
    for (size_t k = 0; k < specs.size(); ++k) {
      args.add(Tensor::empty(specs[k].first, DType::f32, specs[k].second, Direction::in, pageable));
      auto* p = static_cast<unsigned char*>(args.at(k).data());
      for (size_t i = 0; i < args.at(k).nbytes(); ++i)
        p[i] = static_cast<unsigned char>(i * 131 + k * 17 + (i >> 8));
    }
    path_ = (dir_ / "model").string();
    ASSERT_GE(save_sharded_checkpoint(args, path_, 600), 2u);
  }
  static TpPlan plan() {
    TpPlan p;
    p.split("*.q_proj.weight", 0).split("*.o_proj.weight", 1).split("*.up_proj.weight", 0);
    return p;
  }
  std::string path_;
};

TEST_F(TpDevices, EachDeviceHoldsExactlyItsSliceAndTheFilesAreReadOnce) {
  const Checkpoint c = Checkpoint::open(path_);
  for (const int tp : {1, 2, 4, 8}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    WorkerGroup group("sim", {}, sim_node(tp, "", 4));
    PageableAllocator pageable;
    const TpHostLoad reference = load_tp_to_host(c, plan(), tp, pageable);
    TpDeviceLoad load = load_tp_to_devices(c, plan(), group);
    EXPECT_EQ(load.host.read_bytes, c.total_bytes());  // every byte once, for the node
    ASSERT_EQ(load.ranks.size(), static_cast<size_t>(tp));
    for (int r = 0; r < tp; ++r) {
      Worker& w = group.worker(static_cast<size_t>(r));
      uint64_t bytes = 0;
      for (size_t t = 0; t < load.ranks[r].size(); ++t) {
        const DeviceTensor& d = load.ranks[r][t];
        const TpTensor& want = reference.ranks[r][t];
        EXPECT_EQ(d.info.shape, want.shape);
        ASSERT_EQ(d.buffer.size(), want.bytes);
        std::vector<unsigned char> got(want.bytes);
        if (want.bytes > 0) w.copy_to_host(got.data(), d.buffer, 0, want.bytes);
        EXPECT_EQ(std::memcmp(got.data(), want.storage->data(), want.bytes), 0)
            << d.info.name << " on rank " << r;
        bytes += want.bytes;
      }
      EXPECT_EQ(load.uploads[r].bytes, bytes);
      EXPECT_EQ(w.stats().device_bytes, bytes);  // nothing but its share
      EXPECT_EQ(w.stats().pinned_count, 0u);     // the host copies went back to the pool
    }
  }
}

TEST_F(TpDevices, AFailedUploadReleasesEveryDeviceAndNamesTheDevice) {
  const Checkpoint c = Checkpoint::open(path_);
  WorkerGroup group("sim", {}, sim_node(2));
  // A plan the checkpoint cannot take is refused before any memory.
  TpPlan bad;
  bad.split("layers.0.norm.weight", 1);
  const Error refused = error_of([&] { load_tp_to_devices(c, bad, group); });
  EXPECT_EQ(refused.code(), ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(refused.what(), "layers.0.norm.weight")) << refused.what();
  EXPECT_EQ(group.worker(0).host_memory_stats().segments, 0u);
  group.worker(1).inject_fault(FaultKind::device_malloc, 3);
  const Error e = error_of([&] { load_tp_to_devices(c, plan(), group); });
  EXPECT_NE(e.code(), ErrorCode::invalid_argument);
  EXPECT_TRUE(contains(e.what(), "device 1: ")) << e.what();
  for (size_t d = 0; d < 2; ++d) {
    EXPECT_EQ(group.worker(d).stats().device_count, 0u);
    EXPECT_EQ(group.worker(d).stats().pinned_count, 0u);
  }
  group.worker(1).inject_fault(FaultKind::device_malloc, 0);
  EXPECT_EQ(load_tp_to_devices(c, plan(), group).uploaded_bytes, c.total_bytes() + 40);
}

}  // namespace
}  // namespace pinstage
