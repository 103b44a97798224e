// float16 (IEEE binary16) and bfloat16 <-> float32 conversions on raw bit patterns.
//
// Float to half rounds to nearest, ties to even; NaN stays NaN (quieted, sign and top payload bits
// kept), infinities and overflow become infinity, values below the smallest subnormal round to a
// signed zero. Every function is branch-free (selects only) and float-to-half uses integer
// arithmetic only, so loops that call them over arrays vectorise (a floating-point operation under
// a select could trap, which stops GCC's if-conversion). The formulations follow F. Giesen's
// "half_to_float_fast5" and "float_to_half_fast3_rtne", with an integer subnormal path.
#pragma once

#include <cstdint>
#include <cstring>

namespace horo {

inline uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float FloatFromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline float HalfToFloat(uint16_t half) {
  const uint32_t shifted_exponent = 0x7c00u << 13;           // half exponent mask, moved to float
  const float denormal_magic = FloatFromBits(113u << 23);    // 2^-14
  uint32_t bits = (static_cast<uint32_t>(half) & 0x7fffu) << 13;  // exponent and mantissa
  const uint32_t exponent = bits & shifted_exponent;
  bits += (127u - 15u) << 23;                                 // rebias the exponent
  // Inf/NaN: push the exponent to all ones.
  const uint32_t inf_nan_bits = bits + ((128u - 16u) << 23);
  // Zero/subnormal: make it a normal float 2^-14 * (1 + m) and subtract 2^-14, which is exact.
  const uint32_t subnormal_bits = FloatBits(FloatFromBits(bits + (1u << 23)) - denormal_magic);
  bits = exponent == shifted_exponent ? inf_nan_bits : bits;
  bits = exponent == 0 ? subnormal_bits : bits;
  bits |= (static_cast<uint32_t>(half) & 0x8000u) << 16;     // sign
  return FloatFromBits(bits);
}

inline uint16_t FloatToHalf(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  const uint32_t exponent = magnitude >> 23;

  // Normal result: rebias the exponent, add 0x0fff plus the lowest kept bit (ties to even), and
  // truncate; a carry out of the mantissa correctly bumps the exponent, up to infinity.
  const uint32_t mantissa_odd = (magnitude >> 13) & 1u;
  const uint32_t normal_half = (magnitude - (112u << 23) + 0xfffu + mantissa_odd) >> 13;
  // Subnormal or zero result (below 2^-14): the half is the float's significand, implicit bit
  // included, shifted right by 126 - exponent with the same rounding. Shifts past 31 give zero.
  const uint32_t shift = exponent < 95u ? 31u : exponent > 125u ? 31u : 126u - exponent;
  const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t subnormal_half = (significand + (1u << (shift - 1)) - 1u + ((significand >> shift) & 1u)) >> shift;
  // NaN keeps its top payload bits and becomes quiet; infinity and overflow become infinity.
  const uint32_t nan_half = 0x7e00u | ((magnitude >> 13) & 0x3ffu);
  const uint32_t inf_nan_half = magnitude > 0x7f800000u ? nan_half : 0x7c00u;

  uint32_t half = exponent < 113u ? subnormal_half : normal_half;
  half = exponent >= 143u ? inf_nan_half : half;  // 2^16 and above
  return static_cast<uint16_t>(half | sign);
}

inline float BFloat16ToFloat(uint16_t bfloat) { return FloatFromBits(static_cast<uint32_t>(bfloat) << 16); }

inline uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  // Ties to even: add 0x7fff plus the lowest kept bit, then truncate. NaN: quiet, keep the sign.
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>(is_nan ? quiet_nan : rounded);
}

}  // namespace horo
