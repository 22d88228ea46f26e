// The golden's hot loops. Note [golden kernels]:
//
// gemm16: y[16][N] = x[16][K] @ W[K][N] with W bf16 row-major, read in place. A tile is 16 lanes
// x 32 columns. The AVX-512 form loads 32 bf16 of one weight row as 16 dwords and widens them
// to f32 without a shuffle: `dword << 16` gives the even columns and `dword & 0xffff0000` the
// odd ones, so the accumulators hold a tile in (even, odd) order, put back in column order
// once at the end. Eight lanes x 32 columns (16 zmm accumulators) are done per pass, the lane
// values are broadcast from xT (all 16 lanes of one k in one cache line). Weight rows are
// walked in blocks of kKBlock rows across the caller's whole tile range, so each pass touches
// only kKBlock pages and reads each row's segment front to back (hardware prefetch works, the
// TLB holds the pages); the next tile's line of the same row is prefetched by software.
// Accumulators between blocks live in `acc`, tile-major so they do not alias in L1 the way
// rows of a [16][N] array with a power-of-two-ish stride would.
//
// attend: per row, the 128 bf16 K values widen the same way (even/odd), so q is permuted
// to match once and each score is 8 FMAs per query head into one vector; the horizontal sums
// are done 16 rows at a time by one transpose-and-add (row_sums). The V pass
// runs twice over the rows, once per half of the head dim, so 5 heads x 4 accumulators fit
// in registers.
#include "pinstage/qwen3/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "pinstage/dtype.h"
#include "pinstage/error.h"
#include "pinstage/names.h"
#include "pinstage/qwen3/decode.h"
#include "pinstage/settings.h"

#if defined(__x86_64__)
// GCC 12 reports its own intrinsics' _mm512_undefined_* placeholders as maybe-uninitialized
// when they are inlined here (a known false positive); the diagnostic points into the header.
#if !defined(__clang__)  // clang has no such warning (and warns of the unknown name)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define PINSTAGE_GOLDEN_X86 1
#else
#define PINSTAGE_GOLDEN_X86 0
#endif

namespace pinstage::qwen3::kernels {
namespace {

constexpr int kHeads = kQPerKv;  // query heads per kv head
const float kAttnScale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));

// softmax over each head's S scores, in place: exp(s - max) / sum.
void softmax_rows(float* scores, int S) {
  for (int j = 0; j < kHeads; ++j) {
    float* s = scores + static_cast<size_t>(j) * S;
    float mx = s[0];
    for (int i = 1; i < S; ++i) mx = std::max(mx, s[i]);
    float sum = 0.0f;
    for (int i = 0; i < S; ++i) {
      s[i] = std::exp(s[i] - mx);
      sum += s[i];
    }
    for (int i = 0; i < S; ++i) s[i] /= sum;
  }
}

// ---- portable forms (also compiled for AVX2) ----

// The same tiling as the AVX-512 form (blocks of kKBlock weight rows across the tile range,
// accumulators in `acc`), in plain loops the compiler vectorizes.
__attribute__((always_inline)) inline void gemm_portable_body(const float* xT, int K,
                                                              const uint16_t* w, int64_t ldw,
                                                              int t0, int t1, float* acc, float* y,
                                                              int64_t ldy) {
  for (int k0 = 0; k0 < K; k0 += kKBlock) {
    const int rows = std::min(K - k0, kKBlock);
    for (int t = t0; t < t1; ++t) {
      float* a = acc + static_cast<int64_t>(t - t0) * kLanes * kTile;
      if (k0 == 0) std::fill(a, a + kLanes * kTile, 0.0f);
      float wf[kKBlock][kTile];
      for (int r = 0; r < rows; ++r) {
        const uint16_t* wr = w + (k0 + r) * ldw + static_cast<int64_t>(t) * kTile;
        for (int c = 0; c < kTile; ++c) wf[r][c] = bf16_to_f32(wr[c]);
      }
      for (int m = 0; m < kLanes; ++m) {
        float* am = a + m * kTile;
        for (int r = 0; r < rows; ++r) {
          const float xv = xT[static_cast<int64_t>(k0 + r) * kLanes + m];
          for (int c = 0; c < kTile; ++c) am[c] += xv * wf[r][c];
        }
      }
    }
  }
  for (int t = t0; t < t1; ++t)
    for (int m = 0; m < kLanes; ++m)
      std::memcpy(y + m * ldy + static_cast<int64_t>(t) * kTile,
                  acc + (static_cast<int64_t>(t - t0) * kLanes + m) * kTile, kTile * sizeof(float));
}

