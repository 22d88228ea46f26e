// Counter-based standard normals: the value of element i of a stream depends only on
// (seed, stream, i), so any thread may generate any range, in any order, on any machine,
// and get the same bytes. See docs/tensors.md, "Random values".
//
// Definition (every code path below computes exactly this, with IEEE f32 operations
// in this order, no fused multiply-add):
//   Elements come in blocks of 32; element i is lane l = i % 16 of half h = (i / 16) % 2
//   of block B = i / 32, and belongs to Box-Muller pair l of that block (the pair feeds
//   elements 32B+l and 32B+16+l).
//   Keys: six 128-bit round keys rk0..rk5 from a splitmix64 sequence seeded by
//   (seed, stream).
//   Hash: for j = 0..7, E_j = AES-5(B mod 2^64 | j << 64): x = input ^ rk0, then five
//   AESENC rounds with rk1..rk5. The 16 dwords of E_0..E_3 are the words a of pairs
//   0..15, those of E_4..E_7 the words b.
//   u = ((a >> 8) + 1) / 2^24 in (0, 1]; r = sqrt(-2 ln u), ln by our own polynomial.
//   theta = 2 pi b / 2^32, reduced to a quadrant and a residual in [-pi/4, pi/4),
//   sin and cos of the residual by minimax polynomials (degree 7 and 6).
//   z = r cos(theta) for half 0, r sin(theta) for half 1.
//   A stored value is (r * std) * trig(theta) + bias, the bias added only when nonzero;
//   bf16 storage rounds that f32 to nearest even.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pinstage/export.h"

namespace pinstage {

// One stream of standard normals.
struct NormalStream {
  uint64_t seed = 0;
  uint64_t stream = 0;  // e.g. the tensor's index in the fixture table
};

// The code paths that compute the same bytes; the fastest the CPU has is used unless
// PINSTAGE_GEN_ISA (generic, avx2, avx512, avx512bf16) asks for a slower one.
enum class GenIsa { generic, avx2, avx512, avx512bf16 };

PINSTAGE_API const char* gen_isa_name(GenIsa isa);
PINSTAGE_API bool gen_isa_supported(GenIsa isa);
// The path fill_normal_* uses when none is passed.
PINSTAGE_API GenIsa gen_isa_default();

// out[k] = the stored value of element first + k, k in [0, count): bf16 bits or f32.
PINSTAGE_API void fill_normal_bf16(uint16_t* out, NormalStream stream, uint64_t first,
                                   uint64_t count, float std, float bias);
PINSTAGE_API void fill_normal_f32(float* out, NormalStream stream, uint64_t first, uint64_t count,
                                  float std, float bias);
// The same on a chosen path (tests compare the paths). Throws Error(unsupported) when the
// CPU lacks it.
PINSTAGE_API void fill_normal_bf16_with(GenIsa isa, uint16_t* out, NormalStream stream,
                                        uint64_t first, uint64_t count, float std, float bias);
PINSTAGE_API void fill_normal_f32_with(GenIsa isa, float* out, NormalStream stream, uint64_t first,
                                       uint64_t count, float std, float bias);

// The stored f32 value of one element, by a plain scalar transcription of the
// definition: the reference the vector paths are tested against.
PINSTAGE_API float normal_reference(NormalStream stream, uint64_t index, float std = 1.0f,
                                    float bias = 0.0f);

}  // namespace pinstage
