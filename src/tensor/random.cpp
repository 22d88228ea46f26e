// Counter-based standard normals (definition in random.h).
//
// Three implementations compute the same bytes: an AVX-512 one with intrinsics (VAES
// for the counter hash, and the AVX512-BF16 rounding instruction where the CPU has it),
// a portable one written with GCC vector extensions (built twice: baseline x86-64 with a
// table-driven AES round, and AVX2 with AES-NI), and a scalar reference for tests. They
// agree bit for bit: the AES round is one exact function whatever computes it, and the
// f32 math is the same IEEE operations in the same order (this file is compiled with
// -ffp-contract=off, so no fused multiply-add; it calls no libm function but sqrt,
// which is correctly rounded everywhere, and has its own polynomials for log, sin, cos).
#include "pinstage/random.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "pinstage/error.h"
#include "pinstage/names.h"
#include "pinstage/settings.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define PINSTAGE_GEN_X86 1
#else
#define PINSTAGE_GEN_X86 0
#endif

namespace pinstage {
namespace {

// ---- constants of the definition -------------------------------------------------
constexpr int kRounds = 5;                     // AES rounds of the counter hash
constexpr int32_t kSqrtHalfBits = 0x3f3504f3;  // bits of sqrt(0.5f)
constexpr float kTwoLn2 = 1.38629436111989062f;
// -2 ln m = -4 atanh(s) = s * (Q0 + s^2 (Q1 + s^2 Q2)), s = (m - 1) / (m + 1), |s| <=
// 0.1716: a minimax fit of the atanh series (fitted for this file; r = sqrt(-2 ln u)
// comes out within 1.7e-7 relative of the exact value for every u).
constexpr float kQ0 = -4.00000048f, kQ1 = -1.33304369f, kQ2 = -0.825954556f;
constexpr float kAngleUnit = 3.14159265358979324f / 2147483648.0f;  // pi / 2^31
// Minimax polynomials on [-pi/4, pi/4] (fitted for this file; in f32 their error is
// below 1e-7, as small as the Taylor ones of two degrees more):
// sin a = a + a^3 (S3 + a^2 (S5 + a^2 S7)), cos a = 1 + a^2 (C2 + a^2 (C4 + a^2 C6)).
constexpr float kS3 = -0.166666552f, kS5 = 0.0083321603f, kS7 = -0.000195152839f;
constexpr float kC2 = -0.499998957f, kC4 = 0.041656293f, kC6 = -0.0013597823f;

constexpr uint64_t kBlock = 32;          // elements per block
constexpr uint64_t kPairsPerBlock = 16;  // Box-Muller pairs per block

// The round keys of one stream: rk[0] is xored in first, rk[1..5] end each round.
struct Keys {
  alignas(16) uint32_t rk[kRounds + 1][4];
};

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// A splitmix64 sequence started from (seed, stream) fills the 96 key bytes.
Keys make_keys(NormalStream s) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  uint64_t state = mix64(s.seed + kGolden * (s.stream + 1));
  Keys k{};
  for (auto& rk : k.rk) {
    for (int half = 0; half < 2; ++half) {
      state += kGolden;
      const uint64_t v = mix64(state);
      rk[2 * half] = static_cast<uint32_t>(v);
      rk[2 * half + 1] = static_cast<uint32_t>(v >> 32);
    }
  }
  return k;
}

// ---- the AES round, table-driven (for CPUs without AES instructions) -------------
// aesenc(x, k) = MixColumns(SubBytes(ShiftRows(x))) ^ k on 16 bytes, column c being
// bytes 4c..4c+3 (the x86 AESENC instruction). te[k][v] is what input byte v in row k
// of a column contributes to the column after SubBytes and MixColumns, as a
// little-endian dword.
constexpr uint8_t gf_mul2(uint8_t v) {
  return static_cast<uint8_t>((v << 1) ^ ((v & 0x80) ? 0x1b : 0x00));
}
constexpr uint8_t gf_mul(uint8_t a, uint8_t b) {
  uint8_t out = 0;
  for (int i = 0; i < 8; ++i, b >>= 1, a = gf_mul2(a))
    if (b & 1) out ^= a;
  return out;
}
constexpr uint8_t rotl8(uint8_t v, int n) {
  return static_cast<uint8_t>((v << n) | (v >> (8 - n)));
}

struct AesTables {
  uint32_t te[4][256];
};

// The multiplicative inverse in GF(2^8) is v^254 (0 for 0).
constexpr uint8_t gf_inverse(uint8_t v) {
  uint8_t result = 1, power = v;
  for (int e = 254; e > 0; e >>= 1, power = gf_mul(power, power))
    if (e & 1) result = gf_mul(result, power);
  return result;
}

constexpr AesTables make_aes_tables() {
  AesTables t{};
  for (int v = 0; v < 256; ++v) {
    const uint8_t inv = gf_inverse(static_cast<uint8_t>(v));
    const uint8_t sb = static_cast<uint8_t>(inv ^ rotl8(inv, 1) ^ rotl8(inv, 2) ^ rotl8(inv, 3) ^
                                            rotl8(inv, 4) ^ 0x63);
    const uint32_t s1 = sb, s2 = gf_mul2(sb), s3 = s2 ^ sb;
    // MixColumns rows: [2 3 1 1] [1 2 3 1] [1 1 2 3] [3 1 1 2].
    t.te[0][v] = s2 | (s1 << 8) | (s1 << 16) | (s3 << 24);
    t.te[1][v] = s3 | (s2 << 8) | (s1 << 16) | (s1 << 24);
    t.te[2][v] = s1 | (s3 << 8) | (s2 << 16) | (s1 << 24);
    t.te[3][v] = s1 | (s1 << 8) | (s3 << 16) | (s2 << 24);
  }
  return t;
}

constexpr AesTables kAes = make_aes_tables();

// One AESENC round on 4 little-endian column dwords.
void aes_round_soft(uint32_t x[4], const uint32_t rk[4]) {
  uint32_t out[4];
  for (int c = 0; c < 4; ++c) {
    // ShiftRows: row r of column c comes from column c + r.
    out[c] = kAes.te[0][x[c] & 0xff] ^ kAes.te[1][(x[(c + 1) & 3] >> 8) & 0xff] ^
             kAes.te[2][(x[(c + 2) & 3] >> 16) & 0xff] ^ kAes.te[3][x[(c + 3) & 3] >> 24] ^ rk[c];
  }
  std::memcpy(x, out, sizeof out);
}

// The counter hash of block `blk`: 8 AES encryptions of (blk, j) for j = 0..7; j 0..3
// give a[0..15] (the radius words of the 16 pairs), j 4..7 give b[0..15] (the angles).
void block_hash_soft(uint64_t blk, const Keys& k, uint32_t a[16], uint32_t b[16]) {
  for (uint32_t j = 0; j < 8; ++j) {
    uint32_t x[4] = {static_cast<uint32_t>(blk), static_cast<uint32_t>(blk >> 32), j, 0};
    for (int c = 0; c < 4; ++c) x[c] ^= k.rk[0][c];
    for (int r = 1; r <= kRounds; ++r) aes_round_soft(x, k.rk[r]);
    std::memcpy(j < 4 ? a + 4 * j : b + 4 * (j - 4), x, sizeof x);
  }
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- the polynomials, on one float or on 16 lanes (F = float or f32x16) -------------
// One copy for the scalar reference and the portable vector path, so the two cannot drift
// (-ffp-contract=off keeps each operation rounded alone). The AVX-512 path, in intrinsics,
// stays the independent check that tests run against the scalar one.

// s * q of the log: s = (m - 1) / (m + 1), q = Q0 + Q1 s^2 + Q2 s^4.
template <typename F>
__attribute__((always_inline)) inline void log_poly(const F& m, F& out) {
  const F s = (m - 1.0f) / (m + 1.0f);
  const F s2 = s * s;
  F q = s2 * kQ2 + kQ1;
  q = q * s2 + kQ0;
  out = s * q;
}

// sin and cos of `an` in [-pi/4, pi/4].
template <typename F>
__attribute__((always_inline)) inline void sin_cos_poly(const F& an, F& sn, F& cs) {
  const F a2 = an * an;
  F ps = a2 * kS7 + kS5;
  ps = ps * a2 + kS3;
  sn = an + an * (a2 * ps);
  F pc = a2 * kC6 + kC4;
  pc = pc * a2 + kC2;
  cs = pc * a2 + 1.0f;
}

template <typename F>
__attribute__((always_inline)) inline void add_bias(F& v0, F& v1, float bias) {
  if (bias != 0.0f) {
    v0 = v0 + bias;
    v1 = v1 + bias;
  }
}

typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));

