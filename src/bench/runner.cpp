// The A/B runner: groups x arms x rounds of binds on the Qwen3 decode fixture, with the
// plain memcpy baseline measured next to every arm.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pinstage/ab_bench.h"
#include "pinstage/parallel.h"

namespace pinstage::ab {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

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
    if (device_is_host) {
      device_ = worker.alloc_device(size);
      dst_ = static_cast<unsigned char*>(device_.data());
    } else {
      host_ = PageableAllocator().allocate(size);
      dst_ = static_cast<unsigned char*>(host_->data());
    }
  }

  // One timed round.
  double round() {
    const auto start = Clock::now();
    for (size_t i = 0; i < args_.size(); ++i) {
      const Tensor& t = args_.at(i);
      if (t.direction() == Direction::out || t.nbytes() == 0) continue;
      parallel_memcpy(dst_ + offsets_[i], t.data(), t.nbytes());
    }
    return seconds_since(start);
  }

 private:
  const TaskArgs& args_;
  std::vector<size_t> offsets_;
  DeviceBuffer device_;
  std::shared_ptr<Storage> host_;
  unsigned char* dst_ = nullptr;
};

}  // namespace

Timings BenchResult::timings() const {
  Timings t;
  for (Arm arm : config.arms) t.arms.emplace_back(arm_name(arm));
  t.reference = 0;
  for (size_t a = 0; a < config.arms.size(); ++a)
    if (config.arms[a] == Arm::pageable) t.reference = a;
  t.staged_bytes = sizes.staged_bytes;
  t.keep_cold = config.keep_cold;
  for (const auto& group : groups) {
    auto& lat = t.latency.emplace_back();
    auto& up = t.upload.emplace_back();
    auto& base = t.baseline.emplace_back();
    for (const ArmRun& run : group) {
      auto& l = lat.emplace_back();
      auto& u = up.emplace_back();
      for (const RoundRecord& rec : run.binds) {
        l.push_back(rec.seconds);
        u.push_back(rec.phase_seconds[static_cast<size_t>(BindPhase::upload)]);
      }
      base.push_back(run.memcpy_seconds);
    }
  }
  if (!config.baseline) t.baseline.clear();
  return t;
}

BenchResult run_ab(Worker& worker, const BenchConfig& config, const ArgsFactory& make_args,
                   const ProgressFn& progress) {
  validate(config);
  require_chip_worker(worker, "run_ab");
  if (!make_args) throw Error(ErrorCode::invalid_argument, "run_ab: no argument factory given");

  BenchResult result;
  result.config = config;
  result.backend = worker.backend().name;
  result.threads = default_thread_count();
  const bool device_is_host = worker.capabilities().device_memory_is_host;
  result.baseline_kind =
      device_is_host ? "device memory, which is host memory on " + result.backend
                     : std::string("a pageable host buffer (a host-to-host reference; ") +
                           "device memory is not host-addressable on " + result.backend + ")";

  const size_t arms = config.arms.size();
  const size_t rounds = static_cast<size_t>(config.rounds);
  Progress prog;
  prog.total =
      static_cast<size_t>(config.groups) * arms * (1 + rounds + (config.baseline ? rounds : 0));
  auto report = [&](int group, Arm arm, std::string step) {
    ++prog.done;
    prog.group = group;
    prog.arm = arm;
    prog.step = std::move(step);
    if (progress) progress(prog);
  };

  bool have_sizes = false;
  result.groups.resize(static_cast<size_t>(config.groups));
  for (int g = 0; g < config.groups; ++g) {
    for (Arm arm : config.arms) {
      ArmRun run;
      run.arm = arm;
      // Only this arm's args exist while it runs; they are freed before the next arm.
      std::optional<PinnedAllocator> pinned;
      PageableAllocator pageable;
      HostAllocator* allocator = &pageable;
      if (arm == Arm::pinned) allocator = &pinned.emplace(worker);
      const auto gen_start = Clock::now();
      const TaskArgs args = make_args(*allocator);
      run.generate_seconds = seconds_since(gen_start);
      qwen3::Sizes sizes;
      sizes.tensors = args.size();
      sizes.staged_tensors = args.staged_count();
      sizes.total_bytes = args.total_bytes();
      sizes.staged_bytes = args.staged_bytes();
      if (!have_sizes) {
        result.sizes = sizes;
        have_sizes = true;
      } else if (sizes.total_bytes != result.sizes.total_bytes ||
                 sizes.staged_bytes != result.sizes.staged_bytes ||
                 sizes.tensors != result.sizes.tensors) {
        throw Error(ErrorCode::invalid_argument,
                    std::string("run_ab: the argument factory built different tensors for arm ") +
                        arm_name(arm) + "; every arm must bind the same task");
      }
      report(g, arm, "generate");

      BindOptions options;
      options.upload = arm == Arm::staged ? UploadPath::staged : UploadPath::direct;
      options.staging_buffers = config.staging_buffers;
      options.staging_buffer_bytes = config.staging_buffer_bytes;
      Binder binder(worker, options);
      for (size_t r = 0; r < rounds; ++r) {
        const BindReport rep = binder.run(args);
        RoundRecord rec;
        rec.seconds = rep.total_seconds;
        rec.phase_seconds = rep.phase_seconds;
        rec.cold = r == 0;
        run.binds.push_back(rec);
        if (r + 1 == rounds) run.bind_summary = rep.summary();
        report(g, arm, "bind " + std::to_string(r + 1) + "/" + std::to_string(rounds));
      }
      // After the binds, so its destination never coexists with the bind's arena.
      if (config.baseline) {
        Baseline baseline(worker, args, device_is_host);
        for (size_t r = 0; r < rounds; ++r) {
          run.memcpy_seconds.push_back(baseline.round());
          report(g, arm, "memcpy " + std::to_string(r + 1) + "/" + std::to_string(rounds));
        }
      }
      result.groups[static_cast<size_t>(g)].push_back(std::move(run));
    }
  }
  result.stats = compute_stats(result.timings());
  return result;
}

BenchResult run_bench(Worker& worker, const BenchConfig& config, const LayerPlan& plan,
                      const ProgressFn& progress) {
  if (plan.layers < 1)
    throw Error(ErrorCode::invalid_argument,
                "run_bench: the layer plan has no layers; make it with plan_layers()");
  qwen3::Config qc;
  qc.n_layers = plan.layers;
  qc.seq_len = config.seq_len;
  qc.seed = config.seed;
  BenchResult result = run_ab(
      worker, config, [&](HostAllocator& allocator) { return qwen3::make_args(allocator, qc); },
      progress);
  result.plan = plan;
  return result;
}

}  // namespace pinstage::ab
