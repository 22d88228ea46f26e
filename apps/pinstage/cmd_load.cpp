// pinstage load PATH: open and validate a checkpoint, load it into a worker's pinned host
// memory or stream it onto the device, and print bytes, seconds and GB/s per phase.
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_common.h"
#include "commands.h"
#include "pinstage/checkpoint.h"
#include "pinstage/error.h"
#include "pinstage/load_plan.h"
#include "pinstage/worker_group.h"

namespace pinstage::cli {

namespace {

struct LoadArgs : CheckpointArgs {
  std::string to = "host";
};

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
  put_fields(j, report_fields(r));
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
  if (r.mode == "map")  // "in place" only where no file's tensors were copied
    std::fprintf(
        out, "  map      %8.3f s\n  pin      %8.3f s%s\n", r.map_s, r.pin_s,
        r.map_note.find("copied") == std::string::npos ? "  (in place: nothing copied)" : "");
  else if (!r.host_pages.empty())  // copy mode: a fresh segment, faulted by the readers
    std::fprintf(out, "  pin      %8.3f s  (a fresh segment on %s pages, behind the readers)\n",
                 r.pin_s, r.host_pages.c_str());
  if (!r.map_folios.empty()) std::fprintf(out, "  folios   %s\n", r.map_folios.c_str());
  if (!r.map_note.empty()) std::fprintf(out, "  %s\n", r.map_note.c_str());
  if (r.cache != "off")
    std::fprintf(out, "  cache    %s%s%s%s\n", r.cache.c_str(), r.cache_entry.empty() ? "" : ": ",
                 r.cache_entry.c_str(),
                 r.cache_note.empty() ? "" : (" (" + r.cache_note + ")").c_str());
  std::fprintf(out, "  alloc    %8.3f s\n", r.alloc_s);
  if (!r.device_first_touch_reason.empty())  // sim's own cost, not a device's
    std::fprintf(out, "           %.3f s of it backing %s of sim's device pool (first touch)\n",
                 r.device_first_touch_s, format_bytes(r.device_first_touch_bytes).c_str());
  if (r.verify_s > 0) std::fprintf(out, "  verify   %8.3f s\n", r.verify_s);
  if (!r.direct_note.empty()) std::fprintf(out, "  %s\n", r.direct_note.c_str());
  if (r.verified)
    std::fprintf(out, "  every tensor's xxh3-64 matches the recorded one%s\n",
                 to == "device" ? ", read back from the device" : "");
  else if (r.unverified > 0)
    std::fprintf(out, "  %s had no recorded xxh3-64 and could not be checked\n",
                 plural(r.unverified, "tensor").c_str());
}

// The host side of a tensor-parallel load, the same keys for a host and a device load:
// the plan, the read against the checkpoint, the kinds of tensors, the scatter.
void add_tp_host_keys(nlohmann::ordered_json& j, const TpPlan& plan, const LoadArgs& a, int tp,
                      const TpLoadReport& r) {
  j["tp"] = tp;
  j["plan"] = a.plan;
  j["read_bytes"] = r.read_bytes;
  j["checkpoint_bytes"] = r.checkpoint_bytes;
  j["host_bytes"] = r.host_bytes;
  j["replicated"] = r.replicated;
  j["contiguous"] = r.contiguous;
  j["strided"] = r.strided;
  j["scatter_bytes"] = r.scatter_bytes;
  j["scatter_s"] = r.scatter_s;
  j["unused_rules"] = nlohmann::ordered_json::array();
  for (int rule : r.unused_rules) j["unused_rules"].push_back(plan.describe(rule));
}

// The tensor-parallel figures: the read against the checkpoint, and per rank its tensors.
nlohmann::ordered_json tp_report_json(const Checkpoint& c, const TpPlan& plan, const LoadArgs& a,
                                      const TpHostLoad& load) {
  const TpLoadReport& r = load.report;
  nlohmann::ordered_json j = report_json(c, r.load, "host");
  add_tp_host_keys(j, plan, a, load.tp, r);
  j["ranks"] = nlohmann::ordered_json::array();
  for (size_t rank = 0; rank < load.ranks.size(); ++rank) {
    nlohmann::ordered_json one = {{"rank", rank}, {"tensors", load.ranks[rank].size()}};
    uint64_t bytes = 0;
    nlohmann::ordered_json slices = nlohmann::ordered_json::array();
    for (const TpTensor& t : load.ranks[rank]) {
      bytes += t.bytes;
      slices.push_back({{"name", t.info.name},
                        {"dtype", t.info.dtype},
                        {"shape", t.shape},
                        {"dim", t.dim},
                        {"begin", t.begin},
                        {"bytes", t.bytes},
                        {"shared", t.dim < 0}});
    }
    one["bytes"] = bytes;
    one["slices"] = std::move(slices);
    j["ranks"].push_back(std::move(one));
  }
  return j;
}

void print_tp_report(FILE* out, const Checkpoint& c, const TpHostLoad& load) {
  const TpLoadReport& r = load.report;
  std::fprintf(out, "loaded %s for %d ranks from %s (%s) into pinned host memory\n",
               plural(r.load.tensors, "tensor").c_str(), load.tp,
               plural(r.load.files, "file").c_str(), checkpoint_layout_name(c.layout()));
  std::fprintf(out, "  read     %s bytes of the checkpoint's %s%s\n",
               format_thousands(r.read_bytes).c_str(), format_thousands(r.checkpoint_bytes).c_str(),
               r.read_bytes == r.checkpoint_bytes ? ": every byte once" : "");
  for (size_t rank = 0; rank < load.ranks.size(); ++rank) {
    uint64_t bytes = 0;
    for (const TpTensor& t : load.ranks[rank]) bytes += t.bytes;
    std::fprintf(out, "  rank %-3zu %s, %s (%s bytes)\n", rank,
                 plural(load.ranks[rank].size(), "tensor").c_str(), format_bytes(bytes).c_str(),
                 format_thousands(bytes).c_str());
  }
  std::fprintf(out, "  pinned   %s (%s bytes; %s held once for every rank)\n",
               format_bytes(r.host_bytes).c_str(), format_thousands(r.host_bytes).c_str(),
               plural(r.replicated, "replicated tensor").c_str());
  std::fprintf(out, "  split    %zu into byte ranges, %zu along an inner dim (%s staged)\n",
               r.contiguous, r.strided, format_bytes(r.scatter_bytes).c_str());
  std::fputs(phase("total", r.read_bytes, r.load.total_s).c_str(), out);
  std::fputs(phase("read", r.read_bytes, r.load.read_s).c_str(), out);
  std::fprintf(out, "  scatter  %8.3f s\n  alloc    %8.3f s\n", r.scatter_s, r.load.alloc_s);
  if (r.load.verify_s > 0) std::fprintf(out, "  verify   %8.3f s\n", r.load.verify_s);
  if (!r.load.direct_note.empty()) std::fprintf(out, "  %s\n", r.load.direct_note.c_str());
  if (r.load.verified) std::fprintf(out, "  every tensor's xxh3-64 matches the recorded one\n");
}

// The plan of --plan FILE, or none (every tensor replicated), and the tp: --tp, else the
// plan's "tp". Both read and checked before the checkpoint is opened.
TpPlan tp_plan(LoadArgs& a) {
  if (a.to == "device")
    throw Error(ErrorCode::invalid_argument,
                "--tp and --plan load into pinned host memory; --to device cannot be combined "
                "with them: --devices LIST loads each rank onto a device of its own");
  TpPlan plan = a.plan.empty() ? TpPlan() : TpPlan::read_file(a.plan);
  if (a.tp == 0 && !plan.tp())
    throw Error(ErrorCode::invalid_argument,
                "--plan '" + a.plan + "' gives no \"tp\": say how many ranks with --tp N");
  if (a.tp == 0) a.tp = *plan.tp();
  return plan;
}

// --devices with several ids, or with --tp or --plan: rank r onto the r-th listed device,
// so the tp is the device count; --tp or the plan's "tp" saying otherwise is an error.
TpPlan device_tp_plan(LoadArgs& a, const std::vector<int>& ids) {
  const int n = static_cast<int>(ids.size());
  const std::string devices =
      "--devices '" + a.devices.list + "' lists " + plural(ids.size(), "device");
  if (a.cmd->count("--to") > 0 && a.to == "host")
    throw Error(ErrorCode::invalid_argument,
                "--to host and " + devices +
                    ": a load onto several devices goes to the devices; "
                    "omit --to or give --to device");
  if (a.tp > 0 && a.tp != n)
    throw Error(ErrorCode::invalid_argument,
                "--tp " + std::to_string(a.tp) + " and " + devices +
                    " disagree: rank r goes onto the r-th listed device, so --tp must be the "
                    "device count (or omitted)");
  TpPlan plan = a.plan.empty() ? TpPlan() : TpPlan::read_file(a.plan);
  if (a.tp == 0 && plan.tp() && *plan.tp() != n)
    throw Error(ErrorCode::invalid_argument, "--plan '" + a.plan + "' gives \"tp\": " +
                                                 std::to_string(*plan.tp()) + " but " + devices);
  a.tp = n;
  return plan;
}

void print_device_report(FILE* out, const Checkpoint& c, const TpDeviceLoad& d) {
  const TpLoadReport& r = d.host;
  std::fprintf(out, "loaded %s for %d ranks from %s (%s) onto devices %s\n",
               plural(r.load.tensors, "tensor").c_str(), d.tp, plural(r.load.files, "file").c_str(),
               checkpoint_layout_name(c.layout()), join_ids(d.devices).c_str());
  std::fprintf(out, "  read     %s bytes of the checkpoint's %s%s\n",
               format_thousands(r.read_bytes).c_str(), format_thousands(r.checkpoint_bytes).c_str(),
               r.read_bytes == r.checkpoint_bytes ? ": every byte once" : "");
  std::fprintf(out, "  %-6s %-5s %16s %8s %10s %9s\n", "device", "rank", "bytes", "tensors",
               "upload s", "GB/s");
  for (size_t rank = 0; rank < d.uploads.size(); ++rank) {
    const TpDeviceReport& u = d.uploads[rank];
    std::fprintf(out, "  %-6d %-5zu %16s %8zu %10.3f %9.2f\n", u.device, rank,
                 format_thousands(u.bytes).c_str(), u.tensors, u.upload_s, u.gbps());
  }
  std::fprintf(out, "  upload   %s bytes onto %s in %.3f s: %.2f GB/s aggregate\n",
               format_thousands(d.uploaded_bytes).c_str(),
               plural(d.devices.size(), "device").c_str(), d.upload_s, d.upload_gbps());
  std::fputs(phase("total", r.checkpoint_bytes, d.total_s).c_str(), out);
  std::fputs(phase("read", r.read_bytes, r.load.read_s).c_str(), out);
  std::fprintf(out, "  scatter  %8.3f s\n  alloc    %8.3f s\n", r.scatter_s, r.load.alloc_s);
  if (r.load.verify_s > 0) std::fprintf(out, "  verify   %8.3f s\n", r.load.verify_s);
  if (!r.load.direct_note.empty()) std::fprintf(out, "  %s\n", r.load.direct_note.c_str());
  if (r.load.verified) std::fprintf(out, "  every tensor's xxh3-64 matches the recorded one\n");
}

// The device load's JSON: the host load's figures, the node's upload, and per device
// (rank r on devices[r]) what it received and how fast.
nlohmann::ordered_json device_report_json(const Checkpoint& c, const TpPlan& plan,
                                          const LoadArgs& a, const TpDeviceLoad& d) {
  const TpLoadReport& r = d.host;
  nlohmann::ordered_json j = report_json(c, r.load, "devices");
  j["total_s"] = d.total_s;
  j["total_gbps"] = d.total_s > 0 ? static_cast<double>(r.checkpoint_bytes) / d.total_s / 1e9 : 0;
  add_tp_host_keys(j, plan, a, d.tp, r);
  j["uploaded_bytes"] = d.uploaded_bytes;
  j["upload_s"] = d.upload_s;
  j["upload_gbps"] = d.upload_gbps();
  j["devices"] = nlohmann::ordered_json::array();
  for (size_t rank = 0; rank < d.uploads.size(); ++rank) {
    const TpDeviceReport& u = d.uploads[rank];
    nlohmann::ordered_json one = {{"device", u.device},     {"rank", rank},
                                  {"bytes", u.bytes},       {"tensors", u.tensors},
                                  {"upload_s", u.upload_s}, {"upload_gbps", u.gbps()}};
    if (rank < r.ranks.size()) {
      one["direct_bytes"] = r.ranks[rank].direct_bytes;
      one["scatter_bytes"] = r.ranks[rank].scatter_bytes;
      one["shared_bytes"] = r.ranks[rank].shared_bytes;
    }
    j["devices"].push_back(std::move(one));
  }
  return j;
}

// The checkpoint, validated before any memory is taken. A hash sidecar that could not be
// used (stale or broken) is refused with --verify, and a warning otherwise.
Checkpoint open_checkpoint(const LoadArgs& a, const CheckpointLoadOptions& o) {
  Checkpoint c = Checkpoint::open(a.path);
  check_sidecar(c, o);
  if (!c.sidecar_problem().empty())
    std::fprintf(stderr, "warning: %s; loading without its hashes (nothing asked to verify)\n",
                 c.sidecar_problem().c_str());
  return c;
}

// --devices LIST [--tp N] [--plan FILE]: read once on the host, each rank onto its device.
void run_device_tp_load(LoadArgs& a, CheckpointLoadOptions& o, const WorkerOptions& wo,
                        const std::vector<int>& ids) {
  const TpPlan plan = device_tp_plan(a, ids);
  const Checkpoint c = open_checkpoint(a, o);
  resolve_tp_plan(c, plan, a.tp);  // every refusal before any memory is taken
  chatter(a.report, "plan: %s for %d ranks on devices %s\n",
          a.plan.empty() ? "none given, every tensor replicated" : a.plan.c_str(), a.tp,
          join_ids(ids).c_str());
  WorkerGroupOptions go;
  go.worker = wo;
  WorkerGroup group(a.backend.name, ids, go);
  {
    ProgressBar bar(a.report);
    o.progress = progress_of(bar);
    const TpDeviceLoad load = load_tp_to_devices(c, plan, group, o);
    bar.clear();
    for (int rule : load.host.unused_rules)
      chatter(a.report, "note: %s matched no tensor\n", plan.describe(rule).c_str());
    print_device_report(text_out(a.report), c, load);  // the result: --quiet keeps it
    a.write(device_report_json(c, plan, a, load), &group.worker(0));
  }
  for (size_t i = 0; i < group.size(); ++i) finish_worker(group.worker(i));
}

// --tp N [--plan FILE]: the plan and every split checked before the worker starts.
void run_tp_load(LoadArgs& a, CheckpointLoadOptions& o, const WorkerOptions& wo) {
  const TpPlan plan = tp_plan(a);
  const Checkpoint c = open_checkpoint(a, o);
  resolve_tp_plan(c, plan, a.tp);  // every refusal before any memory is taken
  chatter(a.report, "plan: %s for %d ranks\n",
          a.plan.empty() ? "none given, every tensor replicated" : a.plan.c_str(), a.tp);
  Worker worker;
  worker.init(a.backend.name, 0, wo);
  {
    ProgressBar bar(a.report);
    o.progress = progress_of(bar);
    PinnedAllocator pinned(worker);
    const TpHostLoad load = load_tp_to_host(c, plan, a.tp, pinned, o);
    bar.clear();
    for (int rule : load.report.unused_rules)
      chatter(a.report, "note: %s matched no tensor\n", plan.describe(rule).c_str());
    print_tp_report(text_out(a.report), c, load);  // the result: --quiet keeps it
    a.write(tp_report_json(c, plan, a, load), &worker);
  }
  finish_worker(worker);
}

void run_load(LoadArgs& a) {
  check_report_args(a.report);
  CheckpointLoadOptions o = a.load_options();
  const WorkerOptions wo = worker_options(a.backend);
  const std::vector<int> ids = device_ids(a.devices, a.backend);
  const bool tp = a.tp > 0 || !a.plan.empty();
  if (a.devices.given && (ids.size() > 1 || tp)) return run_device_tp_load(a, o, wo, ids);
  if (tp) return run_tp_load(a, o, wo);
  const Checkpoint c = open_checkpoint(a, o);
  Worker worker;
  worker.init(a.backend.name, ids[0], wo);
  ProgressBar bar(a.report);
  o.progress = progress_of(bar);
  LoadReport r;
  if (a.to == "device") {
    r = load_to_device(c, worker, o).report;
  } else {
    r = load_to_host(c, worker, o).report;  // reserved once (copy), or mapped (--map)
  }
  bar.clear();
  print_report(text_out(a.report), c, r, a.to);  // the result: --quiet keeps it
  a.write(report_json(c, r, a.to), &worker);
  finish_worker(worker);
}

}  // namespace

