// pinstage scene <scene>: generate, golden, then rounds of bind, execute, read back and
// compare, for any registered scene. Exits non-zero on any mismatch.
#include <sys/resource.h>

#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "pinstage/scene.h"

namespace pinstage::cli {
namespace {

struct SceneArgs {
  SceneValues values;
  BackendArgs backend;
  DeviceArgs devices;
  ReportArgs report;
  int threads = 0;
  int rounds = 1;
  int steps = 1;
  bool full_bind = false;
  std::string storage = "pinned";
  BindOptions bind;  // the bind option flags (kSceneBindFlags) write here
  bool skip_golden = false;
  std::string save_golden;
  bool save_golden_given = false;
  const CLI::App* cmd = nullptr;
};

void print_round(FILE* out, const SceneRound& round, bool steps) {
  const BindReport& b = round.bind;
  std::fprintf(out,
               "%s %d: alloc %.3f s | upload %.3f s (%.2f GB/s) | verify %.3f s | execute %.3f s | "
               "download %.3f s | release %.3f s | check %.3f s | ",
               steps ? "step" : "round", round.index, b.phase(BindPhase::device_alloc),
               b.phase(BindPhase::upload), b.upload_gbps(), b.phase(BindPhase::verify),
               b.phase(BindPhase::execute), b.phase(BindPhase::download),
               b.phase(BindPhase::release), round.check_seconds);
  if (steps)
    std::fprintf(out, "moved %s up, %s down, %zu stayed | ", format_bytes(b.uploaded_bytes).c_str(),
                 format_bytes(b.downloaded_bytes).c_str(), b.stayed_count);
  if (!round.ok()) {
    std::fprintf(out, "FAILED\n  %s\n", round.failure.c_str());
  } else if (round.comparison) {
    std::fprintf(out, "matches golden\n");
    for (const auto& t : round.comparison->tensors)
      std::fprintf(out, "  %s\n", t.message().c_str());
  } else {
    std::fprintf(out, "bytes intact (no golden compared)\n");
  }
  std::fflush(out);
}

// Peak resident memory against what the run holds: the args, and the device copy where
// device memory is host RAM (sim).
double print_memory(const ReportArgs& args, const SceneReport& report, bool device_is_host) {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double peak = static_cast<double>(usage.ru_maxrss) * 1024.0;
  const double fixture = static_cast<double>(report.sizes.total_bytes);
  const double device = device_is_host ? fixture : 0.0;
  chatter(args, "peak resident memory %.3f GB = %.3f x (fixture %.3f GB + device %.3f GB in RAM)\n",
          peak / 1e9, peak / (fixture + device), fixture / 1e9, device / 1e9);
  return peak;
}

nlohmann::ordered_json report_json(const SceneReport& report, double peak_rss) {
  nlohmann::ordered_json rounds = nlohmann::ordered_json::array();
  for (const SceneRound& r : report.rounds) {
    nlohmann::ordered_json round = {{"round", r.index}, {"ok", r.ok()}, {"failure", r.failure}};
    put_fields(round, report_fields(r.bind));  // the BindReport's totals, as Python names them
    put_fields(round["phases"], phase_fields(r.bind.phase_seconds));
    round["check_seconds"] = r.check_seconds;
    round["golden_compared"] = r.comparison.has_value();
    rounds.push_back(std::move(round));
  }
  return {{"scene", report.scene},
          {"storage", report.storage},
          {"args", report.args_summary},
          {"tensors", report.sizes.tensors},
          {"total_bytes", report.sizes.total_bytes},
          {"input_bytes", report.sizes.input_bytes},
          {"generate_seconds", report.generate_seconds},
          {"golden_seconds", report.golden_seconds},
          {"peak_rss_bytes", peak_rss},
          {"ok", report.ok()},
          {"integrity_only", report.integrity_only},
          {"steps", report.steps},
          {"resident", report.resident},
          {"rounds", rounds}};
}

SceneRunOptions run_options(const Scene& scene, const SceneArgs& a) {
  SceneRunOptions options;
  options.values = a.values;
  options.threads = a.threads;
  options.rounds = a.rounds;
  options.steps = a.steps;
  options.resident = !a.full_bind;
  options.storage = parse_host_storage(a.storage);
  options.skip_golden = a.skip_golden;
  options.save_golden = a.save_golden;
  options.bind = a.bind;
  validate(scene, options);  // before the worker or any memory is taken
  options.values = resolve_params(scene, options.values);
  return options;
}

// The scene on one device: its report (with "device"), and the run block of the first.
nlohmann::ordered_json run_on(const Scene& scene, const SceneArgs& a,
                              const SceneRunOptions& options, int device, RunInfo* run) {
  Worker worker;
  worker.init(a.backend.name, device, worker_options(a.backend));
  FILE* out = text_out(a.report);
  const std::string steps =
      a.steps == 1 ? ""
                   : ", " + std::to_string(a.steps) + " steps (" +
                         (a.full_bind ? "a full bind per step" : "resident args") + ")";
  chatter(a.report, "%s scene: %s, %s storage, %s backend, device %d%s\n", scene.name().c_str(),
          scene.describe(options.values).c_str(), a.storage.c_str(), worker.backend().name.c_str(),
          device, steps.c_str());
  std::fflush(out);
  SceneReport report;
  {
    const bool steps = a.steps > 1;
    ProgressTicker ticker(a.report, "generate, golden, then " +
                                        (steps ? plural(static_cast<size_t>(a.steps), "step")
                                               : plural(static_cast<size_t>(a.rounds), "round")));
    report = run_scene(worker, scene, options,
                       [out, steps](const SceneRound& r) { print_round(out, r, steps); });
  }
  if (report.integrity_only)
    std::fprintf(out,
                 "integrity check only: the %s backend runs no host callables, so no execute "
                 "step and no golden comparison; every upload was read back and compared byte "
                 "for byte\n",
                 worker.backend().name.c_str());
  chatter(a.report, "generated %s in %.3f s; golden %.3f s\n", report.args_summary.c_str(),
          report.generate_seconds, report.golden_seconds);
  if (!options.save_golden.empty())
    chatter(a.report, "golden written to %s\n", options.save_golden.c_str());
  const double peak = print_memory(a.report, report, worker.capabilities().device_memory_is_host);
  std::fprintf(out, "%s\n", report.ok() ? "PASS" : "FAIL");
  nlohmann::ordered_json doc = report_json(report, peak);
  doc["device"] = device;
  if (run != nullptr) *run = collect_run_info(&worker, command_options(*a.cmd));
  finish_worker(worker);
  return doc;
}

// --devices 0,1: the scene on each device in turn (one after another, not at once); the
// JSON has one report per device under "devices".
int run(const Scene& scene, const SceneArgs& a) {
  check_report_args(a.report);
  if (a.save_golden_given) check_out_option("--save-golden", a.save_golden);
  const std::vector<int> ids = device_ids(a.devices, a.backend);
  SceneRunOptions options = run_options(scene, a);
  RunInfo run;
  nlohmann::ordered_json devices = nlohmann::ordered_json::array();
  bool ok = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    devices.push_back(run_on(scene, a, options, ids[i], i == 0 ? &run : nullptr));
    ok = ok && devices.back()["ok"].get<bool>();
    options.save_golden.clear();  // the golden is the host's: written once
  }
  if (ids.size() == 1) {
    write_report(a.report, devices[0], run);
    return ok ? 0 : 1;
  }
  std::fprintf(text_out(a.report), "%s on devices %s (one after another)\n", ok ? "PASS" : "FAIL",
               join_ids(ids).c_str());
  write_report(a.report, {{"scene", scene.name()}, {"ok", ok}, {"devices", devices}}, run);
  return ok ? 0 : 1;
}

}  // namespace

