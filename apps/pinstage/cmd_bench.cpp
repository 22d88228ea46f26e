// pinstage bench <task>: the pageable-vs-pinned A/B benchmark of the bind phase, for every
// registered scene and for the synthetic task (K tensors of N bytes).
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "cli_common.h"
#include "commands.h"
#include "pinstage/ab_bench.h"
#include "pinstage/atomic_file.h"
#include "pinstage/error.h"
#include "pinstage/pages.h"
#include "pinstage/settings.h"
#include "pinstage/worker.h"

namespace pinstage::cli {

namespace {

// The options every task shares.
struct BenchArgs {
  BackendArgs backend;
  ReportArgs report;
  std::string arms = "pageable,pinned";
  int groups = 5;
  int rounds = 6;
  bool keep_cold = false;
  bool no_baseline = false;
  bool no_plot = false;
  size_t staging_buffers = 4;
  size_t staging_buffer_mib = 8;
  const CLI::App* cmd = nullptr;  // for the report's option list
};

ab::BenchConfig make_config(const BenchArgs& a, int64_t size) {
  ab::BenchConfig config;
  config.backend = a.backend.name;
  config.size = size;
  config.arms = ab::parse_arms(a.arms);
  config.groups = a.groups;
  config.rounds = a.rounds;
  config.keep_cold = a.keep_cold;
  config.baseline = !a.no_baseline;
  config.bind.staging_buffers = a.staging_buffers;
  config.bind.staging_buffer_bytes = a.staging_buffer_mib << 20;
  ab::validate(config);
  return config;
}

ab::ProgressFn progress_fn(ProgressBar& bar, const ab::BenchConfig& config) {
  if (!bar.enabled()) return {};
  bar.show(0.0, "group 1/" + std::to_string(config.groups) + "  generate");
  const int groups = config.groups;
  return [&bar, groups](const ab::Progress& p) {
    const double frac = p.total ? static_cast<double>(p.done) / static_cast<double>(p.total) : 1.0;
    bar.show(frac, "group " + std::to_string(p.group + 1) + "/" + std::to_string(groups) + "  " +
                       ab::arm_name(p.arm) + "  " + p.step);
  };
}

// The JSON report (with its "run" block) and, when matplotlib is there, the PNG next to
// it. The report is rewritten after every group, so a run cut short keeps what it measured.
void write_bench_json(const BenchArgs& a, const ab::BenchResult& result) {
  if (a.report.json.empty() || a.report.json == "-") return;
  write_file_atomically(a.report.json, ab::to_json(result));
}

void finish_report(const BenchArgs& a, const ab::BenchResult& result) {
  FILE* text = text_out(a.report);
  std::fputs(ab::format_table(result).c_str(), text);
  if (a.report.json.empty()) return;
  if (a.report.json == "-") {
    std::fputs(ab::to_json(result).c_str(), stdout);
    return;
  }
  write_bench_json(a, result);
  chatter(a.report, "report with every raw timing: %s\n", a.report.json.c_str());
  if (a.no_plot) return;
  const std::string png = plot_path_for(a.report.json);
  std::string why;
  if (plot_report(a.report.json, png, why))
    chatter(a.report, "picture: %s\n", png.c_str());
  else
    chatter(a.report, "no picture: %s\n", why.c_str());
}

// Everything that needs no machine figures is checked (by make_task and make_config)
// before the worker starts; the size is planned before any argument is allocated.
void run_bench_command(const BenchArgs& a, const std::function<ab::BenchTask()>& make_task,
                       int64_t size) {
  check_report_args(a.report);
  const ab::BenchTask task = make_task();
  const ab::BenchConfig config = make_config(a, size);
  Worker worker;
  worker.init(config.backend, 0, worker_options(a.backend));
  ab::MemoryBudget budget;
  budget.host_available = available_memory_bytes();
  budget.device_is_host = worker.capabilities().device_memory_is_host;
  budget.device_capacity = worker.stats().device_capacity_bytes;
  const ab::SizePlan plan = ab::plan_size(config, task, budget);
  chatter(a.report, "pinstage bench: %s\n", plan.reason.c_str());

  ab::BenchResult seed;
  seed.run = collect_run_info(&worker, command_options(*a.cmd));
  ProgressBar bar(a.report);
  ab::BenchResult result = ab::run_bench(
      worker, config, task, plan, progress_fn(bar, config),
      [&](const ab::BenchResult& partial) { write_bench_json(a, partial); }, std::move(seed));
  bar.clear();
  finish_report(a, result);
  finish_worker(worker);
}

void add_common_options(CLI::App& q, BenchArgs& args) {
  args.cmd = &q;
  add_backend_args(q, args.backend);
  q.add_option("--arms", args.arms, "Comma-separated arms in run order: pageable,pinned,staged")
      ->transform(kLowerCase)
      ->capture_default_str();
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  add_integer_option(q, "--groups", args.groups, "Groups; each runs every arm once", 1, kIntMax)
      ->capture_default_str();
  add_integer_option(q, "--rounds", args.rounds, "Binds per arm per group", 1, kIntMax)
      ->capture_default_str();
  q.add_flag("--keep-cold", args.keep_cold,
             "Keep the first (cold) bind of every arm in the statistics");
  q.add_flag("--no-baseline", args.no_baseline, "Skip the plain memcpy baseline rounds");
  // BindOptions' ranges (validate in bind.h), checked here while parsing.
  add_integer_option(q, "--staging-buffers", args.staging_buffers,
                     "Staging ring buffers (staged arm), 1..64", 1, 64)
      ->capture_default_str();
  add_integer_option(q, "--staging-buffer-mib", args.staging_buffer_mib,
                     "Size of each staging buffer in MiB (staged arm), 1..1024", 1, 1024)
      ->capture_default_str();
  add_report_options(q, args.report);
  q.add_flag("--no-plot", args.no_plot, "Do not draw the PNG next to the --json report");
}

// `bench <scene> --steps N`: resident args against a full bind per step.
void run_steps_command(const BenchArgs& a, const Scene& scene, const SceneValues& values, int steps,
                       const CLI::App& cmd) {
  for (const char* flag : {"--arms", "--rounds", "--keep-cold", "--no-baseline"})
    if (cmd.count(flag) > 0)
      throw Error(ErrorCode::invalid_argument,
                  std::string(flag) +
                      " belongs to the A/B benchmark; --steps runs the "
                      "resident-vs-full-bind steps benchmark, which has no arms");
  check_report_args(a.report);
  ab::StepsBenchConfig config;
  config.steps = steps;
  config.groups = cmd.count("--groups") > 0 ? a.groups : config.groups;
  config.bind.staging_buffers = a.staging_buffers;
  config.bind.staging_buffer_bytes = a.staging_buffer_mib << 20;
  ab::validate(config);
  const SceneValues resolved = resolve_params(scene, values);
  scene.validate_steps(resolved, steps);
  Worker worker;
  worker.init(a.backend.name, 0, worker_options(a.backend));
  ProgressBar bar(a.report);
  const double total = 2.0 * config.groups * config.steps;
  double done = 0;
  ab::StepsBenchResult result =
      ab::run_steps_bench(worker, scene, resolved, config,
                          [&](const std::string& text) { bar.show(++done / total, text); });
  bar.clear();
  result.run = collect_run_info(&worker, command_options(cmd));
  std::fputs(ab::format_steps_table(result).c_str(), text_out(a.report));
  if (a.report.json == "-")
    std::fputs(ab::steps_to_json(result).c_str(), stdout);
  else if (!a.report.json.empty())
    write_file_atomically(a.report.json, ab::steps_to_json(result));
  finish_worker(worker);
}

void add_scene_bench(CLI::App& bench, const std::shared_ptr<const Scene>& scene) {
  struct Args {
    BenchArgs common;
    SceneValues values;
    int steps = 1;
  };
  auto args = std::make_shared<Args>();
  CLI::App* q = bench.add_subcommand(
      scene->name(), "A/B benchmark: bind the " + scene->name() +
                         " arguments from pageable vs pinned (vs staged) host memory, in "
                         "interleaved groups, next to a plain memcpy of the same bytes");
  add_common_options(*q, args->common);
  add_scene_options(*q, *scene, args->values, SizeDefault::automatic);
  add_integer_option(*q, "--steps", args->steps,
                     "Decode steps: > 1 runs the steps benchmark instead (resident args vs a "
                     "full bind per step; --groups defaults to 2 there)",
                     1, std::numeric_limits<int>::max())
      ->capture_default_str();
  q->callback([scene, args, q] {
    if (args->steps > 1) {
      SceneValues values = args->values;
      const auto knob = size_param(*scene);
      if (knob && q->count(param_flag(knob->name)) == 0)  // the scene command's default size
        values[knob->name] = knob->scene_default > 0 ? knob->scene_default : knob->default_value;
      run_steps_command(args->common, *scene, values, args->steps, *q);
      return;
    }
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
  add_integer_option(*q, "--tensors", args->tensors, "IN tensors, 1..65536", 1, 65536)
      ->capture_default_str();
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
  add_bench_compare_command(*bench);
  add_bench_load_command(*bench);
}

}  // namespace pinstage::cli
