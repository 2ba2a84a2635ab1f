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

  int Window(int layer) const { return sliding_windows.empty() ? 0 : sliding_windows[layer]; }
};

// INVALID_ARGUMENT unless q heads are a positive multiple of the spec's kv heads (at most
// kMaxQHeadsPerKvHead per kv head), 1 <= topk <= kMaxTopk, the windows are none or one >= 0 per
// layer of a pool without an indexer, and τ is finite and >= 0.
absl::Status ValidateModelConfig(const ModelConfig& model, const PoolSpec& spec);

}  // namespace kvp
