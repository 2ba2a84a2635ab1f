// The activations a job's kernels consume, per layer, in host memory: the tensors the job carried
// or, when it carried none, the synthetic model's (docs/design.md §6).
#pragma once

#include <vector>

#include "kvpool/format/bf16.h"
#include "worker/job.h"

namespace kvp {

// As TokenActivations: an MLA pool's k is [tokens, 576] (latent then RoPE) and v is empty.
struct TokenInputs {
  std::vector<Bf16> k, v;     // [tokens, kv_heads, head_dim]
  std::vector<Bf16> index_k;  // [tokens, 128]; pools with an indexer
};

// Values of one token's k row: kv_heads · head_dim, or an MLA token's 576.
size_t TokenRow(const PoolSpec& spec);

struct QueryInputs {
  std::vector<Bf16> q;         // [steps, q_heads, head_dim]; MLA pools [steps, q_heads, 576]
  std::vector<Bf16> index_q;   // [steps, 64, 128]; pools with an indexer
  std::vector<float> weights;  // [steps, 64]
};

// The per-step arrays the attention kernels take, the same for every layer and both executors.
struct DecodeBatch {
  int32_t stride = 1;           // entries per block-table row: the longest table
  int32_t max_len = 1;          // the longest sequence after its step
  std::vector<int32_t> tables;  // [steps, stride]; short rows padded with block 0, never read
  std::vector<int32_t> lens;    // [steps]: tokens after the step
  std::vector<int64_t> slots;   // [steps]: where each step's new token goes
};
DecodeBatch DecodeBatchOf(const DecodeWork& work);

// One result per step with its sequence and new length; outputs still empty.
std::vector<DecodeStepResult> EmptyResults(const DecodeWork& work);

// Layer `layer` of a prefill's tokens.
void FillPrefillInputs(const PrefillWork& work, const JobContext& ctx, int layer, TokenInputs* out);

// Layer `layer` of every step's new token, one row per step.
void FillDecodeTokenInputs(const DecodeWork& work, const JobContext& ctx, int layer,
                           TokenInputs* out);

// Layer `layer` of every step's queries, one row per step.
void FillDecodeQueryInputs(const DecodeWork& work, const JobContext& ctx, int layer,
                           QueryInputs* out);

}  // namespace kvp
