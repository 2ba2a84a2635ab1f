// Indexer logits with tensor cores. A CTA stages the FP8 keys of 128 positions in shared memory
// with cp.async (one round trip to memory for all of them). Warp w then computes Sᵀ = K·Q_wᵀ for 16
// positions (rows) by its 16 heads (two n-tiles of 8) per step: keys are the A fragments (thread t
// takes 32 contiguous key bytes of a row, as in attention), its queries the B fragments held in
// registers. ReLU and the head weights apply in registers; the heads of a row sit in one quad, so
// two shuffles sum them, and the 4 warps' sums meet in shared memory, times each position's scale
// (positive, so it commutes with ReLU).
#include <cstdint>

#include "kernels/common/cp_async.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/indexer_logits/indexer_logits_launch.h"

namespace kvp {
namespace {

constexpr int kWarps = kIndexHeads / 16;
constexpr int kChunk = 256;  // tokens per CTA: the queries each CTA loads are amortized over them
constexpr int kSteps = kIndexHeadDim / 16;
constexpr int kRow = kIndexHeadDim + 16;  // staged key row, padded against bank conflicts

__global__ void __launch_bounds__(kWarps * 32) IndexerLogitsKernel(IndexerLogitsParams p) {
  __shared__ float partial[kWarps][kChunk];
  __shared__ __align__(16) uint8_t keys[kChunk * kRow];
  __shared__ float scales[kChunk];
  const LayerCache& c = p.cache;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int seq = blockIdx.y;
  const int32_t chunk0 = blockIdx.x * kChunk;
  const int32_t len = p.seq_lens[seq];
  const int32_t* table = p.block_tables + int64_t{seq} * p.block_table_stride;

  // Stage the chunk. Block ids first (one load per position, all in flight together), then the
  // key copies and scales, which only need address arithmetic; masked positions become zeros.
  __shared__ int32_t blocks[kChunk];
  for (int i = threadIdx.x; i < kChunk; i += blockDim.x) {
    const int32_t pos = chunk0 + i;
    blocks[i] = pos < len ? table[pos / c.block_size] : -1;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kChunk * 8; i += blockDim.x) {
    const int token = i / 8, part = i % 8;
    const int32_t block = blocks[token];
    const int slot = (chunk0 + token) % c.block_size;
    cp_async::Copy<16>(keys + token * kRow + part * 16,
                       c.IndexValues(block < 0 ? 0 : block, block < 0 ? 0 : slot) + part * 16,
                       block < 0 ? 0 : 16);
  }
  for (int i = threadIdx.x; i < kChunk; i += blockDim.x) {
    const int32_t block = blocks[i];
    scales[i] =
        block < 0
            ? 0.0f
            : *reinterpret_cast<const float*>(c.IndexScale(block, (chunk0 + i) % c.block_size));
  }
  cp_async::Commit();

  // B fragments: head n = g of n-tile nt is head warp·16 + nt·8 + g; dims permuted as in mma.cuh.
  uint32_t qb[2][kSteps][2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(p.index_q) +
                        (int64_t{seq} * kIndexHeads + warp * 16 + nt * 8 + g) * kIndexHeadDim;
#pragma unroll
    for (int s = 0; s < kSteps; s += 2) {  // 16 bytes: dims of k-steps s and s + 1
      uint32_t pairs[4];
      mma::Bf16x8ToHalf2x4(q + t * (kIndexHeadDim / 4) + 4 * s, pairs);
      qb[nt][s][0] = pairs[0];
      qb[nt][s][1] = pairs[1];
      qb[nt][s + 1][0] = pairs[2];
      qb[nt][s + 1][1] = pairs[3];
    }
  }
  // Weights of the C columns this thread holds: heads nt·8 + 2t and nt·8 + 2t + 1.
  float w[2][2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    w[nt][0] = p.head_weights[int64_t{seq} * kIndexHeads + warp * 16 + nt * 8 + 2 * t];
    w[nt][1] = p.head_weights[int64_t{seq} * kIndexHeads + warp * 16 + nt * 8 + 2 * t + 1];
  }

  cp_async::Wait<0>();
  __syncthreads();
  for (int base = 0; base < kChunk; base += 16) {
    uint32_t kw[2][kSteps];  // rows g and g + 8
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint8_t* row = keys + (base + r * 8 + g) * kRow + t * 32;
      const uint4 a = *reinterpret_cast<const uint4*>(row);
      const uint4 b = *reinterpret_cast<const uint4*>(row + 16);
      kw[r][0] = a.x;
      kw[r][1] = a.y;
      kw[r][2] = a.z;
      kw[r][3] = a.w;
      kw[r][4] = b.x;
      kw[r][5] = b.y;
      kw[r][6] = b.z;
      kw[r][7] = b.w;
    }
    float acc[2][4] = {};
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const uint32_t a[4] = {
          mma::E4m3x2ToHalf2(kw[0][s] & 0xFFFFu), mma::E4m3x2ToHalf2(kw[1][s] & 0xFFFFu),
          mma::E4m3x2ToHalf2(kw[0][s] >> 16), mma::E4m3x2ToHalf2(kw[1][s] >> 16)};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) mma::MmaF16(acc[nt], a, qb[nt][s][0], qb[nt][s][1]);
    }
    float row0 = 0.0f, row1 = 0.0f;  // positions base + g and base + g + 8
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      row0 += w[nt][0] * fmaxf(acc[nt][0], 0.0f) + w[nt][1] * fmaxf(acc[nt][1], 0.0f);
      row1 += w[nt][0] * fmaxf(acc[nt][2], 0.0f) + w[nt][1] * fmaxf(acc[nt][3], 0.0f);
    }
#pragma unroll
    for (int mask = 1; mask < 4; mask *= 2) {
      row0 += __shfl_xor_sync(0xFFFFFFFFu, row0, mask);
      row1 += __shfl_xor_sync(0xFFFFFFFFu, row1, mask);
    }
    if (t == 0) {
      partial[warp][base + g] = row0;
      partial[warp][base + g + 8] = row1;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kChunk; i += blockDim.x) {
    const int32_t pos = chunk0 + i;
    if (pos >= p.logits_stride) break;
    const float score =
        pos < len ? (partial[0][i] + partial[1][i] + partial[2][i] + partial[3][i]) * scales[i]
                  : -INFINITY;
    p.logits[int64_t{seq} * p.logits_stride + pos] = score;
  }
}

}  // namespace

LaunchStatus IndexerLogitsLaunch(const IndexerLogitsParams& p, cudaStream_t stream) {
  if (!p.cache.has_indexer) return Unsupported("a pool without indexer sections");
  if (p.num_heads != kIndexHeads) return Unsupported("index head counts other than 64");
  if (p.num_seqs == 0 || p.logits_stride == 0) return {};
  const dim3 grid((p.logits_stride + kChunk - 1) / kChunk, p.num_seqs);
  IndexerLogitsKernel<<<grid, kWarps * 32, 0, stream>>>(p);
  return LastLaunchError();
}

}  // namespace kvp
