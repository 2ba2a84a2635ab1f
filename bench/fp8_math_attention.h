// Dense decode over a layer cache with chosen operands of its two products rounded to E4M3, as
// FP8 tensor math would take them: what FP8 `wgmma` for Q·Kᵀ and P·V would cost in accuracy (the
// kernels take Q, P and V as f16 and stay within 3e-3 of the reference's float math).
#pragma once

#include "absl/status/status.h"
#include "kernels/attention/attention_params.h"

namespace kvp::bench {

// Which operands are rounded. K needs none: an fp8_e4m3 cache holds E4M3 bytes already.
struct Fp8Operands {
  bool q = false;  // each q head scaled by a power of two into E4M3's range, then rounded
  bool p = false;  // the softmax weights exp(s - max) ≤ 1, times 256, rounded (the denominator
                   // sums them unrounded, as a kernel sums its float weights)
  bool v = false;  // the stored (rotated) values of each kv head of a sequence, scaled by a
                   // power of two into E4M3's range, then rounded

  bool any() const { return q || p || v; }
};

// Writes p.out as the reference's dense decode does (float math, no window, no sparse-V), but with
// `operands` rounded to E4M3.
absl::Status Fp8MathAttention(const AttentionParams& p, Fp8Operands operands);

}  // namespace kvp::bench
