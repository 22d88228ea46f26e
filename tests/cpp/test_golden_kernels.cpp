// The golden's kernels against double-precision references on synthetic data, for every
// kernel set this machine supports.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "pinstage/dtype.h"
#include "pinstage/error.h"
#include "pinstage/qwen3/kernels.h"

namespace {

namespace D = pinstage::qwen3::kernels;
using pinstage::bf16_round;
using pinstage::bf16_to_f32;
using pinstage::f32_to_bf16;

std::vector<D::Isa> supported_isas() {
  std::vector<D::Isa> isas;
  for (D::Isa isa : {D::Isa::generic, D::Isa::avx2, D::Isa::avx512})
    if (D::isa_supported(isa)) isas.push_back(isa);
  return isas;
}

// Small deterministic generator (splitmix64) for test data.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) / static_cast<float>(1 << 24);
  }

 private:
  uint64_t state_;
};

struct GemmCase {
  int K;
  int N;
};

TEST(GoldenKernels, Gemm16MatchesDoubleReferenceInItsTileRange) {
  for (D::Isa isa : supported_isas()) {
    for (GemmCase c : {GemmCase{1, 32}, GemmCase{17, 64}, GemmCase{100, 96}, GemmCase{300, 160}}) {
      SCOPED_TRACE(std::string(D::isa_name(isa)) + " K=" + std::to_string(c.K) +
                   " N=" + std::to_string(c.N));
      Rng rng(static_cast<uint64_t>(c.K) * 1000 + c.N);
      const int64_t ldw = c.N + D::kTile;  // wider rows than the columns used
      std::vector<uint16_t> w(static_cast<size_t>(c.K) * ldw);
      for (auto& e : w) e = f32_to_bf16(rng.uniform(-1.0f, 1.0f));
      std::vector<float> xT(static_cast<size_t>(c.K) * D::kLanes);
      for (auto& e : xT) e = bf16_round(rng.uniform(-2.0f, 2.0f));
      const int64_t ldy = c.N + 7;
      std::vector<float> y(D::kLanes * ldy, std::numeric_limits<float>::quiet_NaN());
      const int t0 = 1, t1 = c.N / D::kTile;  // skip the first tile
      std::vector<float> acc(static_cast<size_t>(t1 - t0) * D::kLanes * D::kTile);
      D::gemm16(isa, xT.data(), c.K, w.data(), ldw, t0, t1, acc.data(), y.data(), ldy);
      for (int m = 0; m < D::kLanes; ++m)
        for (int64_t n = 0; n < ldy; ++n) {
          const float got = y[m * ldy + n];
          if (n < t0 * D::kTile || n >= t1 * D::kTile) {
            ASSERT_TRUE(std::isnan(got)) << "wrote outside its tiles at lane " << m << " col " << n;
            continue;
          }
          double ref = 0.0, mag = 0.0;
          for (int k = 0; k < c.K; ++k) {
            const double term =
                static_cast<double>(xT[k * D::kLanes + m]) * bf16_to_f32(w[k * ldw + n]);
            ref += term;
            mag += std::fabs(term);
          }
          ASSERT_NEAR(got, ref, 1e-6 * mag + 1e-30) << "lane " << m << " col " << n;
        }
    }
  }
}

TEST(GoldenKernels, Gemm16ResultDoesNotDependOnTheTileSplit) {
  const int K = 70, N = 128;
  Rng rng(7);
  std::vector<uint16_t> w(static_cast<size_t>(K) * N);
  for (auto& e : w) e = f32_to_bf16(rng.uniform(-1.0f, 1.0f));
  std::vector<float> xT(static_cast<size_t>(K) * D::kLanes);
  for (auto& e : xT) e = bf16_round(rng.uniform(-1.0f, 1.0f));
  for (D::Isa isa : supported_isas()) {
    SCOPED_TRACE(D::isa_name(isa));
    std::vector<float> whole(D::kLanes * N), split(D::kLanes * N);
    std::vector<float> acc(static_cast<size_t>(N / D::kTile) * D::kLanes * D::kTile);
    D::gemm16(isa, xT.data(), K, w.data(), N, 0, N / D::kTile, acc.data(), whole.data(), N);
    for (int t = 0; t < N / D::kTile; ++t)
      D::gemm16(isa, xT.data(), K, w.data(), N, t, t + 1, acc.data(), split.data(), N);
    EXPECT_EQ(whole, split);
  }
}

