// Fixture generation: the normal generator per code path (in cache), the first-touch
// floor, and whole fixtures into pageable and pinned memory.
//   ./build/bin/bench_fixture
// items_per_second of BM_NormalBf16 = values per second on one core; bytes_per_second of
// BM_FirstTouch and BM_MakeArgs at the same layer count give the generate / floor ratio
// (the CLI's `--first-touch --repeat` measures the two side by side).
#include <benchmark/benchmark.h>

#include <memory>
#include <optional>
#include <vector>

#include "pinstage/pages.h"
#include "pinstage/parallel.h"
#include "pinstage/qwen3/decode.h"
#include "pinstage/random.h"
#include "pinstage/worker.h"

namespace {

using namespace pinstage;

// 128 Ki bf16 values (256 KiB, in L2) per iteration on one thread.
void BM_NormalBf16(benchmark::State& state) {
  const auto isa = static_cast<GenIsa>(state.range(0));
  if (!gen_isa_supported(isa)) {
    state.SkipWithError("this CPU lacks the path");
    return;
  }
  state.SetLabel(gen_isa_name(isa));
  std::vector<uint16_t> out(1 << 17);
  uint64_t first = 0;
  for (auto _ : state) {
    fill_normal_bf16_with(isa, out.data(), {1234, 2}, first, out.size(), 0.02f, 0.0f);
    first += out.size();
    benchmark::DoNotOptimize(out.data());
  }
  // items_per_second: values per second on one core (1e9 / it = ns per value).
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(out.size()));
}
BENCHMARK(BM_NormalBf16)->DenseRange(0, 3)->ArgName("isa");

qwen3::Config config_of(int layers) {
  qwen3::Config c;
  c.n_layers = layers;
  return c;
}

// Allocate the fixture's storages and write one byte per page on all cores (the floor),
// or populate them with MADV_POPULATE_WRITE (range(1) = 1), as the generator does.
void BM_FirstTouch(benchmark::State& state) {
  const bool populate = state.range(1) != 0;
  const auto specs = qwen3::tensor_specs(config_of(static_cast<int>(state.range(0))));
  PageableAllocator alloc;
  uint64_t bytes = 0;
  for (auto _ : state) {
    std::vector<std::shared_ptr<Storage>> storages;
    storages.reserve(specs.size());
    for (const auto& s : specs) storages.push_back(alloc.allocate(s.nbytes));
    const auto method = populate ? PrefaultMethod::populate : PrefaultMethod::touch;
    for (const auto& s : storages) prefault(s->data(), s->bytes(), 0, 0, method);
    state.PauseTiming();
    for (const auto& s : storages) bytes += s->bytes();
    storages.clear();  // unmapping is not part of the floor
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_FirstTouch)
    ->ArgsProduct({{1, 2}, {0, 1}})
    ->ArgNames({"layers", "populate"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(4);

// Times make_args into `alloc`; freeing the args is left out of the timing.
void time_make_args(benchmark::State& state, HostAllocator& alloc, const qwen3::Config& c) {
  uint64_t bytes = 0;
  for (auto _ : state) {
    std::optional<TaskArgs> args(qwen3::make_args(alloc, c));
    state.PauseTiming();
    bytes += args->total_bytes();
    args.reset();
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}

void BM_MakeArgs(benchmark::State& state) {
  const qwen3::Config c = config_of(static_cast<int>(state.range(0)));
  PageableAllocator alloc;
  time_make_args(state, alloc, c);
}
BENCHMARK(BM_MakeArgs)
    ->Arg(1)
    ->Arg(2)
    ->ArgName("layers")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(4);

// Into a sim worker's pinned memory (pinning included: it is part of the allocation).
void BM_MakeArgsPinned(benchmark::State& state) {
  const qwen3::Config c = config_of(static_cast<int>(state.range(0)));
  Worker worker;
  worker.init("sim");
  PinnedAllocator alloc(worker);
  time_make_args(state, alloc, c);
}
BENCHMARK(BM_MakeArgsPinned)
    ->Arg(1)
    ->ArgName("layers")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