__attribute__((always_inline)) inline void attend_portable_body(const float* q,
                                                                const uint16_t* const* krow,
                                                                const uint16_t* const* vrow, int S,
                                                                float* scores, float* out) {
  for (int i = 0; i < S; ++i) {
    float kf[kHeadDim];
    for (int d = 0; d < kHeadDim; ++d) kf[d] = bf16_to_f32(krow[i][d]);
    for (int j = 0; j < kHeads; ++j) {
      float s = 0.0f;
      for (int d = 0; d < kHeadDim; ++d) s += q[j * kHeadDim + d] * kf[d];
      scores[static_cast<size_t>(j) * S + i] = s * kAttnScale;
    }
  }
  softmax_rows(scores, S);
  std::fill(out, out + kHeads * kHeadDim, 0.0f);
  for (int i = 0; i < S; ++i) {
    float vf[kHeadDim];
    for (int d = 0; d < kHeadDim; ++d) vf[d] = bf16_to_f32(vrow[i][d]);
    for (int j = 0; j < kHeads; ++j) {
      const float wj = scores[static_cast<size_t>(j) * S + i];
      for (int d = 0; d < kHeadDim; ++d) out[j * kHeadDim + d] += wj * vf[d];
    }
  }
}

void gemm_generic(const float* xT, int K, const uint16_t* w, int64_t ldw, int t0, int t1,
                  float* acc, float* y, int64_t ldy) {
  gemm_portable_body(xT, K, w, ldw, t0, t1, acc, y, ldy);
}

void attend_generic(const float* q, const uint16_t* const* krow, const uint16_t* const* vrow, int S,
                    float* scores, float* out) {
  attend_portable_body(q, krow, vrow, S, scores, out);
}

#if PINSTAGE_GOLDEN_X86

__attribute__((target("avx2,fma"))) void gemm_avx2(const float* xT, int K, const uint16_t* w,
                                                   int64_t ldw, int t0, int t1, float* acc,
                                                   float* y, int64_t ldy) {
  gemm_portable_body(xT, K, w, ldw, t0, t1, acc, y, ldy);
}

__attribute__((target("avx2,fma"))) void attend_avx2(const float* q, const uint16_t* const* krow,
                                                     const uint16_t* const* vrow, int S,
                                                     float* scores, float* out) {
  attend_portable_body(q, krow, vrow, S, scores, out);
}

// ---- AVX-512 forms ----

#define PINSTAGE_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq")))

// 32 bf16 (as 16 dwords) -> the even columns and the odd columns as f32.
PINSTAGE_AVX512 inline void widen(__m512i v, __m512i hi_mask, __m512& even, __m512& odd) {
  even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
}

// (even, odd) order -> column order: returns columns 0..15 in lo and 16..31 in hi.
PINSTAGE_AVX512 inline void interleave(__m512 even, __m512 odd, __m512& lo, __m512& hi) {
  const __m512i idx_lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i idx_hi =
      _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  lo = _mm512_permutex2var_ps(even, idx_lo, odd);
  hi = _mm512_permutex2var_ps(even, idx_hi, odd);
}

