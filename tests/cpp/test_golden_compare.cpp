// Comparison reporting on synthetic data: names the tensor, counts mismatches, finds the
// worst element with its index and values, applies the spec's tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include "pinstage/dtype.h"
#include "pinstage/error.h"
#include "pinstage/qwen3/golden.h"
#include "pinstage/safetensors.h"
#include "pinstage/tensor.h"

namespace {

using namespace pinstage;
using namespace pinstage::qwen3;

std::vector<uint16_t> bf16_values(const std::vector<float>& values) {
  std::vector<uint16_t> out;
  for (float v : values) out.push_back(f32_to_bf16(v));
  return out;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(GoldenCompare, IdenticalArraysAreOkWithNothingDiffering) {
  const auto a = bf16_values({1.0f, -2.0f, 0.5f, 0.0f});
  const TensorComparison c = compare_bf16("out", a.data(), a.data(), a.size());
  EXPECT_TRUE(c.ok());
  EXPECT_EQ(c.checked, 4u);
  EXPECT_EQ(c.mismatches, 0u);
  EXPECT_EQ(c.differing, 0u);
  EXPECT_EQ(c.worst_diff, 0.0f);
  EXPECT_TRUE(contains(c.message(), "out: ok")) << c.message();
}

TEST(GoldenCompare, ToleranceIsAtolPlusRtolTimesExpected) {
  // expected 10: limit 0.1 + 0.05 * 10 = 0.6. bf16 near 10 steps by 0.0625.
  const auto expected = bf16_values({10.0f, 10.0f, 0.0f, 0.0f});
  const auto actual = bf16_values({10.5625f, 10.625f, 0.099609375f, 0.10009765625f});
  const TensorComparison c = compare_bf16("x", actual.data(), expected.data(), 4);
  EXPECT_EQ(c.checked, 4u);
  EXPECT_EQ(c.differing, 4u);
  EXPECT_EQ(c.mismatches, 2u);  // 10.625 (diff 0.625 > 0.6) and 0.1001 (> 0.1)
  EXPECT_EQ(c.worst_index, 1u);
  EXPECT_EQ(c.worst_actual, 10.625f);
  EXPECT_EQ(c.worst_expected, 10.0f);
  EXPECT_EQ(c.worst_diff, 0.625f);
}

TEST(GoldenCompare, WithinToleranceReportsTheLargestDifference) {
  const auto expected = bf16_values({1.0f, 2.0f, 3.0f});
  const auto actual = bf16_values({1.0f, 2.0625f, 3.0f});
  const TensorComparison c = compare_bf16("out", actual.data(), expected.data(), 3);
  EXPECT_TRUE(c.ok());
  EXPECT_EQ(c.differing, 1u);
  EXPECT_EQ(c.worst_index, 1u);
  EXPECT_EQ(c.worst_diff, 0.0625f);
}

TEST(GoldenCompare, NanIsAMismatchAndTheWorst) {
  const auto expected = bf16_values({1.0f, 1.0f, 1.0f});
  const auto actual = bf16_values({5.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f});
  const TensorComparison c = compare_bf16("v_cache", actual.data(), expected.data(), 3);
  EXPECT_EQ(c.mismatches, 2u);
  EXPECT_EQ(c.worst_index, 1u);
  EXPECT_TRUE(std::isinf(c.worst_diff));
  EXPECT_TRUE(std::isnan(c.worst_actual));
  const std::string m = c.message();
  EXPECT_TRUE(contains(m, "v_cache")) << m;
  EXPECT_TRUE(contains(m, "2 of 3")) << m;
  EXPECT_TRUE(contains(m, "index 1")) << m;
}

TEST(GoldenCompare, RowsAreComparedAtTheirFlatIndicesAndTheLastWriteWins) {
  const uint64_t cache_rows = 10;
  std::vector<uint16_t> cache(cache_rows * kHeadDim, f32_to_bf16(0.25f));
  const std::vector<int64_t> rows = {7, 2, 7};  // row 7 written twice: the second counts
  std::vector<uint16_t> expected(rows.size() * kHeadDim, f32_to_bf16(0.25f));
  for (int d = 0; d < kHeadDim; ++d) expected[0 * kHeadDim + d] = f32_to_bf16(99.0f);  // stale
  EXPECT_TRUE(compare_rows("k_cache", cache.data(), cache_rows, rows, expected).ok());

  cache[2 * kHeadDim + 5] = f32_to_bf16(-4.0f);  // corrupt row 2, column 5
  const TensorComparison c = compare_rows("k_cache", cache.data(), cache_rows, rows, expected);
  EXPECT_EQ(c.checked, 2u * kHeadDim);
  EXPECT_EQ(c.mismatches, 1u);
  EXPECT_EQ(c.worst_index, 2u * kHeadDim + 5);
  EXPECT_EQ(c.worst_actual, -4.0f);
  EXPECT_EQ(c.worst_expected, 0.25f);
}

TEST(GoldenCompare, RowsOutsideTheCacheOrShortValuesAreRefused) {
  std::vector<uint16_t> cache(4 * kHeadDim);
  const std::vector<uint16_t> one_row(kHeadDim);
  try {
    compare_rows("v_cache", cache.data(), 4, {4}, one_row);
    ADD_FAILURE() << "row 4 of a 4-row cache was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_TRUE(contains(e.what(), "v_cache")) << e.what();
  }
  EXPECT_THROW(compare_rows("v_cache", cache.data(), 4, {0, 1}, one_row), Error);
}

// A synthetic golden: out plus two written rows per cache.
struct Synthetic {
  Golden golden;
  std::vector<uint16_t> out, k, v;
  static constexpr uint64_t kRows = 6;
  Synthetic() {
    golden.n_layers = 1;
    for (int i = 0; i < kBatch * kHidden; ++i)
      golden.out.push_back(f32_to_bf16(static_cast<float>(i % 17) - 8.0f));
    golden.kv_rows = {1, 4};
    for (int i = 0; i < 2 * kHeadDim; ++i) {
      golden.k_rows.push_back(f32_to_bf16(0.5f + i % 3));
      golden.v_rows.push_back(f32_to_bf16(-0.5f - i % 5));
    }
    out = golden.out;
    k.assign(kRows * kHeadDim, 0);
    v.assign(kRows * kHeadDim, 0);
    for (int r = 0; r < 2; ++r)
      for (int d = 0; d < kHeadDim; ++d) {
        k[golden.kv_rows[r] * kHeadDim + d] = golden.k_rows[r * kHeadDim + d];
        v[golden.kv_rows[r] * kHeadDim + d] = golden.v_rows[r * kHeadDim + d];
      }
  }
  Comparison run() const { return compare(out.data(), k.data(), v.data(), kRows, golden); }
};

TEST(GoldenCompare, CompareChecksOutAndBothCaches) {
  Synthetic s;
  Comparison c = s.run();
  ASSERT_TRUE(c.ok) << c.message();
  ASSERT_EQ(c.tensors.size(), 3u);
  EXPECT_EQ(c.tensors[0].tensor, "out");
  EXPECT_EQ(c.tensors[1].tensor, "k_cache");
  EXPECT_EQ(c.tensors[2].tensor, "v_cache");
  EXPECT_EQ(c.tensors[1].checked, 2u * kHeadDim);
  EXPECT_TRUE(contains(c.message(), "ok (")) << c.message();

  // Rows the decode does not write are not compared.
  s.k[0] = f32_to_bf16(1000.0f);
  EXPECT_TRUE(s.run().ok);

  s.v[4 * kHeadDim + 3] = f32_to_bf16(50.0f);
  s.v[4 * kHeadDim + 9] = f32_to_bf16(20.0f);
  c = s.run();
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.tensor, "v_cache");
  EXPECT_EQ(c.mismatches, 2u);
  EXPECT_EQ(c.worst_index, 4u * kHeadDim + 3);
  EXPECT_EQ(c.worst_actual, 50.0f);
  EXPECT_TRUE(c.tensors[0].ok() && c.tensors[1].ok());
  EXPECT_TRUE(contains(c.message(), "v_cache: 2 of 256 elements mismatch")) << c.message();
  EXPECT_FALSE(contains(c.message(), "out")) << c.message();
}

TEST(GoldenCompare, FirstFailingTensorIsReportedInOrder) {
  Synthetic s;
  s.out[100] = f32_to_bf16(1e4f);
  s.k[1 * kHeadDim] = f32_to_bf16(-1e4f);
  const Comparison c = s.run();
  EXPECT_EQ(c.tensor, "out");
  EXPECT_EQ(c.worst_index, 100u);
  EXPECT_TRUE(contains(c.message(), "out: 1 of 81,920")) << c.message();
  EXPECT_TRUE(contains(c.message(), "k_cache: 1 of 256")) << c.message();
}

TEST(GoldenCompare, TaskArgsFormFindsTheTensorsByName) {
  Synthetic s;
  PageableAllocator alloc;
  TaskArgs result;
  auto add = [&](const std::string& name, std::vector<int64_t> shape,
                 const std::vector<uint16_t>& data) {
    Tensor t = Tensor::empty(name, DType::bf16, std::move(shape), Direction::inout, alloc);
    std::copy(data.begin(), data.end(), t.data_as<uint16_t>());
    result.add(std::move(t));
  };
  add("out", {kBatch, kHidden}, s.out);
  add("k_cache", {static_cast<int64_t>(Synthetic::kRows), kHeadDim}, s.k);
  EXPECT_THROW(compare(result, s.golden), Error);  // no v_cache
  s.v[1 * kHeadDim + 1] = f32_to_bf16(7.0f);
  add("v_cache", {static_cast<int64_t>(Synthetic::kRows), kHeadDim}, s.v);
  const Comparison c = compare(result, s.golden);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.tensor, "v_cache");
  EXPECT_EQ(c.worst_index, 1u * kHeadDim + 1);
}

