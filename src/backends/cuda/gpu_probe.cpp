// pinstage_gpu_probe: the GPU check's own measurements, printed as one JSON object.
//  - link: the link's limit, a plain pinned cudaMemcpy host-to-device (and back) of one
//    buffer, best of several; pageable for reference (the driver's bounce).
//  - pinning: time to pin the same size through the cuda plugin in each pinned mode
//    (cudaHostAlloc, register with and without huge pages), time to release it, and one
//    copy from that buffer through the plugin to show it runs at link speed.
//  - prefault: the register mode's pre-faulting alone (no CUDA), on one thread and on
//    all, with and without huge pages. --prefault-only measures just this, on any machine.
// Usage: pinstage_gpu_probe [--device N] [--link-mib 1024] [--reps 8] [--pin-gib 8]
//                           [--prefault-gib 2] [--prefault-only] [--plugin PATH]
//                           [--json FILE]
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/cuda_ext.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/host_pages.h"
#include "pinstage/platform_abi.h"

namespace {

using json = nlohmann::json;

struct Args {
  int device = 0;
  size_t link_bytes = size_t{1} << 30;
  int reps = 8;
  size_t pin_bytes = size_t{8} << 30;
  size_t prefault_bytes = size_t{2} << 30;
  bool prefault_only = false;
  std::string plugin;
  std::string json_path;
};

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "pinstage_gpu_probe: %s\n", message.c_str());
  std::exit(1);
}

void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) die(what + ": " + pinstage::cuda::cuda_error_text(err));
}

uint64_t parse_count(const std::string& flag, const char* text) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || v == 0) die(flag + " needs a positive whole number");
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::puts(
          "pinstage_gpu_probe [--device N] [--link-mib 1024] [--reps 8] [--pin-gib 8] "
          "[--prefault-gib 2] [--prefault-only] [--plugin PATH] [--json FILE]");
      std::exit(0);
    }
    if (flag == "--prefault-only") {
      a.prefault_only = true;
      continue;
    }
    if (i + 1 >= argc) die(flag + " needs a value (see --help)");
    const char* value = argv[++i];
    if (flag == "--device")
      a.device = std::atoi(value);
    else if (flag == "--link-mib")
      a.link_bytes = parse_count(flag, value) << 20;
    else if (flag == "--reps")
      a.reps = static_cast<int>(parse_count(flag, value));
    else if (flag == "--pin-gib")
      a.pin_bytes = parse_count(flag, value) << 30;
    else if (flag == "--prefault-gib")
      a.prefault_bytes = parse_count(flag, value) << 30;
    else if (flag == "--plugin")
      a.plugin = value;
    else if (flag == "--json")
      a.json_path = value;
    else
      die("unknown option " + flag + " (see --help)");
  }
  if (a.plugin.empty()) {
    // Beside the build's lib folder: <build>/bin/pinstage_gpu_probe -> <build>/lib.
    const auto exe = std::filesystem::read_symlink("/proc/self/exe");
    a.plugin = (exe.parent_path().parent_path() / "lib" / "libpinstage_backend_cuda.so").string();
  }
  return a;
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
  check(cudaMalloc(&dev, a.link_bytes), "cudaMalloc");
  check(cudaHostAlloc(&pinned, a.link_bytes, cudaHostAllocPortable), "cudaHostAlloc");
  std::memset(pinned, 0x5a, a.link_bytes);
  std::vector<char> pageable(a.link_bytes, 0x5a);
  json link;
  link["bytes"] = a.link_bytes;
  link["reps"] = a.reps;
  link["pinned_h2d"] =
      summarize(time_copies(dev, pinned, a.link_bytes, cudaMemcpyHostToDevice, a.reps, stream));
  link["pinned_d2h"] =
      summarize(time_copies(pinned, dev, a.link_bytes, cudaMemcpyDeviceToHost, a.reps, stream));
  link["pageable_h2d"] = summarize(
      time_copies(dev, pageable.data(), a.link_bytes, cudaMemcpyHostToDevice, a.reps, stream));
  check(cudaFreeHost(pinned), "cudaFreeHost");
  check(cudaFree(dev), "cudaFree");
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return link;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Plugin {
  const ps_platform_api* api = nullptr;
  ps_cuda_pin_stats_fn pin_stats = nullptr;
};

