// Device helpers of the sparse MLA decode kernels: fp8_ds_mla latents to the bf16 the tensor
// cores take. Two ways: TokenChunkBf16 through the hardware converter (E4M3 to f16 to float,
// times the scale, rounded to bf16: exact, NaN kept), and DequantizeEight with integer and bf16
// arithmetic only, which the decode uses for its tiles: the converter path made dequantization
// about 40% of a 128-head decode's time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kvpool/format/mla_latent.h"

namespace kvp::mla {

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Two E4M3 codes times their tile's scale, as a bf16 pair (the code is exact in f16 and float).
__device__ __forceinline__ uint32_t DequantizePair(uint32_t two_codes, float scale) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return PackBf16(f.x * scale, f.y * scale);
}

// A tile's float32 scale as two bf16 parts, hi = RN(s) and lo = RN(s - hi), each in both halves
// of a pair and times 2^120 (exact: the bits of hi and lo with the exponent raised, for |s| below
// kPrescaledScaleLimit): a value is then fma(x, hi, x · lo) in bf16 arithmetic, x the code's bits
// shifted into a bf16 2^120 below the code's value (DequantizeSignedPair), whose products are
// those of the code's value and the unscaled parts. The one rounding sees the product code · s to
// within about 2^-16 of it (the bf16 lo keeps s's next 8 bits). That result is RN(code · s) but
// where code · s lies that close to halfway between two bf16: then one step off.
struct Bf16SplitScale {
  __nv_bfloat162 hi, lo;
};

// Scales of this magnitude or more (amax >= 57,344), infinite or NaN take TokenChunkBf16 instead:
// hi · 2^120 would leave bf16's range at 256.
inline constexpr float kPrescaledScaleLimit = 128.0f;

__device__ __forceinline__ Bf16SplitScale SplitScale(float s) {
  constexpr float k2To120 = 0x1p120f;
  const __nv_bfloat16 hi = __float2bfloat16_rn(s);
  const __nv_bfloat16 lo = __float2bfloat16_rn(s - __bfloat162float(hi));
  return {__bfloat162bfloat162(__float2bfloat16_rn(__bfloat162float(hi) * k2To120)),
          __bfloat162bfloat162(__float2bfloat16_rn(__bfloat162float(lo) * k2To120))};
}

// The bytes of `word` picked by `selector` (prmt), a selector nibble of 8 or more replicating the
// sign of byte (nibble - 8).
__device__ __forceinline__ uint32_t Permute(uint32_t word, uint32_t selector) {
  uint32_t out;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(out) : "r"(word), "r"(selector));
  return out;
}

