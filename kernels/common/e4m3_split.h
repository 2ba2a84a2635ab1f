// bf16 queries as two E4M3 parts for FP8 tensor cores, whose other operand is the FP8 cache as it
// lies (keys need no conversion then). A bf16 has 8 significant bits and an E4M3 normal 4, so after
// a head's values are scaled by a power of two 2^e that brings its largest magnitude into
// [128, 256), hi = E4M3(x·2^e) and lo = E4M3(x·2^e - hi) give hi + lo = x·2^e exactly for every
// scaled value of magnitude 1/4 or more, at least 2^-10 of the largest (the residual then has at
// most 4 significant bits on E4M3's grid); smaller ones are off by at most 2^-9, 2^-16 of the
// largest.
// The product with a key is then two FP8 mma whose sum carries 2^e, undone by one multiply on the
// accumulated score. Host and device (tests/kernels/e4m3_split_test.cc checks these claims on the
// host; the device's converter agrees with the host's on every value it represents exactly).
//
// What is not exact is the FP8 tensor cores' accumulation: Hopper aligns each k-step's products and
// the running sum to the largest exponent and keeps about 13 mantissa bits, truncating. Summing the
// low part's steps first keeps their truncations 2^-4 smaller, so a score's error comes from the
// high part's steps: a few 1e-4 of the largest products (tests/kernels/gpu states the tolerance).
#pragma once

#include <cstdint>

#include "base/hd.h"
#include "kvpool/format/e4m3.h"

namespace kvp::e4m3_split {

// The exponent e of the scale 2^e for a head whose largest magnitude is `amax` (>= 0): amax·2^e
// in [128, 256), kept inside [-126, 126] so that 2^e and 2^-e are normal floats. From the bits:
// amax in [2^(b - 127), 2^(b - 126)) for a normal float of biased exponent b. A head holding an
// infinity or a NaN keeps e = 0; its parts then hold NaNs (E4M3 has no infinity: hi saturates and
// lo, inf - inf, is NaN), so its scores are NaN, which ReLU drops as the reference drops NaN dots.
KVP_HD int ScaleExponent(float amax) {
  const int biased = static_cast<int>(FloatBits(amax) >> 23);
  if (biased == 0) return amax > 0.0f ? 126 : 0;  // subnormal or zero
  if (biased == 255) return 0;
  const int e = 134 - biased;
  return e < -126 ? -126 : e > 126 ? 126 : e;
}

// 2^e for e in [-126, 127].
KVP_HD float Pow2(int e) { return BitsToFloat(static_cast<uint32_t>(127 + e) << 23); }

// Two floats as E4M3 (round to nearest, saturating), the first in the low byte: the device's
// converter, the host's integer encoding, equal wherever a value is exact in E4M3.
KVP_HD uint32_t ToE4m3x2(float first, float second) {
#if defined(__CUDA_ARCH__)
  return __nv_cvt_float2_to_fp8x2(make_float2(first, second), __NV_SATFINITE, __NV_E4M3);
#else
  return E4m3FromFloat(first) | (uint32_t{E4m3FromFloat(second)} << 8);
#endif
}

// x rounded to 4 significant bits (half away from zero) by integer arithmetic on its bits: exact in
// E4M3 from 2^-6 to 256, and its conversion then costs nothing but the one that packs the bytes.
KVP_HD float RoundTo4Bits(float x) { return BitsToFloat((FloatBits(x) + 0x80000u) & 0xFFF00000u); }

// Four scaled values as the hi and lo words (byte i = value i) of their E4M3 split: four
// conversions, against ten when hi is converted to E4M3 and read back.
KVP_HD void Split4(const float (&x)[4], uint32_t* hi, uint32_t* lo) {
  float h[4], r[4];
  for (int i = 0; i < 4; ++i) {
    h[i] = RoundTo4Bits(x[i]);
    r[i] = x[i] - h[i];  // exact: at most 4 significant bits
  }
  *hi = ToE4m3x2(h[0], h[1]) | (ToE4m3x2(h[2], h[3]) << 16);
  *lo = ToE4m3x2(r[0], r[1]) | (ToE4m3x2(r[2], r[3]) << 16);
}

// Four bf16 values (two words, the lower value in each word's low half) scaled by `scale` (2^e),
// as the hi and lo words of their split.
KVP_HD void SplitBf16x4(uint32_t w0, uint32_t w1, float scale, uint32_t* hi, uint32_t* lo) {
  const float x[4] = {BitsToFloat(w0 << 16) * scale, BitsToFloat(w0 & 0xFFFF0000u) * scale,
                      BitsToFloat(w1 << 16) * scale, BitsToFloat(w1 & 0xFFFF0000u) * scale};
  Split4(x, hi, lo);
}

// The largest magnitude of `count` bf16 pairs, as a float's bits: magnitudes' bit patterns order
// like their values, with infinities and NaNs above every finite one, so an integer maximum (here
// and across threads) keeps them where fmaxf would drop a NaN.
KVP_HD uint32_t Bf16AbsMaxBits(const uint32_t* words, int count) {
  uint32_t pairs = 0;
#if defined(__CUDA_ARCH__)
  for (int i = 0; i < count; ++i) pairs = __vmaxu2(pairs, words[i] & 0x7FFF7FFFu);
#else
  for (int i = 0; i < count; ++i) {
    const uint32_t w = words[i] & 0x7FFF7FFFu;
    const uint32_t low = (w & 0xFFFFu) > (pairs & 0xFFFFu) ? w & 0xFFFFu : pairs & 0xFFFFu;
    const uint32_t high = (w >> 16) > (pairs >> 16) ? w >> 16 : pairs >> 16;
    pairs = low | (high << 16);
  }
#endif
  const uint32_t low = pairs & 0xFFFFu, high = pairs >> 16;
  return (low > high ? low : high) << 16;
}

}  // namespace kvp::e4m3_split
