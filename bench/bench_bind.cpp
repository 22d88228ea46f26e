// The Binder's own overhead per tensor for small tensors, where copies cost almost
// nothing: a full bind versus the same worker calls made by hand; and a large upload
// against a plain memcpy of the same bytes.
//   ./build/bin/bench_bind
// per_tensor = wall time per tensor; the difference between BM_Bind and BM_HandRolled at
// the same arguments is what the Binder adds (report, bookkeeping, checks).
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pinstage/bind.h"
#include "pinstage/clock.h"
#include "pinstage/parallel.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"

namespace {

using namespace pinstage;

Worker& sim_worker() {
  static Worker* worker = [] {
    auto* w = new Worker();  // lives for the process: benchmarks share one device
    w->init("sim");
    return w;
  }();
  return *worker;
}

// n IN tensors of `bytes` each (f32), plus one OUT of the same size.
// n IN tensors and one OUT of `bytes` each, in pageable memory (the storages keep their
// allocator's memory alive on their own).
TaskArgs small_task(int n, int64_t bytes) {
  PageableAllocator alloc;
  TaskArgs args;
  for (int i = 0; i <= n; ++i) {
    std::string name = std::to_string(i);  // not "t" + ...: a GCC 12 -Wrestrict false alarm
    name.insert(0, 1, 't');
    Tensor t = Tensor::empty(std::move(name), DType::f32, {bytes / 4},
                             i == n ? Direction::out : Direction::in, alloc);
    std::memset(t.data(), i & 0xff, t.nbytes());
    args.add(std::move(t));
  }
  return args;
}

void set_counters(benchmark::State& state, int n, int64_t bytes) {
  state.counters["per_tensor"] = benchmark::Counter(
      n + 1, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetBytesProcessed(state.iterations() * n * bytes);
}

// Args: tensors, bytes per tensor, upload path (0 direct, 1 staged), layout (0 arena, 1 per tensor)
void BM_Bind(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int64_t bytes = state.range(1);
  Worker& worker = sim_worker();
  const TaskArgs args = small_task(n, bytes);
  BindOptions opt;
  opt.upload = state.range(2) ? UploadPath::staged : UploadPath::direct;
  opt.layout = state.range(3) ? DeviceLayout::per_tensor : DeviceLayout::arena;
  Binder binder(worker, opt);
  for (auto _ : state) benchmark::DoNotOptimize(binder.run(args));
  set_counters(state, n, bytes);
}

// The same device work as BM_Bind's direct arena case, without the Binder: one
// allocation, an async copy and a stream sync per tensor, a download, the free.
void BM_HandRolled(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int64_t bytes = state.range(1);
  Worker& worker = sim_worker();
  const TaskArgs args = small_task(n, bytes);
  Stream stream = worker.create_stream();
  for (auto _ : state) {
    DeviceBuffer arena =
        worker.alloc_device(static_cast<size_t>((n + 1) * ((bytes + 255) / 256 * 256)));
    size_t off = 0;
    for (const Tensor& t : args) {
      if (t.direction() != Direction::out) {
        worker.copy_to_device_async(arena, off, t.data(), t.nbytes(), stream);
        worker.synchronize(stream);
      } else {
        worker.copy_to_host_async(t.data(), arena, off, t.nbytes(), stream);
        worker.synchronize(stream);
      }
      off += (t.nbytes() + 255) / 256 * 256;
    }
    arena.reset();
  }
  set_counters(state, n, bytes);
}

// Upload throughput of one large tensor against a plain all-cores memcpy of the same
// bytes into device memory of the same kind (sim: host memory, backed at allocation),
// and the effect of the direct path's piece size. Arg: chunk MiB (0 = the memcpy).
void BM_LargeUpload(benchmark::State& state) {
  constexpr int64_t kBytes = int64_t{512} << 20;
  Worker& worker = sim_worker();
  PageableAllocator alloc;
  TaskArgs args;
  args.add(Tensor::empty("w", DType::f32, {kBytes / 4}, Direction::in, alloc));
  std::memset(args.at(0).data(), 0x3c, kBytes);
  BindOptions opt;
  opt.chunk_bytes = static_cast<size_t>(state.range(0)) << 20;
  std::unique_ptr<Binder> binder;
  if (state.range(0) > 0) binder = std::make_unique<Binder>(worker, opt);
  for (auto _ : state) {
    if (binder) {
      state.SetIterationTime(binder->run(args).phase(BindPhase::upload));
    } else {
      DeviceBuffer dst = worker.alloc_device(kBytes);  // untimed, like device_alloc
      const Stopwatch clock;
      parallel_memcpy(dst.data(), args.at(0).data(), kBytes);
      state.SetIterationTime(clock.seconds());
    }
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
}

BENCHMARK(BM_Bind)
    ->ArgNames({"tensors", "bytes", "staged", "per_tensor"})
    ->ArgsProduct({{1, 20, 256}, {64, 4096}, {0, 1}, {0}})
    ->Args({256, 64, 0, 1})
    ->Args({256, 4096, 0, 1});
BENCHMARK(BM_HandRolled)->ArgNames({"tensors", "bytes"})->ArgsProduct({{1, 20, 256}, {64, 4096}});
BENCHMARK(BM_LargeUpload)
    ->ArgName("chunk_mib")
    ->Arg(0)
    ->Arg(1024)
    ->Arg(64)
    ->Arg(8)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
