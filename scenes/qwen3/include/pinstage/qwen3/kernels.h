// The golden's hot loops (16-lane matrix product over bf16 weights, paged
// attention for one lane and kv head), each in a portable form and an AVX-512 form chosen
// at run time, and the decode with a chosen kernel set. See docs/golden.md ("Kernels").
// Public for the tests, tools and benchmarks that compare kernel sets.
#pragma once

#include <cstdint>

#include "pinstage/export.h"
#include "pinstage/qwen3/golden.h"

namespace pinstage::qwen3::kernels {

// Instruction set a kernel uses. generic is plain C++ (any x86-64 or other machine); avx2
// is the same code compiled for AVX2+FMA; avx512 is the hand-written AVX-512F/BW form.
enum class Isa { generic, avx2, avx512 };

PINSTAGE_API const char* isa_name(Isa isa);
// Whether this machine can run `isa`.
PINSTAGE_API bool isa_supported(Isa isa);
// The best supported Isa, or the one PINSTAGE_GOLDEN_ISA names (generic|avx2|avx512) when
// set; an unknown or unsupported name there is Error(invalid_argument).
PINSTAGE_API Isa default_isa();

inline constexpr int kLanes = 16;   // rows of every activation matrix (the decode batch)
inline constexpr int kTile = 32;    // output columns per kernel tile
inline constexpr int kKBlock = 16;  // weight rows per pass over a tile range (see gemm)

// y[m][n] = sum_k x[k][m] * w[k * ldw + n] for m < 16 and n in [kTile * t0, kTile * t1).
// xT is the activation transposed: f32 [K][16] (16 lanes of one k side by side). w is bf16
// row-major with row stride ldw elements, read in place. y is f32 with row stride ldy.
// acc is scratch of (t1 - t0) * 16 * kTile floats. Sums run over k in a fixed order per
// output element, so results do not depend on how callers split the tiles.
PINSTAGE_API void gemm16(Isa isa, const float* xT, int K, const uint16_t* w, int64_t ldw, int t0,
                         int t1, float* acc, float* y, int64_t ldy);

// Attention of kQPerKv query heads sharing one kv head over S rows (the spec's step 6):
// q is f32 [5][128] (already bf16-rounded), krow[i]/vrow[i] point at row i's 128 bf16 values.
// scores is scratch of 5 * S floats; out is f32 [5][128].
PINSTAGE_API void attend(Isa isa, const float* q, const uint16_t* const* krow,
                         const uint16_t* const* vrow, int S, float* scores, float* out);

// run_decode with an explicit kernel set and thread count (0 = all cores).
PINSTAGE_API void run_decode_with(const DecodeBuffers& buffers, int n_layers, bool write_cache,
                                  Golden* golden, Isa isa, int threads);

// The twenty argument names in signature order (ArgIndex).
PINSTAGE_API extern const char* const kArgNames[kNumArgs];

}  // namespace pinstage::qwen3::kernels
