// A report as its ordered, named fields: the one serialiser of each report type. The
// library lists a report's fields once, and every front end (the CLI's JSON, Python's
// dicts) writes them as they come, so all of them say the same keys.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace pinstage {

// One field's value; counts are unsigned, times and rates double, a list of names (the keys
// a prune removed) a vector: every visitor (the CLI's JSON, Python's dicts) writes it as a
// list.
using ReportValue =
    std::variant<bool, int64_t, uint64_t, double, std::string, std::vector<std::string>>;

struct ReportField {
  std::string key;
  ReportValue value;
};

// In the order a report lists them.
using ReportFields = std::vector<ReportField>;

// A member's value as a ReportValue: signed integers as int64_t, unsigned ones as
// uint64_t, so a serialiser generated from a field list needs no cast per field.
template <class T>
ReportValue report_value(const T& v) {
  static_assert(!std::is_enum_v<T>, "an enum field needs a report_value overload: its name");
  if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::string> ||
                std::is_same_v<T, std::vector<std::string>>)
    return v;
  else if constexpr (std::is_floating_point_v<T>)
    return static_cast<double>(v);
  else if constexpr (std::is_signed_v<T>)
    return static_cast<int64_t>(v);
  else
    return static_cast<uint64_t>(v);
}

// One field of a field list X(type, name, default, doc) appended as {"name", r.name} to
// `fields`, `r` being the report: a serialiser is LIST(PINSTAGE_REPORT_FIELD).
#define PINSTAGE_REPORT_FIELD(type, name, value, doc) \
  fields.push_back({#name, ::pinstage::report_value(r.name)});

}  // namespace pinstage
