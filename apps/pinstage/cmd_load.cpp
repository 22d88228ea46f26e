// pinstage load PATH: open and validate a checkpoint, load it into a worker's pinned host
// memory or stream it onto the device, and print bytes, seconds and GB/s per phase.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_common.h"
#include "commands.h"
#include "pinstage/checkpoint.h"
#include "pinstage/error.h"

namespace pinstage::cli {

namespace {

struct LoadArgs {
  std::string path;
  BackendArgs backend;
  std::string to = "host";
  int threads = 0;
  int64_t chunk_mib = 8;
  int64_t ring_mib = 64;
  bool direct = false;
  std::string verify;  // "", "all" or "if-present"
  ReportArgs report;
  CLI::App* cmd = nullptr;
};

// The options' ranges were checked while parsing (add_integer_option).
CheckpointLoadOptions load_options(const LoadArgs& a) {
  CheckpointLoadOptions o;
  o.threads = a.threads;
  o.chunk_bytes = static_cast<uint64_t>(a.chunk_mib) << 20;
  o.ring_bytes = static_cast<uint64_t>(a.ring_mib) << 20;
  o.direct = a.direct;
  o.verify = !a.verify.empty();
  o.verify_if_present = a.verify == "if-present";
  return o;
}

std::string phase(const char* name, uint64_t bytes, double s) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "  %-8s %8.3f s  %7.2f GB/s\n", name, s,
                s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0.0);
  return buf;
}

nlohmann::ordered_json report_json(const Checkpoint& c, const LoadReport& r,
                                   const std::string& to) {
  nlohmann::ordered_json j;
  j["path"] = c.path();
  j["layout"] = checkpoint_layout_name(c.layout());
  j["to"] = to;
  j["files"] = r.files;
  j["tensors"] = r.tensors;
  j["bytes"] = r.bytes;
  j["threads"] = r.threads;
  j["chunk_bytes"] = r.chunk_bytes;
  j["total_s"] = r.total_s;
  j["total_gbps"] = r.gbps(r.total_s);
  j["alloc_s"] = r.alloc_s;
  j["read_s"] = r.read_s;
  j["read_gbps"] = r.gbps(r.read_s);
  j["verify_s"] = r.verify_s;
  if (to == "device") {
    j["upload_s"] = r.upload_s;
    j["overlap"] = r.overlap;
    j["ring_pinned_bytes"] = r.ring_pinned_bytes;
    j["peak_pinned_bytes"] = r.peak_pinned_bytes;
  }
  j["direct"] = r.direct;
  j["direct_note"] = r.direct_note;
  j["verified"] = r.verified;
  j["unverified_tensors"] = r.unverified;
  if (to == "device") j["verify_readback_bytes"] = r.verify_readback_bytes;
  return j;
}

void print_report(FILE* out, const Checkpoint& c, const LoadReport& r, const std::string& to) {
  std::fprintf(out, "loaded %s, %s (%s bytes) from %s (%s) %s\n",
               plural(r.tensors, "tensor").c_str(), format_bytes(r.bytes).c_str(),
               format_thousands(r.bytes).c_str(), plural(r.files, "file").c_str(),
               checkpoint_layout_name(c.layout()),
               to == "device" ? "onto the device" : "into pinned host memory");
  std::fputs(phase("total", r.bytes, r.total_s).c_str(), out);
  std::fputs(phase("read", r.bytes, r.read_s).c_str(), out);
  if (to == "device") {
    std::fputs(phase("upload", r.bytes, r.upload_s).c_str(), out);
    std::fprintf(out, "  overlap  %.0f%% of the read time ran with copies queued; ring %s pinned\n",
                 r.overlap * 100, format_bytes(r.ring_pinned_bytes).c_str());
  }
  std::fprintf(out, "  alloc    %8.3f s\n", r.alloc_s);
  if (r.verify_s > 0) std::fprintf(out, "  verify   %8.3f s\n", r.verify_s);
  if (!r.direct_note.empty()) std::fprintf(out, "  %s\n", r.direct_note.c_str());
  if (r.verified)
    std::fprintf(out, "  every tensor's xxh3-64 matches the recorded one%s\n",
                 to == "device" ? ", read back from the device" : "");
  else if (r.unverified > 0)
    std::fprintf(out, "  %s had no recorded xxh3-64 and could not be checked\n",
                 plural(r.unverified, "tensor").c_str());
}

