// ModelConfig: what decode jobs need beyond the pool's bytes (docs/design.md §5). kvpoold holds
// it (from its flags), Health reports it and workers receive it when they register; the synthetic
// model (kernels/synthetic/synthetic_model.h) is derived from it and the pool spec.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kvpool/layout/pool_spec.h"
#include "kvpool/model/model_limits.h"

namespace kvp {

// The attention's q heads, how many positions the indexer selects per layer, the synthetic
// model's seed, the per-layer sliding windows and the sparse-V threshold.
struct ModelConfig {
  int num_q_heads = 32;
  int topk = 2048;
  uint64_t synthetic_seed = 0x6B76706F6F6Cull;
  // Per layer: > 0 attends to the last W positions only; empty: every layer attends to all.
  // Dense decode only (pools without an indexer): sparse decode attends to what top-k selects.
  std::vector<int> sliding_windows;
  float sparse_v_threshold = 0.0f;  // τ of sparse-V (docs/design.md §5); 0: exact dense softmax
  // The attention's softmax scale; 0: the pool kind's default (SoftmaxScaleOf).
  float softmax_scale = 0.0f;

  int Window(int layer) const { return sliding_windows.empty() ? 0 : sliding_windows[layer]; }
};

// INVALID_ARGUMENT unless q heads are a positive multiple of the spec's kv heads (at most
// kMaxQHeadsPerKvHead per kv head; an MLA pool: a multiple of 16 up to kMaxMlaQHeads), 1 <= topk
// <= kMaxTopk, the windows are none or one >= 0 per layer of a pool without an indexer, τ is
// finite and >= 0 (0 for MLA pools: their decode has no sparse-V) and the softmax scale is 0 or
// finite and positive.
absl::Status ValidateModelConfig(const ModelConfig& model, const PoolSpec& spec);

// The softmax scale decode uses: the model's, or 1/√head_dim (KV pools), or DeepSeek-V3.2's
// 0.1352 (MLA pools: 1/√192 times YaRN's mscale², never 1/√576).
float SoftmaxScaleOf(const ModelConfig& model, const PoolSpec& spec);

}  // namespace kvp