// ---- scalar reference ------------------------------------------------------------
// The scalar twin of portable_math() below (and of the AVX-512 path): the same operations
// in the same order on one pair, so tests can check every vector path against it element
// by element.
// The two stored values (half 0 and half 1) of the pair with hash words a and b.
void scalar_pair(uint32_t a, uint32_t b, float sd, float bias, float* v0, float* v1) {
  // Radius.
  const float f = static_cast<float>(static_cast<int32_t>((a >> 8) + 1u));
  const int32_t bits = static_cast<int32_t>(bits_of(f));
  const int32_t e = (bits - kSqrtHalfBits) >> 23;
  const float m = float_of(static_cast<uint32_t>(bits - (e << 23)));
  float t2;
  log_poly(m, t2);
  const float t1 = static_cast<float>(24 - e) * kTwoLn2;
  const float w = t1 + t2;
  const float rs = __builtin_sqrtf(w) * sd;
  // Angle.
  const uint32_t ta = b + (1u << 29);
  const uint32_t tb = b + (3u << 29);
  const float an = static_cast<float>(static_cast<int32_t>(b << 2) >> 2) * kAngleUnit;
  float sn, cs;
  sin_cos_poly(an, sn, cs);
  const bool swap = (ta & 0x40000000u) != 0;
  const uint32_t c = bits_of(swap ? sn : cs) ^ (tb & 0x80000000u);
  const uint32_t sv = bits_of(swap ? cs : sn) ^ (ta & 0x80000000u);
  float r0 = rs * float_of(c);
  float r1 = rs * float_of(sv);
  add_bias(r0, r1, bias);
  *v0 = r0;
  *v1 = r1;
}

