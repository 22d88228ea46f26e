// The comparison report every scene returns (include/pinstage/scene.h).
#include <cstdio>
#include <string>

#include "pinstage/scene.h"

namespace pinstage {
namespace {

std::string fmt(float value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", static_cast<double>(value));
  return text;
}

}  // namespace

std::string TensorComparison::message() const {
  if (ok())
    return tensor + ": ok, " + format_thousands(checked) + " elements, " +
           format_thousands(differing) + " differ, max |a-b| " + fmt(worst_diff);
  return tensor + ": " + format_thousands(mismatches) + " of " + format_thousands(checked) +
         " elements mismatch, worst |a-b| = " + fmt(worst_diff) + " at index " +
         std::to_string(worst_index) + " (actual " + fmt(worst_actual) + ", expected " +
         fmt(worst_expected) + "; tolerance " + fmt(atol) + " + " + fmt(rtol) + " * |expected|)";
}

std::string Comparison::message() const {
  std::string text;
  for (const TensorComparison& t : tensors) {
    if (ok || !t.ok()) text += (text.empty() ? "" : "; ") + t.message();
  }
  return ok ? "ok (" + text + ")" : text;
}

void Comparison::add(TensorComparison t) {
  if (!t.ok() && ok) {
    ok = false;
    tensor = t.tensor;
    mismatches = t.mismatches;
    worst_index = t.worst_index;
    worst_actual = t.worst_actual;
    worst_expected = t.worst_expected;
    worst_diff = t.worst_diff;
  }
  tensors.push_back(std::move(t));
}

}  // namespace pinstage
