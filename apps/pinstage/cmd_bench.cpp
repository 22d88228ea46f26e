// pinstage bench qwen3-decode: the pageable-vs-pinned A/B benchmark of the bind phase.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "commands.h"
#include "pinstage/ab_bench.h"
#include "pinstage/error.h"
#include "pinstage/worker.h"

namespace pinstage::cli {

namespace {

struct BenchArgs {
  std::string backend = "sim";
  int layers = 0;
  int seq_len = qwen3::kDefaultSeqLen;
  uint64_t seed = qwen3::kDefaultSeed;
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

void run_bench_command(const BenchArgs& a) {
  ab::BenchConfig config;
  config.backend = a.backend;
  config.layers = a.layers;
  config.seq_len = a.seq_len;
  config.seed = a.seed;
  config.arms = ab::parse_arms(a.arms);
  config.groups = a.groups;
  config.rounds = a.rounds;
  config.keep_cold = a.keep_cold;
  config.baseline = !a.no_baseline;
  config.staging_buffers = a.staging_buffers;
  if (a.staging_buffer_mib < 1 || a.staging_buffer_mib > 1024)
    throw Error(ErrorCode::invalid_argument, "--staging-buffer-mib is " +
                                                 std::to_string(a.staging_buffer_mib) +
                                                 "; it must be in [1, 1024]");
  config.staging_buffer_bytes = a.staging_buffer_mib << 20;
  // Everything that needs no machine figures is checked before the worker starts.
  ab::validate(config);

  Worker worker;
  worker.init(config.backend);
  ab::MemoryBudget budget;
  budget.host_available = ab::read_mem_available();
  budget.device_is_host = worker.capabilities().device_memory_is_host;
  budget.device_capacity = worker.stats().device_capacity_bytes;
  // Fails here, before any argument is allocated, when the size does not fit.
  const ab::LayerPlan plan = ab::plan_layers(config, budget);
  std::fprintf(stderr, "pinstage bench: %s\n", plan.reason.c_str());

  // Opened before the run so a bad path fails now, not after minutes of binds.
  std::unique_ptr<std::ofstream> json;
  if (!a.json_path.empty()) {
    json = std::make_unique<std::ofstream>(a.json_path);
    if (!*json)
      throw Error(ErrorCode::io, "--json: cannot open '" + a.json_path +
                                     "' for writing; check that its directory exists");
  }

  const bool tty = !a.no_progress && isatty(STDERR_FILENO) == 1;
  ab::ProgressFn progress;
  if (tty) {
    progress = [&](const ab::Progress& p) { draw_progress(p, config.groups); };
    ab::Progress start;  // the first step (generating the args) takes a while: show it
    start.total = 1;
    start.arm = config.arms.front();
    start.step = "generate";
    draw_progress(start, config.groups);
  }
  const ab::BenchResult result = ab::run_bench(worker, config, plan, progress);

  std::fputs(ab::format_table(result).c_str(), stdout);
  if (json) {
    *json << ab::to_json(result);
    json->flush();
    if (!*json) throw Error(ErrorCode::io, "--json: writing '" + a.json_path + "' failed");
    std::printf("raw timings written to %s\n", a.json_path.c_str());
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks of the bind phase");
  bench->require_subcommand(1);
  auto args = std::make_shared<BenchArgs>();
  CLI::App* q = bench->add_subcommand(
      "qwen3-decode",
      "A/B benchmark: bind the Qwen3-14B decode arguments from pageable vs pinned (vs staged) "
      "host memory, in interleaved groups, next to a plain memcpy of the same bytes");
  q->add_option("--backend", args->backend, "Backend plugin (sim, cuda)")->capture_default_str();
  q->add_option("--layers", args->layers,
                "Decoder layers (1 GB each); default: the largest that fits in half of "
                "MemAvailable");
  q->add_option("--seq-len", args->seq_len, "Tokens in the KV cache per lane")
      ->capture_default_str();
  q->add_option("--seed", args->seed, "Fixture seed")->capture_default_str();
  q->add_option("--arms", args->arms, "Comma-separated arms in run order: pageable,pinned,staged")
      ->capture_default_str();
  q->add_option("--groups", args->groups, "Groups; each runs every arm once")
      ->capture_default_str();
  q->add_option("--rounds", args->rounds, "Binds per arm per group")->capture_default_str();
  q->add_flag("--keep-cold", args->keep_cold,
              "Keep the first (cold) bind of every arm in the statistics");
  q->add_flag("--no-baseline", args->no_baseline, "Skip the plain memcpy baseline rounds");
  q->add_option("--staging-buffers", args->staging_buffers, "Staging ring buffers (staged arm)")
      ->capture_default_str();
  q->add_option("--staging-buffer-mib", args->staging_buffer_mib,
                "Size of each staging buffer in MiB (staged arm)")
      ->capture_default_str();
  q->add_option("--json", args->json_path, "Write the config, stats and every raw timing here");
  q->add_flag("--no-progress", args->no_progress, "No progress bar even on a terminal");
  q->callback([args] { run_bench_command(*args); });
}

}  // namespace pinstage::cli
