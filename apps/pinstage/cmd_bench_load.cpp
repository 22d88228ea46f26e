// pinstage bench load PATH: four ways to get a checkpoint into pinned memory or onto the
// device, warm and cold, interleaved in rounds, next to the raw parallel pread and the
// all-core memcpy of the same bytes; with --tp N, the tensor-parallel load too, and its
// per-rank figures. See docs/loading.md ("Benchmark").
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench_load_arms.h"
#include "cli_common.h"
#include "commands.h"
#include "pinstage/checkpoint.h"
#include "pinstage/clock.h"
#include "pinstage/error.h"
#include "pinstage/load_plan.h"
#include "pinstage/pages.h"
#include "pinstage/parallel.h"
#include "pinstage/worker_group.h"

namespace pinstage::cli {

namespace {

struct BenchLoadArgs : CheckpointArgs {
  int rounds = 3;
  bool no_cold = false;
};

// Drops every file from the page cache; returns the fraction of its pages still resident
// afterwards (mincore over a mapping), so the report says whether the drop took effect.
double drop_cache(const Checkpoint& c) {
  uint64_t pages = 0, resident = 0;
  for (const CheckpointFile& f : c.files()) {
    const int fd = open_shard(f.path);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    void* map = f.size > 0 ? ::mmap(nullptr, f.size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (map != MAP_FAILED) {
      const size_t n = (f.size + page_size() - 1) / page_size();
      std::vector<unsigned char> v(n);
      if (::mincore(map, f.size, v.data()) == 0)
        for (unsigned char b : v) resident += b & 1;
      pages += n;
      ::munmap(map, f.size);
    }
    ::close(fd);
  }
  return pages > 0 ? static_cast<double>(resident) / static_cast<double>(pages) : 0.0;
}

// The disk or page-cache limit: every tensor's bytes by parallel pread into one
// preallocated, pre-faulted buffer.
void raw_pread(const Checkpoint& c, unsigned char* dst, const CheckpointLoadOptions& o) {
  std::vector<ReadTarget> targets;
  uint64_t off = 0;
  for (const CheckpointTensor& t : c.tensors()) {
    targets.push_back({&t, dst + off});
    off += t.bytes;
  }
  CheckpointLoadOptions plain = o;
  plain.verify = false;
  read_checkpoint(c, targets, plain);
}

// Device copies alone: the checkpoint's bytes from one 64 MiB pinned buffer.
void upload_alone(Worker& worker, uint64_t bytes, const PinnedHostBuffer& src, DeviceBuffer& dst) {
  Stream stream = worker.create_stream();
  for (uint64_t done = 0; done < bytes; done += src.size())
    worker.copy_to_device_async(dst, 0, src.data(), std::min<uint64_t>(src.size(), bytes - done),
                                stream);
  worker.synchronize(stream);
}

struct Series {
  std::vector<double> seconds;
  std::vector<double> resident;  // cold rounds: fraction of pages still cached
  double best() const {
    return seconds.empty() ? 0 : *std::min_element(seconds.begin(), seconds.end());
  }
  double median() const {
    if (seconds.empty()) return 0;
    std::vector<double> s = seconds;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
};

// One arm: `run` is timed; `before` and `after` (optional) run untimed around it, so an arm
// can start from a fresh worker or give back what it mapped without paying for that.
struct Arm {
  std::string name;
  std::function<void()> run;
  std::function<void()> before = {};
  std::function<void()> after = {};
};
using Arms = std::vector<Arm>;

// Every round runs every arm warm, then (unless --no-cold) every arm cold.
std::map<std::string, Series> run_rounds(const Checkpoint& c, const BenchLoadArgs& a,
                                         const Arms& arms, ProgressBar& bar) {
  std::map<std::string, Series> out;
  const int modes = a.no_cold ? 1 : 2;
  const int steps = a.rounds * modes * static_cast<int>(arms.size());
  int step = 0;
  drop_cache(c);
  auto once = [](const Arm& arm) {
    if (arm.before) arm.before();
    arm.run();
    if (arm.after) arm.after();
  };
  for (const auto& arm : arms) once(arm);  // warm-up: fills the page cache, faults code in
  for (int r = 0; r < a.rounds; ++r) {
    for (int m = 0; m < modes; ++m) {
      const std::string mode = m == 0 ? "warm" : "cold";
      for (const Arm& arm : arms) {
        bar.show(static_cast<double>(step++) / steps,
                 "round " + std::to_string(r + 1) + " " + mode + " " + arm.name);
        Series& s = out[arm.name + "/" + mode];
        if (arm.before) arm.before();
        if (m == 1) s.resident.push_back(drop_cache(c));
        const Stopwatch clock;
        arm.run();
        s.seconds.push_back(clock.seconds());
        if (arm.after) arm.after();
      }
    }
  }
  bar.clear();
  return out;
}

nlohmann::ordered_json summarize(const std::map<std::string, Series>& series, uint64_t bytes,
                                 FILE* text, bool print) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [key, s] : series) {
    const double gbps = s.best() > 0 ? static_cast<double>(bytes) / s.best() / 1e9 : 0;
    j[key] = {{"seconds", s.seconds},
              {"best_s", s.best()},
              {"median_s", s.median()},
              {"best_gbps", gbps}};
    if (!s.resident.empty()) {
      const double worst = *std::max_element(s.resident.begin(), s.resident.end());
      j[key]["resident_after_drop"] = worst;
      j[key]["drop_took_effect"] = worst < 0.05;
    }
    if (print)
      std::fprintf(text, "  %-24s best %8.3f s  %7.2f GB/s  median %8.3f s%s\n", key.c_str(),
                   s.best(), gbps, s.median(),
                   s.resident.empty()
                       ? ""
                       : (*std::max_element(s.resident.begin(), s.resident.end()) < 0.05
                              ? "  (cache dropped)"
                              : "  (cache NOT dropped)"));
  }
  return j;
}

// The ratios the targets are stated in (docs/loading.md), each with its goal and verdict.
nlohmann::ordered_json targets(const std::map<std::string, Series>& s, double warm_alloc_share,
                               FILE* text, bool print) {
  auto best = [&](const std::string& k) { return s.count(k) ? s.at(k).best() : 0.0; };
  auto ratio = [](double num, double den) { return den > 0 ? num / den : 0.0; };
  nlohmann::ordered_json t;
  // (key, value, goal, at least?) in print order.
  auto add = [&](const char* key, double value, double goal, bool at_least) {
    const bool met = at_least ? value >= goal : value <= goal;
    t[key] = {{"value", value}, {"goal", goal}, {"at_least", at_least}, {"met", met}};
    if (print)
      std::fprintf(text, "  %-36s %7.3f  goal %s %.2f: %s\n", key, value,
                   at_least ? ">=" : "<=", goal, met ? "met" : "NOT met");
  };
  add("warm_c_over_memcpy_speed",
      ratio(best("memcpy_all_cores/warm"), best("c_pinstage_host/warm")), 0.9, true);
  add("warm_c_alloc_share", warm_alloc_share, 0.02, false);
  add("first_load_over_floors_time",
      ratio(best("c_first_load/warm"), best("prefault_floor/warm") + best("raw_pread/warm")), 1.15,
      false);
  add("warm_c_over_a_speed", ratio(best("a_read_then_copy/warm"), best("c_pinstage_host/warm")),
      3.0, true);
  if (s.count("c_pinstage_host/cold"))
    add("cold_c_over_raw_pread_speed", ratio(best("raw_pread/cold"), best("c_pinstage_host/cold")),
        0.9, true);
  const double alone = std::max(best("raw_pread/warm"), best("upload_alone/warm"));
  add("warm_d_over_max_read_upload_time", ratio(best("d_pinstage_device/warm"), alone), 1.15,
      false);
  return t;
}

// The pre-fault floor: what faulting in and locking `bytes` costs on this machine with
// every core, the part of a first load no pool can avoid.
MappedPages fault_and_lock(uint64_t bytes) {
  MappedPages p = map_pages(std::max<uint64_t>(bytes, 1));
  (void)::mlock(p.data, p.bytes);  // refused without CAP_IPC_LOCK: then the floor is the faults
  return p;
}

// The tp_load arm's figures, from its fastest run: the read against the checkpoint, and
// per rank what it received, read straight into its storages or scattered to it from the
// staging buffer. Each rank is an object so per-device figures (an upload) can join it.
nlohmann::ordered_json tp_figures(const BenchLoadArgs& a, const TpLoadReport& r, FILE* text) {
  nlohmann::ordered_json j = {{"tp", a.tp},
                              {"plan", a.plan},
                              {"read_bytes", r.read_bytes},
                              {"checkpoint_bytes", r.checkpoint_bytes},
                              {"host_bytes", r.host_bytes},
                              {"scatter_bytes", r.scatter_bytes},
                              {"total_s", r.load.total_s},
                              {"read_s", r.load.read_s},
                              {"scatter_s", r.scatter_s},
                              {"ranks", nlohmann::ordered_json::array()}};
  std::fprintf(text,
               "tp load, %d ranks (fastest run): read %s of the checkpoint's %s%s, %.3f s "
               "read, %.3f s scatter\n  %-5s %12s %14s %12s %12s\n",
               a.tp, format_bytes(r.read_bytes).c_str(), format_bytes(r.checkpoint_bytes).c_str(),
               r.read_bytes == r.checkpoint_bytes ? " (every byte once)" : "", r.load.read_s,
               r.scatter_s, "rank", "bytes", "read straight", "scattered", "shared");
  for (size_t rank = 0; rank < r.ranks.size(); ++rank) {
    const TpRankReport& k = r.ranks[rank];
    j["ranks"].push_back({{"rank", rank},
                          {"bytes", k.bytes},
                          {"direct_bytes", k.direct_bytes},
                          {"scatter_bytes", k.scatter_bytes},
                          {"shared_bytes", k.shared_bytes}});
    std::fprintf(text, "  %-5zu %12s %14s %12s %12s\n", rank, format_bytes(k.bytes).c_str(),
                 format_bytes(k.direct_bytes).c_str(), format_bytes(k.scatter_bytes).c_str(),
                 format_bytes(k.shared_bytes).c_str());
  }
  return j;
}

// The tp_devices arm's figures (the load's own figures, without its device tensors).
struct DeviceFigures {
  TpLoadReport host;
  std::vector<TpDeviceReport> uploads;
  uint64_t uploaded_bytes = 0;
  double upload_s = 0, upload_gbps = 0, total_s = 0;
};

// --devices with several ids (or with --tp): the tp is the device count; --tp or the plan's
// "tp" saying otherwise is an error naming both.
void check_device_tp(BenchLoadArgs& a, const std::vector<int>& ids) {
  const int n = static_cast<int>(ids.size());
  if (a.tp > 0 && a.tp != n)
    throw Error(ErrorCode::invalid_argument,
                std::string(a.cmd->count("--tp") > 0 ? "--tp " : "the plan's \"tp\" ") +
                    std::to_string(a.tp) + " and --devices '" + a.devices.list + "' (" +
                    plural(ids.size(), "device") +
                    ") disagree: rank r goes onto the r-th listed device, so the tp must be "
                    "the device count");
  a.tp = n;
}

// The tp_devices arm: load_tp_to_devices onto every device of `group`, its fastest run kept.
Arm device_arm(const Checkpoint& c, const TpPlan& plan, WorkerGroup& group,
               const CheckpointLoadOptions& o, std::optional<DeviceFigures>& fastest) {
  return {"tp_devices", [&c, &plan, &group, o, &fastest] {
            const TpDeviceLoad d = load_tp_to_devices(c, plan, group, o);
            if (fastest && fastest->total_s <= d.total_s) return;
            fastest = DeviceFigures{d.host,     d.uploads,       d.uploaded_bytes,
                                    d.upload_s, d.upload_gbps(), d.total_s};
          }};
}

// Per device (rank r on devices[r]): what it received, read straight or scattered on the
// host, and its upload; then the node's read and aggregate upload.
nlohmann::ordered_json device_figures(const DeviceFigures& f, FILE* text) {
  const TpLoadReport& r = f.host;
  nlohmann::ordered_json j = {{"tp", f.uploads.size()},
                              {"read_bytes", r.read_bytes},
                              {"checkpoint_bytes", r.checkpoint_bytes},
                              {"read_s", r.load.read_s},
                              {"uploaded_bytes", f.uploaded_bytes},
                              {"upload_s", f.upload_s},
                              {"upload_gbps", f.upload_gbps},
                              {"total_s", f.total_s},
                              {"devices", nlohmann::ordered_json::array()}};
  std::fprintf(text,
               "tp onto %s (fastest run): read %s of the checkpoint's %s%s in %.3f s, upload "
               "%.3f s, %.2f GB/s aggregate\n  %-6s %-5s %12s %14s %12s %10s %9s\n",
               plural(f.uploads.size(), "device").c_str(), format_bytes(r.read_bytes).c_str(),
               format_bytes(r.checkpoint_bytes).c_str(),
               r.read_bytes == r.checkpoint_bytes ? " (every byte once)" : "", r.load.read_s,
               f.upload_s, f.upload_gbps, "device", "rank", "bytes", "read straight", "scattered",
               "upload s", "GB/s");
  for (size_t rank = 0; rank < f.uploads.size(); ++rank) {
    const TpDeviceReport& u = f.uploads[rank];
    const TpRankReport k = rank < r.ranks.size() ? r.ranks[rank] : TpRankReport{};
    j["devices"].push_back({{"device", u.device},
                            {"rank", rank},
                            {"bytes", u.bytes},
                            {"tensors", u.tensors},
                            {"direct_bytes", k.direct_bytes},
                            {"scatter_bytes", k.scatter_bytes},
                            {"shared_bytes", k.shared_bytes},
                            {"upload_s", u.upload_s},
                            {"upload_gbps", u.gbps()}});
    std::fprintf(text, "  %-6d %-5zu %12s %14s %12s %10.3f %9.2f\n", u.device, rank,
                 format_bytes(u.bytes).c_str(), format_bytes(k.direct_bytes).c_str(),
                 format_bytes(k.scatter_bytes).c_str(), u.upload_s, u.gbps());
  }
  return j;
}

// The report's figures of every arm and the targets, printed as they are made.
nlohmann::ordered_json bench_doc(const BenchLoadArgs& a, const Checkpoint& c,
                                 const std::map<std::string, Series>& series,
                                 double warm_alloc_share) {
  FILE* text = text_out(a.report);
  const bool print = true;  // the per-arm table and the targets are the result
  const uint64_t bytes = c.total_bytes();
  chatter(a.report, "bench load %s: %s in %s and %s, %d round(s)\n", a.path.c_str(),
          format_bytes(bytes).c_str(), plural(c.tensors().size(), "tensor").c_str(),
          plural(c.files().size(), "file").c_str(), a.rounds);
  nlohmann::ordered_json doc;
  doc["path"] = a.path;
  doc["bytes"] = bytes;
  doc["tensors"] = c.tensors().size();
  doc["files"] = c.files().size();
  doc["rounds"] = a.rounds;
  doc["arms"] = summarize(series, bytes, text, print);
  doc["targets"] = targets(series, warm_alloc_share, text, print);
  return doc;
}

void run_bench_load(BenchLoadArgs& a) {
  check_report_args(a.report);
  const WorkerOptions wo = worker_options(a.backend);
  const std::vector<int> ids = device_ids(a.devices, a.backend);
  const Checkpoint c = Checkpoint::open(a.path);
  const TpPlan plan = a.plan.empty() ? TpPlan() : TpPlan::read_file(a.plan);
  if (a.tp == 0 && plan.tp()) a.tp = *plan.tp();
  const bool on_devices = a.devices.given && (ids.size() > 1 || a.tp > 0);
  if (on_devices) check_device_tp(a, ids);
  if (a.tp > 0) resolve_tp_plan(c, plan, a.tp);  // every refusal before the worker starts
  Worker worker;
  worker.init(a.backend.name, ids[0], wo);
  PinnedAllocator pinned(worker);
  const CheckpointLoadOptions o = a.load_options();
  const uint64_t bytes = c.total_bytes();
  const MappedPages scratch = map_pages(std::max<uint64_t>(bytes, 1));
  const MappedPages copy_dst = map_pages(std::max<uint64_t>(bytes, 1));
  PinnedHostBuffer upload_src = worker.alloc_pinned_host(size_t{64} << 20);
  DeviceBuffer upload_dst = worker.alloc_device(size_t{64} << 20);
  // c_first_load: a fresh worker each time, so its pool starts empty (set up untimed).
  std::unique_ptr<Worker> fresh;
  MappedPages floor_pages;
  double warm_alloc_share = 0;
  std::optional<TpLoadReport> fastest_tp;
  Arms arms = {
      {"a_read_then_copy", [&] { arm_read_then_copy(c, pinned); }},
      {"b_mmap_copy", [&] { arm_mmap_copy(c, pinned); }},
      {"c_pinstage_host",
       [&] {
         const HostLoad load = load_to_host(c, pinned, o);
         if (load.report.total_s > 0)
           warm_alloc_share = std::max(warm_alloc_share, load.report.alloc_s / load.report.total_s);
       }},
      {"c_first_load",
       [&] {
         PinnedAllocator first(*fresh);
         load_to_host(c, first, o);
       },
       [&] {
         fresh = std::make_unique<Worker>();
         fresh->init(a.backend.name, ids[0], wo);
       },
       [&] { finish_worker(*fresh); }},
      {"d_pinstage_device", [&] { load_to_device(c, worker, o); }},
      {"raw_pread", [&] { raw_pread(c, static_cast<unsigned char*>(scratch.data), o); }},
      {"prefault_floor", [&] { floor_pages = fault_and_lock(bytes); }, nullptr,
       [&] { unmap_pages(floor_pages); }},
      {"memcpy_all_cores",
       [&] { parallel_memcpy(copy_dst.data, scratch.data, bytes, a.options.threads); }},
      {"upload_alone", [&] { upload_alone(worker, bytes, upload_src, upload_dst); }},
  };
  if (a.tp > 0)
    arms.push_back({"tp_load", [&] {
                      TpLoadReport r = load_tp_to_host(c, plan, a.tp, pinned, o).report;
                      if (!fastest_tp || r.load.total_s < fastest_tp->load.total_s)
                        fastest_tp = std::move(r);
                    }});
  std::optional<DeviceFigures> fastest_devices;
  std::unique_ptr<WorkerGroup> group;
  if (on_devices) {
    group = std::make_unique<WorkerGroup>(a.backend.name, ids, WorkerGroupOptions{wo, 0});
    arms.push_back(device_arm(c, plan, *group, o, fastest_devices));
  }
  ProgressBar bar(a.report);
  const auto series = run_rounds(c, a, arms, bar);
  nlohmann::ordered_json doc = bench_doc(a, c, series, warm_alloc_share);
  if (fastest_tp) doc["tp"] = tp_figures(a, *fastest_tp, text_out(a.report));
  if (fastest_devices) doc["tp_devices"] = device_figures(*fastest_devices, text_out(a.report));
  unmap_pages(scratch);
  unmap_pages(copy_dst);
  a.write(std::move(doc), &worker);
  for (size_t i = 0; group && i < group->size(); ++i) finish_worker(group->worker(i));
  finish_worker(worker);
}

}  // namespace

void add_bench_load_command(CLI::App& bench) {
  const auto a = add_checkpoint_command<BenchLoadArgs>(
      bench, "load",
      "Checkpoint loading: read()+copy, mmap+copy, pinstage into pinned memory and onto "
      "the device, warm and cold, next to raw parallel pread and all-core memcpy",
      {"and the memcpy_all_cores arm's copy threads",
       "several ids (or --tp with --devices) add the tp_devices arm: the tensor-parallel load "
       "onto them, rank r on the r-th device, with per-device read and upload figures",
       "add the tp_load arm (every byte read once for all ranks) and its per-rank figures; with "
       "--devices it must equal the device count",
       "The tp_load arm's plan file (docs/loading.md); without one every tensor is replicated"},
      kReadFlags, run_bench_load);
  add_integer_option(*a->cmd, "--rounds", a->rounds,
                     "Rounds; each runs every arm warm then cold, 1..1000", 1, 1000)
      ->capture_default_str();
  a->cmd->add_flag("--no-cold", a->no_cold, "Skip the cold (page cache dropped) runs");
}

}  // namespace pinstage::cli
