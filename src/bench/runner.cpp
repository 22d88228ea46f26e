// The A/B runner: groups x arms x rounds of binds of any task's arguments, with the
// plain memcpy baseline measured next to every arm.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pinstage/ab_bench.h"
#include "pinstage/clock.h"
#include "pinstage/parallel.h"

namespace pinstage::ab {

namespace {

// The baseline: a plain all-cores memcpy of every uploaded tensor into destination
// memory of the kind the bind writes to (device memory where it is host memory, else a
// pageable host buffer), laid out like the bind's arena. The destination is taken once
// for an arm's rounds, untimed, as the bind's upload phase excludes its device_alloc.
class Baseline {
 public:
  Baseline(Worker& worker, const TaskArgs& args, bool device_is_host) : args_(args) {
    const size_t align = BindOptions{}.arena_alignment;  // the bind's arena layout
    offsets_.assign(args.size(), 0);
    size_t size = 0;
    for (size_t i = 0; i < args.size(); ++i) {
      const Tensor& t = args.at(i);
      if (t.direction() == Direction::out || t.nbytes() == 0) continue;
      size = (size + align - 1) & ~(align - 1);
      offsets_[i] = size;
      size += t.nbytes();
    }
    if (size == 0) return;
    if (device_is_host)
      device_ = worker.alloc_device(size);
    else
      host_ = PageableAllocator().allocate(size);
    dst_ = static_cast<unsigned char*>(device_ ? device_.data() : host_->data());
  }

  // One timed round on `threads` threads (0 = all cores).
  double round(int threads = 0) {
    const Stopwatch clock;
    for (size_t i = 0; i < args_.size(); ++i) {
      const Tensor& t = args_.at(i);
      if (t.direction() == Direction::out || t.nbytes() == 0) continue;
      parallel_memcpy(dst_ + offsets_[i], t.data(), t.nbytes(), threads);
    }
    return clock.seconds();
  }

 private:
  const TaskArgs& args_;
  std::vector<size_t> offsets_;
  DeviceBuffer device_;
  std::shared_ptr<Storage> host_;
  unsigned char* dst_ = nullptr;
};

// Counts the steps and reports each to the caller's progress function.
class Steps {
 public:
  Steps(const BenchConfig& config, const ProgressFn& fn) : fn_(fn) {
    const size_t rounds = static_cast<size_t>(config.rounds);
    prog_.total = static_cast<size_t>(config.groups) * config.arms.size() *
                  (1 + rounds + (config.baseline ? rounds + 1 : 0));
  }
  void done(int group, Arm arm, std::string step) {
    ++prog_.done;
    prog_.group = group;
    prog_.arm = arm;
    prog_.step = std::move(step);
    if (fn_) fn_(prog_);
  }

