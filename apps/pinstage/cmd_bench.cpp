// pinstage bench <task>: the pageable-vs-pinned A/B benchmark of the bind phase, for every
// registered scene and for the synthetic task (K tensors of N bytes).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "commands.h"
#include "pinstage/ab_bench.h"
#include "pinstage/error.h"
#include "pinstage/settings.h"
#include "pinstage/worker.h"

namespace pinstage::cli {

namespace {

// The options every task shares.
struct BenchArgs {
  std::string backend = "sim";
  std::string arms = "pageable,pinned";
  int groups = 5;
  int rounds = 6;
  bool keep_cold = false;
  bool no_baseline = false;
  size_t staging_buffers = 4;
  size_t staging_buffer_mib = 8;
  std::string json_path;
  bool no_progress = false;
};

// A one-line bar on stderr, redrawn in place.
void draw_progress(const ab::Progress& p, int groups) {
  constexpr int kWidth = 30;
  const double frac = p.total ? static_cast<double>(p.done) / static_cast<double>(p.total) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar += std::string(static_cast<size_t>(kWidth - filled), '.');
  std::fprintf(stderr, "\r\033[K[%s] %3d%%  group %d/%d  %-8s %s", bar.c_str(),
               static_cast<int>(frac * 100.0), p.group + 1, groups, ab::arm_name(p.arm),
               p.step.c_str());
  if (p.done == p.total) std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

ab::BenchConfig make_config(const BenchArgs& a, int64_t size) {
  ab::BenchConfig config;
  config.backend = a.backend;
  config.size = size;
  config.arms = ab::parse_arms(a.arms);
  config.groups = a.groups;
  config.rounds = a.rounds;
  config.keep_cold = a.keep_cold;
  config.baseline = !a.no_baseline;
  config.bind.staging_buffers = a.staging_buffers;
  if (a.staging_buffer_mib < 1 || a.staging_buffer_mib > 1024)
    throw Error(ErrorCode::invalid_argument, "--staging-buffer-mib is " +
                                                 std::to_string(a.staging_buffer_mib) +
                                                 "; it must be in [1, 1024]");
  config.bind.staging_buffer_bytes = a.staging_buffer_mib << 20;
  ab::validate(config);
  return config;
}

ab::ProgressFn start_progress(const BenchArgs& a, const ab::BenchConfig& config) {
  if (a.no_progress || isatty(STDERR_FILENO) != 1) return {};
  ab::Progress start;  // the first step (generating the args) takes a while: show it
  start.total = 1;
  start.arm = config.arms.front();
  start.step = "generate";
  draw_progress(start, config.groups);
  const int groups = config.groups;
  return [groups](const ab::Progress& p) { draw_progress(p, groups); };
}

// Everything that needs no machine figures is checked (by make_task and make_config)
// before the worker starts; the size is planned before any argument is allocated.
void run_bench_command(const BenchArgs& a, const std::function<ab::BenchTask()>& make_task,
                       int64_t size) {
  const ab::BenchTask task = make_task();
  const ab::BenchConfig config = make_config(a, size);
  Worker worker;
  worker.init(config.backend);
  ab::MemoryBudget budget;
  budget.host_available = ab::read_mem_available();
  budget.device_is_host = worker.capabilities().device_memory_is_host;
  budget.device_capacity = worker.stats().device_capacity_bytes;
  const ab::SizePlan plan = ab::plan_size(config, task, budget);
  std::fprintf(stderr, "pinstage bench: %s\n", plan.reason.c_str());

  // Opened before the run so a bad path fails now, not after minutes of binds.
  std::unique_ptr<std::ofstream> json;
  if (!a.json_path.empty()) {
    json = std::make_unique<std::ofstream>(a.json_path);
    if (!*json)
      throw Error(ErrorCode::io, "--json: cannot open '" + a.json_path +
                                     "' for writing; check that its directory exists");
  }
  const ab::BenchResult result =
      ab::run_bench(worker, config, task, plan, start_progress(a, config));
  std::fputs(ab::format_table(result).c_str(), stdout);
  if (json) {
    *json << ab::to_json(result);
    json->flush();
    if (!*json) throw Error(ErrorCode::io, "--json: writing '" + a.json_path + "' failed");
    std::printf("raw timings written to %s\n", a.json_path.c_str());
  }
}

void add_common_options(CLI::App& q, BenchArgs& args) {
  q.add_option("--backend", args.backend, "Backend plugin (sim, cuda)")->capture_default_str();
  q.add_option("--arms", args.arms, "Comma-separated arms in run order: pageable,pinned,staged")
      ->capture_default_str();
  q.add_option("--groups", args.groups, "Groups; each runs every arm once")->capture_default_str();
  q.add_option("--rounds", args.rounds, "Binds per arm per group")->capture_default_str();
  q.add_flag("--keep-cold", args.keep_cold,
             "Keep the first (cold) bind of every arm in the statistics");
  q.add_flag("--no-baseline", args.no_baseline, "Skip the plain memcpy baseline rounds");
  q.add_option("--staging-buffers", args.staging_buffers, "Staging ring buffers (staged arm)")
      ->capture_default_str();
  q.add_option("--staging-buffer-mib", args.staging_buffer_mib,
               "Size of each staging buffer in MiB (staged arm)")
      ->capture_default_str();
  q.add_option("--json", args.json_path, "Write the config, stats and every raw timing here");
  q.add_flag("--no-progress", args.no_progress, "No progress bar even on a terminal");
}

void add_scene_bench(CLI::App& bench, const std::shared_ptr<const Scene>& scene) {
  struct Args {
    BenchArgs common;
    SceneValues values;
  };
  auto args = std::make_shared<Args>();
  CLI::App* q = bench.add_subcommand(
      scene->name(), "A/B benchmark: bind the " + scene->name() +
                         " arguments from pageable vs pinned (vs staged) host memory, in "
                         "interleaved groups, next to a plain memcpy of the same bytes");
  add_common_options(*q, args->common);
  add_scene_options(*q, *scene, args->values, SizeDefault::automatic);
  q->callback([scene, args] {
    const auto knob = size_param(*scene);
    const int64_t size = knob ? args->values[knob->name] : 0;
    run_bench_command(
        args->common, [&] { return ab::scene_task(*scene, args->values); }, size);
  });
}

void add_synthetic_bench(CLI::App& bench) {
  struct Args {
    BenchArgs common;
    int64_t tensors = 4;
    std::string bytes = "64M";
  };
  auto args = std::make_shared<Args>();
  CLI::App* q = bench.add_subcommand(
      "synthetic", "A/B benchmark of a synthetic task: --tensors IN tensors of --bytes each");
  add_common_options(*q, args->common);
  q->add_option("--tensors", args->tensors, "IN tensors, [1, 65536]")->capture_default_str();
  q->add_option("--bytes", args->bytes, "Bytes per tensor, a multiple of 4 (64M, 1G, 4096)")
      ->capture_default_str();
  q->callback([args] {
    run_bench_command(
        args->common,
        [&] { return ab::synthetic_task(args->tensors, parse_byte_count(args->bytes, "--bytes")); },
        0);
  });
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks of the bind phase");
  bench->require_subcommand(1);
  for (const auto& scene : registered_scenes()) add_scene_bench(*bench, scene);
  add_synthetic_bench(*bench);
}

}  // namespace pinstage::cli