// exp(x) to about 1 ulp: x = n ln2 + r with |r| <= ln2/2, a degree-7 Taylor polynomial for
// exp(r) (truncation < 5e-9 relative), then scalef by 2^n, which also gives 0 and inf for
// arguments far out of range and keeps NaN.
PINSTAGE_AVX512 inline __m512 exp512(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2 high part
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);     // ln2 low part
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// softmax_rows with exp512; the tail of each row goes through a masked load.
PINSTAGE_AVX512 void softmax_rows_avx512(float* scores, int S) {
  for (int j = 0; j < kHeads; ++j) {
    float* s = scores + static_cast<size_t>(j) * S;
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int i = 0; i < S; i += 16) {
      const __mmask16 m = S - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (S - i)) - 1);
      mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(mx, m, s + i));
    }
    const __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int i = 0; i < S; i += 16) {
      const __mmask16 m = S - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (S - i)) - 1);
      const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + i), vmax));
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
      _mm512_mask_storeu_ps(s + i, m, e);
    }
    const __m512 total = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
    for (int i = 0; i < S; i += 16) {
      const __mmask16 m = S - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (S - i)) - 1);
      _mm512_mask_storeu_ps(s + i, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, s + i), total));
    }
  }
}

PINSTAGE_AVX512 void gemm_avx512(const float* xT, int K, const uint16_t* w, int64_t ldw, int t0,
                                 int t1, float* acc, float* y, int64_t ldy) {
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  constexpr int kHalf = kLanes / 2;
  for (int k0 = 0; k0 < K; k0 += kKBlock) {
    const int k1 = std::min(K, k0 + kKBlock);
    for (int t = t0; t < t1; ++t) {
      float* a = acc + static_cast<int64_t>(t - t0) * kLanes * kTile;
      const uint16_t* wt = w + k0 * ldw + static_cast<int64_t>(t) * kTile;
#pragma GCC unroll 2
      for (int mh = 0; mh < kLanes; mh += kHalf) {
        __m512 ae[kHalf], ao[kHalf];
#pragma GCC unroll 8
        for (int m = 0; m < kHalf; ++m) {
          if (k0 == 0) {
            ae[m] = _mm512_setzero_ps();
            ao[m] = _mm512_setzero_ps();
          } else {
            ae[m] = _mm512_loadu_ps(a + (mh + m) * kTile);
            ao[m] = _mm512_loadu_ps(a + (mh + m) * kTile + 16);
          }
        }
        const float* xp = xT + static_cast<int64_t>(k0) * kLanes + mh;
        const uint16_t* wp = wt;
        for (int k = k0; k < k1; ++k, xp += kLanes, wp += ldw) {
          const __m512i v = _mm512_loadu_si512(wp);
          // The next tile's line of this row; a prefetch past the end never faults.
          if (mh == 0) _mm_prefetch(reinterpret_cast<const char*>(wp + kTile), _MM_HINT_T0);
          __m512 even, odd;
          widen(v, hi_mask, even, odd);
#pragma GCC unroll 8
          for (int m = 0; m < kHalf; ++m) {
            const __m512 xb = _mm512_set1_ps(xp[m]);
            ae[m] = _mm512_fmadd_ps(xb, even, ae[m]);
            ao[m] = _mm512_fmadd_ps(xb, odd, ao[m]);
          }
        }
#pragma GCC unroll 8
        for (int m = 0; m < kHalf; ++m) {
          _mm512_storeu_ps(a + (mh + m) * kTile, ae[m]);
          _mm512_storeu_ps(a + (mh + m) * kTile + 16, ao[m]);
        }
      }
    }
  }
  for (int t = t0; t < t1; ++t) {
    const float* a = acc + static_cast<int64_t>(t - t0) * kLanes * kTile;
    for (int m = 0; m < kLanes; ++m) {
      __m512 lo, hi;
      interleave(_mm512_loadu_ps(a + m * kTile), _mm512_loadu_ps(a + m * kTile + 16), lo, hi);
      float* yp = y + m * ldy + static_cast<int64_t>(t) * kTile;
      _mm512_storeu_ps(yp, lo);
      _mm512_storeu_ps(yp + 16, hi);
    }
  }
}

