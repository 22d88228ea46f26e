// dtype sizes and names, bf16 and f16 conversions (rounding, NaN, infinities).
#include <cpuid.h>
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "pinstage/dtype.h"
#include "pinstage/safetensors.h"

namespace pinstage {
namespace {

float f32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(DType, SizesAndNames) {
  // Every dtype with its size; the raw-storage ones (boolean on) complete the safetensors
  // set, u16 to u64 the unsigned ones safetensors and torch 2.3+ write.
  const std::pair<DType, size_t> sizes[] = {
      {DType::bf16, 2},    {DType::f16, 2},     {DType::f32, 4}, {DType::i32, 4}, {DType::i64, 8},
      {DType::boolean, 1}, {DType::u8, 1},      {DType::i8, 1},  {DType::i16, 2}, {DType::f64, 8},
      {DType::f8_e4m3, 1}, {DType::f8_e5m2, 1}, {DType::u16, 2}, {DType::u32, 4}, {DType::u64, 8}};
  for (const auto& [d, size] : sizes) {
    EXPECT_EQ(dtype_size(d), size) << dtype_name(d);
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
    EXPECT_EQ(parse_dtype(dtype_safetensors_name(d)), d);
    EXPECT_EQ(safetensors_dtype_size(dtype_safetensors_name(d)), dtype_size(d));
  }
  EXPECT_STREQ(dtype_safetensors_name(DType::bf16), "BF16");
  EXPECT_STREQ(dtype_name(DType::i64), "i64");
  EXPECT_STREQ(dtype_safetensors_name(DType::boolean), "BOOL");
  EXPECT_STREQ(dtype_name(DType::f8_e5m2), "f8_e5m2");
  EXPECT_STREQ(dtype_safetensors_name(DType::u64), "U64");
  EXPECT_EQ(parse_dtype("U32"), DType::u32);
  EXPECT_EQ(safetensors_dtype_size("f64"), 0u);  // the format spells dtypes upper-case
  EXPECT_FALSE(parse_dtype("F128"));
  EXPECT_FALSE(parse_dtype(""));
  EXPECT_FALSE(parse_dtype("Bf16"));
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // Exactly halfway between 0x3f80 and 0x3f81: to the even one.
  EXPECT_EQ(f32_to_bf16(f32(0x3f808000)), 0x3f80);
  // Halfway between 0x3f81 and 0x3f82: to the even one (up).
  EXPECT_EQ(f32_to_bf16(f32(0x3f818000)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(f32(0x3f808001)), 0x3f81);  // just above half
  EXPECT_EQ(f32_to_bf16(f32(0x3f807fff)), 0x3f80);  // just below half
  EXPECT_EQ(f32_to_bf16(-1.0f), 0xbf80);
  EXPECT_EQ(f32_to_bf16(f32(0xbf818000)), 0xbf82);  // sign does not change the rounding
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  // A carry out of the mantissa moves to the next binade.
  EXPECT_EQ(f32_to_bf16(f32(0x3fffffff)), 0x4000);
  // Subnormals round like everything else.
  EXPECT_EQ(f32_to_bf16(f32(0x00008000)), 0x0000);
  EXPECT_EQ(f32_to_bf16(f32(0x00018000)), 0x0002);
  EXPECT_EQ(f32_to_bf16(f32(0x00010001)), 0x0001);
}

TEST(Bf16, InfinityAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_bf16(inf), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-inf), 0xff80);
  // The largest finite f32 is past bf16's largest finite value + half an ulp: infinity.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(f32(0x7f7f7fff)), 0x7f7f);  // just below the midpoint: finite
  // NaN stays NaN, even when its payload is only in the low bits (truncation would give inf).
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu}) {
    const uint16_t h = f32_to_bf16(f32(nan));
    EXPECT_TRUE(std::isnan(bf16_to_f32(h))) << std::hex << nan;
    EXPECT_EQ(h & 0x8000, (nan >> 16) & 0x8000) << "sign kept";
  }
  EXPECT_TRUE(std::isinf(bf16_to_f32(0x7f80)));
  EXPECT_TRUE(std::isnan(bf16_round(std::numeric_limits<float>::quiet_NaN())));
}

TEST(Bf16, EveryValueRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    EXPECT_EQ(bits(f), h << 16);
    if (std::isnan(f))
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    else
      ASSERT_EQ(f32_to_bf16(f), h);
  }
}

// Independent reference: the nearer of the two bf16 neighbours by exact distance in
// double, the even one on a tie.
uint16_t reference_bf16(float x) {
  const uint32_t b = bits(x);
  const uint16_t down = static_cast<uint16_t>(b >> 16);  // toward zero
  const uint16_t up = static_cast<uint16_t>(down + 1);   // away from zero (may be inf)
  const double dx = std::fabs(static_cast<double>(x));
  const double ddown = dx - std::fabs(static_cast<double>(bf16_to_f32(down)));
  // Past the largest finite value the next step up is 2^128 (which rounds to infinity).
  const double vup = (up & 0x7fff) == 0x7f80 ? std::ldexp(1.0, 128)
                                             : std::fabs(static_cast<double>(bf16_to_f32(up)));
  const double dup = vup - dx;
  if (ddown < dup) return down;
  if (dup < ddown) return up;
  return (down & 1) ? up : down;
}

TEST(Bf16, MatchesReferenceOnRandomFloats) {
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    uint32_t b = rng();
    if ((b & 0x7f800000u) == 0x7f800000u) continue;   // inf/NaN covered above
    if (i % 4 == 0) b = (b & 0xffff0000u) | 0x8000u;  // many exact ties
    ASSERT_EQ(f32_to_bf16(f32(b)), reference_bf16(f32(b))) << std::hex << b;
  }
}

TEST(F16, KnownValues) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);  // largest finite
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);  // below the midpoint to 65536
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // the midpoint ties to even: infinity
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // half of it: ties to even (0)
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -26)), 0x0001);  // above half
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulps: ties to even (2)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f32(0x7f800001u)))));
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(0xfc00)));
}

TEST(F16, EveryValueRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ(h & 0x7c00, 0x7c00u);
      EXPECT_NE(h & 0x3ff, 0u);
    } else {
      ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
    }
  }
}

__attribute__((target("f16c"))) uint16_t hw_f32_to_f16(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

TEST(F16, MatchesHardwareConversion) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 29) & 1)) GTEST_SKIP() << "no F16C on this CPU";
  std::mt19937 rng(11);
  for (int i = 0; i < 300000; ++i) {
    uint32_t b = rng();
    // Concentrate on the f16 range, its subnormals and exact ties.
    if (i % 3 == 0) b = (b & 0x807fffffu) | ((103u + rng() % 40u) << 23);
    if (i % 5 == 0) b = (b & 0xffffe000u) | 0x1000u;
    const float x = f32(b);
    if (std::isnan(x)) continue;
    ASSERT_EQ(f32_to_f16(x), hw_f32_to_f16(x)) << std::hex << b;
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float a = f16_to_f32(static_cast<uint16_t>(h)),
                b = hw_f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(b))
      EXPECT_TRUE(std::isnan(a));
    else
      ASSERT_EQ(bits(a), bits(b)) << std::hex << h;
  }
}

}  // namespace
}  // namespace pinstage
