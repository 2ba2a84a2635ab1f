// Device helpers of the sparse MLA decode kernels: fp8_ds_mla latents to the bf16 the tensor
// cores take.
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

}  // namespace kvp::mla
