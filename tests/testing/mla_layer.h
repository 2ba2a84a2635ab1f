// A layer of nothing but fp8_ds_mla latents, for the MLA kernel tests and benchmarks: any block
// size (pools have 16, 32 or 64 tokens a block; the kernels are also checked on sizes that are not
// powers of two), `num_blocks` blocks of `block_size` tokens of 656 bytes, each block padded to the
// pool's block alignment, the latent section at the start of a block, no indexer.
#pragma once

#include <cstdint>

#include "kvpool/layout/block_layout.h"
#include "kvpool/layout/layer_cache.h"

namespace kvp::testing {

inline int64_t MlaLayerStride(int32_t block_size) {
  return (int64_t{block_size} * kMlaTokenBytes + kBlockAlignment - 1) / kBlockAlignment *
         kBlockAlignment;
}

inline LayerCache MlaLayer(uint8_t* base, int64_t num_blocks, int32_t block_size) {
  LayerCache cache;
  cache.base = base;
  cache.num_blocks = num_blocks;
  cache.block_stride = MlaLayerStride(block_size);
  cache.block_size = block_size;
  cache.num_kv_heads = 1;
  return cache;
}

}  // namespace kvp::testing