 private:
  const ProgressFn& fn_;
  Progress prog_;
};

// One untimed bind that reads every input back and compares it with its host bytes, so
// that an upload delivering wrong bytes fails the bench instead of timing well.
void verify_arm(Worker& worker, BindOptions options, const TaskArgs& args, Arm arm, int g) {
  options.verify_upload = true;
  Binder binder(worker, options);
  try {
    binder.run(args);
  } catch (const BindError& e) {
    if (e.code() != ErrorCode::mismatch) throw;
    throw Error(ErrorCode::mismatch, std::string("the bench's upload check failed for arm ") +
                                         arm_name(arm) + " in group " + std::to_string(g + 1) +
                                         ": " + e.what());
  }
}

std::string step_name(const char* what, size_t r, size_t rounds) {
  return std::string(what) + " " + std::to_string(r + 1) + "/" + std::to_string(rounds);
}

// One arm's turn in group g: build its args, bind them config.rounds times, then the
// memcpy baseline; the args are freed on return, before the next arm starts.
ArmRun run_arm(Worker& worker, const BenchConfig& config, const ArgsFactory& make_args, Arm arm,
               int g, bool device_is_host, BenchResult& result, bool& have_sizes, Steps& steps) {
  ArmRun run;
  run.arm = arm;
  std::optional<PinnedAllocator> pinned;
  PageableAllocator pageable;
  HostAllocator* allocator = &pageable;
  if (arm == Arm::pinned) allocator = &pinned.emplace(worker);
  const Stopwatch gen;
  const TaskArgs args = make_args(*allocator);
  run.generate_seconds = gen.seconds();
  const TaskSizes sizes = task_sizes(args);
  if (!have_sizes) {
    result.sizes = sizes;
    have_sizes = true;
  } else if (sizes.total_bytes != result.sizes.total_bytes ||
             sizes.input_bytes != result.sizes.input_bytes ||
             sizes.tensors != result.sizes.tensors) {
    throw Error(ErrorCode::invalid_argument,
                std::string("run_ab: the argument factory built different tensors for arm ") +
                    arm_name(arm) + "; every arm must bind the same task");
  }
  steps.done(g, arm, "generate");

  BindOptions options = config.bind;
  options.upload = arm == Arm::staged ? UploadPath::staged : UploadPath::direct;
  Binder binder(worker, options);
  const size_t rounds = static_cast<size_t>(config.rounds);
  for (size_t r = 0; r < rounds; ++r) {
    BindReport rep = binder.run(args);
    run.binds.push_back({rep.total_seconds, rep.phase_seconds, r == 0});
    if (r + 1 == rounds) {
      run.bind_summary = rep.summary();
      run.tensors = std::move(rep.tensors);
    }
    steps.done(g, arm, step_name("bind", r, rounds));
  }
  verify_arm(worker, options, args, arm, g);
  run.verified = true;
  // After the binds, so its destination never coexists with the bind's arena.
  if (config.baseline) {
    Baseline baseline(worker, args, device_is_host);
    for (size_t r = 0; r < rounds; ++r) {
      run.memcpy_seconds.push_back(baseline.round());
      steps.done(g, arm, step_name("memcpy", r, rounds));
    }
    // One round on one thread: the rate of the driver's one-thread staging pass, for the
    // copy-engine model's prediction.
    run.memcpy_one_core_seconds.push_back(baseline.round(1));
    steps.done(g, arm, "memcpy one core");
  }
  return run;
}

}  // namespace

Timings BenchResult::timings() const {
  Timings t;
  for (Arm arm : config.arms) t.arms.emplace_back(arm_name(arm));
  t.reference = 0;
  for (size_t a = 0; a < config.arms.size(); ++a)
    if (config.arms[a] == Arm::pageable) t.reference = a;
  t.input_bytes = sizes.input_bytes;
  t.keep_cold = config.keep_cold;
  for (const auto& group : groups) {
    auto& lat = t.latency.emplace_back();
    auto& up = t.upload.emplace_back();
    auto& al = t.alloc.emplace_back();
    auto& base = t.baseline.emplace_back();
    auto& one = t.baseline_one_core.emplace_back();
    for (const ArmRun& run : group) {
      auto& l = lat.emplace_back();
      auto& u = up.emplace_back();
      auto& d = al.emplace_back();
      for (const RoundRecord& rec : run.binds) {
        l.push_back(rec.seconds);
        u.push_back(rec.phase_seconds[static_cast<size_t>(BindPhase::upload)]);
        d.push_back(rec.phase_seconds[static_cast<size_t>(BindPhase::device_alloc)]);
      }
      base.push_back(run.memcpy_seconds);
      one.push_back(run.memcpy_one_core_seconds);
    }
  }
  if (!config.baseline) {
    t.baseline.clear();
    t.baseline_one_core.clear();
  }
  t.model = model;
  return t;
}

BenchResult run_ab(Worker& worker, const BenchConfig& config, const ArgsFactory& make_args,
                   const ProgressFn& progress, const GroupDoneFn& group_done, BenchResult seed) {
  validate(config);
  require_chip_worker(worker, "run_ab");
  if (!make_args) throw Error(ErrorCode::invalid_argument, "run_ab: no argument factory given");

  BenchResult result = std::move(seed);
  result.groups.clear();
  result.config = config;
  result.backend = worker.backend().name;
  result.threads = default_thread_count();
  // sim's DMA is a host memcpy, so its model predicts the upload ratios (Timings::model).
  result.model.reset();
  if (const auto params = backend_model(worker); !params.empty()) {
    CopyModel& m = result.model.emplace();
    m.cores = usable_cpu_count();
    for (const auto& [key, value] : params) {
      if (key == "dma_threads") m.dma_threads = static_cast<int>(value);
      if (key == "link_gbps") m.link_gbps = static_cast<double>(value);
    }
  }
  const bool device_is_host = worker.capabilities().device_memory_is_host;
  result.baseline_kind =
      device_is_host ? "device memory, which is host memory on " + result.backend
                     : std::string("a pageable host buffer (a host-to-host reference; ") +
                           "device memory is not host-addressable on " + result.backend + ")";
  Steps steps(config, progress);
  bool have_sizes = false;
  for (int g = 0; g < config.groups; ++g) {
    auto& group = result.groups.emplace_back();
    for (Arm arm : config.arms)
      group.push_back(
          run_arm(worker, config, make_args, arm, g, device_is_host, result, have_sizes, steps));
    result.stats = compute_stats(result.timings());
    if (group_done) group_done(result);
  }
  return result;
}

BenchResult run_bench(Worker& worker, const BenchConfig& config, const BenchTask& task,
                      const SizePlan& plan, const ProgressFn& progress,
                      const GroupDoneFn& group_done, BenchResult seed) {
  if (plan.size < 1)
    throw Error(ErrorCode::invalid_argument,
                "run_bench: the size plan has no size; make it with plan_size()");
  if (!task.make_args)
    throw Error(ErrorCode::invalid_argument, "run_bench: the task builds no arguments");
  const int64_t size = plan.size;
  // The task's facts go in before the first group, so partial results carry them too.
  seed.plan = plan;
  seed.task = task.name;
  seed.description = task.describe ? task.describe(size) : std::string();
  seed.size_name = task.size.name;
  seed.params = task.params;
  return run_ab(
      worker, config, [&](HostAllocator& allocator) { return task.make_args(allocator, size); },
      progress, group_done, std::move(seed));
}

}  // namespace pinstage::ab
