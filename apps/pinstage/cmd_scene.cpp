// pinstage scene qwen3-decode: generate, golden, then rounds of bind, execute, read back
// and compare. Exits non-zero on any mismatch.
#include <sys/resource.h>

#include <cstdio>

#include "commands.h"
#include "pinstage/qwen3_scene.h"

namespace pinstage::cli {
namespace {

struct SceneArgs {
  std::string backend = "sim";
  int layers = 2;
  int seq_len = qwen3::kDefaultSeqLen;
  uint64_t seed = qwen3::kDefaultSeed;
  int rounds = 1;
  std::string storage = "pinned";
  std::string upload = "direct";
  bool skip_golden = false;
  std::string save_golden;
};

void print_round(const qwen3::SceneRound& round) {
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

int run(const SceneArgs& a) {
  qwen3::SceneOptions options;
  options.config.n_layers = a.layers;
  options.config.seq_len = a.seq_len;
  options.config.seed = a.seed;
  options.rounds = a.rounds;
  options.storage = qwen3::parse_host_storage(a.storage);
  options.skip_golden = a.skip_golden;
  options.save_golden = a.save_golden;
  options.bind.upload = parse_upload_path(a.upload);
  qwen3::validate(options);  // before the worker or any memory is taken

  Worker worker;
  worker.init(a.backend);
  std::printf("qwen3-decode scene: %d layer(s), seq_len %d, seed %llu, %s storage, %s backend\n",
              a.layers, a.seq_len, static_cast<unsigned long long>(a.seed), a.storage.c_str(),
              worker.backend().name.c_str());
  std::fflush(stdout);
  const qwen3::SceneReport report = qwen3::run_scene(worker, options, print_round);
  std::printf("generated %s in %.3f s; golden %.3f s\n", report.args_summary.c_str(),
              report.generate_seconds, report.golden_seconds);
  if (!a.save_golden.empty()) std::printf("golden written to %s\n", a.save_golden.c_str());
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const qwen3::Sizes sizes = qwen3::sizes(options.config);
  const double peak = static_cast<double>(usage.ru_maxrss) * 1024.0;
  const double fixture = static_cast<double>(sizes.total_bytes);
  // Device memory is resident here only where it is host RAM (sim).
  const double device = worker.capabilities().device_memory_is_host ? fixture : 0.0;
  std::printf("peak resident memory %.3f GB = %.3f x (fixture %.3f GB + device %.3f GB in RAM)\n",
              peak / 1e9, peak / (fixture + device), fixture / 1e9, device / 1e9);
  std::printf("%s\n", report.ok() ? "PASS" : "FAIL");
  return report.ok() ? 0 : 1;
}

}  // namespace

void add_scene_command(CLI::App& app) {
  auto* scene = app.add_subcommand("scene", "Run a scene end to end and check it");
  scene->require_subcommand(1);
  auto* cmd = scene->add_subcommand("qwen3-decode", "The Qwen3-14B decode scene");
  static SceneArgs a;
  cmd->add_option("--backend", a.backend, "Backend plugin")->capture_default_str();
  cmd->add_option("--layers", a.layers, "Decoder layers (>= 1)")->capture_default_str();
  cmd->add_option("--seq-len", a.seq_len, "Tokens per lane, [1, 5500]")->capture_default_str();
  cmd->add_option("--seed", a.seed, "Fixture seed")->capture_default_str();
  cmd->add_option("--rounds", a.rounds, "Bind/execute/compare rounds (>= 1)")
      ->capture_default_str();
  cmd->add_option("--storage", a.storage, "Host storage: pageable or pinned")
      ->capture_default_str();
  cmd->add_option("--upload", a.upload, "Upload path: direct or staged")->capture_default_str();
  cmd->add_flag("--skip-golden", a.skip_golden, "Check byte integrity only");
  cmd->add_option("--save-golden", a.save_golden, "Write the golden to FILE.safetensors");
  cmd->callback([] {
    const int status = run(a);
    if (status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace pinstage::cli