namespace {

// The spellings load had before its flags came from the list: --map (--mode map) and
// --verify=all|if-present (--verify, with --verify-if-present).
void add_load_aliases(CLI::App& q, CheckpointLoadOptions& o) {
  q.add_flag_callback(
       "--map", [&o] { o.mode = LoadMode::map; },
       "--mode map: map the files read-only and pin their page cache in place (docs/loading.md, "
       "\"Modes\"); not with --direct")
      ->excludes(q.get_option("--mode"));
  q.get_option("--verify")
      ->transform(CLI::Validator(
          [&o](std::string& value) {
            value = to_lower(value);
            if (value == "if-present") o.verify_if_present = true;
            if (value == "all" || value == "if-present") value = "true";
            return std::string();
          },
          "", "all|if-present"))
      ->description(q.get_option("--verify")->get_description() +
                    " (also --verify=all, and --verify=if-present for both)");
}

}  // namespace

void add_load_command(CLI::App& app) {
  const auto a = add_checkpoint_command<LoadArgs>(
      app, "load",
      "Load a checkpoint (a .safetensors file or a directory of shards) into pinned "
      "host memory or onto the device (--devices: tensor-parallel onto several); prints "
      "bytes, seconds and GB/s per phase",
      {"",
       "several ids (or --tp/--plan with --devices) load tensor-parallel, rank r onto the r-th "
       "device, reading the checkpoint once",
       "load each rank's share into pinned host memory, reading every byte of the checkpoint "
       "once; with --devices, onto the devices (then it must equal the device count)",
       "A tensor-parallel plan file (docs/loading.md): which tensors are split along which dim; "
       "without one every tensor is replicated"},
      kLoadFlags, run_load);
  CLI::App& q = *a->cmd;
  q.add_option("--to", a->to, "host (pinned memory) or device (streamed through the ring)")
      ->transform(kLowerCase)
      ->check(CLI::IsMember({"host", "device"}))
      ->capture_default_str();
  add_load_aliases(q, a->options);
}

