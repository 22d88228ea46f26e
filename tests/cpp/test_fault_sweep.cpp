// Issue 14's fault sweep on sim: for a bind and for a scene run, a failure is injected at
// every backend call index in turn (1..N) for every fault kind. Each run must end with a
// clear error naming the failed step, leave the worker's table empty (a refused free is
// counted as failed instead), put VmLck back to its baseline after finalize, and the next
// run on the same worker must succeed. A tiny scene keeps the whole sweep to seconds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "lock_test_util.h"
#include "pinstage/bind.h"
#include "pinstage/scene.h"
#include "pinstage/worker.h"

namespace pinstage {
namespace {

constexpr const char* kCallable = "fault_sweep.double";
constexpr uint64_t kMaxCalls = 400;  // far above any N here: the sweep must end before

// y = 2 * x (bytewise), acc += 1: a scene small enough to run hundreds of times.
void run_double(std::span<const ExecArg> args) {
  auto* x = static_cast<const unsigned char*>(args[0].device_ptr);
  auto* y = static_cast<unsigned char*>(args[1].device_ptr);
  auto* acc = static_cast<unsigned char*>(args[2].device_ptr);
  for (uint64_t i = 0; i < args[1].bytes; ++i) y[i] = static_cast<unsigned char>(x[i] * 2);
  for (uint64_t i = 0; i < args[2].bytes; ++i) acc[i] = static_cast<unsigned char>(acc[i] + 1);
}

unsigned char x_byte(size_t i) { return static_cast<unsigned char>(i * 13 + 7); }
unsigned char acc_byte(size_t i) { return static_cast<unsigned char>(i * 5 + 1); }

TaskArgs make_tiny(HostAllocator& alloc) {
  TaskArgs args;
  Tensor x = Tensor::empty("x", DType::i32, {2500}, Direction::in, alloc);  // 10,000 bytes
  Tensor y = Tensor::empty("y", DType::i32, {2500}, Direction::out, alloc);
  Tensor acc = Tensor::empty("acc", DType::i32, {700}, Direction::inout, alloc);
  for (size_t i = 0; i < x.nbytes(); ++i) static_cast<unsigned char*>(x.data())[i] = x_byte(i);
  std::memset(y.data(), 0, y.nbytes());
  for (size_t i = 0; i < acc.nbytes(); ++i)
    static_cast<unsigned char*>(acc.data())[i] = acc_byte(i);
  args.add(std::move(x));
  args.add(std::move(y));
  args.add(std::move(acc));
  return args;
}

struct TinyGolden : SceneGolden {};

class TinyScene final : public Scene {
 public:
  std::string name() const override { return "fault-sweep-tiny"; }
  std::string description() const override { return "y = 2x, acc += 1 (tests)"; }
  std::vector<SceneParam> params() const override { return {}; }
  void validate(const SceneValues&) const override {}
  std::vector<SceneTensor> tensors(const SceneValues&) const override { return {}; }
  TaskArgs make_args(HostAllocator& allocator, const SceneValues&, int) const override {
    return make_tiny(allocator);
  }
  std::unique_ptr<SceneGolden> compute_golden(const TaskArgs&, const SceneValues&) const override {
    return std::make_unique<TinyGolden>();
  }
  Comparison compare(const TaskArgs& result, const SceneGolden&) const override {
    Comparison c;
    const auto* y = static_cast<const unsigned char*>(result.at(1).data());
    const auto* acc = static_cast<const unsigned char*>(result.at(2).data());
    TensorComparison ty{.tensor = "y", .checked = result.at(1).nbytes()};
    for (size_t i = 0; i < result.at(1).nbytes(); ++i)
      ty.mismatches += y[i] != static_cast<unsigned char>(x_byte(i) * 2);
    TensorComparison ta{.tensor = "acc", .checked = result.at(2).nbytes()};
    for (size_t i = 0; i < result.at(2).nbytes(); ++i)
      ta.mismatches += acc[i] != static_cast<unsigned char>(acc_byte(i) + 1);
    c.add(ty);
    c.add(ta);
    return c;
  }
  std::string callable() const override { return kCallable; }
};

// What one run said: empty when it succeeded, else the error or the round's failure.
using Run = std::string (*)(Worker& worker);

BindOptions bind_options(UploadPath path) {
  BindOptions opt;
  opt.upload = path;
  opt.staging_buffers = 2;
  opt.staging_buffer_bytes = 4096;  // several ring turns per tensor: many copy calls
  opt.chunk_bytes = 4096;
  opt.verify_upload = true;  // a corrupted upload is caught here
  opt.execute_callable = kCallable;
  return opt;
}

template <UploadPath Path>
std::string run_bind(Worker& worker) {
  PinnedAllocator pinned(worker);
  try {
    const TaskArgs args = make_tiny(pinned);
    Binder binder(worker, bind_options(Path));
    binder.run(args);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

std::string run_tiny_scene(Worker& worker) {
  static const TinyScene scene;
  SceneRunOptions options;
  options.storage = HostStorage::pinned;
  options.bind = bind_options(UploadPath::staged);
  try {
    const SceneReport report = run_scene(worker, scene, options);
    if (!report.ok()) return report.rounds.empty() ? "no round ran" : report.rounds.back().failure;
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

// What the message of a failure injected into `kind` must name: the failed step.
const char* step_text(FaultKind kind) {
  static const std::pair<FaultKind, const char*> steps[] = {
      {FaultKind::device_malloc, "device malloc"},
      {FaultKind::host_alloc, "pinned host alloc"},
      {FaultKind::copy_h2d, "host-to-device"},
      {FaultKind::copy_d2h, "device-to-host"},
      {FaultKind::execute, "execute 'fault_sweep.double'"},
      {FaultKind::corrupt_h2d, "differs from the host bytes"}};
  for (const auto& [k, text] : steps)
    if (k == kind) return text;
  return nullptr;  // a refused free is not an error of the run (counted instead)
}

// A run, then the host memory pool's cache handed back: the pool's segments are the
// pinned host calls (host_alloc on a miss, host_free here), so the sweep reaches them. A
// refused release is counted by the worker, not a failure of the run.
std::string run_then_empty_cache(Run run, Worker& worker) {
  std::string failure = run(worker);
  try {
    worker.empty_cache();
  } catch (const Error&) {
  }
  return failure;
}

// One run with the nth call of `kind` failing; false once the run no longer reaches it.
bool run_once(Run run, FaultKind kind, uint64_t nth, const char* what) {
  SCOPED_TRACE(std::string(what) + ": " + fault_kind_name(kind) + " #" + std::to_string(nth));
  const uint64_t vmlck_before = test::vmlck_bytes();
  Worker worker;
  worker.init("sim");
  worker.inject_fault(kind, nth);
  const std::string failure = run_then_empty_cache(run, worker);
  const WorkerStats s = worker.stats();
  const char* step = step_text(kind);
  bool reached;
  if (step != nullptr) {
    reached = !failure.empty();
    // The operation, by the runtime's name for it or (an async copy failing at its
    // stream's synchronize) by the backend's name of the fault.
    if (reached) {
      EXPECT_TRUE(failure.find(step) != std::string::npos ||
                  failure.find(fault_kind_name(kind)) != std::string::npos)
          << failure;
    }
    EXPECT_EQ(s.failed_free_count, 0u);
  } else {
    EXPECT_EQ(failure, "");  // the release failed, not the run...
    reached = s.free_failures > 0;
    EXPECT_LE(s.failed_free_count, 1u);  // ...and the refused free is counted
    EXPECT_EQ(s.failed_free_count, s.free_failures);
  }
  // Nothing the run took is left handed out.
  EXPECT_EQ(s.pinned_count, 0u);
  EXPECT_EQ(s.device_count, 0u);
  EXPECT_EQ(s.pageable_fallback_count, 0u);
  worker.inject_fault(kind, 0);
  EXPECT_EQ(run(worker), "") << "the next run on the same worker must succeed";
  worker.finalize();
  EXPECT_EQ(worker.free_failures(), s.free_failures);  // finalize's retry succeeded
  EXPECT_EQ(test::vmlck_bytes(), vmlck_before);
  return reached;
}

void sweep(Run run, const char* what) {
  {
    Worker worker;
    worker.init("sim");
    const std::string failure = run(worker);
    ASSERT_EQ(failure, "") << what << " fails without a fault: nothing to sweep";
  }
  for (int k = 0; k < PS_FAULT_KIND_COUNT; ++k) {
    const auto kind = static_cast<FaultKind>(k);
    uint64_t nth = 1;
    while (nth <= kMaxCalls && run_once(run, kind, nth, what)) ++nth;
    EXPECT_LE(nth, kMaxCalls) << what << " " << fault_kind_name(kind) << " never stopped failing";
    // Every kind is reached at least once: the sweep really covers it.
    EXPECT_GT(nth, 1u) << what << ": no " << fault_kind_name(kind) << " call was reached";
    std::printf("[sweep] %s %s: N = %llu\n", what, fault_kind_name(kind),
                static_cast<unsigned long long>(nth - 1));
  }
}

class FaultSweep : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::vector<std::string> names = host_callable_names();
    if (std::find(names.begin(), names.end(), kCallable) == names.end())
      register_host_callable(kCallable, run_double);
  }
};

TEST_F(FaultSweep, EveryCallOfADirectBind) { sweep(&run_bind<UploadPath::direct>, "bind direct"); }
TEST_F(FaultSweep, EveryCallOfAStagedBind) { sweep(&run_bind<UploadPath::staged>, "bind staged"); }
TEST_F(FaultSweep, EveryCallOfASceneRun) { sweep(&run_tiny_scene, "scene run"); }

}  // namespace
}  // namespace pinstage
