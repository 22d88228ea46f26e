// The host memory pool's figures (issue 20), side by side in one run on this machine:
//  - a pinned allocation of --gib GiB from an empty pool (a segment mapped, pre-faulted on
//    every core and locked) against the same request from a warm pool (a cache hit);
//  - what empty_cache() gives back, read from /proc (VmLck, VmRSS);
//  - the huge-page policy (PINSTAGE_HOST_HUGE_PAGES=thp against off), interleaved, with
//    its spread;
//  - the memory overhead of 10,000 random odd sizes (1 B to 64 MiB) all live at once,
//    against what power-of-two rounding would reserve for them (no memory is touched:
//    the pool runs over a fake address space).
//   bench_host_pool [--gib N] [--rounds N]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "pinstage/clock.h"
#include "pinstage/worker.h"
#include "runtime/host_memory/host_pool.h"

namespace {

using pinstage::HostMemoryStats;
using pinstage::PinnedHostBuffer;
using pinstage::Stopwatch;
using pinstage::Worker;

uint64_t proc_status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(std::strlen(key))) * 1024;
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct ColdWarm {
  double cold = 0, warm = 0;
};

// One fresh worker: the first request misses (a segment), the second hits.
ColdWarm cold_then_warm(size_t bytes, bool give_back_report) {
  Worker worker;
  worker.init("sim");
  ColdWarm r;
  {
    const Stopwatch t;
    PinnedHostBuffer a = worker.alloc_pinned_host(bytes);
    r.cold = t.seconds();
  }
  {
    const Stopwatch t;
    PinnedHostBuffer b = worker.alloc_pinned_host(bytes);
    r.warm = t.seconds();
  }
  if (give_back_report) {
    const uint64_t cached = worker.host_memory_stats().cached_bytes;
    const uint64_t lck0 = proc_status_bytes("VmLck:"), rss0 = proc_status_bytes("VmRSS:");
    const uint64_t given = worker.empty_cache();
    const uint64_t lck1 = proc_status_bytes("VmLck:"), rss1 = proc_status_bytes("VmRSS:");
    std::printf(
        "empty_cache: cached %.1f MiB, returned %.1f MiB; VmLck fell %.1f MiB, VmRSS fell "
        "%.1f MiB\n",
        cached / 1048576.0, given / 1048576.0, (lck0 - lck1) / 1048576.0,
        (static_cast<double>(rss0) - static_cast<double>(rss1)) / 1048576.0);
  }
  return r;
}

void overhead() {
  pinstage::runtime::HostPool pool;
  std::mt19937_64 rng(20);
  std::uniform_int_distribution<uint64_t> size(1, uint64_t{64} << 20);
  uintptr_t next = uintptr_t{1} << 44;
  uint64_t asked = 0, pow2 = 0;
  for (int i = 0; i < 10'000; ++i) {
    const uint64_t n = size(rng) | 1;
    asked += n;
    pow2 += uint64_t{1} << static_cast<int>(std::ceil(std::log2(static_cast<double>(n))));
    if (!pool.take(n)) {
      const size_t seg = pinstage::runtime::HostPool::segment_bytes_for(n);
      pool.add_segment(
          pinstage::runtime::HostPool::Owned{
              ps_allocation{reinterpret_cast<void*>(next), seg, nullptr},
              pinstage::runtime::SourceKind::anonymous, true},
          0);
      next += seg;
      pool.take(n);
    }
  }
  std::printf(
      "overhead: 10,000 odd sizes, 1 B..64 MiB, %.1f GiB asked: pool reserves %.4fx, "
      "power-of-two rounding would reserve %.4fx\n",
      asked / 1073741824.0, static_cast<double>(pool.stats().reserved_bytes) / asked,
      static_cast<double>(pow2) / asked);
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 1;
  int rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--gib")
      gib = std::stod(argv[i + 1]);
    else if (k == "--rounds")
      rounds = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_host_pool [--gib N] [--rounds N]\n");
      return 2;
    }
  }
  const size_t bytes = static_cast<size_t>(gib * 1073741824.0);
  std::printf("bench_host_pool: %.2f GiB, %d round(s)\n", gib, rounds);
  std::vector<double> cold, warm;
  for (int r = 0; r < rounds; ++r) {
    const ColdWarm cw = cold_then_warm(bytes, r == 0);
    cold.push_back(cw.cold);
    warm.push_back(cw.warm);
  }
  std::printf(
      "pinned alloc of %.2f GiB: cold (empty pool) median %.4f s, warm (cache hit) median "
      "%.6f s: warm/cold %.2e (goal < 0.01)\n",
      gib, median(cold), median(warm), median(warm) / median(cold));
  // Huge pages: interleaved, off then thp, every round.
  std::vector<double> off, thp;
  for (int r = 0; r < rounds; ++r) {
    for (int h = 0; h < 2; ++h) {
      setenv("PINSTAGE_HOST_HUGE_PAGES", h == 0 ? "off" : "thp", 1);
      (h == 0 ? off : thp).push_back(cold_then_warm(bytes, false).cold);
    }
  }
  unsetenv("PINSTAGE_HOST_HUGE_PAGES");
  auto spread = [](const std::vector<double>& v) {
    return std::string("min ") + std::to_string(*std::min_element(v.begin(), v.end())) +
           " median " + std::to_string(median(v)) + " max " +
           std::to_string(*std::max_element(v.begin(), v.end()));
  };
  std::printf("cold alloc, huge pages off: %s s\n", spread(off).c_str());
  std::printf("cold alloc, huge pages thp: %s s\n", spread(thp).c_str());
  overhead();
  return 0;
}
