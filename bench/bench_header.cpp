// Opening a safetensors header of N tensors (issue 23, defect 1): parse_safetensors_header
// on a synthetic header of N one-byte U8 tensors, best of a few runs, for N from 10,000 to
// 1,000,000, so that the time per tensor shows whether the cost grows linearly.
//   bench_header [N ...]      (default 10000 100000 1000000)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "pinstage/clock.h"
#include "pinstage/safetensors.h"

namespace {

// {"t.0":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},...}: N tensors, N data bytes.
std::string header_of(size_t n) {
  std::string h = "{";
  for (size_t k = 0; k < n; ++k) {
    const std::string at = std::to_string(k);
    h.append(k ? ",\"t." : "\"t.").append(at);
    h.append(R"(":{"dtype":"U8","shape":[1],"data_offsets":[)").append(at).append(",");
    h.append(std::to_string(k + 1)).append("]}");
  }
  return h + "}";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> counts;
  for (int i = 1; i < argc; ++i) counts.push_back(std::strtoull(argv[i], nullptr, 10));
  if (counts.empty()) counts = {10'000, 100'000, 1'000'000};
  std::printf("%10s %12s %12s %14s\n", "tensors", "header MB", "best s", "us per tensor");
  for (size_t n : counts) {
    const std::string text = header_of(n);
    double best = 0.0;
    for (int run = 0; run < (n >= 1'000'000 ? 2 : 3); ++run) {
      const pinstage::Stopwatch clock;
      const pinstage::SafetensorsHeader h = pinstage::parse_safetensors_header(text, n, "bench");
      const double s = clock.seconds();
      if (h.tensors.size() != n) {
        std::fprintf(stderr, "parsed %zu tensors, expected %zu\n", h.tensors.size(), n);
        return 1;
      }
      best = run == 0 ? s : std::min(best, s);
    }
    std::printf("%10zu %12.1f %12.3f %14.2f\n", n, static_cast<double>(text.size()) / 1e6, best,
                best / static_cast<double>(n) * 1e6);
  }
  return 0;
}
