// Cache write (docs/design.md §5): quantizes new tokens' K, V and index K into their slots of one
// layer. The CPU reference and the CUDA kernel take this same struct; nvcc-safe.
#pragma once

#include <cstdint>

#include "kvpool/format/bf16.h"
#include "kvpool/layout/layer_cache.h"

namespace kvp {

struct CacheWriteParams {
  LayerCache cache;                       // the layer written
  const Bf16* k = nullptr;                // [num_tokens, num_kv_heads, head_dim]
  const Bf16* v = nullptr;                // [num_tokens, num_kv_heads, head_dim]
  const Bf16* index_k = nullptr;          // [num_tokens, 128]; required iff cache.has_indexer
  const int64_t* slot_mapping = nullptr;  // [num_tokens]; block · block_size + offset, -1 = skip
  int64_t num_tokens = 0;
};

}  // namespace kvp
