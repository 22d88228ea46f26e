// qwen3_dump: the C++ side of the PyTorch checks of the golden (test support, not installed).
//
//   qwen3_dump --layers N --seq-lens S[,S...] [--out-dir DIR] [--seed X] [--runs R]
//
// For each seq_len S it generates the fixture, computes the golden R times (timed) and
// prints one JSON line {"layers", "seq_len", "isa", "seconds": [...]}. With --out-dir it also
// writes DIR/fixture.safetensors (all twenty arguments, at the first S) and, per S,
// DIR/golden_<S>.safetensors: that S's seq_lens and slot_mapping (the only arguments that
// depend on S) plus the golden (out, kv_rows, k_rows, v_rows).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/qwen3/golden.h"
#include "pinstage/safetensors.h"
#include "pinstage/tensor.h"

namespace {

using namespace pinstage;

struct Options {
  int layers = 0;
  std::vector<int> seq_lens;
  std::string out_dir;
  uint64_t seed = qwen3::kDefaultSeed;
  int runs = 1;
};

// One seq_len: generate, time the golden `runs` times, print the JSON line, write files.
void dump(const Options& o, size_t s, PageableAllocator& allocator) {
  qwen3::Config config;
  config.n_layers = o.layers;
  config.seq_len = o.seq_lens[s];
  config.seed = o.seed;
  const TaskArgs args = qwen3::make_args(allocator, config);
  if (!o.out_dir.empty() && s == 0) save_safetensors(args, o.out_dir + "/fixture.safetensors");

  qwen3::Golden golden;
  std::string seconds;
  for (int r = 0; r < o.runs; ++r) {
    const Stopwatch clock;
    golden = qwen3::compute_golden(args, o.layers);
    char text[32];
    std::snprintf(text, sizeof text, "%s%.4f", r ? ", " : "", clock.seconds());
    seconds += text;
  }
  std::printf("{\"layers\": %d, \"seq_len\": %d, \"isa\": \"%s\", \"seconds\": [%s]}\n", o.layers,
              config.seq_len, qwen3::golden_kernels(), seconds.c_str());
  std::fflush(stdout);

  if (!o.out_dir.empty()) {
    TaskArgs saved = qwen3::golden_tensors(golden, allocator);
    saved.add(args.get("seq_lens"));
    saved.add(args.get("slot_mapping"));
    save_safetensors(saved,
                     o.out_dir + "/golden_" + std::to_string(config.seq_len) + ".safetensors");
  }
}

}  // namespace

static int run(int argc, char** argv) {
  CLI::App app{"qwen3_dump: a Qwen3 decode fixture and its goldens, for the PyTorch checks"};
  Options o;
  app.add_option("--layers", o.layers, "Decoder layers")->required()->check(CLI::Range(1, 1 << 20));
  app.add_option("--seq-lens", o.seq_lens, "Comma-separated seq_lens, each in [1, 5500]")
      ->required()
      ->delimiter(',')
      ->check(CLI::Range(1, qwen3::kMaxSeq));
  app.add_option("--out-dir", o.out_dir, "Write fixture.safetensors and golden_<S>.safetensors");
  app.add_option("--seed", o.seed, "Fixture seed")->capture_default_str();
  app.add_option("--runs", o.runs, "Golden runs per seq_len (timed)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
    PageableAllocator allocator;
    for (size_t s = 0; s < o.seq_lens.size(); ++s) dump(o, s, allocator);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qwen3_dump: %s\n", e.what());
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) { return pinstage::run_main("qwen3_dump", run, argc, argv); }
