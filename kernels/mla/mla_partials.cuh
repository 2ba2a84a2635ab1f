// How both sparse MLA decode kernels write a split's partial outputs (the layout is stated in
// kernels/mla/sparse_mla_decode_wgmma.h; CombineSplitsKernel reads them) in 16-byte stores.
//
// An mma accumulator fragment gives lane (g, t) = (lane / 4, lane % 4) the dims [d, d + 2),
// d = 8j + 2t, of two rows: the upper (row g) and the lower (row g + 8). Lanes t and t ^ 1 hold the
// two halves of the same four dims, so they swap one pair and each stores four floats of one row:
// the even lane dims [d, d + 4) of the upper row, the odd lane dims [d - 2, d + 2) of the lower.
// Half the stores of writing every pair by itself, which is what a batch-1 decode's warps waited
// on (the load/store queue: 64 float pairs a thread).
#pragma once

#include <cstdint>

#include "kvpool/format/mla_latent.h"

namespace kvp::mla {

// Whether lane t stores the upper row's dims (else the lower's, starting two dims earlier).
__device__ __forceinline__ bool StoresUpperRow(int t) { return t % 2 == 0; }

// The four floats lane t stores, from its pairs of the upper and the lower row. Every lane of the
// warp must call it (it shuffles). Scale them after the swap: the two lanes share their rows.
__device__ __forceinline__ float4 SwapRowPairs(int t, float2 upper, float2 lower) {
  const bool keeps_upper = StoresUpperRow(t);
  const float2 send = keeps_upper ? lower : upper;
  const float x = __shfl_xor_sync(~0u, send.x, 1), y = __shfl_xor_sync(~0u, send.y, 1);
  return keeps_upper ? make_float4(upper.x, upper.y, x, y) : make_float4(x, y, lower.x, lower.y);
}

// Where lane t's stores of split `split` start in part_out[(row · splits + split) · 512 + d]: the
// upper row `row` (even t) or the lower row + 8 (odd t, two dims earlier), at the lane's dim `dim`
// = its fragment's first column (then every 8 dims).
__device__ __forceinline__ float* PartialStores(float* part_out, int64_t row, int splits,
                                                int split, int dim, int t) {
  const bool upper = StoresUpperRow(t);
  return part_out + ((row + (upper ? 0 : 8)) * splits + split) * kMlaLatentDim + dim -
         (upper ? 0 : 2);
}

__device__ __forceinline__ float4 Scaled(float4 v, float s) {
  return make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
}

}  // namespace kvp::mla