// ---- portable vector path (GCC vector extensions, 16 lanes) -------------------------

// The f32 math of one block from its hash words, stored at `out` (32 elements).
template <bool kBf16>
__attribute__((always_inline)) inline void portable_math(const u32x16& a, const u32x16& b, float sd,
                                                         float bias, void* out) {
  const f32x16 f = __builtin_convertvector((i32x16)((a >> 8) + 1u), f32x16);
  const i32x16 bits = (i32x16)f;
  const i32x16 e = (bits - kSqrtHalfBits) >> 23;
  const f32x16 m = (f32x16)(bits - (e << 23));
  f32x16 t2;
  log_poly(m, t2);
  const f32x16 t1 = __builtin_convertvector(24 - e, f32x16) * kTwoLn2;
  const f32x16 w = t1 + t2;
  f32x16 r;
  for (int l = 0; l < 16; ++l) r[l] = __builtin_sqrtf(w[l]);
  const f32x16 rs = r * sd;
  const u32x16 ta = b + (1u << 29);
  const u32x16 tb = b + (3u << 29);
  const f32x16 an = __builtin_convertvector(((i32x16)(b << 2)) >> 2, f32x16) * kAngleUnit;
  f32x16 sn, cs;
  sin_cos_poly(an, sn, cs);
  const i32x16 swap = (i32x16)(ta & 0x40000000u) != 0;
  const u32x16 c = (swap ? (u32x16)sn : (u32x16)cs) ^ (tb & 0x80000000u);
  const u32x16 sv = (swap ? (u32x16)cs : (u32x16)sn) ^ (ta & 0x80000000u);
  f32x16 v0 = rs * (f32x16)c;
  f32x16 v1 = rs * (f32x16)sv;
  add_bias(v0, v1, bias);
  if constexpr (kBf16) {
    u32x16 b0 = (u32x16)v0, b1 = (u32x16)v1;
    b0 = (b0 + 0x7fffu + ((b0 >> 16) & 1u)) >> 16;
    b1 = (b1 + 0x7fffu + ((b1 >> 16) & 1u)) >> 16;
    const u16x16 h0 = __builtin_convertvector(b0, u16x16);
    const u16x16 h1 = __builtin_convertvector(b1, u16x16);
    auto* o = static_cast<uint16_t*>(out);
    std::memcpy(o, &h0, sizeof h0);
    std::memcpy(o + 16, &h1, sizeof h1);
  } else {
    auto* o = static_cast<float*>(out);
    std::memcpy(o, &v0, sizeof v0);
    std::memcpy(o + 16, &v1, sizeof v1);
  }
}

