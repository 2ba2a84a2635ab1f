// Lightning-indexer logits (docs/design.md §5, DeepSeek-V3.2):
//   score[s, n] = Σ_h w[s, h] · ReLU(q[s, h] · k̂[s, n])
// over the FP8 indexer cache of one layer. nvcc-safe.
#pragma once

#include <cstdint>

#include "kvpool/format/bf16.h"
#include "kvpool/layout/layer_cache.h"

namespace kvp {

struct IndexerLogitsParams {
  LayerCache cache;                       // must have the indexer sections
  const Bf16* index_q = nullptr;          // [num_seqs, num_heads, 128]
  const float* head_weights = nullptr;    // [num_seqs, num_heads]
  const int32_t* block_tables = nullptr;  // [num_seqs, block_table_stride]
  int32_t block_table_stride = 0;
  const int32_t* seq_lens = nullptr;  // [num_seqs]
  float* logits = nullptr;            // [num_seqs, logits_stride]; n >= seq_len gets -inf
  int32_t logits_stride = 0;          // >= every seq_len
  int32_t num_seqs = 0;
  int32_t num_heads = kIndexHeads;
};

}  // namespace kvp