// Two E4M3 codes times a scale as a bf16 pair, without the converter. `signed_pair` holds each
// code sign-extended to 16 bits (sign in [7, 16), magnitude in [0, 7)). E4M3's 4 exponent and 3
// mantissa bits shifted left by 4 are the low exponent bits and the mantissa of a bf16 with the
// same significand and an exponent 120 lower (E4M3's bias is 7, bf16's 127), subnormal codes
// included (bf16 arithmetic keeps subnormals); the split scale carries the 2^120 back. A NaN code
// (magnitude 0x7F) reads 480 here: the callers check for NaN codes apart.
__device__ __forceinline__ uint32_t DequantizeSignedPair(uint32_t signed_pair, Bf16SplitScale s) {
  const uint32_t bits = (signed_pair << 4) & 0x87F087F0u;
  const __nv_bfloat162 x = *reinterpret_cast<const __nv_bfloat162*>(&bits);
  const __nv_bfloat162 v = __hfma2(x, s.hi, __hmul2(x, s.lo));
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Whether any of the four codes of `codes` is a NaN (magnitude 0x7F): adding 1 to each 7-bit
// magnitude carries into the byte's top bit only there.
__device__ __forceinline__ uint32_t NanCodes(uint32_t codes) {
  return ((codes & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
}

// Eight codes (two words of `codes`) times a scale below kPrescaledScaleLimit in magnitude as four
// bf16 pairs, in order;
// `nan_codes` gains a bit for each NaN code, whose value this does not give (TokenChunkBf16 does).
__device__ __forceinline__ uint4 DequantizeEight(uint2 codes, Bf16SplitScale s,
                                                 uint32_t& nan_codes) {
  nan_codes |= NanCodes(codes.x) | NanCodes(codes.y);
  return make_uint4(DequantizeSignedPair(Permute(codes.x, 0x9180), s),
                    DequantizeSignedPair(Permute(codes.x, 0xB3A2), s),
                    DequantizeSignedPair(Permute(codes.y, 0x9180), s),
                    DequantizeSignedPair(Permute(codes.y, 0xB3A2), s));
}

// Eight values of a cached token as bf16: 16-byte chunk `chunk` (0..71) of its 576 inputs, the
// latent's (chunks 0..63) dequantized with their tile's scale, the RoPE part's copied.
__device__ __forceinline__ uint4 TokenChunkBf16(const uint8_t* entry, int chunk) {
  constexpr int kLatentChunks = kMlaLatentDim / 8;
  if (chunk < kLatentChunks) {
    const uint2 codes = *reinterpret_cast<const uint2*>(entry + chunk * 8);
    const float scale =
        *reinterpret_cast<const float*>(entry + kMlaScalesOffset + 4 * (chunk / (kMlaTile / 8)));
    return make_uint4(DequantizePair(codes.x, scale), DequantizePair(codes.x >> 16, scale),
                      DequantizePair(codes.y, scale), DequantizePair(codes.y >> 16, scale));
  }
  return *reinterpret_cast<const uint4*>(entry + kMlaRopeOffset + (chunk - kLatentChunks) * 16);
}

// Part `part` of kParts (4 or 8) of a cached entry as bf16, chunk c (0..71) of its 576 values (8
// a chunk) stored at chunk_at(c), a uint4*: latent chunks [64 / kParts · part, +64 / kParts), all
// of one scale's tile, and RoPE chunks 64 + [8 / kParts · part, +8 / kParts). When consecutive
// threads take consecutive entries of one part, their reads of the 656-byte entries (41 · 16
// bytes) fall in eight different 16-byte bank groups.
template <int kParts, typename ChunkAt>
__device__ __forceinline__ void DequantizeTokenPart(const uint8_t* entry, int part,
                                                    ChunkAt chunk_at) {
  constexpr int kLatentChunks = kMlaLatentDim / 8;
  constexpr int kChunks = kLatentChunks / kParts;
  constexpr int kRopeChunks = kMlaRopeDim / 8 / kParts;
  static_assert(kMlaTile / 8 % kChunks == 0 && kChunks % 2 == 0 && kRopeChunks >= 1);
  const int first = part * kChunks;
  const float tile_scale =
      *reinterpret_cast<const float*>(entry + kMlaScalesOffset + 4 * (first / (kMlaTile / 8)));
  const Bf16SplitScale scale = SplitScale(tile_scale);
  uint32_t nan_codes = 0;
#pragma unroll
  for (int i = 0; i < kChunks; i += 2) {
    const uint4 codes = *reinterpret_cast<const uint4*>(entry + (first + i) * 8);
    *chunk_at(first + i) = DequantizeEight(make_uint2(codes.x, codes.y), scale, nan_codes);
    *chunk_at(first + i + 1) = DequantizeEight(make_uint2(codes.z, codes.w), scale, nan_codes);
  }
  // Rare: NaN codes, which the converter keeps, or a scale out of the split's range: a tile that
  // held an infinity (an infinite scale, whose products the converter gives as ±inf), a huge one,
  // or a NaN scale (bytes no kvpool writer makes).
  if (nan_codes != 0 || !(fabsf(tile_scale) < kPrescaledScaleLimit)) {
    for (int i = 0; i < kChunks; ++i) *chunk_at(first + i) = TokenChunkBf16(entry, first + i);
  }
#pragma unroll
  for (int i = 0; i < kRopeChunks; ++i) {
    const int c = kLatentChunks + part * kRopeChunks + i;
    *chunk_at(c) = TokenChunkBf16(entry, c);
  }
}

}  // namespace kvp::mla
