// pinstage fixture <scene>: build a registered scene's arguments, time it against the
// first-touch floor, optionally write them to a .safetensors file.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "pinstage/ab_bench.h"
#include "pinstage/checkpoint.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/pages.h"
#include "pinstage/parallel.h"
#include "pinstage/safetensors.h"
#include "pinstage/scene.h"
#include "pinstage/settings.h"
#include "pinstage/worker.h"
#include "shard_cleanup.h"

namespace pinstage::cli {

namespace {

struct FixtureArgs {
  SceneValues values;
  int threads = 0;
  bool pinned = false;
  bool size_only = false;
  bool first_touch = false;
  int repeat = 1;
  ReportArgs report;
  std::string out;
  bool out_given = false;
  std::string shard_size;  // --shard-size: --out is a sharded checkpoint directory
  const CLI::App* cmd = nullptr;
};

// Best (smallest) of the runs' seconds.
double best(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}

std::string rate(uint64_t bytes, double s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f s (%.2f GB/s)", s,
                s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0.0);
  return buf;
}

// The floor: the same storages from the same allocator, one byte written per page on
// all cores (or, with `populate`, the pages pre-faulted by MADV_POPULATE_WRITE, the way
// the generator does it). Allocation is inside the timing, as it is for generation
// (pinned memory is populated when it is allocated).
double population_floor(HostAllocator& allocator, const std::vector<SceneTensor>& tensors,
                        int threads, bool populate) {
  const Stopwatch clock;
  std::vector<std::shared_ptr<Storage>> storages;
  storages.reserve(tensors.size());
  for (const auto& t : tensors) storages.push_back(allocator.allocate(t.nbytes));
  const auto method = populate ? PrefaultMethod::populate : PrefaultMethod::touch;
  for (const auto& s : storages) prefault(s->data(), s->bytes(), threads, 0, method);
  const double s = clock.seconds();
  storages.clear();  // unmapping is not part of the floor
  return s;
}

void print_table(FILE* out, const std::vector<SceneTensor>& tensors) {
  std::fprintf(out, "%-3s %-17s %-5s %-6s %-20s %18s\n", "#", "name", "dtype", "dir", "shape",
               "bytes");
  int i = 1;
  for (const auto& t : tensors) {
    std::fprintf(out, "%-3d %-17s %-5s %-6s %-20s %18s\n", i++, t.name.c_str(), dtype_name(t.dtype),
                 direction_name(t.dir), format_shape(t.shape).c_str(),
                 format_thousands(t.nbytes).c_str());
  }
}

// Every option is checked before any memory is taken.
void check_options(const FixtureArgs& a) {
  check_report_args(a.report);
  if (a.out_given && a.shard_size.empty()) check_out_option("--out", a.out);
  if (a.size_only && (a.out_given || a.first_touch || a.pinned || a.repeat != 1))
    throw Error(ErrorCode::invalid_argument,
                "--size-only allocates nothing: it cannot be combined with --out, --first-touch, "
                "--pinned or --repeat");
}

// The timings of --repeat runs: generation, and with --first-touch the two floors.
struct Runs {
  std::vector<double> generate, floor, populate;
  std::optional<TaskArgs> args;  // the last run's
};

Runs generate_runs(const Scene& scene, const FixtureArgs& a, HostAllocator& allocator,
                   const std::vector<SceneTensor>& tensors, uint64_t total_bytes) {
  Runs runs;
  for (int r = 0; r < a.repeat; ++r) {
    // Side by side: the floor and the generation alternate, each on fresh memory.
    if (a.first_touch) {
      runs.floor.push_back(population_floor(allocator, tensors, a.threads, false));
      runs.populate.push_back(population_floor(allocator, tensors, a.threads, true));
    }
    runs.args.reset();  // the previous run's memory goes back first
    const Stopwatch clock;
    runs.args.emplace(scene.make_args(allocator, a.values, a.threads));
    runs.generate.push_back(clock.seconds());
    if (a.repeat > 1)
      chatter(a.report, "  run %d/%d: generate %s%s%s\n", r + 1, a.repeat,
              rate(total_bytes, runs.generate.back()).c_str(),
              a.first_touch ? ", first-touch " : "",
              a.first_touch ? rate(total_bytes, runs.floor.back()).c_str() : "");
  }
  return runs;
}

void print_runs(const Runs& runs, const FixtureArgs& a, uint64_t total) {
  FILE* out = text_out(a.report);
  const double gen_best = best(runs.generate);
  const char* best_note = a.repeat > 1 ? " (best run)" : "";
  std::fprintf(out, "%s\n", runs.args->summary().c_str());
  std::fprintf(out, "generate: %s in %s%s\n", format_bytes(total).c_str(),
               rate(total, gen_best).c_str(), best_note);
  if (!a.first_touch) return;
  const double fb = best(runs.floor);
  const double pb = best(runs.populate);
  std::fprintf(out, "first-touch floor: %s of fresh memory in %s%s; generate / floor = %.2fx\n",
               format_bytes(total).c_str(), rate(total, fb).c_str(), best_note,
               fb > 0 ? gen_best / fb : 0.0);
  std::fprintf(out, "populate only (MADV_POPULATE_WRITE): %s; generate / populate = %.2fx\n",
               rate(total, pb).c_str(), pb > 0 ? gen_best / pb : 0.0);
}

void add_runs(nlohmann::ordered_json& report, const Runs& runs, bool first_touch, uint64_t total) {
  const double gen_best = best(runs.generate);
  report["summary"] = runs.args->summary();
  report["generate_s"] = runs.generate;
  report["generate_best_s"] = gen_best;
  report["generate_best_gbps"] = static_cast<double>(total) / gen_best / 1e9;
  if (!first_touch) return;
  report["first_touch_s"] = runs.floor;
  report["first_touch_best_s"] = best(runs.floor);
  report["generate_over_first_touch"] = gen_best / best(runs.floor);
  report["populate_s"] = runs.populate;
  report["populate_best_s"] = best(runs.populate);
}

void write_out(const FixtureArgs& a, const TaskArgs& args, nlohmann::ordered_json& report) {
  const Stopwatch clock;
  if (!a.shard_size.empty()) {  // shards + model.safetensors.index.json (docs/loading.md)
    const uint64_t shard_bytes = parse_byte_count(a.shard_size, "--shard-size");
    std::error_code ec;
    std::filesystem::create_directories(a.out, ec);  // save_sharded_checkpoint names a failure
    std::optional<ShardCleanupOnSignal> cleanup;
    if (!ec) cleanup.emplace(a.out);
    report["shards"] = save_sharded_checkpoint(args, a.out, shard_bytes);
  }
  const uint64_t file_bytes =
      a.shard_size.empty() ? save_safetensors(args, a.out) : args.total_bytes();
  const double s = clock.seconds();
  report["out"] = a.out;
  report["file_bytes"] = file_bytes;
  report["write_s"] = s;
  chatter(a.report, "wrote %s: %s in %s\n", a.out.c_str(), format_bytes(file_bytes).c_str(),
          rate(file_bytes, s).c_str());
}

// The size knob when it was omitted (0): the same automatic size as the bench, the
// largest that fits in half of MemAvailable. A given size must fit in all of it. Nothing
// is allocated when it does not fit.
void plan_fixture_size(const Scene& scene, FixtureArgs& a) {
  const auto knob = size_param(scene);
  if (!knob) return;
  int64_t& value = a.values[knob->name];
  if (a.size_only) {
    if (value == 0) value = knob->default_value;  // sizes only: the whole model
    return;
  }
  ab::BenchConfig config;
  config.arms = {ab::Arm::pageable};
  config.baseline = false;
  config.groups = 1;
  config.rounds = 2;
  config.size = value;
  ab::MemoryBudget budget;
  budget.host_available = available_memory_bytes();
  const ab::SizePlan plan = ab::plan_size(config, ab::scene_task(scene, a.values), budget);
  if (value == 0) chatter(a.report, "pinstage fixture: %s\n", plan.reason.c_str());
  value = plan.size;
}

void print_size_only(const Scene& scene, const FixtureArgs& a,
                     const std::vector<SceneTensor>& tensors, const TaskSizes& sizes) {
  FILE* out = text_out(a.report);
  std::fprintf(out, "%s fixture (size only): %s\n", scene.name().c_str(),
               scene.describe(a.values).c_str());
  print_table(out, tensors);
  std::fprintf(out, "%s, %s, %s; all tensors %s\n", plural(sizes.tensors, "tensor").c_str(),
               plural(sizes.input_tensors, "input").c_str(),
               format_bytes(sizes.input_bytes).c_str(), format_bytes(sizes.total_bytes).c_str());
}

void run_fixture(const Scene& scene, FixtureArgs a) {
  check_options(a);
  plan_fixture_size(scene, a);
  a.values = resolve_params(scene, a.values);
  const std::vector<SceneTensor> tensors = scene.tensors(a.values);
  const TaskSizes sizes = task_sizes(tensors);
  nlohmann::ordered_json report;
  for (const auto& [name, value] : a.values) report[name] = value;
  report["tensors"] = sizes.tensors;
  report["input_tensors"] = sizes.input_tensors;
  report["input_bytes"] = sizes.input_bytes;
  report["total_bytes"] = sizes.total_bytes;

  if (a.size_only) {
    report["size_only"] = true;
    print_size_only(scene, a, tensors, sizes);
    write_report(a.report, report, collect_run_info(nullptr, command_options(*a.cmd)));
    return;
  }

  // The worker outlives the arguments that hold its pinned memory.
  std::optional<Worker> worker;
  std::unique_ptr<HostAllocator> allocator;
  if (a.pinned) {
    worker.emplace();
    worker->init("sim");
    allocator = std::make_unique<PinnedAllocator>(*worker);
  } else {
    allocator = std::make_unique<PageableAllocator>();
  }
  const int threads = a.threads > 0 ? a.threads : default_thread_count();
  const std::string generator = scene.generator();
  chatter(a.report, "%s fixture: %s, %s memory, %s%s\n", scene.name().c_str(),
          scene.describe(a.values).c_str(), allocator->name().c_str(),
          plural(static_cast<size_t>(threads), "thread").c_str(),
          generator.empty() ? "" : (", " + generator).c_str());
  std::fflush(text_out(a.report));
  Runs runs;
  {
    ProgressTicker ticker(a.report, "generating " + format_bytes(sizes.total_bytes));
    runs = generate_runs(scene, a, *allocator, tensors, sizes.total_bytes);
  }
  print_runs(runs, a, sizes.total_bytes);
  report["allocator"] = allocator->name();
  report["threads"] = threads;
  report["generator"] = generator;
  add_runs(report, runs, a.first_touch, sizes.total_bytes);
  if (a.out_given) {
    ProgressTicker ticker(a.report, "writing " + a.out);
    write_out(a, *runs.args, report);
  }
  write_report(a.report, report,
               collect_run_info(worker ? &*worker : nullptr, command_options(*a.cmd)));
  runs.args.reset();  // the pinned args go back before the worker finalizes
  if (worker) finish_worker(*worker);
}

}  // namespace