// Writes `nblocks` whole blocks starting at block `blk0`.
template <bool kBf16>
void generic_blocks(void* out, uint64_t blk0, uint64_t nblocks, const Keys& k, float sd,
                    float bias) {
  const size_t block_bytes = kBlock * (kBf16 ? 2 : 4);
  for (uint64_t i = 0; i < nblocks; ++i) {
    u32x16 a, b;
    uint32_t wa[16], wb[16];
    block_hash_soft(blk0 + i, k, wa, wb);
    std::memcpy(&a, wa, sizeof a);
    std::memcpy(&b, wb, sizeof b);
    portable_math<kBf16>(a, b, sd, bias, static_cast<unsigned char*>(out) + i * block_bytes);
  }
}

#if PINSTAGE_GEN_X86
// AVX2 math with the AES-NI instruction for the hash (one 128-bit block at a time).
template <bool kBf16>
__attribute__((target("avx2,aes"))) void avx2_blocks(void* out, uint64_t blk0, uint64_t nblocks,
                                                     const Keys& k, float sd, float bias) {
  const size_t block_bytes = kBlock * (kBf16 ? 2 : 4);
  __m128i rk[kRounds + 1];
  for (int r = 0; r <= kRounds; ++r)
    rk[r] = _mm_load_si128(reinterpret_cast<const __m128i*>(k.rk[r]));
  for (uint64_t i = 0; i < nblocks; ++i) {
    const uint64_t blk = blk0 + i;
    __m128i x[8];
    for (int j = 0; j < 8; ++j)
      x[j] = _mm_xor_si128(_mm_set_epi32(0, j, static_cast<int>(blk >> 32), static_cast<int>(blk)),
                           rk[0]);
    for (int r = 1; r <= kRounds; ++r)
      for (int j = 0; j < 8; ++j) x[j] = _mm_aesenc_si128(x[j], rk[r]);
    u32x16 a, b;
    std::memcpy(&a, &x[0], sizeof a);
    std::memcpy(&b, &x[4], sizeof b);
    portable_math<kBf16>(a, b, sd, bias, static_cast<unsigned char*>(out) + i * block_bytes);
  }
}

// ---- AVX-512 path --------------------------------------------------------------------
// GCC 12 reports the _mm512_undefined_* inside the intrinsic headers as (maybe)
// uninitialized (GCC bug 105593, fixed in 13): silence those warnings here.
#pragma GCC diagnostic push
#if !defined(__clang__)  // clang has no such warning (and warns of the unknown name)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
#define PINSTAGE_AVX512 "avx512f,avx512bw,avx512dq,avx512vl,vaes,aes"

