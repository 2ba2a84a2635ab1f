// OCP FP8 E4M3FN (docs/design.md §3): bias 7, largest finite 448, no infinities, NaN = 0x7F / 0xFF.
//
// Encoding rounds to nearest even and saturates to ±448 (CUDA's __NV_SATFINITE), infinities
// included; NaN stays NaN with its sign. The host encodes with integers only; the device with its
// converter, given inputs on which it agrees with the host bit for bit (E4m3SnapBelowMinNormal).
#pragma once

#include <cstdint>

#include "base/hd.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace kvp {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr uint8_t kE4m3MaxCode = 0x7E;
inline constexpr uint8_t kE4m3NanCode = 0x7F;

#if defined(__CUDACC__)
// The device's converter rounds to nearest even and saturates like __NV_SATFINITE for normal
// magnitudes and infinities, but its ties below 2^-6 are not E4m3FromFloat's, and it drops NaN's
// sign. Below 2^-6 E4m3FromFloat rounds |x| / 2^-9 to the nearest integer, ties to even (the
// subnormals and the smallest normal binade share the quantum 2^-9); that value,
// rint(x · 2^9) · 2^-9, is exact in E4M3, so the converter keeps it. Adding 1.5 · 2^23 rounds
// x · 2^9 (|x · 2^9| < 8) to an integer in one fused operation, subtracting it back is exact, and a
// zero keeps x's sign. Normal magnitudes, infinities and NaN pass through unchanged.
__device__ __forceinline__ float E4m3SnapBelowMinNormal(float x) {
  constexpr float kMinNormal = 0.015625f;         // 2^-6
  constexpr float kRoundToInteger = 12582912.0f;  // 1.5 · 2^23
  const float rounded = __fmaf_rn(x, 512.0f, kRoundToInteger);
  const float snapped = __fmaf_rn(rounded, 1.0f / 512.0f, -kRoundToInteger / 512.0f);
  const float chosen = fabsf(x) < kMinNormal ? snapped : x;
  return __uint_as_float(__float_as_uint(chosen) | (__float_as_uint(x) & 0x80000000u));
}

// E4m3FromFloat of two values, a in the low byte, except that NaN becomes 0x7F whatever its sign.
__device__ __forceinline__ uint32_t E4m3x2FromFloat(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(E4m3SnapBelowMinNormal(a), E4m3SnapBelowMinNormal(b)),
                                  __NV_SATFINITE, __NV_E4M3);
}

// E4m3x2FromFloat of two values that are bf16 values, through f16: f16 holds a bf16 value exactly
// from 2^-17 up to 65504; below that both the value and its f16 are under half E4M3's smallest
// subnormal (zeros of the value's sign), above it both saturate. The converter from f16 then
// agrees with E4m3FromFloat everywhere, ties below 2^-6 included (every bf16 value is checked by
// the GPU tests), so two conversions a pair replace E4m3SnapBelowMinNormal's five a value.
__device__ __forceinline__ uint32_t E4m3x2FromBf16Values(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return __nv_cvt_halfraw2_to_fp8x2(static_cast<__half2_raw>(h), __NV_SATFINITE, __NV_E4M3);
}
#endif

KVP_HD uint8_t E4m3FromFloat(float x) {
#if defined(__CUDA_ARCH__)
  if (isnan(x)) return static_cast<uint8_t>(((__float_as_uint(x) >> 24) & 0x80u) | kE4m3NanCode);
  return static_cast<uint8_t>(E4m3x2FromFloat(x, 0.0f));
#else
  const uint32_t bits = FloatBits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return sign | kE4m3NanCode;
  if (abs_bits > FloatBits(kE4m3Max)) return sign | kE4m3MaxCode;

  // |x| = significand * 2^(biased_exp - 150), significand with its implicit bit.
  const int biased_exp = static_cast<int>(abs_bits >> 23);
  const uint32_t significand = (abs_bits & 0x7FFFFFu) | (biased_exp ? 0x800000u : 0u);
  const int exp = (biased_exp ? biased_exp : 1) - 127;
  // The E4M3 quantum at this magnitude: 2^(e-3) for normals, 2^-9 for subnormals (e < -6).
  const int quantum_exp = (exp < -6 ? -6 : exp) - 3;
  const int shift = quantum_exp + 150 - (biased_exp ? biased_exp : 1);  // >= 20
  if (shift > 25) return sign;  // below half the smallest subnormal
  uint32_t n = significand >> shift;
  const uint32_t rem = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (n & 1u))) ++n;
  // n counts quanta, implicit bit included (8..16 for normals), so a rounding carry walks into the
  // next binade on its own.
  const int exp_field_base = (exp < -6 ? -6 : exp) + 6;
  return sign | static_cast<uint8_t>(exp_field_base * 8 + static_cast<int>(n));
#endif
}

KVP_HD float E4m3ToFloat(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exp = (code >> 3) & 0xFu;
  const uint32_t mant = code & 0x7u;
  if (exp == 0xFu && mant == 0x7u) return BitsToFloat(sign | 0x7FC00000u);
  if (exp == 0) {
    const float magnitude = static_cast<float>(mant) * 0.001953125f;  // mant * 2^-9, exact
    return sign ? -magnitude : magnitude;
  }
  return BitsToFloat(sign | ((exp + 120u) << 23) | (mant << 20));
}

}  // namespace kvp
