// pinstage_gpu_probe: the GPU check's own measurements, printed as one JSON object.
//  - link: the link's limit, a plain pinned cudaMemcpy host-to-device (and back) of one
//    buffer, best of several; pageable for reference (the driver's bounce).
//  - pinning: time to pin the same size through a cuda pinstage::Worker in each pinned
//    mode (cudaHostAlloc, register with and without huge pages), time to release it, and
//    copies from that buffer through the worker to show they run at link speed. The two
//    default modes alternate for --pin-rounds rounds, so neither pays the machine's first
//    touch of that much memory alone. The breakdown comes from "cuda.pin_stats".
//  - prefault: the register mode's pre-faulting alone (pinstage::map_pages, no CUDA), on
//    one thread and on all, with and without huge pages. --prefault-only measures just
//    this, on any machine.
// Usage (pinstage_gpu_probe --help): [--device N] [--link-mib 1024] [--reps 8]
//   [--pin-mib 8192] [--pin-rounds 2] [--prefault-mib 2048] [--prefault-only]
//   [--plugin PATH] [--json FILE]
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "pinstage/atomic_file.h"
#include "pinstage/backend/cuda_ext.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/pages.h"
#include "pinstage/worker.h"

namespace {

using json = nlohmann::json;

struct Args {
  int device = 0;
  size_t link_mib = 1024;
  int reps = 8;
  size_t pin_mib = 8192;
  int pin_rounds = 2;
  size_t prefault_mib = 2048;
  bool prefault_only = false;
  std::string plugin;
  std::string json_path;

  size_t link_bytes() const { return link_mib << 20; }
  size_t pin_bytes() const { return pin_mib << 20; }
  size_t prefault_bytes() const { return prefault_mib << 20; }
};

// A failed CUDA call of the probe's own measurements.
void check(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return;
  const char* name = cudaGetErrorName(err);
  const char* text = cudaGetErrorString(err);
  throw std::runtime_error(what + ": " + (text ? text : "unknown CUDA error") + " (" +
                           (name ? name : "?") + ")");
}

// An option of `value` within [lo, hi], its default shown in --help.
template <class T>
void add_ranged(CLI::App& app, const char* name, T& value, const char* help, T lo, T hi) {
  app.add_option(name, value, help)->check(CLI::Range(lo, hi))->capture_default_str();
}

// The options, parsed the way the pinstage CLI parses its own (CLI11).
void add_options(CLI::App& app, Args& a) {
  app.add_option("--device", a.device, "CUDA device id")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  add_ranged(app, "--link-mib", a.link_mib, "MiB per copy when measuring the link", size_t{1},
             size_t{1} << 20);
  add_ranged(app, "--reps", a.reps, "Timed copies per measurement", 1, 1000);
  add_ranged(app, "--pin-mib", a.pin_mib, "MiB to pin in each pinned mode", size_t{1},
             size_t{1} << 22);
  add_ranged(app, "--pin-rounds", a.pin_rounds,
             "Rounds of alternating cudaHostAlloc and register-mode pinning", 1, 100);
  add_ranged(app, "--prefault-mib", a.prefault_mib, "MiB to pre-fault alone", size_t{1},
             size_t{1} << 22);
  app.add_flag("--prefault-only", a.prefault_only,
               "Measure only the pre-fault (needs no GPU or driver)");
  app.add_option("--plugin", a.plugin,
                 "The cuda plugin to load (default: libpinstage_backend_cuda.so next to "
                 "libpinstage)");
  app.add_option("--json", a.json_path, "Also write the JSON here (after every section)");
}

double gbps(size_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

json summarize(const std::vector<double>& rates) {
  std::vector<double> r = rates;
  std::sort(r.begin(), r.end());
  return json{{"best_gbps", r.back()},
              {"median_gbps", r[r.size() / 2]},
              {"min_gbps", r.front()},
              {"runs_gbps", rates}};
}

// Times `reps` copies with CUDA events on one stream; returns GB/s per copy.
std::vector<double> time_copies(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                int reps, cudaStream_t stream) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 2; ++i)  // warm-up: first-touch mappings, clocks
    check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "warm-up cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::vector<double> rates;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "cudaMemcpyAsync");
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    rates.push_back(gbps(bytes, ms / 1e3));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return rates;
}