// The hash of 16 blocks' worth of counters held in two vectors: lanes j = 0..3 of c0
// and j = 4..7 of c1 are the 128-bit inputs (blk, j); one encryption gives a and b.
struct Avx512Hash {
  __m512i rk[kRounds + 1];
  __m512i c0, c1;
};

__attribute__((target(PINSTAGE_AVX512), always_inline)) inline Avx512Hash avx512_hash_init(
    uint64_t blk0, const Keys& k) {
  Avx512Hash h;
  for (int r = 0; r <= kRounds; ++r)
    h.rk[r] = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(k.rk[r])));
  const int lo = static_cast<int>(blk0), hi = static_cast<int>(blk0 >> 32);
  h.c0 = _mm512_set_epi32(0, 3, hi, lo, 0, 2, hi, lo, 0, 1, hi, lo, 0, 0, hi, lo);
  h.c1 = _mm512_set_epi32(0, 7, hi, lo, 0, 6, hi, lo, 0, 5, hi, lo, 0, 4, hi, lo);
  return h;
}

// a and b of the current block; moves the counters to the next block.
__attribute__((target(PINSTAGE_AVX512), always_inline)) inline void avx512_hash_next(Avx512Hash& h,
                                                                                     __m512i& a,
                                                                                     __m512i& b) {
  __m512i x0 = _mm512_xor_si512(h.c0, h.rk[0]);
  __m512i x1 = _mm512_xor_si512(h.c1, h.rk[0]);
  for (int r = 1; r <= kRounds; ++r) {
    x0 = _mm512_aesenc_epi128(x0, h.rk[r]);
    x1 = _mm512_aesenc_epi128(x1, h.rk[r]);
  }
  a = x0;
  b = x1;
  // blk + 1 in the low 64 bits of every 128-bit lane (the carry reaches the high dword).
  const __m512i one = _mm512_set_epi64(0, 1, 0, 1, 0, 1, 0, 1);
  h.c0 = _mm512_add_epi64(h.c0, one);
  h.c1 = _mm512_add_epi64(h.c1, one);
}