void add_fixture_command(CLI::App& app) {
  CLI::App* fixture = app.add_subcommand("fixture", "Build a scene's arguments (fixture)");
  fixture->require_subcommand(1);
  for (const auto& scene : registered_scenes()) {
    auto args = command_values<FixtureArgs>();
    CLI::App* q = fixture->add_subcommand(
        scene->name(), scene->description() + ": prints bytes, seconds and GB/s");
    add_scene_options(*q, *scene, args->values, SizeDefault::automatic);
    add_integer_option(*q, "--threads", args->threads,
                       "Generation threads, 0..4096 (0 = all cores)", 0, 4096)
        ->capture_default_str();
    q->add_flag("--pinned", args->pinned, "Generate into pinned memory of a sim worker");
    q->add_flag("--size-only", args->size_only, "Print shapes and byte totals; allocate nothing");
    q->add_flag("--first-touch", args->first_touch,
                "Also time the floor: allocating the same bytes and touching every page");
    add_integer_option(*q, "--repeat", args->repeat,
                       "Runs (each on fresh memory); the best is reported", 1,
                       std::numeric_limits<int>::max())
        ->capture_default_str();
    add_report_options(*q, args->report);
    q->add_option("--out", args->out, "Write the arguments to this .safetensors file")
        ->each([a = args.get()](const std::string&) { a->out_given = true; });
    q->add_option("--shard-size", args->shard_size,
                  "With --out DIR: write a sharded checkpoint, shards of at most SIZE (2G, 512M)");
    args->cmd = q;
    q->callback([scene, args] { run_fixture(*scene, *args); });
  }
}

}  // namespace pinstage::cli
