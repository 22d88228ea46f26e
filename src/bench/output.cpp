// The A/B benchmark's readable table and its JSON document.
#include <cmath>
#include <cstdio>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "pinstage/ab_bench.h"

namespace pinstage::ab {

namespace {

// The upload target: a direct bind's upload reaches this fraction of a plain memcpy.
constexpr double kUploadTarget = 0.9;

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

// "1 group", "5 groups".
std::string count(size_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

std::string cell(const std::string& s, size_t width, bool left = false) {
  if (s.size() >= width) return s + " ";
  return left ? s + std::string(width - s.size(), ' ') : std::string(width - s.size(), ' ') + s;
}

// The header: what ran, the plan's reason, the sizes and the methodology in brief.
std::string header(const BenchResult& r) {
  const Stats& s = r.stats;
  std::string out;
  if (!r.task.empty())
    out += "pinstage bench " + r.task + ": backend " + r.backend +
           (r.description.empty() ? "" : ", " + r.description);
  else
    out += "A/B bind benchmark: backend " + r.backend;
  out += ", " + count(static_cast<size_t>(r.threads), "copy thread") + "\n";
  // The plan's reason is printed by the command when it starts, not repeated here.
  out +=
      "args: " + count(r.sizes.tensors, "tensor") + ", " + count(r.sizes.input_tensors, "input") +
      ", " + format_bytes(r.sizes.input_bytes) + " per bind; " +
      count(r.stats.groups.size(), "group") + " x " +
      count(static_cast<size_t>(r.config.rounds), "round") + " per arm, " +
      (r.config.keep_cold ? "cold round kept"
                          : "cold round dropped (" + std::to_string(s.rounds_used) + " measured)") +
      "; uploads verified once per group, untimed\n";
  if (r.config.baseline)
    out +=
        "memcpy baseline: a plain all-cores memcpy of the same bytes from the arm's host "
        "args into " +
        r.baseline_kind + "\n";
  return out + "\n";
}

// Per group and arm: min bind latency, its allocation part, the transport (upload GB/s)
// and the memcpy baseline, with the bind latency against the reference.
std::string group_table(const BenchResult& r, const std::string& ref) {
  const Stats& s = r.stats;
  const auto& arms = r.config.arms;
  const bool baseline = r.config.baseline;
  std::string out = cell("group", 6) + "  " + cell("arm", 9, true) + cell("bind ms", 10) +
                    cell("vs " + ref, 16) + cell("alloc ms", 10) + cell("upload GB/s", 13);
  if (baseline) out += cell("memcpy GB/s", 13) + cell("up/memcpy", 11);
  out += "\n";
  for (size_t g = 0; g < s.groups.size(); ++g) {
    for (size_t a = 0; a < arms.size(); ++a) {
      const GroupArmStats& ga = s.groups[g][a];
      out += cell(std::to_string(g + 1), 6) + "  " + cell(arm_name(arms[a]), 9, true) +
             cell(fmt("%.2f", ga.min_seconds * 1e3), 10) +
             cell(a == s.reference ? "-" : describe_reduction(ga.reduction), 16) +
             cell(fmt("%.2f", ga.alloc_min_seconds * 1e3), 10) +
             cell(fmt("%.2f", ga.upload_gbps), 13);
      if (baseline)
        out += cell(fmt("%.2f", ga.memcpy_gbps), 13) + cell(fmt("%.3fx", ga.upload_vs_memcpy), 11);
      out += "\n";
    }
  }
  return out;
}

// Across groups per arm: ranges, median and conservative reductions, agreement.
std::string across_table(const BenchResult& r, const std::string& ref) {
  const Stats& s = r.stats;
  const auto& arms = r.config.arms;
  const bool baseline = r.config.baseline;
  std::string out = "\nacross " + count(s.groups.size(), "group") +
                    " (range of the per-group minimum bind latency; faster/slower = bind "
                    "latency against " +
                    ref + "):\n";
  out += cell("arm", 9, true) + cell("bind min-max ms", 20) + cell("median", 16) +
         cell("worst group", 20) + cell("agree", 10) + cell("alloc ms", 10) +
         cell("upload GB/s", 13);
  if (baseline) out += cell("up/memcpy med", 15) + cell("worst", 8);
  out += "\n";
  for (size_t a = 0; a < arms.size(); ++a) {
    const ArmSummary& as = s.arms[a];
    const bool is_ref = a == s.reference;
    out +=
        cell(as.arm, 9, true) +
        cell(fmt("%.2f", as.min_seconds * 1e3) + "-" + fmt("%.2f", as.max_seconds * 1e3), 20) +
        cell(is_ref ? "(reference)" : describe_reduction(as.median_reduction), 16) +
        cell(is_ref ? "-"
                    : describe_reduction(as.worst_reduction) + " (" +
                          std::to_string(as.worst_group + 1) + ")",
             20) +
        cell(is_ref ? "-"
                    : std::to_string(as.groups_agreeing) + " of " + std::to_string(s.groups.size()),
             10) +
        cell(fmt("%.2f", as.median_alloc_seconds * 1e3), 10) +
        cell(fmt("%.2f", as.median_upload_gbps), 13);
    if (baseline)
      out += cell(fmt("%.3fx", as.median_upload_vs_memcpy), 15) +
             cell(fmt("%.3fx", as.worst_upload_vs_memcpy), 8);
    out += "\n";
  }
  return out;
}

// A reduction's headline: "pinned is 35.2% faster than pageable", or a tie within
// kTieBand either way ("pinned ties with pageable (0.1% slower)").
constexpr double kTieBand = 0.005;

std::string verdict(const std::string& arm, double reduction, const std::string& ref) {
  if (std::abs(reduction) < kTieBand)
    return arm + " ties with " + ref + " (" + describe_reduction(reduction) + ", within " +
           fmt("%.1f%%", kTieBand * 100.0) + ")";
  return arm + " is " + describe_reduction(reduction) + " than " + ref;
}

// "5 of 5 groups agree", and why it is not conclusive when it is not.
std::string agreement(const ArmSummary& as, size_t groups) {
  std::string out = std::to_string(as.groups_agreeing) + " of " + std::to_string(groups) +
                    (groups == 1 ? " group agrees" : " groups agree");
  if (as.conclusive) return out;
  return out + (groups < 3 ? "; not conclusive (fewer than 3 groups)"
                           : "; not conclusive (fewer than 4 in 5 agree)");
}

// The upload line: both arms' rates, their ratio and, on sim, the model's prediction.
std::string upload_line(const BenchResult& r, const ArmSummary& as, const ArmSummary& rs) {
  std::string out = "    upload " + fmt("%.2f", as.median_upload_gbps) + " GB/s vs " +
                    fmt("%.2f", rs.median_upload_gbps) + " GB/s: " + fmt("%.2fx", as.upload_ratio) +
                    " measured";
  if (as.predicted_upload_ratio > 0.0 && r.model)
    out += ", " + fmt("%.2fx", as.predicted_upload_ratio) +
           " predicted by sim's copy-engine model from memcpy " +
           fmt("%.2f", as.median_memcpy_gbps) + " GB/s on all cores and " +
           fmt("%.2f", rs.median_memcpy_one_core_gbps) + " GB/s on one" + ", " +
           count(static_cast<size_t>(r.model->dma_threads), "DMA thread") + " on " +
           count(static_cast<size_t>(r.model->cores), "core") +
           (r.model->link_gbps > 0.0 ? ", link " + fmt("%.0f", r.model->link_gbps) + " GB/s" : "");
  return out + "\n";
}

// The upload target: the pinned arm's upload against what the host can copy (on sim, and
// capped by the link where link_gbps paces it), with the measured figure either way.
std::string target_line(const BenchResult& r) {
  const auto& arms = r.config.arms;
  for (size_t a = 0; a < arms.size(); ++a) {
    if (arms[a] != Arm::pinned) continue;
    const ArmSummary& as = r.stats.arms[a];
    const double link = r.model ? r.model->link_gbps : 0.0;
    const bool paced = link > 0.0 && link < as.median_memcpy_gbps;
    const double goal_gbps = paced ? link : as.median_memcpy_gbps;
    const double ratio = goal_gbps > 0.0 ? as.median_upload_gbps / goal_gbps : 0.0;
    const std::string against = paced ? "the link (link_gbps)" : "a plain all-core memcpy";
    // Worded as the upload rate's, never as a verdict: it can be met while the bind
    // latency above is slower (allocation, or other load, dominates the bind).
    std::string out = "  pinned's upload rate: " + fmt("%.3fx", ratio) + " of " + against + " (" +
                      fmt("%.2f", as.median_upload_gbps) + " of " + fmt("%.2f", goal_gbps) +
                      " GB/s); upload-rate target >= " + fmt("%.2fx", kUploadTarget) + ": ";
    if (ratio >= kUploadTarget) return out + "met\n";
    return out + "NOT met: the copy engine did not get the cores it copies on " +
           "(other load on this host, or dma_threads below the cores)\n";
  }
  return "";
}

// The verdict per arm against the reference: the paired median, the worst group, the
// agreement, then the upload and allocation behind it.
std::string summary_lines(const BenchResult& r, const std::string& ref, bool quiet) {
  const Stats& s = r.stats;
  std::string out = "\nsummary:\n";
  for (size_t a = 0; a < r.config.arms.size(); ++a) {
    if (a == s.reference) continue;
    const ArmSummary& as = s.arms[a];
    const ArmSummary& rs = s.arms[s.reference];
    out += "  " + verdict(as.arm, as.median_reduction, ref) + " (bind latency, median of " +
           count(s.groups.size(), "paired group") + "); " + agreement(as, s.groups.size()) + "\n";
    out += "    worst group: group " + std::to_string(as.worst_group + 1) + ", " +
           describe_reduction(as.worst_reduction) + "\n";
    out += upload_line(r, as, rs);
    out += "    allocation " + fmt("%.2f", as.median_alloc_seconds * 1e3) + " ms vs " +
           fmt("%.2f", rs.median_alloc_seconds * 1e3) + " ms (medians)\n";
  }
  if (r.config.baseline) out += target_line(r);
  if (r.backend == "sim" && !quiet)
    out +=
        "  note: sim copies pageable memory through its driver's pinned bounce buffers on one "
        "thread and pinned memory directly on every core, as a card's copy engines do "
        "(docs/worker.md, \"sim semantics\").\n";
  return out;
}

}  // namespace

std::string format_table(const BenchResult& r, bool quiet) {
  const std::string ref = arm_name(r.config.arms[r.stats.reference]);
  return (quiet ? "" : header(r)) + group_table(r, ref) + across_table(r, ref) +
         summary_lines(r, ref, quiet);
}

namespace {

using nlohmann::json;

json config_json(const BenchResult& r) {
  json arms = json::array();
  for (Arm a : r.config.arms) arms.push_back(arm_name(a));
  json config = {
      {"backend", r.backend},
      {"task", r.task},
      {"arms", arms},
      {"reference_arm", arm_name(r.config.arms[r.stats.reference])},
      {"groups", r.config.groups},
      {"rounds", r.config.rounds},
      {"keep_cold", r.config.keep_cold},
      {"baseline", r.config.baseline},
      {"baseline_kind", r.baseline_kind},
      {"staging_buffers", r.config.bind.staging_buffers},
      {"staging_buffer_bytes", r.config.bind.staging_buffer_bytes},
      {"threads", r.threads},
  };
  for (const auto& [name, value] : r.params) config[name] = value;
  // The size knob's value and how it was chosen ("layers", "layers_automatic", ...).
  const std::string knob = r.size_name.empty() ? "size" : r.size_name;
  if (!r.size_name.empty()) config[knob] = r.plan.size;
  config[knob + "_automatic"] = r.plan.automatic;
  config[knob + "_reason"] = r.plan.reason;
  return config;
}

json tensors_json(const std::vector<TensorBindReport>& tensors) {
  json rows = json::array();
  for (const TensorBindReport& t : tensors)
    rows.push_back({{"name", t.name},
                    {"direction", direction_name(t.direction)},
                    {"pinned", t.pinned},
                    {"path", upload_path_name(t.path)},
                    {"bytes", t.bytes},
                    {"upload_seconds", t.upload_seconds},
                    {"upload_gbps", t.upload_gbps()},
                    {"download_seconds", t.download_seconds}});
  return rows;
}

json groups_json(const BenchResult& r) {
  const Stats& s = r.stats;
  json groups = json::array();
  for (size_t g = 0; g < r.groups.size(); ++g) {
    json garms = json::array();
    for (size_t a = 0; a < r.groups[g].size(); ++a) {
      const ArmRun& run = r.groups[g][a];
      json binds = json::array();
      for (size_t i = 0; i < run.binds.size(); ++i) {
        const RoundRecord& rec = run.binds[i];
        json phases;
        for (const ReportField& f : phase_fields(rec.phase_seconds))
          phases[f.key] = std::get<double>(f.value);
        binds.push_back({{"round", i + 1},
                         {"cold", rec.cold},
                         {"dropped", rec.cold && !r.config.keep_cold},
                         {"seconds", rec.seconds},
                         {"phases", phases}});
      }
      const GroupArmStats& ga = s.groups[g][a];
      garms.push_back({{"arm", arm_name(run.arm)},
                       {"generate_seconds", run.generate_seconds},
                       {"bind_summary", run.bind_summary},
                       {"binds", binds},
                       {"memcpy_seconds", run.memcpy_seconds},
                       {"memcpy_one_core_seconds", run.memcpy_one_core_seconds},
                       {"verified", run.verified},
                       {"tensors", tensors_json(run.tensors)},
                       {"stats",
                        {{"min_seconds", ga.min_seconds},
                         {"gbps", ga.gbps},
                         {"reduction", ga.reduction},
                         {"upload_min_seconds", ga.upload_min_seconds},
                         {"upload_gbps", ga.upload_gbps},
                         {"alloc_min_seconds", ga.alloc_min_seconds},
                         {"memcpy_min_seconds", ga.memcpy_min_seconds},
                         {"memcpy_gbps", ga.memcpy_gbps},
                         {"upload_vs_memcpy", ga.upload_vs_memcpy},
                         {"memcpy_one_core_gbps", ga.memcpy_one_core_gbps}}}});
    }
    groups.push_back({{"group", g + 1}, {"arms", garms}});
  }
  return groups;
}

json summary_json(const Stats& s) {
  json summary = json::array();
  for (const ArmSummary& as : s.arms)
    summary.push_back({{"arm", as.arm},
                       {"min_seconds", as.min_seconds},
                       {"max_seconds", as.max_seconds},
                       {"min_gbps", as.min_gbps},
                       {"max_gbps", as.max_gbps},
                       {"median_reduction", as.median_reduction},
                       {"worst_reduction", as.worst_reduction},
                       {"worst_group", as.worst_group + 1},
                       {"worst_case_reduction", as.worst_case_reduction},
                       {"groups_agreeing", as.groups_agreeing},
                       {"direction_agrees", as.direction_agrees},
                       {"conclusive", as.conclusive},
                       {"verdict", describe_reduction(as.median_reduction)},
                       {"median_alloc_seconds", as.median_alloc_seconds},
                       {"median_upload_gbps", as.median_upload_gbps},
                       {"median_upload_vs_memcpy", as.median_upload_vs_memcpy},
                       {"worst_upload_vs_memcpy", as.worst_upload_vs_memcpy},
                       {"median_memcpy_gbps", as.median_memcpy_gbps},
                       {"median_memcpy_one_core_gbps", as.median_memcpy_one_core_gbps},
                       {"upload_ratio", as.upload_ratio},
                       {"predicted_upload_ratio", as.predicted_upload_ratio}});
  return {{"rounds_used", s.rounds_used}, {"upload_target", kUploadTarget}, {"arms", summary}};
}

}  // namespace

std::string to_json(const BenchResult& r) {
  json doc;
  doc["benchmark"] =
      r.task.empty() ? std::string("A/B bind benchmark") : "pinstage bench " + r.task;
  doc["run"] = json::parse(run_info_json(r.run));
  doc["config"] = config_json(r);
  doc["memory"] = {{"host_budget_bytes", r.plan.host_budget},
                   {"host_args_bytes", r.plan.need.host_args},
                   {"device_bytes", r.plan.need.device},
                   {"staging_bytes", r.plan.need.staging},
                   {"host_total_bytes", r.plan.need.host_total}};
  doc["sizes"] = {{"tensors", r.sizes.tensors},
                  {"input_tensors", r.sizes.input_tensors},
                  {"total_bytes", r.sizes.total_bytes},
                  {"input_bytes", r.sizes.input_bytes}};
  doc["groups"] = groups_json(r);
  doc["summary"] = summary_json(r.stats);
  return doc.dump(2) + "\n";
}

}  // namespace pinstage::ab