Plugin load_plugin(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) die("dlopen " + path + ": " + dlerror());
  auto entry =
      reinterpret_cast<ps_platform_entry_fn>(dlsym(handle, PINSTAGE_PLATFORM_ENTRY_SYMBOL));
  auto stats =
      reinterpret_cast<ps_cuda_pin_stats_fn>(dlsym(handle, PINSTAGE_CUDA_PIN_STATS_SYMBOL));
  if (entry == nullptr || stats == nullptr) die(path + " is not the pinstage cuda plugin");
  return Plugin{entry(), stats};
}

void check_ps(const Plugin& p, int status, const std::string& what) {
  if (status != PS_OK)
    die(what + " failed: " + ps_status_str(status) + " (" + p.api->last_error() + ")");
}

// Pins a.pin_bytes through the plugin under `config`, copies link_bytes of it to the
// device through the plugin, releases it.
json measure_pinning(const Args& a, const Plugin& p, const std::string& config) {
  const ps_context_options options{0, config.c_str()};
  ps_device_ctx* ctx = nullptr;
  check_ps(p, p.api->create_context(a.device, &options, &ctx), "create_context(" + config + ")");
  void* host = nullptr;
  auto t0 = std::chrono::steady_clock::now();
  check_ps(p, p.api->host_alloc_pinned(ctx, a.pin_bytes, &host), "host_alloc_pinned");
  const double pin_s = since(t0);
  ps_cuda_pin_stats s{};
  check_ps(p, p.pin_stats(ctx, &s), "pin_stats");

  // The buffer must stage at link speed: a pinned buffer that is not really pinned would
  // fall back to the bounce path and show here.
  const size_t copy_bytes = std::min(a.link_bytes, a.pin_bytes);
  void* dev = nullptr;
  check_ps(p, p.api->device_malloc(ctx, copy_bytes, &dev), "device_malloc");
  std::vector<double> rates;
  for (int i = 0; i < std::max(2, a.reps / 2) + 1; ++i) {
    t0 = std::chrono::steady_clock::now();
    check_ps(p, p.api->copy_h2d(ctx, dev, host, copy_bytes), "copy_h2d");
    if (i > 0) rates.push_back(gbps(copy_bytes, since(t0)));  // the first is a warm-up
  }
  check_ps(p, p.api->device_free(ctx, dev), "device_free");

  t0 = std::chrono::steady_clock::now();
  check_ps(p, p.api->host_free_pinned(ctx, host), "host_free_pinned");
  const double free_s = since(t0);
  check_ps(p, p.api->destroy_context(ctx), "destroy_context");

  const double gib = static_cast<double>(a.pin_bytes) / (1ull << 30);
  json j{{"config", config},
         {"bytes", a.pin_bytes},
         {"mode", s.last_mode == PS_CUDA_PIN_REGISTER ? "register" : "alloc"},
         {"pin_seconds", pin_s},
         {"pin_gib_per_s", gib / pin_s},
         {"free_seconds", free_s},
         {"copy_h2d_wall", summarize(rates)}};
  if (s.last_mode == PS_CUDA_PIN_REGISTER) {
    j["map_seconds"] = s.last_map_seconds;
    j["prefault_seconds"] = s.last_prefault_seconds;
    j["prefault_threads"] = s.last_prefault_threads;
    j["populate_write"] = s.last_populate_write != 0;
    j["register_seconds"] = s.last_register_seconds;
  }
  return j;
}

