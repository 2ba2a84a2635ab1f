// The synthetic generator on the GPU (nvcc-safe): the same bits as FillSyntheticTokens.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common/launch_status.h"
#include "kernels/synthetic/synthetic.h"

namespace kvp {

struct SyntheticTokensParams {
  SyntheticConfig config;
  int32_t layer = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  const int32_t* tokens = nullptr;  // [num_tokens] token ids (device)
  int64_t num_tokens = 0;
  int32_t first_position = 0;  // position of tokens[0] (unless `positions` is given)
  Bf16* k = nullptr;           // [num_tokens, num_kv_heads, head_dim]
  Bf16* v = nullptr;           // [num_tokens, num_kv_heads, head_dim]; null = none (MLA)
  Bf16* index_k = nullptr;     // [num_tokens, 128]; null = none
  const int32_t* positions = nullptr;  // each token's own position [num_tokens]; null = none
};

LaunchStatus SyntheticTokensLaunch(const SyntheticTokensParams& p, cudaStream_t stream);

// The queries of a batch of decode steps: the same bits as FillSyntheticQuery and
// FillSyntheticIndexQuery, one step per row.
struct SyntheticQueriesParams {
  SyntheticConfig config;
  int32_t layer = 0;
  int32_t num_steps = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  const uint64_t* step_seeds = nullptr;       // [num_steps] (device)
  const int32_t* needle_positions = nullptr;  // [num_steps]; -1 = no needle
  const int32_t* needle_tokens = nullptr;     // [num_steps]
  const float* needle_gains = nullptr;        // [num_steps]
  Bf16* q = nullptr;                          // [num_steps, num_q_heads, head_dim]
  Bf16* index_q = nullptr;                    // [num_steps, 64, 128]; null = none
  float* weights = nullptr;                   // [num_steps, 64]; with index_q
};

LaunchStatus SyntheticQueriesLaunch(const SyntheticQueriesParams& p, cudaStream_t stream);

}  // namespace kvp
