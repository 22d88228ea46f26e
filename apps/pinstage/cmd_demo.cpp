// pinstage demo: the Worker's lifecycle in a few lines: pinned and device allocation,
// a round trip checked byte for byte, and finalize reclaiming what is still out.
#include <cstdio>
#include <cstring>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "pinstage/clock.h"
#include "pinstage/log.h"
#include "pinstage/tensor.h"
#include "pinstage/worker.h"

namespace pinstage::cli {
namespace {

struct DemoArgs {
  BackendArgs backend;
  DeviceArgs devices;
  ReportArgs report;
  size_t mib = 256;
  const CLI::App* cmd = nullptr;
};

void run_demo(const DemoArgs& a) {
  check_report_args(a.report);
  const size_t bytes = a.mib << 20;
  const int device_id = single_device(a.devices, a.backend, "demo");
  Worker worker;
  worker.init(a.backend.name, device_id, worker_options(a.backend));
  FILE* out = text_out(a.report);
  chatter(a.report, "worker: %s backend, device %d, chip level\n", worker.backend().name.c_str(),
          worker.device_id());

  Stopwatch watch;
  PinnedHostBuffer host = worker.alloc_pinned_host(bytes);
  const double pin_seconds = watch.seconds();
  const bool locked = worker.capabilities().pinned_is_page_locked;
  chatter(a.report, "pinned %s bytes in %.3f s (page-locked: %s)\n",
          format_thousands(bytes).c_str(), pin_seconds, locked ? "yes" : "no");
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
  std::fprintf(out, "host->device %.2f GB/s, device->host %.2f GB/s, round trip %s\n",
               bytes / up / 1e9, bytes / down / 1e9, same ? "bit-exact" : "CORRUPTED");

  const WorkerStats stats = worker.stats();
  chatter(a.report, "outstanding before finalize: %llu pinned (%s bytes), %llu device (%s bytes)\n",
          static_cast<unsigned long long>(stats.pinned_count),
          format_thousands(stats.pinned_bytes).c_str(),
          static_cast<unsigned long long>(stats.device_count),
          format_thousands(stats.device_bytes).c_str());
  nlohmann::ordered_json doc = {{"backend", worker.backend().name},
                                {"device_id", worker.device_id()},
                                {"bytes", bytes},
                                {"pin_seconds", pin_seconds},
                                {"page_locked", locked},
                                {"h2d_gbps", bytes / up / 1e9},
                                {"d2h_gbps", bytes / down / 1e9},
                                {"bit_exact", same},
                                {"pinned_count_before_finalize", stats.pinned_count},
                                {"device_count_before_finalize", stats.device_count}};
  const RunInfo run = collect_run_info(&worker, command_options(*a.cmd));
  // Finalize with the buffers still alive: the worker reclaims them, and their later
  // destruction is a harmless no-op.
  if (!a.report.quiet && log_level() > LogLevel::info) set_log_level(LogLevel::info);
  std::fflush(out);  // keep the finalize log after the lines above
  finish_worker(worker);
  chatter(a.report, "finalized; buffers released afterwards are no-ops (valid: %s)\n",
          host.valid() ? "yes" : "no");
  doc["valid_after_finalize"] = host.valid();
  write_report(a.report, doc, run);
  if (!same) throw Error(ErrorCode::mismatch, "round trip corrupted the data");
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "Allocate, copy and finalize on a backend");
  auto a = command_values<DemoArgs>();
  a->cmd = cmd;
  add_backend_args(*cmd, a->backend);
  add_devices_option(*cmd, a->devices, "demo takes one id");
  add_integer_option(*cmd, "--mib", a->mib, "Buffer size in MiB, 1..1048576", 1, 1 << 20)
      ->capture_default_str();
  add_report_options(*cmd, a->report);
  cmd->callback([a] { run_demo(*a); });
}

}  // namespace pinstage::cli
