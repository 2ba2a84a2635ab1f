// How both sparse MLA decode kernels write a split's partial outputs (the layout is stated in
// kernels/mla/sparse_mla_decode_wgmma.h; CombineSplitsKernel reads them).
#pragma once

#include <cstdint>

namespace kvp::mla {

// An mma accumulator fragment gives lane (g, t) = (lane / 4, lane % 4) the dims [d, d + 2),
// d = 8j + 2t, of two rows: `upper` (row g) and `lower` (row g + 8). Lanes t and t ^ 1 hold the two
// halves of the same four dims, so they swap one pair and each stores 16 bytes of one row: the
// even lane dims [d, d + 4) of the upper row, the odd lane dims [d - 2, d + 2) of the lower. Half
// the stores of writing every pair by itself, which is what a batch-1 decode's warps wait on (the
// load/store queue: 64 float pairs a thread). upper_row and lower_row point at dim d of their rows;
// d - 2t is 16-byte aligned. Every lane of the warp must call it (it shuffles).
__device__ __forceinline__ void StoreRowPairs(float* upper_row, float* lower_row, int t,
                                              float2 upper, float2 lower) {
  const bool even = t % 2 == 0;
  const float2 send = even ? lower : upper;
  const float2 got = make_float2(__shfl_xor_sync(~0u, send.x, 1), __shfl_xor_sync(~0u, send.y, 1));
  if (even) {
    *reinterpret_cast<float4*>(upper_row) = make_float4(upper.x, upper.y, got.x, got.y);
  } else {
    *reinterpret_cast<float4*>(lower_row - 2) = make_float4(got.x, got.y, lower.x, lower.y);
  }
}

}  // namespace kvp::mla