// Pre-faulting alone, as register mode does it, for 1 thread and the default count,
// without and with transparent huge pages (each size mapped fresh, then unmapped).
json measure_prefault(const Args& a) {
  json runs = json::array();
  const int all = pinstage::cuda::prefault_thread_count(a.prefault_bytes, {});
  for (bool thp : {false, true}) {
    for (int threads : {1, all}) {
      pinstage::cuda::MappedPages pages;
      pinstage::cuda::PrefaultReport report;
      std::string error;
      if (pinstage::cuda::map_prefaulted(a.prefault_bytes, {threads, thp}, pages, report, error) !=
          pinstage::cuda::PagesStatus::ok)
        die("pre-faulting " + std::to_string(a.prefault_bytes) + " bytes: " + error);
      pinstage::cuda::unmap_pages(pages, error);
      const double gib = static_cast<double>(a.prefault_bytes) / (1ull << 30);
      runs.push_back({{"huge_pages", thp},
                      {"threads", report.threads},
                      {"seconds", report.prefault_seconds},
                      {"gib_per_s", gib / report.prefault_seconds},
                      {"populate_write", report.populate_write}});
      if (threads == all && all == 1) break;
    }
  }
  return json{{"bytes", a.prefault_bytes}, {"runs", runs}};
}

void emit(const json& out, const Args& a) {
  const std::string text = out.dump(2);
  std::cout << text << std::endl;
  if (!a.json_path.empty()) {
    std::ofstream f(a.json_path);
    f << text << '\n';
    if (!f) die("cannot write " + a.json_path);
  }
}

int run(int argc, char** argv) {
  const Args a = parse_args(argc, argv);
  json out;
  if (a.prefault_only) {
    out["prefault"] = measure_prefault(a);
    emit(out, a);
    return 0;
  }
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (a.device < 0 || a.device >= count)
    die("device " + std::to_string(a.device) + " does not exist (" + std::to_string(count) +
        " visible)");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, a.device), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  char bus[32] = {};
  cudaDeviceGetPCIBusId(bus, sizeof bus, a.device);
  out["device"] = {{"id", a.device},
                   {"name", prop.name},
                   {"total_bytes", prop.totalGlobalMem},
                   {"pci_bus_id", bus},
                   {"driver_version", driver},
                   {"runtime_version", runtime},
                   {"async_engines", prop.asyncEngineCount}};
  out["host"] = {{"online_cpus", sysconf(_SC_NPROCESSORS_ONLN)},
                 {"physical_bytes", static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                                        static_cast<uint64_t>(sysconf(_SC_PAGESIZE))}};
  out["units"] = "GB/s = 1e9 bytes per second; GiB/s = 2^30 bytes per second";
  // Partial results reach the file after every section: a run cut short keeps them.
  out["complete"] = false;
  auto save = [&] {
    if (a.json_path.empty()) return;
    std::ofstream f(a.json_path);
    f << out.dump(2) << '\n';
  };
  std::fprintf(stderr, "probe: link limit, %zu MiB x %d...\n", a.link_bytes >> 20, a.reps);
  out["link"] = measure_link(a);
  save();

  // The default register mode (no huge pages) first; the THP variant last, as it can
  // stall on memory compaction (docs/cuda.md, register_thp).
  const Plugin plugin = load_plugin(a.plugin);
  out["pinning"] = json::array();
  for (const char* config :
       {"pinned_mode=alloc", "pinned_mode=register", "pinned_mode=register;register_thp=1"}) {
    std::fprintf(stderr, "probe: pinning %zu GiB with %s...\n", a.pin_bytes >> 30, config);
    out["pinning"].push_back(measure_pinning(a, plugin, config));
    save();
  }
  const json& pinning = out["pinning"];
  const double alloc_s = pinning[0]["pin_seconds"].get<double>();
  out["register_speedup"] = alloc_s / pinning[1]["pin_seconds"].get<double>();
  out["register_speedup_thp"] = alloc_s / pinning[2]["pin_seconds"].get<double>();
  save();
  std::fprintf(stderr, "probe: pre-faulting %zu GiB alone...\n", a.prefault_bytes >> 30);
  out["prefault"] = measure_prefault(a);
  out["complete"] = true;
  emit(out, a);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    die(std::string("unexpected error: ") + e.what());
  }
}