// The two stored values of the 16 pairs with hash words a and b (before bf16 rounding).
__attribute__((target(PINSTAGE_AVX512), always_inline)) inline void avx512_values(
    __m512i a, __m512i b, float sd, float bias, bool add_bias, __m512& v0, __m512& v1) {
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512 one = _mm512_set1_ps(1.0f);
  // Radius.
  const __m512 f =
      _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_srli_epi32(a, 8), _mm512_set1_epi32(1)));
  const __m512i bits = _mm512_castps_si512(f);
  const __m512i e = _mm512_srai_epi32(_mm512_sub_epi32(bits, _mm512_set1_epi32(kSqrtHalfBits)), 23);
  const __m512 m = _mm512_castsi512_ps(_mm512_sub_epi32(bits, _mm512_slli_epi32(e, 23)));
  const __m512 s = _mm512_div_ps(_mm512_sub_ps(m, one), _mm512_add_ps(m, one));
  const __m512 s2 = _mm512_mul_ps(s, s);
  __m512 q = _mm512_add_ps(_mm512_mul_ps(s2, _mm512_set1_ps(kQ2)), _mm512_set1_ps(kQ1));
  q = _mm512_add_ps(_mm512_mul_ps(q, s2), _mm512_set1_ps(kQ0));
  const __m512 t1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_set1_epi32(24), e)),
                                  _mm512_set1_ps(kTwoLn2));
  const __m512 w = _mm512_add_ps(t1, _mm512_mul_ps(s, q));
  const __m512 rs = _mm512_mul_ps(_mm512_sqrt_ps(w), _mm512_set1_ps(sd));
  // Angle.
  const __m512i ta = _mm512_add_epi32(b, _mm512_set1_epi32(1 << 29));
  const __m512i tb = _mm512_add_epi32(b, _mm512_set1_epi32(3 << 29));
  const __m512 an = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(b, 2), 2)),
                                  _mm512_set1_ps(kAngleUnit));
  const __m512 an2 = _mm512_mul_ps(an, an);
  __m512 ps = _mm512_add_ps(_mm512_mul_ps(an2, _mm512_set1_ps(kS7)), _mm512_set1_ps(kS5));
  ps = _mm512_add_ps(_mm512_mul_ps(ps, an2), _mm512_set1_ps(kS3));
  const __m512 sn = _mm512_add_ps(an, _mm512_mul_ps(an, _mm512_mul_ps(an2, ps)));
  __m512 pc = _mm512_add_ps(_mm512_mul_ps(an2, _mm512_set1_ps(kC6)), _mm512_set1_ps(kC4));
  pc = _mm512_add_ps(_mm512_mul_ps(pc, an2), _mm512_set1_ps(kC2));
  const __m512 cs = _mm512_add_ps(_mm512_mul_ps(pc, an2), one);
  const __mmask16 swap = _mm512_test_epi32_mask(ta, _mm512_set1_epi32(0x40000000));
  // c ^ (t & sign): ternary-logic truth table 0x78 is A ^ (B & C).
  const __m512 c = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
      _mm512_castps_si512(_mm512_mask_blend_ps(swap, cs, sn)), tb, sign, 0x78));
  const __m512 sv = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
      _mm512_castps_si512(_mm512_mask_blend_ps(swap, sn, cs)), ta, sign, 0x78));
  v0 = _mm512_mul_ps(rs, c);
  v1 = _mm512_mul_ps(rs, sv);
  if (add_bias) {
    v0 = _mm512_add_ps(v0, _mm512_set1_ps(bias));
    v1 = _mm512_add_ps(v1, _mm512_set1_ps(bias));
  }
}

// Every block's values from the hash stream, handed to `store(blk, v0, v1)`: the one loop of
// both AVX-512 outputs. `store` carries the caller's target (a lambda has none of its own).
template <bool kBias, typename Store>
__attribute__((target(PINSTAGE_AVX512), always_inline)) inline void avx512_each_block(
    uint64_t blk0, uint64_t nblocks, const Keys& k, float sd, float bias, const Store& store) {
  Avx512Hash h = avx512_hash_init(blk0, k);
  for (uint64_t blk = 0; blk < nblocks; ++blk) {
    __m512i a, b;
    avx512_hash_next(h, a, b);
    __m512 v0, v1;
    avx512_values(a, b, sd, bias, kBias, v0, v1);
    store(blk, v0, v1);
  }
}

// Software bf16 rounding (or f32 output) on AVX-512F/BW.
template <bool kBf16, bool kBias>
__attribute__((target(PINSTAGE_AVX512))) void avx512_blocks(void* out, uint64_t blk0,
                                                            uint64_t nblocks, const Keys& k,
                                                            float sd, float bias) {
  avx512_each_block<kBias>(
      blk0, nblocks, k, sd, bias,
      [out](uint64_t blk, const __m512& v0, const __m512& v1)
          __attribute__((target(PINSTAGE_AVX512))) {
            if constexpr (kBf16) {
              const __m512i one_i = _mm512_set1_epi32(1);
              const __m512i bias7 = _mm512_set1_epi32(0x7fff);
              __m512i h0 = _mm512_castps_si512(v0), h1 = _mm512_castps_si512(v1);
              h0 = _mm512_add_epi32(_mm512_add_epi32(h0, bias7),
                                    _mm512_and_si512(_mm512_srli_epi32(h0, 16), one_i));
              h1 = _mm512_add_epi32(_mm512_add_epi32(h1, bias7),
                                    _mm512_and_si512(_mm512_srli_epi32(h1, 16), one_i));
              // The high 16 bits of every lane of h0, then of h1.
              const __m512i odd_words =
                  _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
                                   31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
              _mm512_storeu_si512(static_cast<uint16_t*>(out) + blk * kBlock,
                                  _mm512_permutex2var_epi16(h0, odd_words, h1));
            } else {
              auto* o = static_cast<float*>(out) + blk * kBlock;
              _mm512_storeu_ps(o, v0);
              _mm512_storeu_ps(o + 16, v1);
            }
          });
}

