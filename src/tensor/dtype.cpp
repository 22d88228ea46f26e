// Element types: sizes, names and the f16 conversions (bf16 lives inline in dtype.h).
#include "pinstage/dtype.h"

#include "pinstage/names.h"

#include <cstring>

namespace pinstage {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::boolean:
    case DType::u8:
    case DType::i8:
    case DType::f8_e4m3:
    case DType::f8_e5m2:
      return 1;
    case DType::bf16:
    case DType::f16:
    case DType::i16:
    case DType::u16:
      return 2;
    case DType::f32:
    case DType::i32:
    case DType::u32:
      return 4;
    case DType::i64:
    case DType::f64:
    case DType::u64:
      return 8;
  }
  return 0;
}

namespace {
// In DType order.
constexpr const char* kDTypeNames[] = {"bf16",    "f16",     "f32", "i32", "i64",
                                       "bool",    "u8",      "i8",  "i16", "f64",
                                       "f8_e4m3", "f8_e5m2", "u16", "u32", "u64"};
constexpr const char* kSafetensorsNames[] = {"BF16",    "F16",     "F32", "I32", "I64",
                                             "BOOL",    "U8",      "I8",  "I16", "F64",
                                             "F8_E4M3", "F8_E5M2", "U16", "U32", "U64"};
}  // namespace

const char* dtype_name(DType dtype) { return enum_name(dtype, kDTypeNames); }

const char* dtype_safetensors_name(DType dtype) { return enum_name(dtype, kSafetensorsNames); }

std::optional<DType> parse_dtype(std::string_view name) {
  if (auto d = enum_from_name<DType>(name, kDTypeNames)) return d;
  return enum_from_name<DType>(name, kSafetensorsNames);
}

uint16_t f32_to_f16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value = mantissa * 2^-24, rounded to nearest even.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // 14..24: bits dropped to reach units of 2^-24
    const uint32_t half = 1u << (shift - 1);
    const uint32_t rest = mant & ((1u << shift) - 1u);
    uint32_t out = mant >> shift;
    if (rest > half || (rest == half && (out & 1u))) ++out;
    return static_cast<uint16_t>(sign | out);
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even
  // (a carry into the exponent is the correct result, up to inf handled above).
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

float f16_to_f32(uint16_t value) {
  const uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  const uint32_t exp = (value >> 10) & 0x1fu;
  const uint32_t mant = value & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: mant * 2^-24, exactly representable in f32.
    const float magnitude = static_cast<float>(mant) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &magnitude, sizeof bits);
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

}  // namespace pinstage
