// The generic scene run: generate, golden once, then rounds of bind, execute, read back
// and compare, with the scene's round reset between rounds.
#include <functional>
#include <memory>
#include <string>

#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/scene.h"

namespace pinstage {
namespace {

// One round: bind (upload, verify, execute, download), compare, reset.
SceneRound run_round(Binder& binder, const Scene& scene, const TaskArgs& args,
                     const SceneGolden* golden, const RoundReset* reset, int index) {
  SceneRound round;
  round.index = index;
  try {
    round.bind = binder.run(args);
  } catch (const BindError& e) {
    round.failure = e.what();  // names the step and the tensor
  }
  const Stopwatch check;
  if (round.ok() && golden != nullptr) {
    round.comparison = scene.compare(args, *golden);
    if (!round.comparison->ok) round.failure = round.comparison->message();
  }
  if (reset != nullptr) {
    for (const std::string& name : reset->restore()) {
      round.caches_intact = false;
      round.failure += (round.failure.empty() ? "" : "; ") + name +
                       ": bytes outside the rows the run writes came back changed";
    }
  }
  round.check_seconds = check.seconds();
  return round;
}

// The steps of a loop: step s > 0 feeds on step s - 1's results (Scene::advance), the golden
// of each step is computed from that step's inputs (the hidden state as read back, the caches
// holding the rows the device wrote), then the step runs and is compared.
void run_steps(Worker& worker, const Scene& scene, const SceneValues& values,
               const SceneRunOptions& options, const TaskArgs& args, const BindOptions& bind,
               bool golden_wanted, SceneReport& report,
               const std::function<void(const SceneRound&)>& on_round) {
  std::unique_ptr<ResidentBinder> resident;
  std::unique_ptr<Binder> binder;
  if (options.resident)
    resident = std::make_unique<ResidentBinder>(worker, args, bind);
  else
    binder = std::make_unique<Binder>(worker, bind);
  for (int s = 0; s < options.steps; ++s) {
    SceneRound round;
    round.index = s + 1;
    if (s > 0) advance_scene_step(worker, scene, values, args, s, resident.get());
    Stopwatch clock;
    std::unique_ptr<SceneGolden> golden;
    if (golden_wanted) golden = scene.compute_golden(args, values);
    report.golden_seconds += clock.restart();
    try {
      round.bind = resident ? resident->step() : binder->run(args);
    } catch (const BindError& e) {
      round.failure = e.what();
    }
    clock.restart();
    if (round.ok() && resident)
      for (const ByteRange& r : scene.written_ranges(args, values))
        resident->download(r.tensor, r.offset, r.bytes);
    if (round.ok() && golden) {
      round.comparison = scene.compare(args, *golden);
      if (!round.comparison->ok)
        round.failure = "step " + std::to_string(s + 1) + ": " + round.comparison->message();
    }
    round.check_seconds = clock.seconds();
    report.rounds.push_back(std::move(round));
    if (on_round) on_round(report.rounds.back());
    if (!report.rounds.back().ok()) break;
  }
}

}  // namespace

void advance_scene_step(Worker& worker, const Scene& scene, const SceneValues& values,
                        const TaskArgs& args, int step, ResidentBinder* resident) {
  const std::vector<std::string> changed = scene.advance(args, values, step);
  if (resident == nullptr) return;
  const auto feeds = worker.capabilities().device_copy
                         ? scene.device_feeds(values)
                         : std::vector<std::pair<std::string, std::string>>{};
  for (const std::string& name : changed) {
    bool fed = false;
    for (const auto& [from, to] : feeds) fed = fed || to == name;
    if (!fed) resident->mark_changed(name);
  }
  for (const auto& [from, to] : feeds) resident->copy_on_device(from, to);
}

const char* host_storage_name(HostStorage storage) {
  return storage == HostStorage::pinned ? "pinned" : "pageable";
}

HostStorage parse_host_storage(std::string_view name) {
  if (name == "pinned") return HostStorage::pinned;
  if (name == "pageable") return HostStorage::pageable;
  throw Error(ErrorCode::invalid_argument,
              "unknown storage '" + std::string(name) + "' (valid: pageable, pinned)");
}

void validate(const Scene& scene, const SceneRunOptions& options) {
  resolve_params(scene, options.values);
  if (options.threads < 0)
    throw Error(ErrorCode::invalid_argument,
                "threads must be >= 0 (0 = all cores), got " + std::to_string(options.threads));
  if (options.rounds < 1)
    throw Error(ErrorCode::invalid_argument,
                "rounds must be >= 1, got " + std::to_string(options.rounds));
  if (options.skip_golden && !options.save_golden.empty())
    throw Error(ErrorCode::invalid_argument,
                "--save-golden needs the golden: drop --skip-golden to save it");
  if (options.steps < 1)
    throw Error(ErrorCode::invalid_argument,
                "steps must be >= 1, got " + std::to_string(options.steps));
  if (options.steps > 1) {
    scene.validate_steps(resolve_params(scene, options.values), options.steps);
    if (options.rounds != 1)
      throw Error(ErrorCode::invalid_argument, "--steps " + std::to_string(options.steps) +
                                                   " runs one loop of steps; "
                                                   "--rounds must be 1 with it, got " +
                                                   std::to_string(options.rounds));
    if (!options.save_golden.empty())
      throw Error(ErrorCode::invalid_argument,
                  "--save-golden saves a single step's golden; drop it or --steps");
  }
  validate(options.bind);
}

bool SceneReport::ok() const noexcept {
  for (const auto& round : rounds)
    if (!round.ok()) return false;
  return !rounds.empty();
}

SceneReport run_scene(Worker& worker, const Scene& scene, const SceneRunOptions& options,
                      const std::function<void(const SceneRound&)>& on_round) {
  validate(scene, options);
  require_chip_worker(worker, "scene " + scene.name());
  const SceneValues values = resolve_params(scene, options.values);
  SceneReport report;
  report.scene = scene.name();
  report.storage = host_storage_name(options.storage);

  PageableAllocator pageable;
  std::unique_ptr<PinnedAllocator> pinned;
  if (options.storage == HostStorage::pinned) pinned = std::make_unique<PinnedAllocator>(worker);
  HostAllocator& allocator =
      pinned ? static_cast<HostAllocator&>(*pinned) : static_cast<HostAllocator&>(pageable);

  Stopwatch clock;
  const TaskArgs args = scene.make_args(allocator, values, options.threads);
  report.generate_seconds = clock.restart();
  report.args_summary = args.summary();
  report.sizes = task_sizes(args);

  // A backend that runs no host callables (acl) cannot execute the step: the run checks
  // integrity only (upload, read back, compare bytes) and says so in the report.
  report.integrity_only = !worker.capabilities().execute;
  BindOptions bind = options.bind;
  bind.execute_callable = report.integrity_only      ? std::string()
                          : options.callable.empty() ? scene.callable()
                                                     : options.callable;
  bind.verify_upload = true;
  if (options.steps > 1) {
    report.steps = options.steps;
    report.resident = options.resident;
    run_steps(worker, scene, values, options, args, bind,
              !options.skip_golden && !report.integrity_only, report, on_round);
    return report;
  }
  std::unique_ptr<SceneGolden> golden;
  // Computed only to be compared or saved: an integrity-only run (acl) compares none.
  if ((!options.skip_golden && !report.integrity_only) || !options.save_golden.empty()) {
    golden = scene.compute_golden(args, values);
    report.golden_seconds = clock.restart();
    if (!options.save_golden.empty()) scene.save_golden(*golden, options.save_golden);
  }
  if (report.integrity_only) golden.reset();  // nothing on the device computed the outputs
  const std::unique_ptr<RoundReset> reset = scene.round_reset(args, values);
  Binder binder(worker, bind);
  for (int r = 1; r <= options.rounds; ++r) {
    report.rounds.push_back(run_round(binder, scene, args, golden.get(), reset.get(), r));
    if (on_round) on_round(report.rounds.back());
    if (!report.rounds.back().ok()) break;
  }
  return report;
}

}  // namespace pinstage
