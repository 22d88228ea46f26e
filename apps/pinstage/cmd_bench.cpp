// pinstage bench <task>: the pageable-vs-pinned A/B benchmark of the bind phase, for every
// registered scene and for the synthetic task (K tensors of N bytes).
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "pinstage/ab_bench.h"
#include "pinstage/atomic_file.h"
#include "pinstage/error.h"
#include "pinstage/pages.h"
#include "pinstage/settings.h"
#include "pinstage/worker.h"
#include "pinstage/worker_group.h"

namespace pinstage::cli {

namespace {

// The options every task shares.
struct BenchArgs {
  BackendArgs backend;
  DeviceArgs devices;
  ReportArgs report;
  std::string arms = "pageable,pinned";
  int groups = 5;
  int rounds = 6;
  bool keep_cold = false;
  bool no_baseline = false;
  bool no_plot = false;
  BindOptions bind;               // the bind option flags (kBenchBindFlags) write here
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
  config.bind = a.bind;
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

// The group bind of `--devices LIST` (several devices): its table and its JSON section.
// The JSON is kept as text: a struct with a json member has a move that may throw.
struct GroupSection {
  std::string text;
  std::string json;
};

void finish_report(const BenchArgs& a, const ab::BenchResult& result,
                   const GroupSection* group = nullptr) {
  FILE* text = text_out(a.report);
  std::fputs(ab::format_table(result, a.report.quiet).c_str(), text);
  if (group != nullptr) std::fputs(group->text.c_str(), text);
  if (a.report.json.empty()) return;
  std::string json = ab::to_json(result);
  if (group != nullptr) {
    nlohmann::ordered_json doc = nlohmann::ordered_json::parse(json);
    doc["group"] = nlohmann::ordered_json::parse(group->json);
    json = doc.dump(2) + "\n";
  }
  if (a.report.json == "-") {
    std::fputs(json.c_str(), stdout);
    return;
  }
  write_file_atomically(a.report.json, json);
  chatter(a.report, "report with every raw timing: %s\n", a.report.json.c_str());
  if (a.no_plot) return;
  const std::string png = plot_path_for(a.report.json);
  std::string why;
  if (plot_report(a.report.json, png, why))
    chatter(a.report, "picture: %s\n", png.c_str());
  else
    chatter(a.report, "no picture: %s\n", why.c_str());
}

// The group bind's figures, [device][round] after the cold drop, and the node's.
struct GroupSeries {
  std::vector<std::vector<double>> gbps, upload_s, bind_s;
  std::vector<uint64_t> bytes;  // each device's input bytes per bind
  std::vector<double> aggregate_gbps, total_s;
};

// The pinned arm's args made on every member at once (each in its own worker's pinned
// memory, on its team), then --rounds group binds of them, every device at once; the
// first is dropped as cold unless config.keep_cold, as in the A/B.
GroupSeries group_rounds(WorkerGroup& group, const ab::BenchConfig& config,
                         const ab::BenchTask& task, int64_t size, ProgressBar& bar) {
  const size_t n = group.size();
  std::vector<std::unique_ptr<PinnedAllocator>> pinned(n);
  std::vector<TaskArgs> args(n);
  bar.show(0.0, "group bind: generate on " + plural(n, "device"));
  group.run_each([&](size_t i, Worker& worker) {
    pinned[i] = std::make_unique<PinnedAllocator>(worker);
    args[i] = task.make_args(*pinned[i], size);
  });
  BindOptions options = config.bind;
  options.upload = UploadPath::direct;
  GroupBinder binder(group, options);
  GroupSeries s{std::vector<std::vector<double>>(n),
                std::vector<std::vector<double>>(n),
                std::vector<std::vector<double>>(n),
                std::vector<uint64_t>(n),
                {},
                {}};
  for (int r = 0; r < config.rounds; ++r) {
    bar.show(static_cast<double>(r) / config.rounds,
             "group bind " + std::to_string(r + 1) + "/" + std::to_string(config.rounds));
    const GroupBindReport report = binder.run(args);
    if (r == 0 && !config.keep_cold) continue;
    for (size_t i = 0; i < n; ++i) {
      const BindReport& b = report.reports[i];
      s.gbps[i].push_back(b.upload_gbps());
      s.upload_s[i].push_back(b.phase(BindPhase::upload));
      s.bind_s[i].push_back(b.total_seconds);
      s.bytes[i] = b.uploaded_bytes;
    }
    s.aggregate_gbps.push_back(report.upload_gbps());
    s.total_s.push_back(report.total_seconds);
  }
  bar.clear();
  return s;
}

GroupSection group_section(const WorkerGroup& group, const GroupSeries& s) {
  GroupSection out;
  nlohmann::ordered_json j;
  j["arm"] = "pinned";
  j["method"] =
      "args generated per device in its worker's pinned memory; every device binds at once "
      "(GroupBinder); medians over the rounds after the cold drop";
  j["devices"] = group.device_ids();
  j["rounds_used"] = s.total_s.size();
  j["per_device"] = nlohmann::ordered_json::array();
  char line[160];
  std::snprintf(line, sizeof line,
                "\ngroup bind, pinned arm on %s at once (median of %zu rounds):\n"
                "  %-8s %16s %12s %10s %10s\n",
                plural(group.size(), "device").c_str(), s.total_s.size(), "device", "input bytes",
                "upload GB/s", "upload s", "bind s");
  out.text = line;
  for (size_t i = 0; i < group.size(); ++i) {
    const double gbps = ab::median_of(s.gbps[i]), up = ab::median_of(s.upload_s[i]);
    const double bind = ab::median_of(s.bind_s[i]);
    j["per_device"].push_back({{"device", group.device_id(i)},
                               {"input_bytes", s.bytes[i]},
                               {"median_upload_gbps", gbps},
                               {"median_upload_s", up},
                               {"median_bind_s", bind},
                               {"upload_gbps", s.gbps[i]},
                               {"upload_s", s.upload_s[i]},
                               {"bind_s", s.bind_s[i]}});
    std::snprintf(line, sizeof line, "  %-8d %16s %12.2f %10.4f %10.4f\n", group.device_id(i),
                  format_thousands(s.bytes[i]).c_str(), gbps, up, bind);
    out.text += line;
  }
  j["median_aggregate_upload_gbps"] = ab::median_of(s.aggregate_gbps);
  j["median_total_s"] = ab::median_of(s.total_s);
  j["aggregate_upload_gbps"] = s.aggregate_gbps;
  j["total_s"] = s.total_s;
  std::snprintf(line, sizeof line,
                "  aggregate %.2f GB/s (every device's bytes over the slowest upload), group "
                "bind %.4f s\n",
                ab::median_of(s.aggregate_gbps), ab::median_of(s.total_s));
  out.text += line;
  out.json = j.dump();
  return out;
}

// Everything that needs no machine figures is checked (by make_task and make_config)
// before the worker starts; the size is planned before any argument is allocated. With
// --devices listing several, the A/B runs on the first, then the group bind on them all,
// at a size for which every device's args fit.
void run_bench_command(const BenchArgs& a, const std::function<ab::BenchTask()>& make_task,
                       int64_t size) {
  check_report_args(a.report);
  const std::vector<int> ids = device_ids(a.devices, a.backend);
  const ab::BenchTask task = make_task();
  const ab::BenchConfig config = make_config(a, size);
  std::unique_ptr<WorkerGroup> group;
  Worker single;
  Worker* worker = &single;
  if (ids.size() > 1) {
    WorkerGroupOptions options;
    options.worker = worker_options(a.backend);
    group = std::make_unique<WorkerGroup>(a.backend.name, ids, options);
    worker = &group->worker(0);
  } else {
    single.init(config.backend, ids[0], worker_options(a.backend));
  }
  ab::MemoryBudget budget;
  budget.host_available = available_memory_bytes() / ids.size();  // each device's args
  budget.device_is_host = worker->capabilities().device_memory_is_host;
  budget.device_capacity = worker->stats().device_capacity_bytes;
  const ab::SizePlan plan = ab::plan_size(config, task, budget);
  chatter(a.report, "pinstage bench: %s\n", plan.reason.c_str());
  if (group)
    chatter(a.report,
            "devices %s: the A/B on device %d, then a group bind of the pinned arm on every "
            "device at once (sized for 1/%zu of MemAvailable each)\n",
            join_ids(ids).c_str(), ids[0], ids.size());

  ab::BenchResult seed;
  seed.run = collect_run_info(worker, command_options(*a.cmd));
  ProgressBar bar(a.report);
  ab::BenchResult result = ab::run_bench(
      *worker, config, task, plan, progress_fn(bar, config),
      [&](const ab::BenchResult& partial) { write_bench_json(a, partial); }, std::move(seed));
  bar.clear();
  if (!group) {
    finish_report(a, result);
    finish_worker(single);
    return;
  }
  const GroupSection section =
      group_section(*group, group_rounds(*group, config, task, plan.size, bar));
  finish_report(a, result, &section);
  for (size_t i = 0; i < group->size(); ++i) finish_worker(group->worker(i));
}

void add_common_options(CLI::App& q, BenchArgs& args) {
  args.cmd = &q;
  add_backend_args(q, args.backend);
  add_devices_option(q, args.devices,
                     "several ids: after the A/B on the first, a group bind of the pinned arm on "
                     "every device at once, per-device and aggregate upload GB/s (not with "
                     "--steps)");
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
  add_bind_option_flags(q, args.bind, kBenchBindFlags);
  add_mib_alias(q, "--staging-buffer-mib", "staging_buffer_bytes", args.bind.staging_buffer_bytes,
                kBindMaxStagingBufferBytes >> 20);
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
  config.bind = a.bind;
  ab::validate(config);
  const SceneValues resolved = resolve_params(scene, values);
  scene.validate_steps(resolved, steps);
  const int device = single_device(a.devices, a.backend, "bench --steps");
  Worker worker;
  worker.init(a.backend.name, device, worker_options(a.backend));
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
  auto args = command_values<Args>();
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
  auto args = command_values<Args>();
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