// Sums each of 16 vectors: lane r of the result is the sum of a[r]'s 16 lanes. Pairs of
// rows are interleaved and added (unpack ps, then pd), then the 128-bit lanes are folded.
PINSTAGE_AVX512 inline __m512 row_sums(const float (*a)[16]) {
  __m512 t[8], u[4];
  for (int k = 0; k < 8; ++k) {
    const __m512 x = _mm512_load_ps(a[2 * k]), y = _mm512_load_ps(a[2 * k + 1]);
    t[k] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
  }
  for (int k = 0; k < 4; ++k) {
    const __m512d x = _mm512_castps_pd(t[2 * k]), y = _mm512_castps_pd(t[2 * k + 1]);
    u[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // u[k]: each 128-bit lane holds partial sums of rows 4k..4k+3.
  const __m512 w0 =
      _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xdd));
  const __m512 w1 =
      _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xdd));
}

PINSTAGE_AVX512 void attend_avx512(const float* q, const uint16_t* const* krow,
                                   const uint16_t* const* vrow, int S, float* scores, float* out) {
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  constexpr int kGroups = kHeadDim / 32;  // 32 bf16 per 512-bit load
  constexpr int kAhead = 8;               // rows prefetched ahead
  // q in the (even, odd) order the widened K rows come in.
  alignas(64) float qp[kHeads][kHeadDim];
  for (int j = 0; j < kHeads; ++j)
    for (int g = 0; g < kGroups; ++g)
      for (int i = 0; i < 16; ++i) {
        qp[j][g * 32 + i] = q[j * kHeadDim + g * 32 + 2 * i];
        qp[j][g * 32 + 16 + i] = q[j * kHeadDim + g * 32 + 2 * i + 1];
      }
  // Scores 16 rows at a time: each row leaves one partial-sum vector per head in `part`,
  // then one transpose-and-add per head turns 16 vectors into the 16 rows' scores.
  alignas(64) float part[kHeads][16][16];
  const __m512 scale = _mm512_set1_ps(kAttnScale);
  for (int i0 = 0; i0 < S; i0 += 16) {
    const int n = std::min(16, S - i0);
    for (int r = 0; r < n; ++r) {
      const int i = i0 + r;
      if (i + kAhead < S) {
        const char* p = reinterpret_cast<const char*>(krow[i + kAhead]);
        for (int c = 0; c < kHeadDim * 2; c += 64) _mm_prefetch(p + c, _MM_HINT_T0);
      }
      __m512 kv[2 * kGroups];
      for (int g = 0; g < kGroups; ++g)
        widen(_mm512_loadu_si512(krow[i] + g * 32), hi_mask, kv[2 * g], kv[2 * g + 1]);
#pragma GCC unroll 5
      for (int j = 0; j < kHeads; ++j) {
        __m512 s0 = _mm512_mul_ps(kv[0], _mm512_load_ps(qp[j]));
        __m512 s1 = _mm512_mul_ps(kv[1], _mm512_load_ps(qp[j] + 16));
#pragma GCC unroll 8
        for (int r2 = 2; r2 < 2 * kGroups; r2 += 2) {
          s0 = _mm512_fmadd_ps(kv[r2], _mm512_load_ps(qp[j] + r2 * 16), s0);
          s1 = _mm512_fmadd_ps(kv[r2 + 1], _mm512_load_ps(qp[j] + r2 * 16 + 16), s1);
        }
        _mm512_store_ps(part[j][r], _mm512_add_ps(s0, s1));
      }
    }
    const __mmask16 mask = n == 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
    for (int j = 0; j < kHeads; ++j) {
      for (int r = n; r < 16; ++r) _mm512_store_ps(part[j][r], _mm512_setzero_ps());
      _mm512_mask_storeu_ps(scores + static_cast<size_t>(j) * S + i0, mask,
                            _mm512_mul_ps(row_sums(part[j]), scale));
    }
  }
  softmax_rows_avx512(scores, S);
  for (int half = 0; half < 2; ++half) {
    const int g0 = half * kGroups / 2;  // first 32-column group of this half
    __m512 acc[kHeads][4];
#pragma GCC unroll 5
    for (int j = 0; j < kHeads; ++j)
      for (int r = 0; r < 4; ++r) acc[j][r] = _mm512_setzero_ps();
    for (int i = 0; i < S; ++i) {
      if (i + kAhead < S) {
        const char* p = reinterpret_cast<const char*>(vrow[i + kAhead] + g0 * 32);
        _mm_prefetch(p, _MM_HINT_T0);
        _mm_prefetch(p + 64, _MM_HINT_T0);
      }
      __m512 vv[4];
      widen(_mm512_loadu_si512(vrow[i] + g0 * 32), hi_mask, vv[0], vv[1]);
      widen(_mm512_loadu_si512(vrow[i] + g0 * 32 + 32), hi_mask, vv[2], vv[3]);
#pragma GCC unroll 5
      for (int j = 0; j < kHeads; ++j) {
        const __m512 wj = _mm512_set1_ps(scores[static_cast<size_t>(j) * S + i]);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) acc[j][r] = _mm512_fmadd_ps(wj, vv[r], acc[j][r]);
      }
    }
    for (int j = 0; j < kHeads; ++j)
      for (int g = 0; g < 2; ++g) {
        __m512 lo, hi;
        interleave(acc[j][2 * g], acc[j][2 * g + 1], lo, hi);
        float* op = out + j * kHeadDim + (g0 + g) * 32;
        _mm512_storeu_ps(op, lo);
        _mm512_storeu_ps(op + 16, hi);
      }
  }
}

