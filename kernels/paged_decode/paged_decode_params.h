// Dense paged decode (docs/design.md §5): each sequence's query attends over all of its cached
// tokens, or the last `window` of them. nvcc-safe.
#pragma once

#include <cstdint>

#include "kernels/attention/attention_params.h"

namespace kvp {

struct PagedDecodeParams {
  AttentionParams attn;
  int32_t window = 0;  // > 0: attend to positions [seq_len - window, seq_len) only; 0 = all
};

}  // namespace kvp
