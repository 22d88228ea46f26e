// The sim backend's link pacing (backend option link_gbps): copies 256 MiB host-to-device
// at a set rate and reports the rate achieved. Pacing holds when `GB/s` is within 10% of
// `target_GB/s` (`ratio` within 0.9..1.1) for rates the host's memcpy can exceed; a rate
// above what memcpy reaches (compare the link_gbps=0 rows) shows memcpy's rate instead. `pinned`
// rows take the direct DMA path, `pageable` rows the bounce path.
//   bench_sim_link --benchmark_filter=Link
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pinstage/clock.h"
#include "pinstage/worker.h"

namespace {

constexpr size_t kBytes = size_t{256} << 20;

// args: link_gbps (0 = unpaced), pinned (1) or pageable (0) source.
void BM_SimLinkUpload(benchmark::State& state) {
  const int64_t gbps = state.range(0);
  const bool pinned = state.range(1) != 0;
  pinstage::Worker worker;
  pinstage::WorkerOptions options;
  options.device_capacity_bytes = kBytes;
  options.config = {{"link_gbps", std::to_string(gbps)}};
  worker.init("sim", 0, options);
  pinstage::DeviceBuffer dev = worker.alloc_device(kBytes);
  pinstage::PinnedHostBuffer pinned_src;
  std::vector<unsigned char> pageable_src;
  const void* src = nullptr;
  if (pinned) {
    pinned_src = worker.alloc_pinned_host(kBytes);
    std::memset(pinned_src.data(), 1, kBytes);
    src = pinned_src.data();
  } else {
    pageable_src.assign(kBytes, 1);
    src = pageable_src.data();
  }
  worker.copy_to_device(dev, 0, src, kBytes);  // warm: every page touched once
  pinstage::Stopwatch watch;
  for (auto _ : state) worker.copy_to_device(dev, 0, src, kBytes);
  const double gbs =
      static_cast<double>(kBytes) * static_cast<double>(state.iterations()) / watch.seconds() / 1e9;
  state.counters["GB/s"] = gbs;
  state.counters["target_GB/s"] = static_cast<double>(gbps);
  // achieved / target: within 0.9..1.1 wherever memcpy alone is faster than the target.
  if (gbps > 0) state.counters["ratio"] = gbs / static_cast<double>(gbps);
  state.SetLabel(pinned ? "pinned" : "pageable");
}

BENCHMARK(BM_SimLinkUpload)
    ->ArgNames({"link_gbps", "pinned"})
    ->ArgsProduct({{0, 1, 2, 5, 10, 55}, {1, 0}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(0.5);

}  // namespace

BENCHMARK_MAIN();
