#include "bench/gpu_pool.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "base/status_macros.h"
#include "kernels/cuda_ops.h"
#include "kvpool/format/indexer_quant.h"

namespace kvp::bench {

absl::StatusOr<GpuPool> BuildGpuPool(const PoolSpec& spec, int num_seqs, int seq_len,
                                     const SyntheticConfig& synth, cudaStream_t stream) {
  ASSIGN_OR_RETURN(BlockLayout layout, BlockLayout::Create(spec));
  GpuPool pool(std::move(layout));
  pool.num_seqs = num_seqs;
  pool.seq_len = seq_len;
  pool.blocks_per_seq = static_cast<int>(BlocksForTokens(seq_len, spec.block_size));
  pool.num_blocks = int64_t{num_seqs} * pool.blocks_per_seq;
  ASSIGN_OR_RETURN(pool.arena,
                   DeviceBuffer::Allocate(pool.num_blocks * pool.layout.block_stride()));

  std::mt19937_64 rng(synth.seed);
  std::vector<int32_t> tables(pool.num_blocks);
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), rng);
  ASSIGN_OR_RETURN(pool.block_tables, ToDevice(tables));
  ASSIGN_OR_RETURN(pool.seq_lens, ToDevice(std::vector<int32_t>(num_seqs, seq_len)));
  pool.tokens.resize(size_t(num_seqs) * seq_len);
  for (int32_t& t : pool.tokens) t = static_cast<int32_t>(rng() % 128000);

  constexpr int kChunk = 16384;
  const int64_t row = int64_t{spec.num_kv_heads} * spec.head_dim;
  ASSIGN_OR_RETURN(DeviceBuffer k, DeviceBuffer::Allocate(kChunk * row * sizeof(Bf16)));
  ASSIGN_OR_RETURN(DeviceBuffer v, DeviceBuffer::Allocate(kChunk * row * sizeof(Bf16)));
  ASSIGN_OR_RETURN(DeviceBuffer index_k,
                   DeviceBuffer::Allocate(kChunk * kIndexHeadDim * sizeof(Bf16)));
  ASSIGN_OR_RETURN(DeviceBuffer tokens, DeviceBuffer::Allocate(kChunk * sizeof(int32_t)));
  ASSIGN_OR_RETURN(DeviceBuffer slots, DeviceBuffer::Allocate(kChunk * sizeof(int64_t)));
  std::vector<int64_t> host_slots(kChunk);
  for (int s = 0; s < num_seqs; ++s) {
    for (int first = 0; first < seq_len; first += kChunk) {
      const int n = std::min(kChunk, seq_len - first);
      // The previous chunk's kernels read these buffers on `stream`; the copies below do not wait.
      KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      for (int i = 0; i < n; ++i) {
        host_slots[i] =
            SlotOfPosition(&tables[size_t(s) * pool.blocks_per_seq], first + i, spec.block_size);
      }
      RETURN_IF_ERROR(slots.CopyFrom(host_slots.data(), n * sizeof(int64_t)));
      RETURN_IF_ERROR(
          tokens.CopyFrom(pool.tokens.data() + size_t(s) * seq_len + first, n * sizeof(int32_t)));
      for (int layer = 0; layer < spec.num_layers; ++layer) {
        SyntheticTokensParams gen{synth,
                                  layer,
                                  spec.num_kv_heads,
                                  spec.head_dim,
                                  tokens.get<int32_t>(),
                                  n,
                                  first,
                                  k.get<Bf16>(),
                                  v.get<Bf16>(),
                                  spec.indexer ? index_k.get<Bf16>() : nullptr};
        RETURN_IF_ERROR(SyntheticTokensCuda(gen, stream));
        CacheWriteParams write{pool.Layer(layer),    k.get<Bf16>(),
                               v.get<Bf16>(),        spec.indexer ? index_k.get<Bf16>() : nullptr,
                               slots.get<int64_t>(), n};
        RETURN_IF_ERROR(CacheWriteCuda(write, stream));
      }
    }
  }
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return pool;
}

}  // namespace kvp::bench
