// What dense paged decode and sparse decode share: one query token per sequence attending over
// paged K/V of one layer (docs/design.md §5). nvcc-safe.
//
// GQA: q head h reads kv head h / (num_q_heads / num_kv_heads). Softmax over scores
// softmax_scale · q·k̂. Sparse-V: a position whose exp(score - running max) <= τ skips its V load
// and dequantization but still counts in the denominator; τ = 0 skips nothing (exactly dense).
// Skipped positions each carry normalized weight <= τ (the running max is <= the final max and the
// denominator is >= 1), so for n_skip skipped positions
//     ‖o_τ - o‖₂ <= n_skip · τ · max_p ‖v̂_p‖₂.
#pragma once

#include <cmath>
#include <cstdint>

#include "kvpool/format/bf16.h"
#include "kvpool/layout/layer_cache.h"

namespace kvp {

struct AttentionParams {
  LayerCache cache;                       // the layer read
  const Bf16* q = nullptr;                // [num_seqs, num_q_heads, head_dim]
  const int32_t* block_tables = nullptr;  // [num_seqs, block_table_stride]; block ids
  int32_t block_table_stride = 0;         // entries per row of block_tables
  const int32_t* seq_lens = nullptr;      // [num_seqs]; tokens in each sequence's cache
  float* out = nullptr;                   // [num_seqs, num_q_heads, head_dim], float32
  int32_t num_seqs = 0;
  int32_t num_q_heads = 0;            // a multiple of cache.num_kv_heads
  float softmax_scale = 0.0f;         // usually 1/√head_dim (DefaultSoftmaxScale)
  float sparse_v_threshold = 0.0f;    // τ >= 0; 0 = dense
  int32_t max_seq_len = 0;            // host-side upper bound of seq_lens: the CUDA kernels
                                      // plan their split of the work from it
  uint32_t* skipped_tiles = nullptr;  // optional (CUDA): counts 16-position tiles whose V the
                                      // sparse-V rule skipped; null = not counted
};

inline float DefaultSoftmaxScale(int head_dim) {
  return 1.0f / std::sqrt(static_cast<float>(head_dim));
}

}  // namespace kvp