void add_hash_command(CLI::App& app) {
  auto a = command_values<CheckpointArgs>();
  CLI::App* q = app.add_subcommand(
      "hash",
      "Record every tensor's xxh3-64 in a sidecar next to a checkpoint whose writer recorded "
      "none (a Hugging Face checkpoint), so that load --verify checks it from then on");
  a->cmd = q;
  add_checkpoint_read_options(*q, *a, kReadFlags);
  add_report_options(*q, a->report);
  q->callback([a] {
    check_report_args(a->report);
    check_out_option("the sidecar", hash_sidecar_path(a->path));
    const CheckpointLoadOptions o = a->load_options();
    HashReport r;
    {
      ProgressTicker ticker(a->report, "hashing " + a->path);
      r = hash_checkpoint(a->path, o);  // without the old sidecar: a stale one is replaced
    }
    std::fprintf(text_out(a->report), "hashed %s, %s in %.3f s (%.2f GB/s)%s\n",
                 plural(r.tensors, "tensor").c_str(), format_bytes(r.bytes).c_str(), r.seconds,
                 r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds / 1e9 : 0.0,
                 r.already_recorded ? "; the hashes its writer recorded match" : "");
    chatter(a->report, "sidecar: %s (load --verify reads it)\n", r.sidecar.c_str());
    a->write({{"path", a->path},
              {"tensors", r.tensors},
              {"bytes", r.bytes},
              {"already_recorded", r.already_recorded},
              {"seconds", r.seconds},
              {"sidecar", r.sidecar}},
             nullptr);
  });
}

}  // namespace pinstage::cli
