// LayerCache: what a kernel needs to address one layer of the pool, as a plain struct of values
// (nvcc-safe, passed by value into kernels). Made only by BlockLayout::Layer; nothing else computes
// offsets (docs/design.md §4).
//
// Block b starts at base + b · block_stride. Inside it this layer's sections start at `sections`;
// rows are token-major, then head, then element.
#pragma once

#include <cstdint>

#include "base/hd.h"
#include "kvpool/format/head_codec.h"
#include "kvpool/format/kv_format.h"
#include "kvpool/format/mla_latent.h"

namespace kvp {

// The slot of position `pos` of a sequence whose blocks are `block_table` (docs/design.md §4):
// slot = block · block_size + offset, the unit of slot mappings.
KVP_HD int64_t SlotOfPosition(const int32_t* block_table, int64_t pos, int32_t block_size) {
  return int64_t{block_table[pos / block_size]} * block_size + pos % block_size;
}

// Blocks needed for `tokens` tokens.
KVP_HD constexpr int64_t BlocksForTokens(int64_t tokens, int32_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

// Byte offsets of one layer's sections from the start of a block. A section the pool does not have
// (indexer off, no V scales for bf16) has size 0 and shares its offset with the next one.
struct SectionOffsets {
  int64_t latent = 0;  // MLA pools: the fp8_ds_mla latent of each token (kvpool/format/mla_latent.h)
  int64_t k = 0;
  int64_t v_data = 0;
  int64_t v_scale = 0;
  int64_t index_values = 0;
  int64_t index_scales = 0;
  int64_t end = 0;  // one past this layer's last section
};

struct LayerCache {
  uint8_t* base = nullptr;   // arena start: block 0
  int64_t num_blocks = 0;    // blocks in the arena; valid block ids are [0, num_blocks)
  int64_t block_stride = 0;  // bytes between blocks
  SectionOffsets sections;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t k_head_bytes = 0;        // bytes of one token-head in the K section
  int32_t v_data_head_bytes = 0;   // ... in the V data section
  int32_t v_scale_head_bytes = 0;  // ... in the V scale section
  bool has_indexer = false;
  HeadCodec k_codec;      // format, k_scale
  HeadCodec v_codec;      // format, v_scale, rotation and its signs
  HeadCodec index_codec;  // indexer format, ue8m0

  KVP_HD bool ValidBlock(int64_t block) const { return block >= 0 && block < num_blocks; }
  KVP_HD uint8_t* Block(int64_t block) const { return base + block * block_stride; }
  KVP_HD int64_t TokenHead(int slot, int head) const { return int64_t{slot} * num_kv_heads + head; }
  KVP_HD uint8_t* K(int64_t block, int slot, int head) const {
    return Block(block) + sections.k + TokenHead(slot, head) * k_head_bytes;
  }
  KVP_HD uint8_t* VData(int64_t block, int slot, int head) const {
    return Block(block) + sections.v_data + TokenHead(slot, head) * v_data_head_bytes;
  }
  KVP_HD uint8_t* VScale(int64_t block, int slot, int head) const {
    return Block(block) + sections.v_scale + TokenHead(slot, head) * v_scale_head_bytes;
  }
  KVP_HD uint8_t* IndexValues(int64_t block, int slot) const {
    return Block(block) + sections.index_values + int64_t{slot} * kIndexHeadDim;
  }
  KVP_HD uint8_t* IndexScale(int64_t block, int slot) const {
    return Block(block) + sections.index_scales + int64_t{slot} * int64_t{sizeof(float)};
  }
  // The 656-byte latent of token `slot` of `block` (an MLA pool's layer).
  KVP_HD uint8_t* Latent(int64_t block, int slot) const {
    return Block(block) + sections.latent + int64_t{slot} * kMlaTokenBytes;
  }
  // The same for a physical slot, block · block_size + offset (what sparse MLA decode indexes by).
  KVP_HD uint8_t* LatentOfSlot(int64_t slot) const {
    return Latent(slot / block_size, static_cast<int>(slot % block_size));
  }
};

}  // namespace kvp