json measure_link(const Args& a) {
  check(cudaSetDevice(a.device), "cudaSetDevice");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  void* dev = nullptr;
  void* pinned = nullptr;
  check(cudaMalloc(&dev, a.link_bytes()), "cudaMalloc");
  check(cudaHostAlloc(&pinned, a.link_bytes(), cudaHostAllocPortable), "cudaHostAlloc");
  std::memset(pinned, 0x5a, a.link_bytes());
  std::vector<char> pageable(a.link_bytes(), 0x5a);
  json link;
  link["bytes"] = a.link_bytes();
  link["reps"] = a.reps;
  link["pinned_h2d"] =
      summarize(time_copies(dev, pinned, a.link_bytes(), cudaMemcpyHostToDevice, a.reps, stream));
  link["pinned_d2h"] =
      summarize(time_copies(pinned, dev, a.link_bytes(), cudaMemcpyDeviceToHost, a.reps, stream));
  link["pageable_h2d"] = summarize(
      time_copies(dev, pageable.data(), a.link_bytes(), cudaMemcpyHostToDevice, a.reps, stream));
  check(cudaFreeHost(pinned), "cudaFreeHost");
  check(cudaFree(dev), "cudaFree");
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return link;
}

// The copy rate from a pinned host buffer to a device buffer: each of `reps` + 1 copies
// timed, the first (a warm-up) dropped.
template <class Copy>
std::vector<double> copy_rates(size_t bytes, int reps, Copy&& copy) {
  std::vector<double> rates;
  pinstage::Stopwatch watch;
  for (int i = 0; i < std::max(2, reps / 2) + 1; ++i) {
    watch.restart();
    copy();
    const double seconds = watch.seconds();
    if (i > 0) rates.push_back(gbps(bytes, seconds));
  }
  return rates;
}

json pinning_row(const Args& a, const std::string& config, double pin_s, double warm_s,
                 double free_s, const std::vector<double>& rates) {
  const double gib = static_cast<double>(a.pin_bytes()) / (1ull << 30);
  json j{{"config", config},       {"bytes", a.pin_bytes()},
         {"pin_seconds", pin_s},   {"pin_gib_per_s", gib / pin_s},
         {"free_seconds", free_s}, {"copy_h2d_wall", summarize(rates)}};
  if (warm_s >= 0) {
    j["warm_pin_seconds"] = warm_s;
    j["warm_over_cold"] = pin_s > 0 ? warm_s / pin_s : 0.0;
  }
  return j;
}