// Double-precision attention of 5 heads over S rows.
std::vector<double> attend_reference(const std::vector<float>& q,
                                     const std::vector<const uint16_t*>& krow,
                                     const std::vector<const uint16_t*>& vrow) {
  const int S = static_cast<int>(krow.size());
  const double scale = 1.0 / std::sqrt(128.0);
  std::vector<double> out(5 * 128, 0.0);
  for (int j = 0; j < 5; ++j) {
    std::vector<double> s(S);
    double mx = -1e300;
    for (int i = 0; i < S; ++i) {
      double dot = 0.0;
      for (int d = 0; d < 128; ++d)
        dot += static_cast<double>(q[j * 128 + d]) * bf16_to_f32(krow[i][d]);
      s[i] = dot * scale;
      mx = std::max(mx, s[i]);
    }
    double sum = 0.0;
    for (double& e : s) sum += (e = std::exp(e - mx));
    for (int i = 0; i < S; ++i)
      for (int d = 0; d < 128; ++d) out[j * 128 + d] += s[i] / sum * bf16_to_f32(vrow[i][d]);
  }
  return out;
}

TEST(GoldenKernels, AttendMatchesDoubleReferenceThroughScatteredRows) {
  const int pool_rows = 800;
  Rng rng(11);
  std::vector<uint16_t> kpool(pool_rows * 128), vpool(pool_rows * 128);
  for (auto& e : kpool) e = f32_to_bf16(rng.uniform(-1.0f, 1.0f));
  for (auto& e : vpool) e = f32_to_bf16(rng.uniform(-0.5f, 1.0f));
  std::vector<float> q(5 * 128);
  for (auto& e : q) e = bf16_round(rng.uniform(-3.0f, 3.0f));
  for (int S : {1, 2, 17, 130, 600}) {
    std::vector<const uint16_t*> krow(S), vrow(S);
    for (int i = 0; i < S; ++i) {  // rows in a scrambled order, as a block table gives them
      const size_t r = (static_cast<size_t>(i) * 337 + 5) % pool_rows;
      krow[i] = &kpool[r * 128];
      vrow[i] = &vpool[(r * 7 + 3) % pool_rows * 128];
    }
    const std::vector<double> ref = attend_reference(q, krow, vrow);
    for (D::Isa isa : supported_isas()) {
      SCOPED_TRACE(std::string(D::isa_name(isa)) + " S=" + std::to_string(S));
      std::vector<float> scores(5 * S), out(5 * 128);
      D::attend(isa, q.data(), krow.data(), vrow.data(), S, scores.data(), out.data());
      for (int e = 0; e < 5 * 128; ++e) ASSERT_NEAR(out[e], ref[e], 2e-5) << "element " << e;
    }
  }
}

TEST(GoldenKernels, AttendPicksTheDominantRowWhenScoresAreFarApart) {
  // One row scores ~1e4 above the rest: its weight is 1, the others' exp underflows to 0.
  const int S = 40, hot = 23;
  std::vector<uint16_t> kpool(S * 128, f32_to_bf16(0.0f)), vpool(S * 128);
  Rng rng(3);
  for (auto& e : vpool) e = f32_to_bf16(rng.uniform(-1.0f, 1.0f));
  for (int d = 0; d < 128; ++d) kpool[hot * 128 + d] = f32_to_bf16(8.0f);
  std::vector<float> q(5 * 128, 100.0f);
  std::vector<const uint16_t*> krow(S), vrow(S);
  for (int i = 0; i < S; ++i) {
    krow[i] = &kpool[i * 128];
    vrow[i] = &vpool[i * 128];
  }
  for (D::Isa isa : supported_isas()) {
    SCOPED_TRACE(D::isa_name(isa));
    std::vector<float> scores(5 * S), out(5 * 128);
    D::attend(isa, q.data(), krow.data(), vrow.data(), S, scores.data(), out.data());
    for (int j = 0; j < 5; ++j)
      for (int d = 0; d < 128; ++d)
        ASSERT_EQ(out[j * 128 + d], bf16_to_f32(vpool[hot * 128 + d])) << j << "," << d;
  }
}

TEST(GoldenKernels, IsaChoiceFollowsTheEnvironment) {
  EXPECT_TRUE(D::isa_supported(D::Isa::generic));
  ::unsetenv("PINSTAGE_GOLDEN_ISA");
  const D::Isa best = D::default_isa();
  EXPECT_TRUE(D::isa_supported(best));
  if (D::isa_supported(D::Isa::avx512)) {
    EXPECT_EQ(best, D::Isa::avx512);
  }
  ::setenv("PINSTAGE_GOLDEN_ISA", "generic", 1);
  EXPECT_EQ(D::default_isa(), D::Isa::generic);
  ::setenv("PINSTAGE_GOLDEN_ISA", "sse9", 1);
  try {
    D::default_isa();
    ADD_FAILURE() << "an unknown kernel set was accepted";
  } catch (const pinstage::Error& e) {
    EXPECT_EQ(e.code(), pinstage::ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("sse9"), std::string::npos) << e.what();
  }
  ::unsetenv("PINSTAGE_GOLDEN_ISA");
}

}  // namespace
