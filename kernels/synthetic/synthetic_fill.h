// Host fill functions over the synthetic generator: whole activation tensors for prefill and
// decode, as a worker or a benchmark feeds them to the kernels.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/synthetic/synthetic.h"
#include "kvpool/format/bf16.h"

namespace kvp {

struct SyntheticShape {
  int num_kv_heads = 8;
  int num_q_heads = 32;
  int head_dim = 128;
};

// A planted needle: the decode query points at `position` (holding `token`) with `gain`.
struct SyntheticNeedle {
  int32_t position = 0;
  int32_t token = 0;
  float gain = 1.0f;
};

// K and V [tokens.size(), num_kv_heads, head_dim] (no V when v is null: an MLA pool's token is
// its K row of 576, latent then RoPE) and, when index_k is not null, index K [tokens.size(), 128]
// of layer `layer` for tokens at positions first_position, first_position+1, ...
void FillSyntheticTokens(const SyntheticConfig& cfg, const SyntheticShape& shape, int layer,
                         std::span<const int32_t> tokens, int32_t first_position, Bf16* k, Bf16* v,
                         Bf16* index_k);

// The decode query q [num_q_heads, head_dim] of one step (`step_seed` names it); each q head
// points at its kv head's key of `needle` when one is given.
void FillSyntheticQuery(const SyntheticConfig& cfg, const SyntheticShape& shape, int layer,
                        uint64_t step_seed, const SyntheticNeedle* needle, Bf16* q);

// The indexer query [64, 128] and head weights [64] of one step, pointing at `needle`'s index key
// when one is given.
void FillSyntheticIndexQuery(const SyntheticConfig& cfg, int layer, uint64_t step_seed,
                             const SyntheticNeedle* needle, Bf16* index_q, float* weights);

}  // namespace kvp
