// Comparing a run's outputs against the golden with the spec's tolerance (docs/golden.md).
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>

#include "pinstage/dtype.h"
#include "pinstage/error.h"
#include "pinstage/qwen3/golden.h"
#include "pinstage/tensor.h"

namespace pinstage::qwen3 {
namespace {

// Accumulates element comparisons into a TensorComparison.
class Tally {
 public:
  explicit Tally(std::string_view tensor) {
    result_.tensor = std::string(tensor);
    result_.atol = kAtol;
    result_.rtol = kRtol;
  }

  void add(uint64_t index, uint16_t actual_bits, uint16_t expected_bits) {
    ++result_.checked;
    if (actual_bits != expected_bits) ++result_.differing;
    const float a = bf16_to_f32(actual_bits);
    const float b = bf16_to_f32(expected_bits);
    float diff = std::fabs(a - b);
    const bool ok = diff <= kAtol + kRtol * std::fabs(b);  // false for NaN
    if (std::isnan(diff)) diff = std::numeric_limits<float>::infinity();
    if (!ok) {
      ++result_.mismatches;
      if (result_.mismatches == 1 || diff > result_.worst_diff) take(index, a, b, diff);
    } else if (result_.mismatches == 0 && (result_.checked == 1 || diff > result_.worst_diff)) {
      take(index, a, b, diff);
    }
  }

  TensorComparison result() const { return result_; }

 private:
  void take(uint64_t index, float a, float b, float diff) {
    result_.worst_index = index;
    result_.worst_actual = a;
    result_.worst_expected = b;
    result_.worst_diff = diff;
  }
  TensorComparison result_;
};

const Tensor& bf16_tensor(const TaskArgs& result, std::string_view name) {
  const Tensor& t = result.get(name);
  if (t.dtype() != DType::bf16)
    throw Error(ErrorCode::invalid_argument, "compare: tensor '" + std::string(name) + "' is " +
                                                 dtype_name(t.dtype()) + "; expected bf16");
  return t;
}

}  // namespace

TensorComparison compare_bf16(std::string_view tensor, const uint16_t* actual,
                              const uint16_t* expected, size_t n) {
  Tally tally(tensor);
  for (size_t i = 0; i < n; ++i) tally.add(i, actual[i], expected[i]);
  return tally.result();
}

TensorComparison compare_rows(std::string_view tensor, const uint16_t* cache, uint64_t cache_rows,
                              const std::vector<int64_t>& rows,
                              const std::vector<uint16_t>& expected) {
  if (expected.size() != rows.size() * kHeadDim)
    throw Error(ErrorCode::invalid_argument,
                "compare_rows(" + std::string(tensor) + "): " + std::to_string(rows.size()) +
                    " rows need " + std::to_string(rows.size() * kHeadDim) + " values, got " +
                    std::to_string(expected.size()));
  std::unordered_map<int64_t, size_t> last;  // row -> its last entry (the last write wins)
  last.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || static_cast<uint64_t>(rows[i]) >= cache_rows)
      throw Error(ErrorCode::invalid_argument,
                  "compare_rows(" + std::string(tensor) + "): row " + std::to_string(rows[i]) +
                      " is outside the cache's " + std::to_string(cache_rows) + " rows");
    last[rows[i]] = i;
  }
  Tally tally(tensor);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (last[rows[i]] != i) continue;
    const uint64_t base = static_cast<uint64_t>(rows[i]) * kHeadDim;
    for (int d = 0; d < kHeadDim; ++d)
      tally.add(base + d, cache[base + d], expected[i * kHeadDim + d]);
  }
  return tally.result();
}

Comparison compare(const uint16_t* out, const uint16_t* k_cache, const uint16_t* v_cache,
                   uint64_t cache_rows, const Golden& golden) {
  if (golden.out.size() != static_cast<size_t>(kBatch) * kHidden)
    throw Error(ErrorCode::invalid_argument,
                "compare: the golden holds " + std::to_string(golden.out.size()) +
                    " out values, not " + std::to_string(kBatch * kHidden) +
                    "; compute it with compute_golden");
  Comparison result;
  result.add(compare_bf16("out", out, golden.out.data(), golden.out.size()));
  result.add(compare_rows("k_cache", k_cache, cache_rows, golden.kv_rows, golden.k_rows));
  result.add(compare_rows("v_cache", v_cache, cache_rows, golden.kv_rows, golden.v_rows));
  return result;
}

Comparison compare(const TaskArgs& result, const Golden& golden) {
  const Tensor& out = bf16_tensor(result, "out");
  const Tensor& k = bf16_tensor(result, "k_cache");
  const Tensor& v = bf16_tensor(result, "v_cache");
  if (out.numel() != golden.out.size())
    throw Error(ErrorCode::invalid_argument, "compare: 'out' has " + std::to_string(out.numel()) +
                                                 " elements, the golden " +
                                                 std::to_string(golden.out.size()));
  for (const Tensor* cache : {&k, &v})
    if (cache->shape().size() != 2 || cache->shape()[1] != kHeadDim)
      throw Error(ErrorCode::invalid_argument, "compare: '" + cache->name() + "' is " +
                                                   cache->shape_string() + "; expected [rows, " +
                                                   std::to_string(kHeadDim) + "]");
  if (k.shape()[0] != v.shape()[0])
    throw Error(ErrorCode::invalid_argument, "compare: k_cache " + k.shape_string() +
                                                 " and v_cache " + v.shape_string() +
                                                 " differ in rows");
  return compare(out.data_as<uint16_t>(), k.data_as<uint16_t>(), v.data_as<uint16_t>(),
                 static_cast<uint64_t>(k.shape()[0]), golden);
}

}  // namespace pinstage::qwen3
