// The counter-based normal generator: every code path gives the bytes of the scalar
// reference, ranges can start and stop anywhere, and z is a standard normal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "pinstage/dtype.h"
#include "pinstage/random.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

constexpr GenIsa kAll[] = {GenIsa::generic, GenIsa::avx2, GenIsa::avx512, GenIsa::avx512bf16};

std::vector<GenIsa> supported() {
  std::vector<GenIsa> out;
  for (GenIsa isa : kAll)
    if (gen_isa_supported(isa)) out.push_back(isa);
  return out;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

struct Case {
  uint64_t first;
  uint64_t count;
  float std;
  float bias;
};

// Partial blocks at either end, whole blocks, tiny ranges, a nonzero bias.
constexpr Case kCases[] = {
    {0, 4096, 1.0f, 0.0f},     {7, 1000, 0.02f, 0.0f}, {31, 2, 0.01f, 0.3f},
    {1000003, 33, 0.1f, 1.0f}, {5, 1, 0.0006f, 0.0f},  {64, 70000, 0.02f, 0.3f},
};

TEST(Random, EveryPathMatchesTheScalarReference) {
  const NormalStream stream{1234, 13};
  for (const Case& c : kCases) {
    std::vector<float> ref(c.count);
    for (uint64_t k = 0; k < c.count; ++k)
      ref[k] = normal_reference(stream, c.first + k, c.std, c.bias);
    for (GenIsa isa : supported()) {
      std::vector<float> f32(c.count);
      std::vector<uint16_t> bf16(c.count);
      fill_normal_f32_with(isa, f32.data(), stream, c.first, c.count, c.std, c.bias);
      fill_normal_bf16_with(isa, bf16.data(), stream, c.first, c.count, c.std, c.bias);
      for (uint64_t k = 0; k < c.count; ++k) {
        ASSERT_EQ(bits(f32[k]), bits(ref[k]))
            << gen_isa_name(isa) << " f32, element " << c.first + k;
        ASSERT_EQ(bf16[k], f32_to_bf16(ref[k]))
            << gen_isa_name(isa) << " bf16, element " << c.first + k;
      }
    }
  }
}

TEST(Random, AnySplitOfARangeGivesTheSameBytes) {
  const NormalStream stream{99, 2};
  const uint64_t n = 50000;
  std::vector<uint16_t> whole(n), pieces(n);
  fill_normal_bf16(whole.data(), stream, 100, n, 0.02f, 0.0f);
  uint64_t at = 0;
  for (uint64_t step = 1; at < n; step = step * 3 + 1) {
    const uint64_t len = std::min(step, n - at);
    fill_normal_bf16(pieces.data() + at, stream, 100 + at, len, 0.02f, 0.0f);
    at += len;
  }
  EXPECT_EQ(whole, pieces);
}

TEST(Random, FarIndicesMatchTheReference) {
  // The block counter is 64 bits: ranges deep into a stream (past 2^32 blocks) and across
  // a carry into the counter's high dword match the reference and differ from the start.
  const NormalStream stream{5, 1};
  for (uint64_t first :
       {(uint64_t{1} << 37) - 48, (uint64_t{1} << 50) + 3, (uint64_t{1} << 63) - 40}) {
    const uint64_t n = 96;
    for (GenIsa isa : supported()) {
      std::vector<float> out(n);
      fill_normal_f32_with(isa, out.data(), stream, first, n, 1.0f, 0.0f);
      for (uint64_t k = 0; k < n; ++k)
        ASSERT_EQ(bits(out[k]), bits(normal_reference(stream, first + k)))
            << gen_isa_name(isa) << " element " << first + k;
    }
  }
  std::vector<float> low(64), high(64);
  fill_normal_f32(low.data(), stream, 0, 64, 1.0f, 0.0f);
  fill_normal_f32(high.data(), stream, uint64_t{1} << 37, 64, 1.0f, 0.0f);
  EXPECT_NE(low, high);
}

TEST(Random, SeedsAndStreamsDiffer) {
  std::vector<float> a(256), b(256), c(256), d(256);
  fill_normal_f32(a.data(), {1, 0}, 0, 256, 1.0f, 0.0f);
  fill_normal_f32(b.data(), {1, 0}, 0, 256, 1.0f, 0.0f);
  fill_normal_f32(c.data(), {2, 0}, 0, 256, 1.0f, 0.0f);
  fill_normal_f32(d.data(), {1, 1}, 0, 256, 1.0f, 0.0f);
  EXPECT_EQ(a, b);
  int same_c = 0, same_d = 0;
  for (int i = 0; i < 256; ++i) {
    same_c += a[i] == c[i];
    same_d += a[i] == d[i];
  }
  EXPECT_LT(same_c, 3);
  EXPECT_LT(same_d, 3);
}

TEST(Random, RejectsBadArguments) {
  float x;
  EXPECT_EQ(test::error_of([&] { fill_normal_f32(nullptr, {}, 0, 4, 1.0f, 0.0f); }).code(),
            ErrorCode::invalid_argument);
  EXPECT_EQ(test::error_of([&] { fill_normal_f32(&x, {}, UINT64_MAX, 2, 1.0f, 0.0f); }).code(),
            ErrorCode::invalid_argument);
  fill_normal_f32(nullptr, {}, 0, 0, 1.0f, 0.0f);  // nothing to do, nothing checked
  for (GenIsa isa : kAll) {
    if (!gen_isa_supported(isa)) {
      EXPECT_EQ(test::error_of([&] { fill_normal_f32_with(isa, &x, {}, 0, 1, 1.0f, 0.0f); }).code(),
                ErrorCode::unsupported);
    }
  }
}

double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// z itself (std 1, bias 0, f32): the moments, the tails, independence of neighbours and
// of the two halves of a Box-Muller pair, and the Kolmogorov-Smirnov distance to N(0, 1).
TEST(Random, IsAStandardNormal) {
  const uint64_t n = uint64_t{1} << 22;
  std::vector<float> z(n);
  fill_normal_f32(z.data(), {1234, 7}, 0, n, 1.0f, 0.0f);
  double s1 = 0, s2 = 0, s3 = 0, s4 = 0, lag = 0, halves = 0;
  uint64_t beyond1 = 0, beyond2 = 0, beyond3 = 0, beyond4 = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const double v = z[i];
    s1 += v;
    s2 += v * v;
    s3 += v * v * v;
    s4 += v * v * v * v;
    if (i + 1 < n) lag += v * z[i + 1];
    if ((i / 16) % 2 == 0) halves += v * z[i + 16];  // the pair's cos and sin halves
    const double a = std::fabs(v);
    beyond1 += a > 1;
    beyond2 += a > 2;
    beyond3 += a > 3;
    beyond4 += a > 4;
  }
  const double dn = static_cast<double>(n);
  const double mean = s1 / dn, var = s2 / dn - mean * mean;
  const double skew = s3 / dn, kurt = s4 / dn;
  // Five standard errors of each estimate under N(0, 1).
  EXPECT_NEAR(mean, 0.0, 5 / std::sqrt(dn));
  EXPECT_NEAR(var, 1.0, 5 * std::sqrt(2 / dn));
  EXPECT_NEAR(skew, 0.0, 5 * std::sqrt(15 / dn));
  EXPECT_NEAR(kurt, 3.0, 5 * std::sqrt(96 / dn));
  EXPECT_NEAR(lag / dn, 0.0, 5 / std::sqrt(dn));
  EXPECT_NEAR(halves / (dn / 2), 0.0, 5 / std::sqrt(dn / 2));
  for (auto [count, t] :
       {std::pair{beyond1, 1.0}, {beyond2, 2.0}, {beyond3, 3.0}, {beyond4, 4.0}}) {
    const double p = 2 * normal_cdf(-t);
    EXPECT_NEAR(static_cast<double>(count) / dn, p, 5 * std::sqrt(p * (1 - p) / dn))
        << "P(|z| > " << t << ")";
  }
  std::sort(z.begin(), z.end());
  double d = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const double c = normal_cdf(z[i]);
    d = std::max({d, c - static_cast<double>(i) / dn, static_cast<double>(i + 1) / dn - c});
  }
  // The 0.1% critical value of the KS statistic is 1.95 / sqrt(n).
  EXPECT_LT(d * std::sqrt(dn), 1.95) << "KS distance " << d;
  // The tails reach as far as 24-bit uniforms allow (sqrt(2 ln 2^24) = 5.77).
  EXPECT_LT(z.front(), -4.5);
  EXPECT_GT(z.back(), 4.5);
  EXPECT_LE(z.back(), 5.8f);
}

}  // namespace
}  // namespace pinstage
