// Lightning-indexer key quantization (docs/design.md §3; vLLM's DeepSeek-V3.2 layout): one FP8 E4M3
// value per element of the 128-wide index key and one float32 scale per token.
#pragma once

#include <cstdint>

#include "base/hd.h"
#include "kvpool/format/e4m3.h"

namespace kvp {

inline constexpr int kIndexHeadDim = 128;  // elements of one token's index key
inline constexpr int kIndexHeads = 64;     // query heads of the lightning indexer
inline constexpr float kIndexerMinAmax = 1e-4f;

// s rounded up to a power of two, bit-wise: any mantissa bit set -> clear them, exponent + 1.
KVP_HD float RoundUpToUe8m0(float s) {
  const uint32_t bits = FloatBits(s);
  if ((bits & 0x7FFFFFu) == 0) return s;
  return BitsToFloat((bits & 0xFF800000u) + 0x00800000u);
}

// Quantizes k[128]: values[128] = E4M3(k_i / s), *scale = s.
KVP_HD void IndexerEncode(const float* k, bool ue8m0, uint8_t* values, float* scale) {
  float a = kIndexerMinAmax;
  for (int i = 0; i < kIndexHeadDim; ++i) a = MaxAbs(k[i], a);
  float s = DivRn(a, kE4m3Max);
  if (ue8m0) s = RoundUpToUe8m0(s);
  for (int i = 0; i < kIndexHeadDim; ++i) {
    // A NaN input keeps its sign; a NaN the division makes (an infinite key) is the canonical
    // 0x7F, since the sign of a computed NaN differs between CPUs and GPUs.
    const float q = DivRn(k[i], s);
    values[i] = IsNan(k[i]) ? E4m3FromFloat(k[i]) : (IsNan(q) ? kE4m3NanCode : E4m3FromFloat(q));
  }
  *scale = s;
}

KVP_HD void IndexerDecode(const uint8_t* values, float scale, float* k) {
  for (int i = 0; i < kIndexHeadDim; ++i) k[i] = MulRn(E4m3ToFloat(values[i]), scale);
}

}  // namespace kvp
