// pinstage fixture qwen3-decode: build the scene's twenty arguments, time it against the
// first-touch floor, optionally write them to a .safetensors file.
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "pinstage/error.h"
#include "pinstage/parallel.h"
#include "pinstage/qwen3_decode.h"
#include "pinstage/safetensors.h"
#include "pinstage/worker.h"
#include "tensor/memory.h"
#include "tensor/random.h"

namespace pinstage::cli {

namespace {

struct FixtureArgs {
  int layers = qwen3::kDefaultLayers;
  int seq_len = qwen3::kDefaultSeqLen;
  uint64_t seed = qwen3::kDefaultSeed;
  int threads = 0;
  bool pinned = false;
  bool size_only = false;
  bool first_touch = false;
  int repeat = 1;
  bool json = false;
  std::string out;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double best(const std::vector<double>& v) {
  double b = v.empty() ? 0.0 : v[0];
  for (double x : v) b = std::min(b, x);
  return b;
}

std::string rate(uint64_t bytes, double s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f s (%.2f GB/s)", s,
                s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0.0);
  return buf;
}

// The floor: the same storages from the same allocator, one byte written per page on
// all cores (or, with `populate`, the pages populated by MADV_POPULATE_WRITE, the way
// the generator does it). Allocation is inside the timing, as it is for generation
// (pinned memory is populated when it is allocated).
double population_floor(HostAllocator& allocator, const std::vector<qwen3::TensorSpec>& specs,
                        int threads, bool populate) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<Storage>> storages;
  storages.reserve(specs.size());
  for (const auto& spec : specs) storages.push_back(allocator.allocate(spec.nbytes));
  for (const auto& s : storages) {
    if (s->bytes() == 0) continue;
    if (populate)
      detail::populate_all(s->data(), s->bytes(), threads);
    else
      detail::first_touch(s->data(), s->bytes(), threads);
  }
  const double s = seconds_since(t0);
  storages.clear();  // unmapping is not part of the floor
  return s;
}

void print_table(const std::vector<qwen3::TensorSpec>& specs) {
  std::printf("%-3s %-17s %-5s %-6s %-20s %18s\n", "#", "name", "dtype", "dir", "shape", "bytes");
  int i = 1;
  for (const auto& spec : specs) {
    std::printf("%-3d %-17s %-5s %-6s %-20s %18s\n", i++, spec.name.c_str(), dtype_name(spec.dtype),
                direction_name(spec.dir), format_shape(spec.shape).c_str(),
                format_thousands(spec.nbytes).c_str());
  }
}

void run_fixture(const FixtureArgs& a) {
  qwen3::Config config;
  config.n_layers = a.layers;
  config.seq_len = a.seq_len;
  config.seed = a.seed;
  config.threads = a.threads;
  // Everything is checked before any memory is taken.
  const std::vector<qwen3::TensorSpec> specs = qwen3::tensor_specs(config);
  const qwen3::Sizes sizes = qwen3::sizes(config);
  if (a.repeat < 1)
    throw Error(ErrorCode::invalid_argument,
                "--repeat is " + std::to_string(a.repeat) + "; it must be >= 1");
  if (a.size_only && (!a.out.empty() || a.first_touch || a.pinned || a.repeat != 1))
    throw Error(ErrorCode::invalid_argument,
                "--size-only allocates nothing: it cannot be combined with --out, --first-touch, "
                "--pinned or --repeat");
  const std::string summary = std::to_string(sizes.tensors) + " tensors, " +
                              std::to_string(sizes.staged_tensors) + " staged, " +
                              format_thousands(sizes.staged_bytes) + " bytes";
  const int threads = a.threads > 0 ? a.threads : default_thread_count();

  nlohmann::ordered_json report;
  report["layers"] = a.layers;
  report["seq_len"] = a.seq_len;
  report["seed"] = a.seed;
  report["tensors"] = sizes.tensors;
  report["staged_tensors"] = sizes.staged_tensors;
  report["staged_bytes"] = sizes.staged_bytes;
  report["total_bytes"] = sizes.total_bytes;

  if (a.size_only) {
    if (a.json) {
      report["size_only"] = true;
      std::printf("%s\n", report.dump(2).c_str());
    } else {
      std::printf("qwen3-decode fixture (size only): %d layer(s), seq_len %d\n", a.layers,
                  a.seq_len);
      print_table(specs);
      std::printf("%s; all %zu tensors %s bytes\n", summary.c_str(), sizes.tensors,
                  format_thousands(sizes.total_bytes).c_str());
    }
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
  const char* isa = detail::gen_isa_name(detail::gen_isa_default());
  if (!a.json)
    std::printf(
        "qwen3-decode fixture: %d layer(s), seq_len %d, seed %llu, %s memory, %d thread(s), "
        "%s generator\n",
        a.layers, a.seq_len, static_cast<unsigned long long>(a.seed), allocator->name().c_str(),
        threads, isa);

  std::vector<double> gen_s, floor_s, populate_s;
  std::optional<TaskArgs> args;
  for (int r = 0; r < a.repeat; ++r) {
    // Side by side: the floor and the generation alternate, each on fresh memory.
    if (a.first_touch) {
      floor_s.push_back(population_floor(*allocator, specs, a.threads, false));
      populate_s.push_back(population_floor(*allocator, specs, a.threads, true));
    }
    args.reset();  // the previous run's memory goes back first
    const auto t0 = std::chrono::steady_clock::now();
    args.emplace(qwen3::make_args(*allocator, config));
    gen_s.push_back(seconds_since(t0));
    if (!a.json && a.repeat > 1) {
      std::printf("  run %d/%d: generate %s", r + 1, a.repeat,
                  rate(sizes.total_bytes, gen_s.back()).c_str());
      if (a.first_touch)
        std::printf(", first-touch %s", rate(sizes.total_bytes, floor_s.back()).c_str());
      std::printf("\n");
    }
  }
  const double gen_best = best(gen_s);
  if (!a.json) {
    std::printf("%s\n", args->summary().c_str());
    std::printf("generate: %s bytes in %s%s\n", format_thousands(sizes.total_bytes).c_str(),
                rate(sizes.total_bytes, gen_best).c_str(), a.repeat > 1 ? " (best run)" : "");
    if (a.first_touch) {
      const double fb = best(floor_s);
      const double pb = best(populate_s);
      std::printf("first-touch floor: %s fresh bytes in %s%s; generate / floor = %.2fx\n",
                  format_thousands(sizes.total_bytes).c_str(), rate(sizes.total_bytes, fb).c_str(),
                  a.repeat > 1 ? " (best run)" : "", fb > 0 ? gen_best / fb : 0.0);
      std::printf("populate only (MADV_POPULATE_WRITE): %s; generate / populate = %.2fx\n",
                  rate(sizes.total_bytes, pb).c_str(), pb > 0 ? gen_best / pb : 0.0);
    }
  }
  report["allocator"] = allocator->name();
  report["threads"] = threads;
  report["generator"] = isa;
  report["summary"] = args->summary();
  report["generate_s"] = gen_s;
  report["generate_best_s"] = gen_best;
  report["generate_best_gbps"] = static_cast<double>(sizes.total_bytes) / gen_best / 1e9;
  if (a.first_touch) {
    report["first_touch_s"] = floor_s;
    report["first_touch_best_s"] = best(floor_s);
    report["generate_over_first_touch"] = gen_best / best(floor_s);
    report["populate_s"] = populate_s;
    report["populate_best_s"] = best(populate_s);
  }
  if (!a.out.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t file_bytes = save_safetensors(*args, a.out);
    const double s = seconds_since(t0);
    report["out"] = a.out;
    report["file_bytes"] = file_bytes;
    report["write_s"] = s;
    if (!a.json)
      std::printf("wrote %s: %s bytes in %s\n", a.out.c_str(), format_thousands(file_bytes).c_str(),
                  rate(file_bytes, s).c_str());
  }
  if (a.json) std::printf("%s\n", report.dump(2).c_str());
}

}  // namespace

void add_fixture_command(CLI::App& app) {
  auto args = std::make_shared<FixtureArgs>();
  CLI::App* fixture = app.add_subcommand("fixture", "Build a scene's arguments (fixture)");
  fixture->require_subcommand(1);
  CLI::App* q = fixture->add_subcommand(
      "qwen3-decode",
      "The Qwen3-14B decode scene's twenty arguments: prints bytes, seconds and GB/s");
  q->add_option("--layers", args->layers, "Decoder layers (>= 1)")->capture_default_str();
  q->add_option("--seq-len", args->seq_len, "Tokens in the KV cache per lane, [1, 5500]")
      ->capture_default_str();
  q->add_option("--seed", args->seed, "Random seed")->capture_default_str();
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
  q->callback([args] { run_fixture(*args); });
}

}  // namespace pinstage::cli