TEST(GoldenCompare, AGoldenOfTheWrongSizeIsRefused) {
  Synthetic s;
  s.golden.out.pop_back();
  EXPECT_THROW(s.run(), Error);
}

// A golden of one layer with distinct values everywhere.
Golden one_layer_golden() {
  Golden g;
  g.n_layers = 1;
  for (int i = 0; i < kBatch * kHidden; ++i) g.out.push_back(static_cast<uint16_t>(i * 7));
  for (int r = 0; r < kBatch * kNumKvHeads; ++r) {
    g.kv_rows.push_back(int64_t{r} * 1000 + 3);
    for (int d = 0; d < kHeadDim; ++d) {
      g.k_rows.push_back(static_cast<uint16_t>(r * kHeadDim + d));
      g.v_rows.push_back(static_cast<uint16_t>(60000 - r * kHeadDim - d));
    }
  }
  return g;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "_" + std::to_string(::getpid()) + ".safetensors"))
      .string();
}

TEST(GoldenFile, SaveThenLoadGivesTheSameGolden) {
  const Golden g = one_layer_golden();
  const std::string path = temp_path("golden_roundtrip");
  EXPECT_GT(save_golden(g, path), 0u);
  const Golden back = load_golden(path);
  std::remove(path.c_str());
  EXPECT_EQ(back.n_layers, 1);
  EXPECT_EQ(back.out, g.out);
  EXPECT_EQ(back.kv_rows, g.kv_rows);
  EXPECT_EQ(back.k_rows, g.k_rows);
  EXPECT_EQ(back.v_rows, g.v_rows);
}

