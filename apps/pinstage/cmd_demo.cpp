// pinstage demo: the Worker's lifecycle in a few lines: pinned and device allocation,
// a round trip checked byte for byte, and finalize reclaiming what is still out.
#include <cstdio>
#include <cstring>

#include "cli_common.h"
#include "commands.h"
#include "pinstage/clock.h"
#include "pinstage/log.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"

namespace pinstage::cli {
namespace {

void run_demo(const std::string& backend, size_t mib) {
  const size_t bytes = mib << 20;
  Worker worker;
  worker.init(backend);
  std::printf("worker: %s backend, device %d, chip level\n", worker.backend().name.c_str(),
              worker.device_id());

  Stopwatch watch;
  PinnedHostBuffer host = worker.alloc_pinned_host(bytes);
  const double pin_seconds = watch.seconds();
  std::printf("pinned %s bytes in %.3f s (page-locked: %s)\n", format_thousands(bytes).c_str(),
              pin_seconds, worker.capabilities().pinned_is_page_locked ? "yes" : "no");
  auto* data = static_cast<unsigned char*>(host.data());
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(i * 131 + 7);

  DeviceBuffer device = worker.alloc_device(bytes);
  watch.restart();
  worker.copy_to_device(device, 0, host.data(), bytes);
  const double up = watch.seconds();
  PinnedHostBuffer back = worker.alloc_pinned_host(bytes);
  watch.restart();
  worker.copy_to_host(back.data(), device, 0, bytes);
  const double down = watch.seconds();
  const bool same = std::memcmp(host.data(), back.data(), bytes) == 0;
  std::printf("host->device %.2f GB/s, device->host %.2f GB/s, round trip %s\n", bytes / up / 1e9,
              bytes / down / 1e9, same ? "bit-exact" : "CORRUPTED");

  const WorkerStats stats = worker.stats();
  std::printf("outstanding before finalize: %llu pinned (%s bytes), %llu device (%s bytes)\n",
              static_cast<unsigned long long>(stats.pinned_count),
              format_thousands(stats.pinned_bytes).c_str(),
              static_cast<unsigned long long>(stats.device_count),
              format_thousands(stats.device_bytes).c_str());
  // Finalize with the buffers still alive: the worker reclaims them, and their later
  // destruction is a harmless no-op.
  if (log_level() > LogLevel::info) set_log_level(LogLevel::info);
  std::fflush(stdout);  // keep the finalize log after the lines above
  finish_worker(worker);
  std::printf("finalized; buffers released afterwards are no-ops (valid: %s)\n",
              host.valid() ? "yes" : "no");
  if (!same) throw Error(ErrorCode::mismatch, "round trip corrupted the data");
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "Allocate, copy and finalize on a backend");
  static std::string backend = "sim";
  static size_t mib = 256;
  cmd->add_option("--backend", backend, "Backend plugin name")->capture_default_str();
  add_integer_option(*cmd, "--mib", mib, "Buffer size in MiB, 1..1048576", 1, 1 << 20)
      ->capture_default_str();
  cmd->callback([] { run_demo(backend, mib); });
}

}  // namespace pinstage::cli
