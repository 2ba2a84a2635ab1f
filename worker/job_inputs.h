// The activations a job's kernels consume, per layer, in host memory: the tensors the job carried
// or, when it carried none, the synthetic model's (DESIGN.md §6).
#pragma once

#include <vector>

#include "kvpool/format/bf16.h"
#include "worker/job.h"

namespace kvp {

struct TokenInputs {
  std::vector<Bf16> k, v;    // [tokens, kv_heads, head_dim]
  std::vector<Bf16> index_k; // [tokens, 128]; pools with an indexer
};

struct QueryInputs {
  std::vector<Bf16> q;        // [steps, q_heads, head_dim]
  std::vector<Bf16> index_q;  // [steps, 64, 128]; pools with an indexer
  std::vector<float> weights; // [steps, 64]
};

// Layer `layer` of a prefill's tokens.
void FillPrefillInputs(const PrefillWork& work, const JobContext& ctx, int layer, TokenInputs* out);

// Layer `layer` of every step's new token, one row per step.
void FillDecodeTokenInputs(const DecodeWork& work, const JobContext& ctx, int layer,
                           TokenInputs* out);

// Layer `layer` of every step's queries, one row per step.
void FillDecodeQueryInputs(const DecodeWork& work, const JobContext& ctx, int layer,
                           QueryInputs* out);

}  // namespace kvp
