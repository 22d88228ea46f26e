// A/B benchmark configuration: arm names, validation, and the automatic size.
#include <string>
#include <vector>

#include "bench/refuse.h"
#include "pinstage/ab_bench.h"
#include "pinstage/names.h"
#include "pinstage/tensor.h"

namespace pinstage::ab {

namespace {

constexpr uint64_t kPage = 4096;  // PageableAllocator rounds each storage to a page

bool has_arm(const BenchConfig& config, Arm arm) {
  for (Arm a : config.arms)
    if (a == arm) return true;
  return false;
}

// "host args 5.14 GB + device memory 5.14 GB (host memory here) + staging ring 33.55 MB"
std::string describe_need(const MemoryNeed& need, const MemoryBudget& budget) {
  std::string s = "host args " + format_bytes(need.host_args);
  if (budget.device_is_host)
    s += " + device memory " + format_bytes(need.device) + " (host memory here)";
  if (need.host_total > need.host_args + need.staging + (budget.device_is_host ? need.device : 0))
    s += " + memcpy baseline buffer " +
         format_bytes(need.host_total - need.host_args - need.staging -
                      (budget.device_is_host ? need.device : 0));
  if (need.staging > 0) s += " + staging ring " + format_bytes(need.staging);
  return s;
}

bool fits(const MemoryNeed& need, const MemoryBudget& budget, uint64_t host_budget) {
  if (need.host_total > host_budget) return false;
  if (budget.device_capacity > 0 && need.device > budget.device_capacity) return false;
  return true;
}

// The task's size knob as the plan words it.
struct Knob {
  explicit Knob(const BenchTask& task)
      : name(task.size.name),
        flag(param_flag(task.size.name)),
        unit(task.size.unit.empty() ? "step" : task.size.unit),
        max(task.size.name.empty() ? 1 : task.size.size_max),
        max_note(task.size.size_max_note.empty() ? "the maximum" : task.size.size_max_note) {}
  bool fixed() const { return name.empty(); }
  std::string count(int64_t n) const {
    return std::to_string(n) + " " + unit + (n == 1 ? "" : "s");
  }
  std::string name, flag, unit;
  int64_t max;
  std::string max_note;
};

// `size` was asked for (or the task has no knob): it may use all of MemAvailable.
SizePlan explicit_plan(const BenchConfig& config, const BenchTask& task, const MemoryBudget& budget,
                       const Knob& knob, int64_t size, int64_t best) {
  SizePlan plan;
  plan.size = size;
  plan.need = memory_need(config, task, size, budget);
  plan.host_budget = budget.host_available;
  const std::string asked = knob.fixed() ? task.name : knob.flag + " " + std::to_string(size);
  const bool host_ok = plan.need.host_total <= budget.host_available;
  const bool device_ok = budget.device_capacity == 0 || plan.need.device <= budget.device_capacity;
  if (!host_ok || !device_ok) {
    std::string msg = asked + " needs ";
    if (!host_ok)
      msg += format_bytes(plan.need.host_total) + " of host memory (" +
             describe_need(plan.need, budget) + ") but MemAvailable is " +
             format_bytes(budget.host_available);
    else
      msg += format_bytes(plan.need.device) + " of device memory but the device holds " +
             format_bytes(budget.device_capacity);
    if (knob.fixed())
      msg += "; choose smaller sizes";
    else
      msg += best > 0
                 ? "; use " + knob.flag + " " + std::to_string(best) + " or fewer, or omit " +
                       knob.flag + " to choose the largest size that fits in half of MemAvailable"
                 : "; even 1 " + knob.unit +
                       " does not fit in half of MemAvailable on this "
                       "machine";
    throw Error(ErrorCode::out_of_memory, msg);
  }
  plan.reason = asked + ": needs " + describe_need(plan.need, budget) + " = " +
                format_bytes(plan.need.host_total) + " of " + format_bytes(budget.host_available) +
                " available";
  return plan;
}

SizePlan automatic_plan(const BenchConfig& config, const BenchTask& task,
                        const MemoryBudget& budget, const Knob& knob, int64_t best) {
  const uint64_t half = budget.host_available / 2;
  if (best == 0) {
    const MemoryNeed one = memory_need(config, task, 1, budget);
    throw Error(
        ErrorCode::out_of_memory,
        "even 1 " + knob.unit + " needs " + format_bytes(one.host_total) + " of host memory (" +
            describe_need(one, budget) + ")" +
            (budget.device_capacity > 0 ? " and " + format_bytes(one.device) + " of device memory"
                                        : std::string()) +
            ", more than half of MemAvailable (" + format_bytes(budget.host_available) + ")" +
            (budget.device_capacity > 0
                 ? " or the device (" + format_bytes(budget.device_capacity) + ")"
                 : std::string()) +
            "; free memory or pass " + knob.flag + " 1 explicitly to use all of MemAvailable");
  }
  SizePlan plan;
  plan.size = best;
  plan.automatic = true;
  plan.need = memory_need(config, task, best, budget);
  plan.host_budget = half;
  plan.reason = "automatic size: " + knob.count(best) +
                (best == knob.max ? " (" + knob.max_note + ")" : " (the largest that fits)") +
                ": " + describe_need(plan.need, budget) + " = " +
                format_bytes(plan.need.host_total) + " within half of MemAvailable (" +
                format_bytes(half) + ")";
  if (budget.device_capacity > 0)
    plan.reason += ", device memory " + format_bytes(plan.need.device) + " of " +
                   format_bytes(budget.device_capacity);
  return plan;
}

}  // namespace

namespace {
constexpr const char* kArmNames[] = {"pageable", "pinned", "staged"};  // Arm order
}  // namespace

const char* arm_name(Arm arm) { return enum_name(arm, kArmNames, "unknown"); }

std::vector<Arm> parse_arms(std::string_view list) {
  std::vector<Arm> arms;
  size_t pos = 0;
  while (true) {
    const size_t comma = list.find(',', pos);
    const std::string_view item =
        list.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    const std::optional<Arm> parsed = enum_from_name<Arm>(item, kArmNames);
    if (item.empty())
      throw Error(ErrorCode::invalid_argument,
                  "--arms '" + std::string(list) +
                      "' has an empty entry; give a comma-separated list such as "
                      "pageable,pinned,staged");
    if (!parsed)
      throw Error(ErrorCode::invalid_argument,
                  "--arms: unknown arm '" + std::string(item) +
                      "'; the arms are pageable, pinned and staged (e.g. --arms pageable,pinned)");
    const Arm arm = *parsed;
    for (Arm a : arms)
      if (a == arm)
        throw Error(ErrorCode::invalid_argument,
                    "--arms lists '" + std::string(item) + "' twice; name each arm once");
    arms.push_back(arm);
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return arms;
}

void validate(const BenchConfig& config) {
  if (config.arms.empty())
    throw Error(ErrorCode::invalid_argument,
                "--arms is empty; name at least one of pageable, pinned, staged");
  for (size_t i = 0; i < config.arms.size(); ++i)
    for (size_t j = i + 1; j < config.arms.size(); ++j)
      if (config.arms[i] == config.arms[j])
        throw Error(ErrorCode::invalid_argument, std::string("--arms lists '") +
                                                     arm_name(config.arms[i]) +
                                                     "' twice; name each arm once");
  if (config.groups < 1)
    detail::refuse_number("--groups", config.groups,
                          "it must be at least 1 (each group runs every arm once; default 5)");
  if (config.rounds < 1)
    detail::refuse_number("--rounds", config.rounds,
                          "it must be at least 1 (binds per arm per group; default 6)");
  if (config.rounds < 2 && !config.keep_cold)
    throw Error(ErrorCode::invalid_argument,
                "--rounds " + std::to_string(config.rounds) +
                    " leaves no round to measure: the first, cold bind of every arm is "
                    "dropped; use --rounds 2 or more, or --keep-cold");
  if (config.size < 0)
    detail::refuse_number("the size", config.size,
                          "it must be at least 1 (or omitted for the automatic size)");
  validate(config.bind);
}

MemoryNeed memory_need(const BenchConfig& config, const BenchTask& task, int64_t size,
                       const MemoryBudget& budget) {
  if (!task.sizes) throw Error(ErrorCode::invalid_argument, "memory_need: the task has no sizes");
  const TaskSizes sizes = task.sizes(size);
  BindOptions bind;
  MemoryNeed need;
  need.host_args = sizes.total_bytes + sizes.tensors * kPage;
  need.device = sizes.total_bytes + sizes.tensors * bind.arena_alignment;
  if (has_arm(config, Arm::staged))
    need.staging =
        static_cast<uint64_t>(config.bind.staging_buffers) * config.bind.staging_buffer_bytes;
  need.host_total = need.host_args + need.staging;
  if (budget.device_is_host)
    need.host_total += need.device;  // the baseline reuses device memory after the bind
  else if (config.baseline)
    need.host_total += sizes.input_bytes;  // the baseline copies into a host buffer
  return need;
}

SizePlan plan_size(const BenchConfig& config, const BenchTask& task, const MemoryBudget& budget) {
  validate(config);
  const Knob knob(task);
  // The largest value fitting in half of MemAvailable, up to the knob's maximum.
  int64_t best = 0;
  for (int64_t size = 1; size <= knob.max; ++size) {
    if (!fits(memory_need(config, task, size, budget), budget, budget.host_available / 2)) break;
    best = size;
  }
  if (knob.fixed() || config.size > 0)
    return explicit_plan(config, task, budget, knob, knob.fixed() ? 1 : config.size, best);
  return automatic_plan(config, task, budget, knob, best);
}

}  // namespace pinstage::ab