void run_load(LoadArgs& a) {
  check_report_args(a.report);
  CheckpointLoadOptions o = load_options(a);
  const WorkerOptions wo = worker_options(a.backend);
  const Checkpoint c = Checkpoint::open(a.path);  // validated before any memory is taken
  Worker worker;
  worker.init(a.backend.name, 0, wo);
  ProgressBar bar(a.report);
  int shown = -1;
  o.progress = [&](uint64_t done, uint64_t total) {
    const int pct = total > 0 ? static_cast<int>(done * 100 / total) : 100;
    if (pct == shown) return;
    shown = pct;
    bar.show(static_cast<double>(pct) / 100.0, format_bytes(done) + " of " + format_bytes(total));
  };
  LoadReport r;
  if (a.to == "device") {
    r = load_to_device(c, worker, o).report;
  } else {
    PinnedAllocator pinned(worker);
    r = load_to_host(c, pinned, o).report;
  }
  bar.clear();
  print_report(text_out(a.report), c, r, a.to);  // the result: --quiet keeps it
  write_report(a.report, report_json(c, r, a.to),
               collect_run_info(&worker, command_options(*a.cmd)));
  finish_worker(worker);
}

}  // namespace

void add_load_command(CLI::App& app) {
  auto a = std::make_shared<LoadArgs>();
  CLI::App* q = app.add_subcommand(
      "load",
      "Load a checkpoint (a .safetensors file or a directory of shards) into pinned "
      "host memory or onto the device; prints bytes, seconds and GB/s per phase");
  a->cmd = q;
  add_checkpoint_read_options(*q, a->path, a->threads, a->chunk_mib, "Reader threads");
  add_backend_args(*q, a->backend);
  q->add_option("--to", a->to, "host (pinned memory) or device (streamed through the ring)")
      ->transform(kLowerCase)
      ->check(CLI::IsMember({"host", "device"}))
      ->capture_default_str();
  add_integer_option(*q, "--ring-mib", a->ring_mib,
                     "Pinned MiB of the staging ring (--to device), 1..65536", 1, 65536)
      ->capture_default_str();
  q->add_flag("--direct", a->direct, "O_DIRECT reads (falls back, with a message, where refused)");
  q->add_flag("--verify{all}", a->verify,
              "Check every tensor's recorded xxh3-64 (on --to device, as read back from the "
              "device); a tensor without one is an error. --verify=if-present checks those "
              "that have one")
      ->check(CLI::IsMember({"all", "if-present"}));
  add_report_options(*q, a->report);
  q->callback([a] { run_load(*a); });
}

void add_hash_command(CLI::App& app) {
  struct HashArgs {
    std::string path;
    int threads = 0;
    int64_t chunk_mib = 8;
    ReportArgs report;
    CLI::App* cmd = nullptr;
  };
  auto a = std::make_shared<HashArgs>();
  CLI::App* q = app.add_subcommand(
      "hash",
      "Record every tensor's xxh3-64 in a sidecar next to a checkpoint whose writer recorded "
      "none (a Hugging Face checkpoint), so that load --verify checks it from then on");
  a->cmd = q;
  add_checkpoint_read_options(*q, a->path, a->threads, a->chunk_mib, "Reader threads");
  add_report_options(*q, a->report);
  q->callback([a] {
    check_report_args(a->report);
    const Checkpoint c = Checkpoint::open(a->path);
    check_out_option("the sidecar", hash_sidecar_path(c.path()));
    CheckpointLoadOptions o;
    o.threads = a->threads;
    o.chunk_bytes = static_cast<uint64_t>(a->chunk_mib) << 20;
    HashReport r;
    {
      ProgressTicker ticker(a->report, "hashing " + format_bytes(c.total_bytes()));
      r = hash_checkpoint(c, o);
    }
    std::fprintf(text_out(a->report), "hashed %s, %s in %.3f s (%.2f GB/s)%s\n",
                 plural(r.tensors, "tensor").c_str(), format_bytes(r.bytes).c_str(), r.seconds,
                 r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds / 1e9 : 0.0,
                 r.already_recorded ? "; the hashes its writer recorded match" : "");
    chatter(a->report, "sidecar: %s (load --verify reads it)\n", r.sidecar.c_str());
    write_report(a->report,
                 {{"path", c.path()},
                  {"tensors", r.tensors},
                  {"bytes", r.bytes},
                  {"already_recorded", r.already_recorded},
                  {"seconds", r.seconds},
                  {"sidecar", r.sidecar}},
                 collect_run_info(nullptr, command_options(*a->cmd)));
  });
}

}  // namespace pinstage::cli