// bf16 output rounded by VCVTNE2PS2BF16 (round to nearest even, like the software
// path: it differs only for NaN and subnormal inputs, and the values here are never
// NaN and are either 0 or larger than 1e-20 in magnitude).
template <bool kBias>
__attribute__((target(PINSTAGE_AVX512 ",avx512bf16"))) void avx512bf16_blocks(
    void* out, uint64_t blk0, uint64_t nblocks, const Keys& k, float sd, float bias) {
  avx512_each_block<kBias>(
      blk0, nblocks, k, sd, bias,
      [out](uint64_t blk, const __m512& v0, const __m512& v1)
          __attribute__((target(PINSTAGE_AVX512 ",avx512bf16"))) {
            _mm512_storeu_si512(static_cast<uint16_t*>(out) + blk * kBlock,
                                (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
          });
}
#pragma GCC diagnostic pop
#endif  // PINSTAGE_GEN_X86

using BlockFn = void (*)(void*, uint64_t, uint64_t, const Keys&, float, float);

BlockFn block_fn(GenIsa isa, bool bf16, bool bias) {
  switch (isa) {
#if PINSTAGE_GEN_X86
    case GenIsa::avx512bf16:
      if (bf16) return bias ? avx512bf16_blocks<true> : avx512bf16_blocks<false>;
      [[fallthrough]];  // f32 output needs no rounding instruction
    case GenIsa::avx512:
      if (bf16) return bias ? avx512_blocks<true, true> : avx512_blocks<true, false>;
      return bias ? avx512_blocks<false, true> : avx512_blocks<false, false>;
    case GenIsa::avx2:
      return bf16 ? avx2_blocks<true> : avx2_blocks<false>;
#else
    case GenIsa::avx512bf16:
    case GenIsa::avx512:
    case GenIsa::avx2:
#endif
    case GenIsa::generic:
      break;
  }
  return bf16 ? generic_blocks<true> : generic_blocks<false>;
}

#if PINSTAGE_GEN_X86
// The CPU features the paths need, from CPUID, with the OS's consent (XCR0) to use the
// AVX and AVX-512 register state.
struct CpuFeatures {
  bool avx2 = false, aes = false, avx512 = false, vaes = false, avx512bf16 = false;
};

CpuFeatures cpu_features() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  f.aes = (c >> 25) & 1;
  if (!osxsave || !avx) return f;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));  // XCR0 (no xsave target needed)
  const unsigned long long xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  const bool ymm_state = (xcr0 & 0x6) == 0x6;
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;
  if (!ymm_state || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.avx2 = (b >> 5) & 1;
  f.avx512 = zmm_state && ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);
  f.vaes = (c >> 9) & 1;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512bf16 = (a >> 5) & 1;
  return f;
}
#endif

GenIsa best_isa() {
#if PINSTAGE_GEN_X86
  const CpuFeatures f = cpu_features();
  const bool avx512 = f.avx512 && f.vaes && f.aes;  // F, DQ, BW, VL
  if (avx512 && f.avx512bf16) return GenIsa::avx512bf16;
  if (avx512) return GenIsa::avx512;
  if (f.avx2 && f.aes) return GenIsa::avx2;
#endif
  return GenIsa::generic;
}

