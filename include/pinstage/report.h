// A report as its ordered, named fields: the one serialiser of each report type. The
// library lists a report's fields once, and every front end (the CLI's JSON, Python's
// dicts) writes them as they come, so all of them say the same keys.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace pinstage {

// One field's value; counts are unsigned, times and rates double.
using ReportValue = std::variant<bool, int64_t, uint64_t, double, std::string>;

struct ReportField {
  std::string key;
  ReportValue value;
};

// In the order a report lists them.
using ReportFields = std::vector<ReportField>;

}  // namespace pinstage
