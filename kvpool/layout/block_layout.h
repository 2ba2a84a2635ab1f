// BlockLayout: the one place that computes where every section of every layer sits in a block
// (docs/design.md §4). A block is contiguous across all layers, so moving a block is one copy.
//
// Invariants, checked by Create and the tests:
//   1. sections follow each other in order latent (MLA pools), K, V data, V scale (KV pools), IDX
//      values, IDX scales, layer by layer, and never overlap;
//   2. every section starts 16-byte aligned;
//   3. block_stride is the end of the last layer rounded up to 256 bytes.
// Immutable once made; safe to share between threads.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpool/layout/layer_cache.h"
#include "kvpool/layout/pool_spec.h"

namespace kvp {

inline constexpr int64_t kSectionAlignment = 16;
inline constexpr int64_t kBlockAlignment = 256;

class BlockLayout {
 public:
  static absl::StatusOr<BlockLayout> Create(const PoolSpec& spec);

  const PoolSpec& spec() const { return spec_; }
  int64_t block_stride() const { return block_stride_; }
  const SectionOffsets& sections(int layer) const { return sections_[layer]; }

  // The kernel-facing view of `layer` over an arena of `num_blocks` blocks starting at `base`.
  // REQUIRES: 0 <= layer < spec().num_layers.
  LayerCache Layer(uint8_t* base, int64_t num_blocks, int layer) const;

 private:
  BlockLayout(PoolSpec spec, std::vector<SectionOffsets> sections, int64_t block_stride);

  PoolSpec spec_;
  std::vector<SectionOffsets> sections_;
  int64_t block_stride_;
};

}  // namespace kvp