void add_scene_command(CLI::App& app) {
  auto* scene_cmd = app.add_subcommand("scene", "Run a scene end to end and check it");
  scene_cmd->require_subcommand(1);
  for (const auto& scene : registered_scenes()) {
    auto a = command_values<SceneArgs>();
    auto* cmd = scene_cmd->add_subcommand(scene->name(), scene->description());
    a->cmd = cmd;
    add_backend_args(*cmd, a->backend);
    add_devices_option(*cmd, a->devices,
                       "several ids run the scene on each in turn, one after another");
    add_scene_options(*cmd, *scene, a->values, SizeDefault::scene);
    add_integer_option(*cmd, "--threads", a->threads, "Generation threads, 0..4096 (0 = all cores)",
                       0, 4096)
        ->capture_default_str();
    add_integer_option(*cmd, "--rounds", a->rounds, "Bind/execute/compare rounds (>= 1)", 1,
                       std::numeric_limits<int>::max())
        ->capture_default_str();
    add_integer_option(*cmd, "--steps", a->steps,
                       "Decode steps (>= 1): each feeds on the last; inputs stay on the device "
                       "and only changes go up",
                       1, std::numeric_limits<int>::max())
        ->capture_default_str();
    cmd->add_flag("--full-bind", a->full_bind,
                  "With --steps: bind every argument every step (the one-shot way) instead of "
                  "keeping them resident");
    cmd->add_option("--storage", a->storage, "Host storage: pageable or pinned")
        ->transform(kLowerCase)
        ->capture_default_str();
    add_bind_option_flags(*cmd, a->bind, kSceneBindFlags);
    cmd->add_flag("--skip-golden", a->skip_golden, "Check byte integrity only");
    cmd->add_option("--save-golden", a->save_golden, "Write the golden to FILE.safetensors")
        ->each([p = a.get()](const std::string&) { p->save_golden_given = true; });
    add_report_options(*cmd, a->report);
    cmd->callback([scene, a] {
      const int status = run(*scene, *a);
      if (status != 0) throw CLI::RuntimeError(status);
    });
  }
}

}  // namespace pinstage::cli
