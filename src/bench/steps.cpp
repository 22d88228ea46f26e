// The decode-steps benchmark: N steps of a scene with resident args against a full bind per
// step, side by side in one run (docs/bind.md, "Resident args").
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/refuse.h"
#include "pinstage/ab_bench.h"
#include "pinstage/names.h"

namespace pinstage::ab {
namespace {

constexpr const char* kStepModeNames[] = {"resident", "full"};  // StepMode order
// The targets issue 25 set for a decode step: staging at least 20x cheaper resident, and a
// resident step moving under 0.1% of a full bind's bytes.
constexpr double kStagingSpeedupTarget = 20.0;
constexpr double kMovedFractionTarget = 0.001;

StepRecord record_of(int group, StepMode mode, const BindReport& report) {
  StepRecord r;
  r.group = group;
  r.mode = mode;
  r.step = report.step;
  r.staging_seconds = report.staging_seconds();
  r.execute_seconds = report.phase(BindPhase::execute);
  r.uploaded_bytes = report.uploaded_bytes;
  r.downloaded_bytes = report.downloaded_bytes;
  return r;
}

// One mode's N steps; `args` start at step 0's inputs and are put back there first.
void run_mode(Worker& worker, const Scene& scene, const SceneValues& values,
              const StepsBenchConfig& config, const BindOptions& bind, const TaskArgs& args,
              int group, StepMode mode, StepsBenchResult& result,
              const std::function<void(const std::string&)>& progress) {
  std::unique_ptr<ResidentBinder> resident;
  std::unique_ptr<Binder> binder;
  if (mode == StepMode::resident)
    resident = std::make_unique<ResidentBinder>(worker, args, bind, false);
  else
    binder = std::make_unique<Binder>(worker, bind);
  for (int s = 0; s < config.steps; ++s) {
    if (s > 0) advance_scene_step(worker, scene, values, args, s, resident.get());
    BindReport report = resident ? resident->step() : binder->run(args);
    report.step = s + 1;  // a one-shot bind numbers no steps
    result.records.push_back(record_of(group, mode, report));
    if (progress)
      progress("group " + std::to_string(group + 1) + "/" + std::to_string(config.groups) + " " +
               step_mode_name(mode) + " step " + std::to_string(s + 1) + "/" +
               std::to_string(config.steps));
  }
}

void summarize(StepsBenchResult& result) {
  for (size_t m = 0; m < 2; ++m) {
    std::vector<double> staging, execute, moved;
    for (const StepRecord& r : result.records) {
      if (static_cast<size_t>(r.mode) != m || r.step < 2) continue;
      staging.push_back(r.staging_seconds);
      execute.push_back(r.execute_seconds);
      moved.push_back(static_cast<double>(r.uploaded_bytes + r.downloaded_bytes));
    }
    result.median_staging_seconds[m] = median_of(staging);
    result.median_execute_seconds[m] = median_of(execute);
    result.median_moved_bytes[m] = median_of(moved);
  }
  const auto res = static_cast<size_t>(StepMode::resident);
  const auto full = static_cast<size_t>(StepMode::full);
  result.staging_speedup =
      result.median_staging_seconds[res] > 0.0
          ? result.median_staging_seconds[full] / result.median_staging_seconds[res]
          : 0.0;
  result.moved_fraction = result.median_moved_bytes[full] > 0.0
                              ? result.median_moved_bytes[res] / result.median_moved_bytes[full]
                              : 0.0;
}

std::string fixed(double value, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

}  // namespace

const char* step_mode_name(StepMode mode) { return enum_name(mode, kStepModeNames, "unknown"); }

void validate(const StepsBenchConfig& config) {
  if (config.steps < 2)
    detail::refuse_number("--steps", config.steps,
                          "the steps benchmark needs at least 2 (step 1 uploads everything in "
                          "both modes; steps 2..N are what it compares)");
  if (config.groups < 1) detail::refuse_number("--groups", config.groups, "it must be >= 1");
  validate(config.bind);
}

StepsBenchResult run_steps_bench(Worker& worker, const Scene& scene, const SceneValues& values,
                                 const StepsBenchConfig& config,
                                 const std::function<void(const std::string&)>& progress) {
  validate(config);
  const SceneValues resolved = resolve_params(scene, values);
  scene.validate_steps(resolved, config.steps);
  require_chip_worker(worker, "bench " + scene.name() + " --steps");
  StepsBenchResult result;
  result.config = config;
  result.scene = scene.name();
  result.description = scene.describe(resolved);
  BindOptions bind = config.bind;
  bind.execute_callable = worker.capabilities().execute ? scene.callable() : std::string();
  bind.verify_upload = false;
  PinnedAllocator pinned(worker);
  const TaskArgs args = scene.make_args(pinned, resolved, 0);
  result.sizes = task_sizes(args);
  // Each mode starts from step 0's inputs: what a step changes is small (Scene::advance
  // writes a decode's hidden state and positions), so the IN tensors up to 64 MiB are kept
  // and put back; the weights are never written by a step.
  constexpr uint64_t kSmall = uint64_t{64} << 20;
  std::vector<std::pair<const Tensor*, std::vector<unsigned char>>> start;
  for (const Tensor& t : args)
    if (t.direction() == Direction::in && t.nbytes() <= kSmall) {
      const auto* p = static_cast<const unsigned char*>(t.data());
      start.emplace_back(&t, std::vector<unsigned char>(p, p + t.nbytes()));
    }
  for (int g = 0; g < config.groups; ++g) {
    for (int k = 0; k < 2; ++k) {
      const auto mode = static_cast<StepMode>((g + k) % 2);  // alternate which goes first
      for (const auto& [t, bytes] : start) std::memcpy(t->data(), bytes.data(), bytes.size());
      run_mode(worker, scene, resolved, config, bind, args, g, mode, result, progress);
    }
  }
  summarize(result);
  return result;
}

std::string format_steps_table(const StepsBenchResult& r) {
  std::string out = r.scene + ", " + r.description + ": " + std::to_string(r.config.steps) +
                    " steps x " + std::to_string(r.config.groups) + " groups per mode\n";
  out += "step  mode      staging ms   execute ms   uploaded B      downloaded B\n";
  for (int step = 1; step <= r.config.steps; ++step)
    for (const StepMode mode : {StepMode::resident, StepMode::full}) {
      std::vector<double> staging, execute;
      uint64_t up = 0, down = 0;
      for (const StepRecord& rec : r.records) {
        if (rec.step != step || rec.mode != mode) continue;
        staging.push_back(rec.staging_seconds);
        execute.push_back(rec.execute_seconds);
        up = rec.uploaded_bytes;
        down = rec.downloaded_bytes;
      }
      if (staging.empty()) continue;
      char line[160];
      std::snprintf(line, sizeof line, "%4d  %-8s %11.3f %12.3f %16s %16s\n", step,
                    step_mode_name(mode), median_of(staging) * 1e3, median_of(execute) * 1e3,
                    format_thousands(up).c_str(), format_thousands(down).c_str());
      out += line;
    }
  const auto res = static_cast<size_t>(StepMode::resident);
  const auto full = static_cast<size_t>(StepMode::full);
  out += "steps 2.." + std::to_string(r.config.steps) + ", median: staging " +
         fixed(r.median_staging_seconds[res] * 1e3, "%.3f") + " ms resident vs " +
         fixed(r.median_staging_seconds[full] * 1e3, "%.3f") + " ms full (execute " +
         fixed(r.median_execute_seconds[res] * 1e3, "%.1f") + " vs " +
         fixed(r.median_execute_seconds[full] * 1e3, "%.1f") + " ms)\n";
  out += "target: staging >= 20x lower resident: " + fixed(r.staging_speedup, "%.1f") + "x, " +
         (r.staging_speedup >= kStagingSpeedupTarget ? "met" : "NOT met") + "\n";
  out += "target: a resident step moves < 0.1% of a full bind's bytes: " +
         fixed(r.moved_fraction * 100.0, "%.4f") + "% (" +
         format_thousands(static_cast<uint64_t>(r.median_moved_bytes[res])) + " of " +
         format_thousands(static_cast<uint64_t>(r.median_moved_bytes[full])) + " bytes), " +
         (r.moved_fraction < kMovedFractionTarget ? "met" : "NOT met") + "\n";
  return out;
}

std::string steps_to_json(const StepsBenchResult& r) {
  nlohmann::ordered_json records = nlohmann::ordered_json::array();
  for (const StepRecord& rec : r.records)
    records.push_back({{"group", rec.group},
                       {"mode", step_mode_name(rec.mode)},
                       {"step", rec.step},
                       {"staging_seconds", rec.staging_seconds},
                       {"execute_seconds", rec.execute_seconds},
                       {"uploaded_bytes", rec.uploaded_bytes},
                       {"downloaded_bytes", rec.downloaded_bytes}});
  nlohmann::ordered_json medians;
  for (const StepMode mode : {StepMode::resident, StepMode::full}) {
    const auto m = static_cast<size_t>(mode);
    medians[step_mode_name(mode)] = {{"staging_seconds", r.median_staging_seconds[m]},
                                     {"execute_seconds", r.median_execute_seconds[m]},
                                     {"moved_bytes", r.median_moved_bytes[m]}};
  }
  nlohmann::ordered_json doc;
  doc["run"] = nlohmann::ordered_json::parse(run_info_json(r.run));
  doc["kind"] = "steps";
  doc["scene"] = r.scene;
  doc["description"] = r.description;
  doc["steps"] = r.config.steps;
  doc["groups"] = r.config.groups;
  doc["input_bytes"] = r.sizes.input_bytes;
  doc["medians_steps_2_to_n"] = medians;
  doc["staging_speedup"] = r.staging_speedup;
  doc["staging_speedup_target"] = kStagingSpeedupTarget;
  doc["moved_fraction"] = r.moved_fraction;
  doc["moved_fraction_target"] = kMovedFractionTarget;
  doc["records"] = records;
  return doc.dump(2) + "\n";
}

}  // namespace pinstage::ab
