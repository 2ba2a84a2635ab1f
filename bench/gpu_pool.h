// A pool on the GPU filled by the kernels themselves (synthetic generator -> cache write), for the
// kernel benchmarks: real, non-zero bytes in every section, blocks shuffled across the arena.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/common/device_buffer.h"
#include "kernels/synthetic/synthetic.h"
#include "kvpool/layout/block_layout.h"

namespace kvp::bench {

struct GpuPool {
  explicit GpuPool(BlockLayout l) : layout(std::move(l)) {}

  BlockLayout layout;
  int num_seqs = 0;
  int seq_len = 0;
  int blocks_per_seq = 0;
  int64_t num_blocks = 0;
  DeviceBuffer arena;
  DeviceBuffer block_tables;    // [num_seqs, blocks_per_seq] int32
  DeviceBuffer seq_lens;        // [num_seqs] int32, all seq_len
  std::vector<int32_t> tokens;  // [num_seqs, seq_len] token ids (host copy, for needles)

  LayerCache Layer(int layer) const {
    return layout.Layer(arena.get<uint8_t>(), num_blocks, layer);
  }
  const int32_t* table(int seq) const { return block_tables.get<int32_t>() + seq * blocks_per_seq; }
  const int32_t* lens(int seq) const { return seq_lens.get<int32_t>() + seq; }
};

// Every layer of every sequence written by SyntheticTokensCuda + CacheWriteCuda.
absl::StatusOr<GpuPool> BuildGpuPool(const PoolSpec& spec, int num_seqs, int seq_len,
                                     const SyntheticConfig& synth, cudaStream_t stream);

}  // namespace kvp::bench
