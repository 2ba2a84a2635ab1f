// The sparse MLA decode kernel for heads in multiples of 64 (sparse_mla_decode_wgmma.cu), behind
// SparseMlaDecodeLaunch, which plans the split of the top-k and merges the splits' results.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/mla/mla_params.h"

namespace kvp {

inline constexpr int kWgmmaMlaHeads = 64;  // a CTA's heads
// The top-k is taken in tiles of this many tokens by both decode kernels and by the plan of the
// split, whose tiles_per_split counts them.
inline constexpr int kSparseMlaTileTokens = 64;

// REQUIRES: p.heads a multiple of kWgmmaMlaHeads. Split `split` of `splits` takes 64-token tiles
// [split · tiles_per_split, +tiles_per_split) of every row; with splits > 1 it writes normalized
// partial outputs part_out[(row · heads + head) · splits + split][512] and their log-sum-exps
// part_lse[...] instead of p.out and p.lse.
cudaError_t LaunchSparseMlaDecodeWgmma(const SparseMlaDecodeParams& p, int splits,
                                       int tiles_per_split, float* part_out, float* part_lse,
                                       cudaStream_t stream);

}  // namespace kvp
