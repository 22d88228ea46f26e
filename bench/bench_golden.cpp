// Benchmarks of the qwen3 golden: one decode layer at seq_len 3500 on the real fixture
// (the figure compared with PyTorch in bench/golden_vs_torch.py), its largest matrix
// product and one attention work item, each with the AVX-512 and the portable kernels side
// by side. See docs/benchmarks.md ("Golden").
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "pinstage/dtype.h"
#include "pinstage/qwen3/decode.h"
#include "pinstage/qwen3/golden.h"
#include "pinstage/qwen3/kernels.h"
#include "pinstage/tensor.h"

namespace {

using namespace pinstage;
using namespace pinstage::qwen3;
namespace D = pinstage::qwen3::kernels;

// The 1-layer fixture at seq_len 3500, generated on first use (1 GB).
const TaskArgs& fixture() {
  static PageableAllocator allocator;
  static const TaskArgs args = [] {
    Config config;
    config.n_layers = 1;
    config.seq_len = 3500;
    return make_args(allocator, config);
  }();
  return args;
}

bool skip_unsupported(benchmark::State& state, D::Isa isa) {
  if (D::isa_supported(isa)) return false;
  state.SkipWithError("kernel set not supported on this CPU");
  return true;
}

// One full decode layer (every step of the spec, all cores).
void BM_GoldenLayer(benchmark::State& state) {
  const auto isa = static_cast<D::Isa>(state.range(0));
  if (skip_unsupported(state, isa)) return;
  DecodeBuffers buf = decode_buffers(fixture(), 1);
  buf.out = nullptr;
  Golden golden;
  for (auto _ : state) {
    D::run_decode_with(buf, 1, false, &golden, isa, 0);
    benchmark::DoNotOptimize(golden.out.data());
  }
  state.SetLabel(D::isa_name(isa));
  // Weight bytes one layer reads.
  const double weights =
      2.0 * (2.0 * kHidden * kHidden + 2.0 * kHidden * kKvHidden + 3.0 * kHidden * kIntermediate);
  state.SetBytesProcessed(static_cast<int64_t>(weights) * state.iterations());
}
BENCHMARK(BM_GoldenLayer)
    ->Arg(static_cast<int>(D::Isa::avx512))
    ->Arg(static_cast<int>(D::Isa::generic))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);

// y[16][17408] = x[16][5120] @ w_gate on one core: the kernel alone.
void BM_Gemm16Gate(benchmark::State& state) {
  const auto isa = static_cast<D::Isa>(state.range(0));
  if (skip_unsupported(state, isa)) return;
  const auto* w = fixture().get("w_gate").data_as<uint16_t>();
  std::vector<float> xT(static_cast<size_t>(kHidden) * D::kLanes);
  for (size_t i = 0; i < xT.size(); ++i) xT[i] = bf16_round(0.001f * static_cast<float>(i % 997));
  std::vector<float> y(static_cast<size_t>(D::kLanes) * kIntermediate);
  const int tiles = kIntermediate / D::kTile;
  constexpr int kPanel = 128;  // as the decode uses
  std::vector<float> acc(static_cast<size_t>(kPanel) * D::kLanes * D::kTile);
  for (auto _ : state) {
    for (int t = 0; t < tiles; t += kPanel)
      D::gemm16(isa, xT.data(), kHidden, w, kIntermediate, t, std::min(tiles, t + kPanel),
                acc.data(), y.data(), kIntermediate);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(D::isa_name(isa));
  state.SetBytesProcessed(int64_t{2} * kHidden * kIntermediate * state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * D::kLanes * kHidden * kIntermediate,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Gemm16Gate)
    ->Arg(static_cast<int>(D::Isa::avx512))
    ->Arg(static_cast<int>(D::Isa::generic))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// One (lane, kv head) attention item over 3500 rows of the real pool, on one core.
void BM_AttendOneHead(benchmark::State& state) {
  const auto isa = static_cast<D::Isa>(state.range(0));
  if (skip_unsupported(state, isa)) return;
  const int S = 3500;
  const auto* k = fixture().get("k_cache").data_as<uint16_t>();
  const auto* v = fixture().get("v_cache").data_as<uint16_t>();
  std::vector<const uint16_t*> krow(S), vrow(S);
  for (int i = 0; i < S; ++i) {
    const int64_t row = (int64_t{i} * kNumKvHeads + 3) * kHeadDim;  // lane 0, kv head 3
    krow[i] = k + row;
    vrow[i] = v + row;
  }
  std::vector<float> q(kQPerKv * kHeadDim), scores(kQPerKv * S), out(kQPerKv * kHeadDim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = bf16_round(0.01f * static_cast<float>(i % 31));
  for (auto _ : state) {
    D::attend(isa, q.data(), krow.data(), vrow.data(), S, scores.data(), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(D::isa_name(isa));
  state.SetBytesProcessed(int64_t{2} * S * kHeadDim * 2 * state.iterations());
}
BENCHMARK(BM_AttendOneHead)
    ->Arg(static_cast<int>(D::Isa::avx512))
    ->Arg(static_cast<int>(D::Isa::generic))
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