// The vendor's own pinning, for comparison: one cudaHostAlloc of a.pin_bytes().
json measure_host_alloc(const Args& a) {
  check(cudaSetDevice(a.device), "cudaSetDevice");
  pinstage::Stopwatch watch;
  void* host = nullptr;
  check(cudaHostAlloc(&host, a.pin_bytes(), cudaHostAllocPortable), "cudaHostAlloc");
  const double pin_s = watch.seconds();
  const size_t copy_bytes = std::min(a.link_bytes(), a.pin_bytes());
  void* dev = nullptr;
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaMalloc(&dev, copy_bytes), "cudaMalloc");
  const std::vector<double> rates = copy_rates(copy_bytes, a.reps, [&] {
    check(cudaMemcpyAsync(dev, host, copy_bytes, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  });
  check(cudaFree(dev), "cudaFree");
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  watch.restart();
  check(cudaFreeHost(host), "cudaFreeHost");
  json j = pinning_row(a, "cudaHostAlloc", pin_s, -1, watch.seconds(), rates);
  j["mode"] = "alloc";
  return j;
}

// a.pin_bytes() of the runtime's pinned memory (its anonymous source: placed and faulted
// by the runtime, cudaHostRegister'ed by the plugin) under PINSTAGE_HOST_HUGE_PAGES=`huge`,
// copied to the device through the worker, then the pool's hit and its release.
json measure_pinning(const Args& a, const std::string& huge) {
  ::setenv("PINSTAGE_HOST_HUGE_PAGES", huge.c_str(), 1);  // read at init
  pinstage::WorkerOptions options;
  options.plugin_path = a.plugin;
  pinstage::Worker worker;
  worker.init("cuda", a.device, options);
  auto stats_fn =
      reinterpret_cast<ps_cuda_pin_stats_fn>(worker.backend_extension(PS_CUDA_PIN_STATS_NAME));
  if (stats_fn == nullptr)
    throw std::runtime_error(worker.backend().path + " has no " PS_CUDA_PIN_STATS_NAME
                                                     " extension: not the pinstage cuda plugin");
  pinstage::Stopwatch watch;
  pinstage::PinnedHostBuffer host = worker.alloc_pinned_host(a.pin_bytes());
  const double pin_s = watch.seconds();
  ps_cuda_pin_stats s{};
  if (const int status = stats_fn(worker.native_context(), &s); status != PS_OK)
    throw std::runtime_error(std::string(PS_CUDA_PIN_STATS_NAME " failed: ") +
                             ps_status_str(status));
  // The buffer must stage at link speed: a pinned buffer that is not really pinned would
  // fall back to the bounce path and show here.
  const size_t copy_bytes = std::min(a.link_bytes(), a.pin_bytes());
  std::vector<double> rates;
  {
    pinstage::DeviceBuffer dev = worker.alloc_device(copy_bytes);
    rates = copy_rates(copy_bytes, a.reps,
                       [&] { worker.copy_to_device(dev, 0, host.data(), copy_bytes); });
  }
  // The host memory pool: the same request again is a cache hit; empty_cache() is where
  // the memory really goes back (unregistered and unmapped).
  host.reset();
  watch.restart();
  pinstage::PinnedHostBuffer again = worker.alloc_pinned_host(a.pin_bytes());
  const double warm_s = watch.seconds();
  again.reset();
  watch.restart();
  worker.empty_cache();
  const double free_s = watch.seconds();
  const pinstage::HostPlacementInfo placed = worker.host_placement();
  worker.finalize();
  json j = pinning_row(a, "runtime, huge pages " + huge, pin_s, warm_s, free_s, rates);
  j["mode"] = "register";
  j["huge_pages"] = placed.huge_pages;
  j["huge_reason"] = placed.huge_reason;
  j["register_seconds"] = s.last_seconds;
  j["fault_seconds"] = std::max(0.0, pin_s - s.last_seconds);  // placing and faulting
  return j;
}

// Pre-faulting alone, as the runtime's anonymous source does it (the one pre-fault of
// pinstage/pages.h), for 1 thread and the default count, without and with transparent huge pages
// (each size mapped fresh, then unmapped).
json measure_prefault(const Args& a) {
  json runs = json::array();
  const int all = pinstage::prefault_thread_count(a.prefault_bytes(), 0);
  for (bool thp : {false, true}) {
    for (int threads : {1, all}) {
      pinstage::MapOptions options;
      options.threads = threads;
      options.huge_pages = thp;
      options.method = pinstage::PrefaultMethod::populate;  // the runtime's placement's method
      const pinstage::MappedPages pages = pinstage::map_pages(a.prefault_bytes(), options);
      std::string error;
      if (!pinstage::unmap_pages(pages, &error))
        throw std::runtime_error("unmapping the pre-faulted pages: " + error);
      const double gib = static_cast<double>(a.prefault_bytes()) / (1ull << 30);
      runs.push_back({{"huge_pages", thp},
                      {"threads", pages.prefault.threads},
                      {"seconds", pages.prefault.seconds},
                      {"gib_per_s", gib / pages.prefault.seconds},
                      {"populate_write", pages.prefault.populate_write}});
      if (threads == all && all == 1) break;
    }
  }
  return json{{"bytes", a.prefault_bytes()}, {"runs", runs}};
}

void write_json(const json& out, const std::string& path) {
  if (path.empty()) return;
  pinstage::write_file_atomically(path, out.dump(2) + "\n");  // never a half-written report
}

json describe_device(int device) {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (device >= count)
    throw std::runtime_error("device " + std::to_string(device) + " does not exist (" +
                             std::to_string(count) + " visible)");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  char bus[32] = {};
  cudaDeviceGetPCIBusId(bus, sizeof bus, device);
  return {{"id", device},
          {"name", prop.name},
          {"total_bytes", prop.totalGlobalMem},
          {"pci_bus_id", bus},
          {"driver_version", driver},
          {"runtime_version", runtime},
          {"async_engines", prop.asyncEngineCount}};
}

// Where each device's pinned memory really lands (docs/node.md, "Placement"): a worker on
// the device with host_numa_node = the device's node, 64 MiB pinned, and the node of every
// 16th page asked of the kernel (numa_node_of: get_mempolicy MPOL_F_NODE | MPOL_F_ADDR).
json measure_placement(const Args& a) {
  pinstage::WorkerOptions options;
  options.plugin_path = a.plugin;
  json out = json::array();
  for (const pinstage::DeviceInfo& d : pinstage::list_devices("cuda", options)) {
    json row = {{"device", d.id},
                {"pci_bus_id", d.pci_bus_id},
                {"numa_node", d.numa_node},
                {"usable", d.usable}};
    if (d.usable) {
      pinstage::WorkerOptions placed = options;
      if (d.numa_node >= 0) placed.host_numa_node = d.numa_node;
      pinstage::Worker worker;
      worker.init("cuda", d.id, placed);
      constexpr size_t kBytes = size_t{64} << 20;
      pinstage::PinnedHostBuffer host = worker.alloc_pinned_host(kBytes);
      std::map<std::string, uint64_t> pages;
      const size_t step = pinstage::page_size() * 16;
      for (size_t off = 0; off < kBytes; off += step)
        ++pages[std::to_string(pinstage::numa_node_of(static_cast<char*>(host.data()) + off))];
      row["worker_host_numa_node"] = worker.host_numa_node();
      row["sampled_pages_by_node"] = pages;
    }
    std::fprintf(stderr, "probe: placement %s\n", row.dump().c_str());
    out.push_back(std::move(row));
  }
  return out;
}

json run_probe(const Args& a) {
  json out;
  if (a.prefault_only) {
    out["prefault"] = measure_prefault(a);
    return out;
  }
  out["device"] = describe_device(a.device);
  out["host"] = {{"online_cpus", sysconf(_SC_NPROCESSORS_ONLN)},
                 {"physical_bytes", pinstage::physical_memory_bytes()}};
  out["units"] = "GB/s = 1e9 bytes per second; GiB/s = 2^30 bytes per second";
  out["placement"] = measure_placement(a);
  // Partial results reach the file after every section: a run cut short keeps them.
  out["complete"] = false;
  std::fprintf(stderr, "probe: link limit, %zu MiB x %d...\n", a.link_mib, a.reps);
  out["link"] = measure_link(a);
  write_json(out, a.json_path);

  // cudaHostAlloc and the runtime's memory on base pages alternate, round after round, so
  // the first one does not pay the machine's first touch alone; huge pages come last, as
  // they can stall on memory compaction (the stall watch then gives them up).
  out["pinning"] = json::array();
  std::vector<std::string> order;
  for (int round = 0; round < a.pin_rounds; ++round)
    for (const char* config : {"cudaHostAlloc", "off"}) order.emplace_back(config);
  order.emplace_back("thp");
  for (size_t i = 0; i < order.size(); ++i) {
    std::fprintf(stderr, "probe: pinning %zu MiB with %s...\n", a.pin_mib, order[i].c_str());
    json j = order[i] == "cudaHostAlloc" ? measure_host_alloc(a) : measure_pinning(a, order[i]);
    j["round"] = i < order.size() - 1 ? static_cast<int>(i / 2) : 0;
    out["pinning"].push_back(std::move(j));
    write_json(out, a.json_path);
  }
  // The targets compare each way's best round (the later rounds run warm).
  auto best = [&](const std::string& config) {
    double s = 0;
    for (const json& p : out["pinning"])
      if (p["config"] == config && (s == 0 || p["pin_seconds"].get<double>() < s))
        s = p["pin_seconds"].get<double>();
    return s;
  };
  const double alloc_s = best("cudaHostAlloc");
  out["register_speedup"] = alloc_s / best("runtime, huge pages off");
  out["register_speedup_thp"] = alloc_s / best("runtime, huge pages thp");
  write_json(out, a.json_path);
  std::fprintf(stderr, "probe: pre-faulting %zu MiB alone...\n", a.prefault_mib);
  out["prefault"] = measure_prefault(a);
  out["complete"] = true;
  return out;
}

}  // namespace

static int run(int argc, char** argv) {
  CLI::App app{"pinstage_gpu_probe: the GPU check's link and pinning measurements, as JSON"};
  Args args;
  add_options(app, args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    const json out = run_probe(args);
    std::cout << out.dump(2) << std::endl;
    write_json(out, args.json_path);
    return 0;
  } catch (const pinstage::Error& e) {
    std::fprintf(stderr, "pinstage_gpu_probe: error [%s]: %s\n",
                 pinstage::error_code_name(e.code()), e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pinstage_gpu_probe: error: %s\n", e.what());
  }
  return 1;
}

int main(int argc, char** argv) {
  return pinstage::run_main("pinstage_gpu_probe", run, argc, argv);
}
