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
  int32_t first_position = 0;  // position of tokens[0]
  Bf16* k = nullptr;           // [num_tokens, num_kv_heads, head_dim]
  Bf16* v = nullptr;           // [num_tokens, num_kv_heads, head_dim]
  Bf16* index_k = nullptr;     // [num_tokens, 128]; null = none
};

LaunchStatus SyntheticTokensLaunch(const SyntheticTokensParams& p, cudaStream_t stream);

}  // namespace kvp
