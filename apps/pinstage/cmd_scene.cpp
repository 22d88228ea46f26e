// pinstage scene <scene>: generate, golden, then rounds of bind, execute, read back and
// compare, for any registered scene. Exits non-zero on any mismatch.
#include <sys/resource.h>

#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "pinstage/scene.h"

namespace pinstage::cli {
namespace {

struct SceneArgs {
  SceneValues values;
  std::string backend = "sim";
  int threads = 0;
  int rounds = 1;
  std::string storage = "pinned";
  std::string upload = "direct";
  bool skip_golden = false;
  std::string save_golden;
};

void print_round(const SceneRound& round) {
  const BindReport& b = round.bind;
  std::printf(
      "round %d: alloc %.3f s | upload %.3f s (%.2f GB/s) | verify %.3f s | execute %.3f s | "
      "download %.3f s | release %.3f s | check %.3f s | ",
      round.index, b.phase(BindPhase::device_alloc), b.phase(BindPhase::upload), b.upload_gbps(),
      b.phase(BindPhase::verify), b.phase(BindPhase::execute), b.phase(BindPhase::download),
      b.phase(BindPhase::release), round.check_seconds);
  if (!round.ok()) {
    std::printf("FAILED\n  %s\n", round.failure.c_str());
  } else if (round.comparison) {
    std::printf("matches golden\n");
    for (const auto& t : round.comparison->tensors) std::printf("  %s\n", t.message().c_str());
  } else {
    std::printf("bytes intact (golden skipped)\n");
  }
  std::fflush(stdout);
}

// Peak resident memory against what the run holds: the args, and the device copy where
// device memory is host RAM (sim).
void print_memory(const SceneReport& report, bool device_is_host) {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double peak = static_cast<double>(usage.ru_maxrss) * 1024.0;
  const double fixture = static_cast<double>(report.sizes.total_bytes);
  const double device = device_is_host ? fixture : 0.0;
  std::printf("peak resident memory %.3f GB = %.3f x (fixture %.3f GB + device %.3f GB in RAM)\n",
              peak / 1e9, peak / (fixture + device), fixture / 1e9, device / 1e9);
}

int run(const Scene& scene, const SceneArgs& a) {
  SceneRunOptions options;
  options.values = a.values;
  options.threads = a.threads;
  options.rounds = a.rounds;
  options.storage = parse_host_storage(a.storage);
  options.skip_golden = a.skip_golden;
  options.save_golden = a.save_golden;
  options.bind.upload = parse_upload_path(a.upload);
  validate(scene, options);  // before the worker or any memory is taken
  options.values = resolve_params(scene, options.values);

  Worker worker;
  worker.init(a.backend);
  std::printf("%s scene: %s, %s storage, %s backend\n", scene.name().c_str(),
              scene.describe(options.values).c_str(), a.storage.c_str(),
              worker.backend().name.c_str());
  std::fflush(stdout);
  const SceneReport report = run_scene(worker, scene, options, print_round);
  std::printf("generated %s in %.3f s; golden %.3f s\n", report.args_summary.c_str(),
              report.generate_seconds, report.golden_seconds);
  if (!a.save_golden.empty()) std::printf("golden written to %s\n", a.save_golden.c_str());
  print_memory(report, worker.capabilities().device_memory_is_host);
  std::printf("%s\n", report.ok() ? "PASS" : "FAIL");
  return report.ok() ? 0 : 1;
}

}  // namespace

void add_scene_command(CLI::App& app) {
  auto* scene_cmd = app.add_subcommand("scene", "Run a scene end to end and check it");
  scene_cmd->require_subcommand(1);
  for (const auto& scene : registered_scenes()) {
    auto a = std::make_shared<SceneArgs>();
    auto* cmd = scene_cmd->add_subcommand(scene->name(), scene->description());
    cmd->add_option("--backend", a->backend, "Backend plugin")->capture_default_str();
    add_scene_options(*cmd, *scene, a->values, SizeDefault::scene);
    cmd->add_option("--threads", a->threads, "Generation threads (0 = all cores)")
        ->capture_default_str();
    cmd->add_option("--rounds", a->rounds, "Bind/execute/compare rounds (>= 1)")
        ->capture_default_str();
    cmd->add_option("--storage", a->storage, "Host storage: pageable or pinned")
        ->capture_default_str();
    cmd->add_option("--upload", a->upload, "Upload path: direct or staged")->capture_default_str();
    cmd->add_flag("--skip-golden", a->skip_golden, "Check byte integrity only");
    cmd->add_option("--save-golden", a->save_golden, "Write the golden to FILE.safetensors");
    cmd->callback([scene, a] {
      const int status = run(*scene, *a);
      if (status != 0) throw CLI::RuntimeError(status);
    });
  }
}

}  // namespace pinstage::cli
