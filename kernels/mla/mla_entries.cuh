// Where a physical slot's 656-byte entry is, for both sparse MLA decode kernels: the cache's
// LatentOfSlot with the division by the block size fixed at launch (a FastDivisor, on the path
// every tile waits for), a slot of -1 giving null.
#pragma once

#include <cstdint>

#include "kernels/common/fast_divisor.h"
#include "kvpool/layout/layer_cache.h"

namespace kvp::mla {

__device__ __forceinline__ const uint8_t* EntryOfSlot(const LayerCache& cache,
                                                      FastDivisor block_size, int32_t slot) {
  const uint32_t block = block_size.Divide(static_cast<uint32_t>(slot));
  const int offset = slot - static_cast<int>(block * block_size.divisor());
  return slot >= 0 ? cache.Latent(block, offset) : nullptr;
}

}  // namespace kvp::mla