#endif  // PINSTAGE_GOLDEN_X86

}  // namespace

namespace {
constexpr const char* kIsaNames[] = {"generic", "avx2", "avx512"};  // Isa order
}  // namespace

const char* isa_name(Isa isa) { return enum_name(isa, kIsaNames); }

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::generic:
      return true;
#if PINSTAGE_GOLDEN_X86
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq");
#else
    default:
      return false;
#endif
  }
  return false;
}

Isa default_isa() {
  if (const auto name = setting_choice(Setting::golden_isa)) {  // one of the three names
    const Isa isa = *enum_from_name<Isa>(*name, kIsaNames);
    if (!isa_supported(isa))
      throw Error(ErrorCode::invalid_argument,
                  "PINSTAGE_GOLDEN_ISA='" + *name +
                      "' is not supported by this CPU; unset it or choose generic");
    return isa;
  }
  if (isa_supported(Isa::avx512)) return Isa::avx512;
  if (isa_supported(Isa::avx2)) return Isa::avx2;
  return Isa::generic;
}

void gemm16(Isa isa, const float* xT, int K, const uint16_t* w, int64_t ldw, int t0, int t1,
            float* acc, float* y, int64_t ldy) {
  switch (isa) {
#if PINSTAGE_GOLDEN_X86
    case Isa::avx512:
      gemm_avx512(xT, K, w, ldw, t0, t1, acc, y, ldy);
      return;
    case Isa::avx2:
      gemm_avx2(xT, K, w, ldw, t0, t1, acc, y, ldy);
      return;
#endif
    default:
      gemm_generic(xT, K, w, ldw, t0, t1, acc, y, ldy);
      return;
  }
}

void attend(Isa isa, const float* q, const uint16_t* const* krow, const uint16_t* const* vrow,
            int S, float* scores, float* out) {
  switch (isa) {
#if PINSTAGE_GOLDEN_X86
    case Isa::avx512:
      attend_avx512(q, krow, vrow, S, scores, out);
      return;
    case Isa::avx2:
      attend_avx2(q, krow, vrow, S, scores, out);
      return;
#endif
    default:
      attend_generic(q, krow, vrow, S, scores, out);
      return;
  }
}

}  // namespace pinstage::qwen3::kernels