TEST(GoldenFile, TensorsAreNamedAndShapedForTheSceneFile) {
  PageableAllocator alloc;
  const TaskArgs t = golden_tensors(one_layer_golden(), alloc);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t.get("out").shape(), (std::vector<int64_t>{kBatch, kHidden}));
  EXPECT_EQ(t.get("kv_rows").dtype(), DType::i64);
  EXPECT_EQ(t.get("kv_rows").data_as<int64_t>()[5], 5003);
  EXPECT_EQ(t.get("v_rows").shape(), (std::vector<int64_t>{kBatch * kNumKvHeads, kHeadDim}));
}

TEST(GoldenFile, InconsistentGoldensAndForeignFilesAreRefused) {
  Golden bad = one_layer_golden();
  bad.k_rows.pop_back();
  PageableAllocator alloc;
  try {
    golden_tensors(bad, alloc);
    ADD_FAILURE() << "an inconsistent golden was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  }
  // A valid safetensors file that is not a golden.
  TaskArgs other = golden_tensors(one_layer_golden(), alloc);
  TaskArgs without_rows;
  for (const Tensor& t : other)
    if (t.name() != "k_rows") without_rows.add(t);
  const std::string path = temp_path("golden_partial");
  save_safetensors(without_rows, path);
  try {
    load_golden(path);
    ADD_FAILURE() << "a file without k_rows was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io);
    EXPECT_NE(std::string(e.what()).find("k_rows"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

}  // namespace
