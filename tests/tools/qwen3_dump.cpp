// qwen3_dump: the C++ side of the PyTorch checks of the golden (test support, not installed).
//
//   qwen3_dump --layers N --seq-lens S[,S...] [--out-dir DIR] [--seed X] [--runs R]
//
// For each seq_len S it generates the fixture, computes the golden R times (timed) and
// prints one JSON line {"layers", "seq_len", "isa", "seconds": [...]}. With --out-dir it also
// writes DIR/fixture.safetensors (all twenty arguments, at the first S) and, per S,
// DIR/golden_<S>.safetensors: that S's seq_lens and slot_mapping (the only arguments that
// depend on S) plus the golden (out, kv_rows, k_rows, v_rows).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "pinstage/error.h"
#include "pinstage/qwen3_decode.h"
#include "pinstage/qwen3_golden.h"
#include "pinstage/safetensors.h"
#include "pinstage/tensor.h"
#include "scenes/qwen3/golden_kernels.h"

namespace {

using namespace pinstage;

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "qwen3_dump: %s\nusage: qwen3_dump --layers N --seq-lens S[,S...] "
               "[--out-dir DIR] [--seed X] [--runs R]\n",
               problem.c_str());
  std::exit(2);
}

long long parse_int(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0') usage(flag + " needs an integer, got '" + text + "'");
  return value;
}

int run(int argc, char** argv) {
  int layers = 0, runs = 1;
  uint64_t seed = qwen3::kDefaultSeed;
  std::vector<int> seq_lens;
  std::string out_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--layers") {
      layers = static_cast<int>(parse_int(flag, value));
    } else if (flag == "--seq-lens") {
      size_t start = 0;
      while (start <= value.size()) {
        const size_t comma = value.find(',', start);
        const size_t stop = comma == std::string::npos ? value.size() : comma;
        seq_lens.push_back(static_cast<int>(parse_int(flag, value.substr(start, stop - start))));
        start = stop + 1;
      }
    } else if (flag == "--out-dir") {
      out_dir = value;
    } else if (flag == "--seed") {
      seed = static_cast<uint64_t>(parse_int(flag, value));
    } else if (flag == "--runs") {
      runs = static_cast<int>(parse_int(flag, value));
    } else {
      usage("unknown option " + flag);
    }
  }
  if (layers < 1) usage("--layers must be >= 1");
  if (seq_lens.empty()) usage("--seq-lens is required");
  if (runs < 1) usage("--runs must be >= 1");

  PageableAllocator allocator;
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    qwen3::Config config;
    config.n_layers = layers;
    config.seq_len = seq_lens[s];
    config.seed = seed;
    const TaskArgs args = qwen3::make_args(allocator, config);
    if (!out_dir.empty() && s == 0) save_safetensors(args, out_dir + "/fixture.safetensors");

    qwen3::Golden golden;
    std::string seconds;
    for (int r = 0; r < runs; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      golden = qwen3::compute_golden(args, layers);
      const double dt =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      char text[32];
      std::snprintf(text, sizeof text, "%s%.4f", r ? ", " : "", dt);
      seconds += text;
    }
    std::printf("{\"layers\": %d, \"seq_len\": %d, \"isa\": \"%s\", \"seconds\": [%s]}\n", layers,
                seq_lens[s], qwen3::detail::isa_name(qwen3::detail::default_isa()),
                seconds.c_str());
    std::fflush(stdout);

    if (!out_dir.empty()) {
      TaskArgs saved = qwen3::golden_tensors(golden, allocator);
      saved.add(args.get("seq_lens"));
      saved.add(args.get("slot_mapping"));
      save_safetensors(saved, out_dir + "/golden_" + std::to_string(seq_lens[s]) + ".safetensors");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qwen3_dump: %s\n", e.what());
    return 1;
  }
}
