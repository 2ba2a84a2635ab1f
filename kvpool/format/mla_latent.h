// DeepSeek MLA's FP8 latent cache, `fp8_ds_mla` (docs/design.md §3): one entry per token, shared
// by all query heads, exactly 656 bytes, the layout vLLM's concat_and_cache_ds_mla writes and
// FlashMLA's sparse decode reads:
//   [0, 512)    the 512 latent values as E4M3, four tiles of 128;
//   [512, 528)  each tile's scale, float32 little-endian;
//   [528, 656)  the 64 RoPE values as bf16 (round to nearest even).
// A tile's scale is s = max(amax / 448, FLT_MIN) in float32 (amax: the largest |x| of its 128
// values, NaN ignored; no power-of-two rounding); a value is E4M3(x / s): one float32 division,
// round to nearest even, saturating to ±448, NaN kept as 0x7F whatever its sign (CUDA's division
// and conversion give every NaN that code, so GPU writers agree; an infinity in a tile makes its
// scale infinite and itself NaN). nvcc-safe; the one place for these facts.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/hd.h"
#include "kvpool/format/bf16.h"
#include "kvpool/format/e4m3.h"

namespace kvp {

inline constexpr int kMlaLatentDim = 512;   // the compressed KV ("kv_lora_rank")
inline constexpr int kMlaRopeDim = 64;      // the decoupled RoPE key
inline constexpr int kMlaInputDim = kMlaLatentDim + kMlaRopeDim;  // 576: what a token carries
inline constexpr int kMlaTile = 128;        // values per scale
inline constexpr int kMlaTiles = kMlaLatentDim / kMlaTile;
inline constexpr int kMlaScalesOffset = kMlaLatentDim;                        // 512
inline constexpr int kMlaRopeOffset = kMlaScalesOffset + kMlaTiles * 4;       // 528
inline constexpr int kMlaTokenBytes = kMlaRopeOffset + kMlaRopeDim * 2;       // 656
static_assert(kMlaTokenBytes == 656);

// The scale of one tile of 128 values.
KVP_HD float MlaTileScale(const float* tile) {
  float amax = 0.0f;
  for (int i = 0; i < kMlaTile; ++i) {
    const float a = tile[i] < 0.0f ? -tile[i] : tile[i];
    if (a > amax) amax = a;  // false for NaN: ignored
  }
  const float s = DivRn(amax, kE4m3Max);
  return s > FLT_MIN ? s : FLT_MIN;
}

// The code of x / s, the tile's value x over its scale s.
KVP_HD uint8_t MlaLatentCode(float x, float s) {
  const uint8_t code = E4m3FromFloat(DivRn(x, s));
  return (code & 0x7F) == kE4m3NanCode ? kE4m3NanCode : code;
}

// x / s without a division per value, for writers that encode many values of one tile: for a
// scale s in [kMlaQuotientMinScale, FLT_MAX] and r = MlaReciprocal(s) = RN(1/s), MlaQuotient(x, s, r)
// has MlaLatentCode's code for every x of the tile (|x| <= 448 s). q = RN(x·r) is within 1.5 ulp of
// x / s, the residual x - q·s is exact in one fma, and RN(q + residual·r) is the rounded quotient
// (Markstein's correction). The residual is exact wherever the code depends on the last bit: for
// |x / s| >= 2^-10 with s >= 2^-90; smaller quotients code as zero either way. copysign keeps x's
// sign on a zero quotient. Checked against IEEE division in tests/kvpool/mla_latent_test.cc.
inline constexpr float kMlaQuotientMinScale = 0x1p-90f;
KVP_HD float MlaReciprocal(float s) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(s);
#else
  return 1.0f / s;
#endif
}
KVP_HD float MlaQuotient(float x, float s, float r) {
#if defined(__CUDA_ARCH__)
  const float q = __fmul_rn(x, r);
  return copysignf(__fmaf_rn(__fmaf_rn(-q, s, x), r, q), x);
#else
  const float q = x * r;
  return std::copysign(std::fma(std::fma(-q, s, x), r, q), x);
#endif
}

// One token: `in` holds 512 latent then 64 RoPE values, `out` receives its 656 bytes.
KVP_HD void EncodeMlaToken(const float* in, uint8_t* out) {
  for (int t = 0; t < kMlaTiles; ++t) {
    const float* tile = in + t * kMlaTile;
    const float s = MlaTileScale(tile);
    for (int i = 0; i < kMlaTile; ++i) out[t * kMlaTile + i] = MlaLatentCode(tile[i], s);
    std::memcpy(out + kMlaScalesOffset + 4 * t, &s, 4);  // little-endian hosts and GPUs
  }
  for (int i = 0; i < kMlaRopeDim; ++i) {
    const Bf16 r = Bf16FromFloat(in[kMlaLatentDim + i]);
    std::memcpy(out + kMlaRopeOffset + 2 * i, &r.bits, 2);
  }
}

// The 576 values a token's 656 bytes hold (latent value: its code times its tile's scale).
KVP_HD void DecodeMlaToken(const uint8_t* in, float* out) {
  for (int t = 0; t < kMlaTiles; ++t) {
    float s;
    std::memcpy(&s, in + kMlaScalesOffset + 4 * t, 4);
    for (int i = 0; i < kMlaTile; ++i) {
      out[t * kMlaTile + i] = E4m3ToFloat(in[t * kMlaTile + i]) * s;
    }
  }
  for (int i = 0; i < kMlaRopeDim; ++i) {
    Bf16 r;
    std::memcpy(&r.bits, in + kMlaRopeOffset + 2 * i, 2);
    out[kMlaLatentDim + i] = Bf16ToFloat(r);
  }
}

}  // namespace kvp
