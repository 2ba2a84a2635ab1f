// TurboNV value quantization (docs/design.md §3, steps 2-5), host and device.
//
// A token-head vector of head_dim d is (optionally) rotated, then cut into groups of 16. Each group
// stores N-bit codes, packed little-endian (code i in bits [N·i, N·i + N): 2·N bytes), plus one
// E4M3 scale byte. Every float operation below is one IEEE operation in a fixed order; change
// nothing here without changing the format's version.
#pragma once

#include <cstdint>

#include "base/hd.h"
#include "kvpool/format/e4m3.h"
#include "kvpool/format/rotation.h"
#include "kvpool/format/turbo_code_cells.h"
#include "kvpool/format/turbo_codebook.h"

namespace kvp {

template <int kBits>
inline constexpr int kTurboGroupBytes = kTurboGroupSize* kBits / 8;

// Adds `value` (below 2^width) at bit `bit` of the little-endian words w[0, kWords), the part past
// the last word dropped. Adding is OR-ing where no set bits overlap: on the GPU one shift-and-add,
// where OR-ing in a shifted byte also takes a mask.
template <int kWords>
KVP_HD void AddBitsAt(uint32_t (&w)[kWords], int bit, uint32_t value, int width) {
  w[bit / 32] += value << (bit % 32);
  if (bit % 32 + width > 32 && bit / 32 + 1 < kWords) w[bit / 32 + 1] += value >> (32 - bit % 32);
}

// A group's codes packed as they are produced: code i in bits [N·i, N·i + N) of little-endian
// 32-bit words.
template <int kBits>
struct TurboCodeWords {
  static constexpr int kWords = (kTurboGroupBytes<kBits> + 3) / 4;
  uint32_t word[kWords] = {};

