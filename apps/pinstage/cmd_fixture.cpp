// pinstage fixture <scene>: build a registered scene's arguments, time it against the
// first-touch floor, optionally write them to a .safetensors file.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/pages.h"
#include "pinstage/parallel.h"
#include "pinstage/safetensors.h"
#include "pinstage/scene.h"
#include "pinstage/worker.h"

namespace pinstage::cli {

namespace {

struct FixtureArgs {
  SceneValues values;
  int threads = 0;
  bool pinned = false;
  bool size_only = false;
  bool first_touch = false;
  int repeat = 1;
  bool json = false;
  std::string out;
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

void print_table(const std::vector<SceneTensor>& tensors) {
  std::printf("%-3s %-17s %-5s %-6s %-20s %18s\n", "#", "name", "dtype", "dir", "shape", "bytes");
  int i = 1;
  for (const auto& t : tensors) {
    std::printf("%-3d %-17s %-5s %-6s %-20s %18s\n", i++, t.name.c_str(), dtype_name(t.dtype),
                direction_name(t.dir), format_shape(t.shape).c_str(),
                format_thousands(t.nbytes).c_str());
  }
}

// Every option is checked before any memory is taken.
void check_options(const FixtureArgs& a) {
  if (a.repeat < 1)
    throw Error(ErrorCode::invalid_argument,
                "--repeat is " + std::to_string(a.repeat) + "; it must be >= 1");
  if (a.threads < 0)
    throw Error(ErrorCode::invalid_argument,
                "--threads is " + std::to_string(a.threads) + "; it must be >= 0 (0 = all cores)");
  if (a.size_only && (!a.out.empty() || a.first_touch || a.pinned || a.repeat != 1))
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
    if (!a.json && a.repeat > 1) {
      std::printf("  run %d/%d: generate %s", r + 1, a.repeat,
                  rate(total_bytes, runs.generate.back()).c_str());
      if (a.first_touch)
        std::printf(", first-touch %s", rate(total_bytes, runs.floor.back()).c_str());
      std::printf("\n");
    }
  }
  return runs;
}

void print_runs(const Runs& runs, const FixtureArgs& a, uint64_t total) {
  const double gen_best = best(runs.generate);
  const char* best_note = a.repeat > 1 ? " (best run)" : "";
  std::printf("%s\n", runs.args->summary().c_str());
  std::printf("generate: %s bytes in %s%s\n", format_thousands(total).c_str(),
              rate(total, gen_best).c_str(), best_note);
  if (!a.first_touch) return;
  const double fb = best(runs.floor);
  const double pb = best(runs.populate);
  std::printf("first-touch floor: %s fresh bytes in %s%s; generate / floor = %.2fx\n",
              format_thousands(total).c_str(), rate(total, fb).c_str(), best_note,
              fb > 0 ? gen_best / fb : 0.0);
  std::printf("populate only (MADV_POPULATE_WRITE): %s; generate / populate = %.2fx\n",
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
  const uint64_t file_bytes = save_safetensors(args, a.out);
  const double s = clock.seconds();
  report["out"] = a.out;
  report["file_bytes"] = file_bytes;
  report["write_s"] = s;
  if (!a.json)
    std::printf("wrote %s: %s bytes in %s\n", a.out.c_str(), format_thousands(file_bytes).c_str(),
                rate(file_bytes, s).c_str());
}

void run_fixture(const Scene& scene, FixtureArgs a) {
  a.values = resolve_params(scene, a.values);
  check_options(a);
  const std::vector<SceneTensor> tensors = scene.tensors(a.values);
  const TaskSizes sizes = task_sizes(tensors);
  const std::string what = scene.name() + " fixture";
  nlohmann::ordered_json report;
  for (const auto& [name, value] : a.values) report[name] = value;
  report["tensors"] = sizes.tensors;
  report["input_tensors"] = sizes.input_tensors;
  report["input_bytes"] = sizes.input_bytes;
  report["total_bytes"] = sizes.total_bytes;

  if (a.size_only) {
    report["size_only"] = true;
    if (a.json) return (void)std::printf("%s\n", report.dump(2).c_str());
    std::printf("%s (size only): %s\n", what.c_str(), scene.describe(a.values).c_str());
    print_table(tensors);
    std::printf("%zu tensors, %zu inputs, %s bytes; all %zu tensors %s bytes\n", sizes.tensors,
                sizes.input_tensors, format_thousands(sizes.input_bytes).c_str(), sizes.tensors,
                format_thousands(sizes.total_bytes).c_str());
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
  if (!a.json)
    std::printf("%s: %s, %s memory, %d thread(s)%s\n", what.c_str(),
                scene.describe(a.values).c_str(), allocator->name().c_str(), threads,
                generator.empty() ? "" : (", " + generator).c_str());
  const Runs runs = generate_runs(scene, a, *allocator, tensors, sizes.total_bytes);
  if (!a.json) print_runs(runs, a, sizes.total_bytes);
  report["allocator"] = allocator->name();
  report["threads"] = threads;
  report["generator"] = generator;
  add_runs(report, runs, a.first_touch, sizes.total_bytes);
  if (!a.out.empty()) write_out(a, *runs.args, report);
  if (a.json) std::printf("%s\n", report.dump(2).c_str());
}

}  // namespace

void add_fixture_command(CLI::App& app) {
  CLI::App* fixture = app.add_subcommand("fixture", "Build a scene's arguments (fixture)");
  fixture->require_subcommand(1);
  for (const auto& scene : registered_scenes()) {
    auto args = std::make_shared<FixtureArgs>();
    CLI::App* q = fixture->add_subcommand(
        scene->name(), scene->description() + ": prints bytes, seconds and GB/s");
    add_scene_options(*q, *scene, args->values, SizeDefault::param);
    q->add_option("--threads", args->threads, "Generation threads (0 = all cores)")
        ->capture_default_str();
    q->add_flag("--pinned", args->pinned, "Generate into pinned memory of a sim worker");
    q->add_flag("--size-only", args->size_only, "Print shapes and byte totals; allocate nothing");
    q->add_flag("--first-touch", args->first_touch,
                "Also time the floor: allocating the same bytes and touching every page");
    q->add_option("--repeat", args->repeat, "Runs (each on fresh memory); the best is reported")
        ->capture_default_str();
    q->add_flag("--json", args->json, "Print one JSON object instead of text");
    q->add_option("--out", args->out, "Write the arguments to this .safetensors file");
    q->callback([scene, args] { run_fixture(*scene, *args); });
  }
}

}  // namespace pinstage::cli