void fill(GenIsa isa, void* out, bool bf16, NormalStream stream, uint64_t first, uint64_t count,
          float sd, float bias) {
  if (count == 0) return;
  if (out == nullptr) throw Error(ErrorCode::invalid_argument, "fill_normal: null output");
  if (first > UINT64_MAX - count)
    throw Error(ErrorCode::invalid_argument, "fill_normal: element range overflows 64 bits");
  if (!gen_isa_supported(isa))
    throw Error(ErrorCode::unsupported,
                std::string("fill_normal: this CPU cannot run the ") + gen_isa_name(isa) + " path");
  const BlockFn fn = block_fn(isa, bf16, bias != 0.0f);
  const Keys keys = make_keys(stream);
  const size_t esize = bf16 ? 2 : 4;
  auto* dst = static_cast<unsigned char*>(out);
  uint64_t i = first;
  const uint64_t end = first + count;
  while (i < end) {
    const uint64_t blk = i / kBlock;
    const uint64_t off = i % kBlock;
    if (off != 0 || end - i < kBlock) {
      // A partial block: compute it whole, keep the part asked for.
      alignas(64) unsigned char tmp[kBlock * 4];
      fn(tmp, blk, 1, keys, sd, bias);
      const uint64_t n = std::min<uint64_t>(kBlock - off, end - i);
      std::memcpy(dst, tmp + off * esize, n * esize);
      i += n;
      dst += n * esize;
      continue;
    }
    const uint64_t full = (end - i) / kBlock;
    fn(dst, blk, full, keys, sd, bias);
    i += full * kBlock;
    dst += full * kBlock * esize;
  }
}

}  // namespace

const char* gen_isa_name(GenIsa isa) {
  static constexpr const char* kNames[] = {"generic", "avx2", "avx512", "avx512bf16"};
  return enum_name(isa, kNames);
}

bool gen_isa_supported(GenIsa isa) {
  static const GenIsa best = best_isa();
  return static_cast<int>(isa) <= static_cast<int>(best);
}

GenIsa gen_isa_default() {
  static const GenIsa chosen = [] {
    const auto name = setting_choice(Setting::gen_isa);  // validated against the table
    if (!name) return best_isa();
    for (GenIsa isa : {GenIsa::generic, GenIsa::avx2, GenIsa::avx512, GenIsa::avx512bf16}) {
      if (*name != gen_isa_name(isa)) continue;
      if (!gen_isa_supported(isa))
        throw Error(ErrorCode::invalid_argument,
                    "PINSTAGE_GEN_ISA='" + *name + "' is not supported by this CPU (best: " +
                        gen_isa_name(best_isa()) + "); unset it or choose a lower one");
      return isa;
    }
    throw Error(ErrorCode::internal, "PINSTAGE_GEN_ISA: a choice without a kernel set");
  }();
  return chosen;
}

void fill_normal_bf16(uint16_t* out, NormalStream stream, uint64_t first, uint64_t count, float std,
                      float bias) {
  fill(gen_isa_default(), out, true, stream, first, count, std, bias);
}

void fill_normal_f32(float* out, NormalStream stream, uint64_t first, uint64_t count, float std,
                     float bias) {
  fill(gen_isa_default(), out, false, stream, first, count, std, bias);
}

void fill_normal_bf16_with(GenIsa isa, uint16_t* out, NormalStream stream, uint64_t first,
                           uint64_t count, float std, float bias) {
  fill(isa, out, true, stream, first, count, std, bias);
}

void fill_normal_f32_with(GenIsa isa, float* out, NormalStream stream, uint64_t first,
                          uint64_t count, float std, float bias) {
  fill(isa, out, false, stream, first, count, std, bias);
}

float normal_reference(NormalStream stream, uint64_t index, float std, float bias) {
  uint32_t a[16], b[16];
  block_hash_soft(index / kBlock, make_keys(stream), a, b);
  const uint64_t lane = index % kPairsPerBlock;
  float v0, v1;
  scalar_pair(a[lane], b[lane], std, bias, &v0, &v1);
  return (index / kPairsPerBlock) % 2 == 1 ? v1 : v0;
}

}  // namespace pinstage