  // code < 2^N.
  KVP_HD void Put(int i, uint32_t code) { AddBitsAt(word, kBits * i, code, kBits); }
  KVP_HD void ToBytes(uint8_t* out) const {
    for (int b = 0; b < kTurboGroupBytes<kBits>; ++b) {
      out[b] = static_cast<uint8_t>(word[b / 4] >> (8 * (b % 4)));
    }
  }
};

// Packs 16 codes of kBits each into kTurboGroupBytes<kBits> bytes.
template <int kBits>
KVP_HD void TurboPackGroup(const uint8_t* codes, uint8_t* out) {
  TurboCodeWords<kBits> words;
  for (int i = 0; i < kTurboGroupSize; ++i) words.Put(i, codes[i]);
  words.ToBytes(out);
}

template <int kBits>
KVP_HD void TurboUnpackGroup(const uint8_t* in, uint8_t* codes) {
  uint64_t stream = 0;
  for (int b = 0; b < kTurboGroupBytes<kBits>; ++b) stream |= uint64_t{in[b]} << (8 * b);
  for (int i = 0; i < kTurboGroupSize; ++i) {
    codes[i] = static_cast<uint8_t>((stream >> (kBits * i)) & ((1u << kBits) - 1u));
  }
}

// TurboCode and its level by the search that defines them: valid for every u, NaN included.
template <int kBits>
struct TurboSearchCode {
  static constexpr bool kFiniteOnly = false;
  KVP_HD TurboCodeLevel operator()(float u) const {
#ifdef __CUDA_ARCH__
    const int code = TurboCodeSelect<kBits>(u);
#else
    const int code = TurboCode<kBits>(u);
#endif
    return {code, TurboLevel<kBits>(code)};
  }
};

// Quantizes one group x[16] (already rotated): sets the packed codes (zero on entry) and returns
// the scale byte (0x7F when the group holds NaN; NaN values get code 0). code_of(u) must give
// TurboCode(u) and its level: for every u, or (kFiniteOnly, like the GPU's lookup of
// turbo_code_cells.h) for finite |u| <= kTurboCellReach, in which case a group that could produce
// anything else takes the search.
template <int kBits, class CodeOf = TurboSearchCode<kBits>>
KVP_HD uint8_t TurboEncodeGroupCodes(const float* x, float v_scale, TurboCodeWords<kBits>& codes,
                                     CodeOf code_of = {}) {
  float a = 0.0f;
  for (int i = 0; i < kTurboGroupSize; ++i) a = MaxAbs(x[i], a);
  if (a == 0.0f) {
    for (int i = 0; i < kTurboGroupSize; ++i) codes.Put(i, 1u << (kBits - 1));
    return 0;
  }
  const float alpha = DivRn(TurboMaxLevel<kBits>(), a);
  float sum_x2 = 0.0f;
  for (int i = 0; i < kTurboGroupSize; ++i) sum_x2 = Fma(x[i], x[i], sum_x2);
  float sum_c2 = 0.0f;
  const auto quantize = [&](auto code_of_u) {
    for (int i = 0; i < kTurboGroupSize; ++i) {
      const TurboCodeLevel q = code_of_u(MulRn(alpha, x[i]));
      codes.Put(i, static_cast<uint32_t>(q.code));
      sum_c2 = Fma(q.level, q.level, sum_c2);
    }
  };
  // |u| = |alpha·x| stays within the largest level (up to two roundings) when no x is NaN (MaxAbs
  // skipped it; the sum of squares did not) and alpha is finite and above 0 (an infinite x makes
  // alpha 0, a denormal a can make it infinite).
  const bool u_finite = !IsNan(sum_x2) && FloatBits(alpha) - 1u < 0x7F7FFFFFu;
  if (!CodeOf::kFiniteOnly || u_finite) {
    quantize(code_of);
  } else {
    quantize(TurboSearchCode<kBits>{});
  }
  const float s = DivRn(SqrtRn(sum_x2), SqrtRn(sum_c2));  // matched norm
  // A group holding NaN gets the canonical NaN scale: NaN's sign after arithmetic is not portable.
  // (Dividing by a v_scale of 1 is exact, so it is skipped.)
  return IsNan(s)          ? kE4m3NanCode
         : v_scale == 1.0f ? E4m3FromFloat(s)
                           : E4m3FromFloat(DivRn(s, v_scale));
}

// TurboEncodeGroupCodes with the codes as kTurboGroupBytes<kBits> bytes.
template <int kBits, class CodeOf = TurboSearchCode<kBits>>
KVP_HD void TurboEncodeGroup(const float* x, float v_scale, uint8_t* packed, uint8_t* scale_byte,
                             CodeOf code_of = {}) {
  TurboCodeWords<kBits> codes;
  *scale_byte = TurboEncodeGroupCodes<kBits>(x, v_scale, codes, code_of);
  codes.ToBytes(packed);
}

// Dequantizes one group into the rotated domain: y_i = (decode(scale) · v_scale) · C[code_i].
template <int kBits>
KVP_HD void TurboDecodeGroup(const uint8_t* packed, uint8_t scale_byte, float v_scale, float* y) {
  uint8_t codes[kTurboGroupSize];
  TurboUnpackGroup<kBits>(packed, codes);
  const float s = MulRn(E4m3ToFloat(scale_byte), v_scale);
  for (int i = 0; i < kTurboGroupSize; ++i) y[i] = MulRn(s, TurboLevel<kBits>(codes[i]));
}

// Encodes one token-head vector v[d]: data gets d·N/8 bytes, scales gets d/16 bytes.
template <int kBits>
KVP_HD void TurboEncodeHead(const float* v, int d, bool rotate, const RotationSigns& signs,
                            float v_scale, uint8_t* data, uint8_t* scales) {
  float y[kMaxHeadDim];
  for (int j = 0; j < d; ++j) y[j] = v[j];
  if (rotate) RotateForward(y, d, signs);
  for (int g = 0; g < d / kTurboGroupSize; ++g) {
    TurboEncodeGroup<kBits>(y + g * kTurboGroupSize, v_scale, data + g * kTurboGroupBytes<kBits>,
                            scales + g);
  }
}

// Decodes one token-head vector into the rotated domain (ŷ; no inverse rotation).
template <int kBits>
KVP_HD void TurboDecodeHeadRotated(const uint8_t* data, const uint8_t* scales, int d, float v_scale,
                                   float* y) {
  for (int g = 0; g < d / kTurboGroupSize; ++g) {
    TurboDecodeGroup<kBits>(data + g * kTurboGroupBytes<kBits>, scales[g], v_scale,
                            y + g * kTurboGroupSize);
  }
}

// Decodes one token-head vector back to the value domain (v̂).
template <int kBits>
KVP_HD void TurboDecodeHead(const uint8_t* data, const uint8_t* scales, int d, bool rotate,
                            const RotationSigns& signs, float v_scale, float* v) {
  TurboDecodeHeadRotated<kBits>(data, scales, d, v_scale, v);
  if (rotate) RotateInverse(v, d, signs);
}

}  // namespace kvp
