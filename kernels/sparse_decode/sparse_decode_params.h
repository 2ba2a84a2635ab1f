// Sparse decode (docs/design.md §5): each sequence's query attends over the positions its top-k row
// selected, and nothing else. nvcc-safe.
#pragma once

#include <cstdint>

#include "kernels/attention/attention_params.h"

namespace kvp {

struct SparseDecodeParams {
  AttentionParams attn;
  const int32_t* indices = nullptr;  // [num_seqs, topk]; positions < seq_len, distinct, -1 = none
  int32_t topk = 0;                  // entries per row of indices
};

}  // namespace kvp
