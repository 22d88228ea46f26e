// TpPlan: the rules that say which tensors a tensor-parallel load splits, built in code or
// parsed strictly from a plan file, and resolve_tp_plan, which applies them to a
// checkpoint and refuses every split that cannot be made before any memory is taken.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/plan_regex.h"
#include "pinstage/error.h"
#include "pinstage/files.h"
#include "pinstage/load_plan.h"
#include "tensor/strict_json.h"

namespace pinstage {

namespace detail {
struct TpPattern {
  std::optional<PlanRegex> re;  // set for a regex rule (linear in the name, no recursion)
};
}  // namespace detail

namespace {

using detail::shown;

[[noreturn]] void plan_error(const std::string& source, const std::string& why) {
  throw Error(ErrorCode::invalid_argument, "tp plan " + source + ": " + why);
}

std::string dim_range() {
  return std::string("[") + std::to_string(-kTpMaxDim) + ", " + std::to_string(kTpMaxDim - 1) + "]";
}

void check_dim(int dim, const std::string& source, const std::string& where) {
  if (dim < -kTpMaxDim || dim >= kTpMaxDim)
    plan_error(source, where + ": split dim " + std::to_string(dim) + " is out of range " +
                           dim_range() + " (negative counts from the last dim)");
}

void check_tp(int64_t tp, const std::string& what) {
  if (tp < 1 || tp > kTpMaxRanks)
    throw Error(ErrorCode::invalid_argument, what + " is " + std::to_string(tp) +
                                                 "; it must be a whole number in [1, " +
                                                 std::to_string(kTpMaxRanks) + "]");
}

// '*' any run of characters, '?' one, anything else itself; the whole name must match.
bool glob_match(std::string_view p, std::string_view s) {
  size_t pi = 0, si = 0, star = std::string_view::npos, resume = 0;
  while (si < s.size()) {
    if (pi < p.size() && (p[pi] == '?' || (p[pi] != '*' && p[pi] == s[si]))) {
      ++pi;
      ++si;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      resume = si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++resume;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

std::string action(const std::optional<int>& dim) {
  return dim ? "split dim " + std::to_string(*dim) : std::string("replicate");
}

}  // namespace

TpPlan& TpPlan::add(std::string pattern, bool regex, std::optional<int> dim) {
  const std::string where = "rule " + std::to_string(rules_.size() + 1);
  const char* key = regex ? "regex" : "match";
  if (pattern.empty()) plan_error("(built in code)", where + ": its " + key + " is empty");
  if (dim) check_dim(*dim, "(built in code)", where);
  auto compiled = std::make_shared<detail::TpPattern>();
  if (regex) {
    try {
      compiled->re.emplace(pattern);
    } catch (const std::invalid_argument& e) {
      plan_error("(built in code)",
                 where + ": regex " + shown(pattern) + " does not compile: " + e.what());
    }
  }
  rules_.push_back({std::move(pattern), regex, dim, std::move(compiled)});
  return *this;
}

TpPlan& TpPlan::split(std::string glob, int dim) { return add(std::move(glob), false, dim); }
TpPlan& TpPlan::replicate(std::string glob) { return add(std::move(glob), false, std::nullopt); }
TpPlan& TpPlan::split_regex(std::string regex, int dim) { return add(std::move(regex), true, dim); }
TpPlan& TpPlan::replicate_regex(std::string regex) {
  return add(std::move(regex), true, std::nullopt);
}

TpPlan& TpPlan::default_split(int dim) {
  check_dim(dim, "(built in code)", "the default");
  default_dim_ = dim;
  return *this;
}

TpPlan& TpPlan::default_replicate() {
  default_dim_.reset();
  return *this;
}

TpPlan& TpPlan::expect_tp(int tp) {
  check_tp(tp, "tp plan (built in code): \"tp\"");
  tp_ = tp;
  return *this;
}

int TpPlan::match(std::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i) {
    const TpRule& r = rules_[i];
    const bool hit = r.regex ? r.compiled->re->full_match(name) : glob_match(r.pattern, name);
    if (hit) return static_cast<int>(i);
  }
  return -1;
}

std::string TpPlan::describe(int rule) const {
  if (rule < 0) return "the default (" + action(default_dim_) + ")";
  const TpRule& r = rules_.at(static_cast<size_t>(rule));
  return "rule " + std::to_string(rule + 1) + " (" + (r.regex ? "regex " : "match ") +
         shown(r.pattern) + ": " + action(r.split_dim) + ")";
}

namespace {

void only_keys(const nlohmann::json& obj, std::initializer_list<const char*> keys,
               const std::string& source, const std::string& where) {
  if (const auto key = detail::unknown_key(obj, keys))
    plan_error(source, where + " has an unknown key " + shown(*key));
}

// A whole JSON number in [lo, hi] (true, 1.0 and "1" are not).
int64_t whole_in(const nlohmann::json& v, int64_t lo, int64_t hi, const std::string& source,
                 const std::string& what) {
  const std::string range = std::string("[") + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!v.is_number_integer())
    plan_error(source, what + " is not a whole number (it must be in " + range + ")");
  const bool huge = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi);
  if (huge || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    plan_error(source, what + " is " + v.dump() + "; it must be in " + range);
  return v.get<int64_t>();
}

// {"split": DIM} or {"replicate": true}: the dim, or nullopt.
std::optional<int> parse_action(const nlohmann::json& obj, const std::string& source,
                                const std::string& where) {
  const bool has_split = obj.contains("split"), has_rep = obj.contains("replicate");
  if (has_split == has_rep)
    plan_error(source, where + (has_split ? " has both \"split\" and \"replicate\"; give one"
                                          : " has neither \"split\" nor \"replicate\""));
  if (has_rep) {
    if (obj["replicate"] != true)
      plan_error(source, where +
                             ": \"replicate\" must be true (a rule that splits says "
                             "\"split\": DIM)");
    return std::nullopt;
  }
  return static_cast<int>(
      whole_in(obj["split"], -kTpMaxDim, kTpMaxDim - 1, source, where + ": \"split\""));
}

void parse_rule(TpPlan& plan, const nlohmann::json& rule, size_t index, const std::string& source) {
  const std::string where = "rule " + std::to_string(index + 1);
  if (!rule.is_object()) plan_error(source, where + " is not an object");
  only_keys(rule, {"match", "regex", "split", "replicate"}, source, where);
  const bool glob = rule.contains("match"), re = rule.contains("regex");
  if (glob == re)
    plan_error(source, where + (glob ? " has both \"match\" and \"regex\"; give one"
                                     : " has neither \"match\" (a glob) nor \"regex\""));
  const nlohmann::json& pattern = rule[glob ? "match" : "regex"];
  const std::string key = glob ? "\"match\"" : "\"regex\"";
  if (!pattern.is_string()) plan_error(source, where + ": " + key + " is not a string");
  if (pattern.get<std::string>().empty()) plan_error(source, where + ": " + key + " is empty");
  const std::optional<int> dim = parse_action(rule, source, where);
  try {
    if (dim)
      glob ? plan.split(pattern, *dim) : plan.split_regex(pattern, *dim);
    else
      glob ? plan.replicate(pattern) : plan.replicate_regex(pattern);
  } catch (const Error& e) {  // a regex that does not compile: name the file
    const std::string what = e.what();
    plan_error(source, what.substr(what.find(": ") + 2));
  }
}

}  // namespace

TpPlan TpPlan::parse(std::string_view text, const std::string& source_name) {
  const std::string source = "'" + source_name + "'";
  nlohmann::json doc;
  try {
    doc = detail::parse_strict_json(text, "the plan", 8);
  } catch (const detail::StrictJsonError& e) {
    plan_error(source, e.message);
  }
  if (!doc.is_object()) plan_error(source, "the plan is not a JSON object");
  only_keys(doc, {"format", "tp", "rules", "default"}, source, "the plan");
  if (!doc.contains("format") || doc["format"] != kTpPlanFormat)
    plan_error(source, std::string("its \"format\" is not \"") + kTpPlanFormat + "\"");
  if (!doc.contains("rules") || !doc["rules"].is_array())
    plan_error(source, "it has no \"rules\" array (an empty one replicates everything)");
  TpPlan plan;
  if (doc.contains("tp"))
    plan.tp_ = static_cast<int>(whole_in(doc["tp"], 1, kTpMaxRanks, source, "\"tp\""));
  for (size_t i = 0; i < doc["rules"].size(); ++i) parse_rule(plan, doc["rules"][i], i, source);
  if (doc.contains("default")) {
    const nlohmann::json& d = doc["default"];
    if (!d.is_object()) plan_error(source, "\"default\" is not an object");
    only_keys(d, {"split", "replicate"}, source, "the default");
    plan.default_dim_ = parse_action(d, source, "the default");
  }
  return plan;
}

TpPlan TpPlan::read_file(const std::string& path) {
  std::string text, why;
  if (!read_regular_file(path, kTpPlanMaxBytes, &text, &why))
    plan_error("'" + path + "'", "cannot read it: " + why);
  return parse(text, path);
}

TpPart tp_part(int64_t size, int parts, int rank) {
  if (parts < 1 || rank < 0 || rank >= parts || size < 0)
    throw Error(ErrorCode::invalid_argument,
                "tp_part: rank " + std::to_string(rank) + " of " + std::to_string(parts) +
                    " parts of a dimension of size " + std::to_string(size));
  const int64_t base = size / parts, extra = size % parts;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

[[noreturn]] void refuse(const CheckpointTensor& t, const TpPlan& plan, int rule,
                         const std::string& why) {
  throw Error(ErrorCode::invalid_argument, "tp load: tensor " + shown(t.name) + " (shape " +
                                               shape_text(t.shape) + "): " + plan.describe(rule) +
                                               " " + why + "; nothing was loaded");
}

}  // namespace

std::vector<TpDecision> resolve_tp_plan(const Checkpoint& c, const TpPlan& plan, int tp) {
  check_tp(tp, "tp load: tp");
  if (plan.tp() && *plan.tp() != tp)
    throw Error(ErrorCode::invalid_argument, "tp load: the plan was written for tp " +
                                                 std::to_string(*plan.tp()) + ", not " +
                                                 std::to_string(tp));
  std::vector<TpDecision> out;
  out.reserve(c.tensors().size());
  for (const CheckpointTensor& t : c.tensors()) {
    const int rule = plan.match(t.name);
    const std::optional<int> want =
        rule < 0 ? plan.default_dim() : plan.rules()[static_cast<size_t>(rule)].split_dim;
    TpDecision d{&t, rule, -1};
    if (want) {
      const auto rank = static_cast<int>(t.shape.size());
      if (*want >= rank || *want < -rank)
        refuse(t, plan, rule,
               "cannot split it: it has " + std::to_string(rank) + (rank == 1 ? " dim" : " dims") +
                   (rank > 0 ? " (0.." + std::to_string(rank - 1) + ", or -" +
                                   std::to_string(rank) + "..-1)"
                             : std::string()));
      d.dim = *want < 0 ? *want + rank : *want;
      const int64_t size = t.shape[static_cast<size_t>(d.dim)];
      if (size < tp)
        refuse(t, plan, rule,
               "would split dim " + std::to_string(d.dim) + " of size " + std::to_string(size) +
                   " into " + std::to_string(tp) + (tp == 1 ? " part: " : " parts: ") +
                   std::to_string(tp - size) +
                   " would be empty (replicate it, or split a dim of at least tp)");
    }
    out.push_back(d);
  }
  return out;
}

}  // namespace pinstage
