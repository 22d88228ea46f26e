// The A/B statistics: per-group minima, paired reductions, ranges and agreement.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "pinstage/ab_bench.h"

namespace pinstage::ab {

namespace {

using Series = std::vector<std::vector<std::vector<double>>>;

double gbps(uint64_t bytes, double seconds) {
  return seconds > 0.0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

// Checks that `series` is [groups][arms][rounds] with rounds > skip everywhere; returns
// the round count. `what` names the series in errors.
size_t check_shape(const Series& series, size_t groups, size_t arms, size_t skip,
                   const char* what) {
  if (series.size() != groups)
    throw Error(ErrorCode::invalid_argument, std::string("A/B timings: ") + what + " has " +
                                                 std::to_string(series.size()) +
                                                 " groups, expected " + std::to_string(groups));
  size_t rounds = 0;
  for (size_t g = 0; g < groups; ++g) {
    if (series[g].size() != arms)
      throw Error(ErrorCode::invalid_argument, std::string("A/B timings: ") + what + " group " +
                                                   std::to_string(g + 1) + " has " +
                                                   std::to_string(series[g].size()) +
                                                   " arms, expected " + std::to_string(arms));
    for (size_t a = 0; a < arms; ++a) {
      const size_t r = series[g][a].size();
      if (g == 0 && a == 0) rounds = r;
      if (r != rounds)
        throw Error(ErrorCode::invalid_argument, std::string("A/B timings: ") + what +
                                                     " has ragged rounds (" + std::to_string(r) +
                                                     " vs " + std::to_string(rounds) + ")");
    }
  }
  if (rounds <= skip)
    throw Error(ErrorCode::invalid_argument,
                std::string("A/B timings: ") + what + " has " + std::to_string(rounds) +
                    " round(s) per arm and the cold round is dropped, which leaves none; " +
                    "run at least 2 rounds or keep the cold round");
  return rounds;
}

std::optional<Arm> arm_named(const std::string& name) {
  for (Arm arm : {Arm::pageable, Arm::pinned, Arm::staged})
    if (name == arm_name(arm)) return arm;
  return std::nullopt;
}

double min_after(const std::vector<double>& rounds, size_t skip) {
  return min_of(
      std::vector<double>(rounds.begin() + static_cast<std::ptrdiff_t>(skip), rounds.end()));
}

// One arm across the groups: ranges, the paired median and worst reductions, agreement.
ArmSummary summarize_arm(const Stats& s, const std::string& name, size_t a, uint64_t input_bytes,
                         bool have_ratios) {
  const size_t groups = s.groups.size();
  ArmSummary sum;
  sum.arm = name;
  std::vector<double> mins, reductions, ratios, allocs, uploads, memcpys, one_cores, vs_ref;
  for (size_t g = 0; g < groups; ++g) {
    memcpys.push_back(s.groups[g][a].memcpy_gbps);
    one_cores.push_back(s.groups[g][a].memcpy_one_core_gbps);
    const double ref_upload = s.groups[g][s.reference].upload_gbps;
    vs_ref.push_back(ref_upload > 0.0 ? s.groups[g][a].upload_gbps / ref_upload : 0.0);
    mins.push_back(s.groups[g][a].min_seconds);
    reductions.push_back(s.groups[g][a].reduction);
    ratios.push_back(s.groups[g][a].upload_vs_memcpy);
    allocs.push_back(s.groups[g][a].alloc_min_seconds);
    uploads.push_back(s.groups[g][a].upload_gbps);
  }
  sum.median_alloc_seconds = median_of(allocs);
  sum.median_upload_gbps = median_of(uploads);
  sum.min_seconds = *std::min_element(mins.begin(), mins.end());
  sum.max_seconds = *std::max_element(mins.begin(), mins.end());
  sum.min_gbps = gbps(input_bytes, sum.max_seconds);
  sum.max_gbps = gbps(input_bytes, sum.min_seconds);
  sum.median_reduction = median_of(reductions);
  const bool faster = sum.median_reduction >= 0.0;
  const auto worst = faster ? std::min_element(reductions.begin(), reductions.end())
                            : std::max_element(reductions.begin(), reductions.end());
  sum.worst_reduction = *worst;
  sum.worst_group = static_cast<size_t>(worst - reductions.begin());
  sum.median_memcpy_gbps = median_of(memcpys);
  sum.median_memcpy_one_core_gbps = median_of(one_cores);
  sum.upload_ratio = median_of(vs_ref);
  for (double r : reductions) {
    const bool agrees = sum.median_reduction > 0.0   ? r > 0.0
                        : sum.median_reduction < 0.0 ? r < 0.0
                                                     : r == 0.0;
    if (agrees) ++sum.groups_agreeing;
  }
  sum.direction_agrees = sum.groups_agreeing == groups;
  sum.conclusive =
      groups >= 3 && sum.median_reduction != 0.0 && sum.groups_agreeing * 5 >= groups * 4;
  if (have_ratios) {
    sum.median_upload_vs_memcpy = median_of(ratios);
    sum.worst_upload_vs_memcpy = *std::min_element(ratios.begin(), ratios.end());
  }
  return sum;
}

}  // namespace

double min_of(const std::vector<double>& values) {
  if (values.empty())
    throw Error(ErrorCode::invalid_argument, "min_of: no values (every round was dropped?)");
  return *std::min_element(values.begin(), values.end());
}

double median_of(std::vector<double> values) {
  if (values.empty())
    throw Error(ErrorCode::invalid_argument, "median_of: no values (every round was dropped?)");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double reduction(double reference_seconds, double seconds) {
  return reference_seconds > 0.0 ? 1.0 - seconds / reference_seconds : 0.0;
}

double predicted_upload_gbps(Arm arm, double one_core_gbps, double all_core_gbps,
                             const CopyModel& model) {
  if (one_core_gbps <= 0.0 || all_core_gbps <= 0.0) return 0.0;
  const double inf = std::numeric_limits<double>::infinity();
  const double link = model.link_gbps > 0.0 ? model.link_gbps : inf;
  const double cores = std::max(1, model.cores);
  // The engine: its workers' share of the all-core rate.
  const double engine = all_core_gbps * std::min(1.0, std::max(1, model.dma_threads) / cores);
  switch (arm) {
    case Arm::pinned:
      return std::min(engine, link);
    case Arm::pageable:  // one staging thread, and both passes' CPU time within the cores
      return std::min(
          {one_core_gbps, engine, cores / (1.0 / one_core_gbps + cores / all_core_gbps), link});
    case Arm::staged:  // the ring copy on every core, then the engine's pass
      return std::min(1.0 / (1.0 / all_core_gbps + 1.0 / engine), link);
  }
  return 0.0;
}

std::string describe_reduction(double reduction) {
  if (reduction == 0.0) return "no change";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f%% %s", std::abs(reduction) * 100.0,
                reduction > 0.0 ? "faster" : "slower");
  return buf;
}

Stats compute_stats(const Timings& t) {
  const size_t groups = t.latency.size();
  const size_t arms = t.arms.size();
  if (groups == 0 || arms == 0)
    throw Error(ErrorCode::invalid_argument, "A/B timings: no groups or no arms");
  if (t.reference >= arms)
    throw Error(ErrorCode::invalid_argument, "A/B timings: reference arm index out of range");
  const size_t skip = t.keep_cold ? 0 : 1;
  const size_t rounds = check_shape(t.latency, groups, arms, skip, "latency");
  const bool have_upload = !t.upload.empty();
  const bool have_baseline = !t.baseline.empty();
  if (have_upload) check_shape(t.upload, groups, arms, skip, "upload");
  const bool have_alloc = !t.alloc.empty();
  if (have_alloc) check_shape(t.alloc, groups, arms, skip, "alloc");
  if (have_baseline) check_shape(t.baseline, groups, arms, skip, "baseline");
  const bool have_one_core = !t.baseline_one_core.empty();
  if (have_one_core) check_shape(t.baseline_one_core, groups, arms, 0, "one-core baseline");

  Stats s;
  s.reference = t.reference;
  s.rounds_used = rounds - skip;
  s.groups.assign(groups, std::vector<GroupArmStats>(arms));
  for (size_t g = 0; g < groups; ++g) {
    for (size_t a = 0; a < arms; ++a) {
      GroupArmStats& ga = s.groups[g][a];
      ga.rounds_used = rounds - skip;
      ga.min_seconds = min_after(t.latency[g][a], skip);
      ga.gbps = gbps(t.input_bytes, ga.min_seconds);
      if (have_upload) {
        ga.upload_min_seconds = min_after(t.upload[g][a], skip);
        ga.upload_gbps = gbps(t.input_bytes, ga.upload_min_seconds);
      }
      if (have_alloc) ga.alloc_min_seconds = min_after(t.alloc[g][a], skip);
      if (have_baseline) {
        ga.memcpy_min_seconds = min_after(t.baseline[g][a], skip);
        ga.memcpy_gbps = gbps(t.input_bytes, ga.memcpy_min_seconds);
      }
      if (have_one_core)
        ga.memcpy_one_core_gbps = gbps(t.input_bytes, min_of(t.baseline_one_core[g][a]));
      if (have_upload && have_baseline && ga.memcpy_gbps > 0.0)
        ga.upload_vs_memcpy = ga.upload_gbps / ga.memcpy_gbps;
    }
    const double ref = s.groups[g][t.reference].min_seconds;
    for (size_t a = 0; a < arms; ++a)
      s.groups[g][a].reduction = reduction(ref, s.groups[g][a].min_seconds);
  }

  s.arms.resize(arms);
  for (size_t a = 0; a < arms; ++a)
    s.arms[a] = summarize_arm(s, t.arms[a], a, t.input_bytes, have_upload && have_baseline);
  // The conservative pairing and the model's ratio need the reference's summary.
  const ArmSummary& ref = s.arms[t.reference];
  const std::optional<Arm> ref_arm = arm_named(ref.arm);
  const double ref_model = t.model && ref_arm && have_one_core && have_baseline
                               ? predicted_upload_gbps(*ref_arm, ref.median_memcpy_one_core_gbps,
                                                       ref.median_memcpy_gbps, *t.model)
                               : 0.0;
  for (size_t a = 0; a < arms; ++a) {
    ArmSummary& sum = s.arms[a];
    if (a == t.reference) continue;  // against itself it says nothing
    sum.worst_case_reduction = sum.median_reduction >= 0.0
                                   ? reduction(ref.min_seconds, sum.max_seconds)
                                   : reduction(ref.max_seconds, sum.min_seconds);
    const std::optional<Arm> arm = arm_named(sum.arm);
    if (ref_model > 0.0 && arm)
      sum.predicted_upload_ratio = predicted_upload_gbps(*arm, ref.median_memcpy_one_core_gbps,
                                                         sum.median_memcpy_gbps, *t.model) /
                                   ref_model;
  }
  return s;
}

}  // namespace pinstage::ab
