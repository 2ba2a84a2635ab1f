// What dense decode's reads alone cost: a kernel that loads, and only loads, the K, V data and V
// scale rows a dense decode must read, in the order its CTAs read them, timed as the kernels are.
// It is the floor of a dense decode row for its access pattern (bench/NOTES.md).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kvpool/layout/layer_cache.h"

namespace kvp::bench {

// CTA (split, pair, seq) of `splits` x num_kv_heads / 2 x num_seqs reads kv heads 2·pair and
// 2·pair + 1 (side by side in every row: token-major, then head) of its split's share of the
// sequence's blocks, as dense decode's CTAs of two kv heads do, with 16-byte loads that allocate
// nothing in L1. Every sequence holds `blocks_per_seq` full blocks, a multiple of `splits`, and a
// pair's bytes of each row are a multiple of 16.
absl::Status LaunchDenseReadFloor(const LayerCache& cache, const int32_t* block_tables,
                                  int blocks_per_seq, int num_seqs, int splits, uint32_t* sink,
                                  cudaStream_t stream);

}  // namespace kvp::bench
