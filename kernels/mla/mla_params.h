// DeepSeek MLA over an fp8_ds_mla latent cache (docs/design.md §3, §5): the cache write and the
// sparse decode through the indexer's top-k, as vLLM's concat_and_cache_ds_mla and FlashMLA's
// sparse decode define them. nvcc-safe.
//
// Sparse decode: every query head of (sequence b, query token j) attends over the tokens whose
// physical slots row (b, j) of `slots` names (-1: unused), with absorbed queries of 576 values:
//   score_t = softmax_scale · q · [latent_t ; rope_t]       (576 values; latent dequantized)
//   out     = Σ_t softmax(score)_t · latent_t               (512 values)
//   lse     = ln Σ_t exp(score_t)
// A row with no valid slot gives out = 0 and lse = -inf. The top-k is shared by all heads of a
// token; s_q > 1 are the tokens of multi-token prediction, each with its own row.
#pragma once

#include <cstdint>

#include "kvpool/format/bf16.h"
#include "kvpool/layout/layer_cache.h"
#include "kvpool/model/model_limits.h"  // kDeepSeekV32SoftmaxScale

namespace kvp {

struct MlaCacheWriteParams {
  LayerCache cache;                // an MLA pool's layer
  const Bf16* latent = nullptr;    // [num_tokens, 512], rows latent_stride apart
  const Bf16* rope = nullptr;      // [num_tokens, 64], rows rope_stride apart
  const Bf16* index_k = nullptr;   // [num_tokens, 128]; required iff cache.has_indexer
  const int64_t* slots = nullptr;  // [num_tokens]; physical slots, -1: skip (padding)
  int32_t num_tokens = 0;
  // Elements between tokens: slices of one [tokens, 576] row (latent then RoPE) are 576 apart.
  // CUDA: latent rows 8-byte aligned (stride a multiple of 4), RoPE rows 4-byte aligned (even).
  int32_t latent_stride = kMlaLatentDim;
  int32_t rope_stride = kMlaRopeDim;
};

// The write of `num_tokens` rows of 576 values, each a token's latent then its RoPE part: how
// kvpool holds an MLA token's input (TokenActivations, the synthetic model).
inline MlaCacheWriteParams MlaRowsWrite(const LayerCache& cache, const Bf16* rows,
                                        const Bf16* index_k, const int64_t* slots,
                                        int32_t num_tokens) {
  return MlaCacheWriteParams{.cache = cache,
                             .latent = rows,
                             .rope = rows + kMlaLatentDim,
                             .index_k = index_k,
                             .slots = slots,
                             .num_tokens = num_tokens,
                             .latent_stride = kMlaInputDim,
                             .rope_stride = kMlaInputDim};
}

// Top-k positions to physical slots: what the indexer selects, through each sequence's blocks,
// as sparse MLA decode takes it. -1 stays -1.
struct SlotsOfPositionsParams {
  const int32_t* positions = nullptr;     // [rows, k]; -1: none
  const int32_t* block_tables = nullptr;  // [rows, block_table_stride]
  int32_t block_table_stride = 0;
  int32_t block_size = 0;
  int32_t* slots = nullptr;               // [rows, k]
  int32_t rows = 0;
  int32_t k = 0;
};

struct SparseMlaDecodeParams {
  LayerCache cache;                // an MLA pool's layer
  const Bf16* q = nullptr;         // [batch, s_q, heads, 576]
  const int32_t* slots = nullptr;  // [batch, s_q, topk]; physical slots, -1: unused
  int32_t batch = 0;
  int32_t s_q = 1;                 // query tokens per sequence (1, or 2 with MTP)
  int32_t heads = 0;               // query heads: 16, 32, 64 or 128
  int32_t topk = 0;
  float softmax_scale = kDeepSeekV32SoftmaxScale;
  // At most this many CTAs share a row's top-k when the rows are too few to fill the GPU (the
  // launcher plans the split otherwise); 0: no limit, 1: never split.
  int32_t max_splits = 0;
  Bf16* out = nullptr;             // [batch, s_q, heads, 512]
  float* lse = nullptr;            // [batch, s_q, heads]
};

}  // namespace kvp
