// Element types and their conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "pinstage/export.h"

namespace pinstage {

// Element types of tensors (docs/tensors.md).
// The first five are the ones pinstage computes on (generators, kernels, golden); the
// rest are the other safetensors dtypes, carried as raw storage (bind, load, save, Python
// views). `boolean` is the safetensors BOOL (one byte per element).
enum class DType {
  bf16,
  f16,
  f32,
  i32,
  i64,
  boolean,
  u8,
  i8,
  i16,
  f64,
  f8_e4m3,
  f8_e5m2,
  u16,
  u32,
  u64
};

// Bytes per element: 2, 2, 4, 4, 8, then 1, 1, 1, 2, 8, 1, 1, 2, 4, 8.
PINSTAGE_API size_t dtype_size(DType dtype);
// Lower-case name: "bf16", "f16", "f32", "i32", "i64", "bool", "u8", "i8", "i16", "f64",
// "f8_e4m3", "f8_e5m2", "u16", "u32", "u64".
PINSTAGE_API const char* dtype_name(DType dtype);
// The safetensors spelling: "BF16", "F16", "F32", "I32", "I64", "BOOL", "U8", "I8", "I16",
// "F64", "F8_E4M3", "F8_E5M2", "U16", "U32", "U64".
PINSTAGE_API const char* dtype_safetensors_name(DType dtype);
// Parses either spelling; nullopt for anything else.
PINSTAGE_API std::optional<DType> parse_dtype(std::string_view name);

// f32 -> bf16, rounding to nearest even; NaN stays NaN (quiet), infinities stay infinite.
inline uint16_t f32_to_bf16(float value) {
  uint32_t bits;
  __builtin_memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float bf16_to_f32(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float out;
  __builtin_memcpy(&out, &bits, sizeof out);
  return out;
}

// Rounds an f32 to bf16 precision and back (the spec's bf16r).
inline float bf16_round(float value) { return bf16_to_f32(f32_to_bf16(value)); }

// IEEE half: f32 -> f16 rounding to nearest even (NaN stays NaN, overflow -> inf), and back.
PINSTAGE_API uint16_t f32_to_f16(float value);
PINSTAGE_API float f16_to_f32(uint16_t value);

}  // namespace pinstage
