// Indexer logits with tensor cores. A CTA stages the FP8 keys of 128 positions in shared memory with
// cp.async (one round trip to memory for all of them), then warp w computes S = Q_w·Kᵀ for its 16
// heads over 8 positions per m16n8k16 step (thread t takes 32 contiguous key bytes into B
// fragments, as in attention), applies ReLU and the head weights in registers and sums its heads
// with shuffles; the 4 warps' sums meet in shared memory, times each position's scale (positive,
// so it commutes with ReLU).
#include <cstdint>

#include "kernels/common/mma.cuh"
#include "kernels/indexer_logits/indexer_logits_launch.h"

namespace kvp {
namespace {

constexpr int kWarps = kIndexHeads / 16;
constexpr int kChunk = 128;  // tokens per CTA
constexpr int kSteps = kIndexHeadDim / 16;
constexpr int kRow = kIndexHeadDim + 16;  // staged key row, padded against bank conflicts

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, int bytes_valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes_valid));
}

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
    CpAsync16(keys + token * kRow + part * 16,
              c.IndexValues(block < 0 ? 0 : block, block < 0 ? 0 : slot) + part * 16, block < 0 ? 0 : 16);
  }
  for (int i = threadIdx.x; i < kChunk; i += blockDim.x) {
    const int32_t block = blocks[i];
    scales[i] = block < 0 ? 0.0f
                          : *reinterpret_cast<const float*>(c.IndexScale(block, (chunk0 + i) % c.block_size));
  }
  asm volatile("cp.async.commit_group;\n");

  const int h0 = warp * 16 + g, h1 = h0 + 8;
  const uint16_t* q0 = reinterpret_cast<const uint16_t*>(p.index_q) + (int64_t{seq} * kIndexHeads + h0) * kIndexHeadDim;
  const uint16_t* q1 = reinterpret_cast<const uint16_t*>(p.index_q) + (int64_t{seq} * kIndexHeads + h1) * kIndexHeadDim;
  uint32_t qa[kSteps][4];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int d = t * (kIndexHeadDim / 4) + 4 * s;
    qa[s][0] = mma::Bf16PairToHalf2(q0[d], q0[d + 1]);
    qa[s][1] = mma::Bf16PairToHalf2(q1[d], q1[d + 1]);
    qa[s][2] = mma::Bf16PairToHalf2(q0[d + 2], q0[d + 3]);
    qa[s][3] = mma::Bf16PairToHalf2(q1[d + 2], q1[d + 3]);
  }
  const float w0 = p.head_weights[int64_t{seq} * kIndexHeads + h0];
  const float w1 = p.head_weights[int64_t{seq} * kIndexHeads + h1];

  asm volatile("cp.async.wait_group 0;\n");
  __syncthreads();
  for (int step = 0; step < kChunk / 8; ++step) {
    const uint8_t* row = keys + (step * 8 + g) * kRow + t * 32;
    const uint4 a = *reinterpret_cast<const uint4*>(row);
    const uint4 b = *reinterpret_cast<const uint4*>(row + 16);
    const uint32_t kw[kSteps] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      mma::MmaF16(acc, qa[s], mma::E4m3x2ToHalf2(kw[s] & 0xFFFFu), mma::E4m3x2ToHalf2(kw[s] >> 16));
    }
    float even = w0 * fmaxf(acc[0], 0.0f) + w1 * fmaxf(acc[2], 0.0f);
    float odd = w0 * fmaxf(acc[1], 0.0f) + w1 * fmaxf(acc[3], 0.0f);
#pragma unroll
    for (int mask = 4; mask < 32; mask *= 2) {
      even += __shfl_xor_sync(0xFFFFFFFFu, even, mask);
      odd += __shfl_xor_sync(0xFFFFFFFFu, odd, mask);
    }
    if (g == 0) {
      partial[warp][step * 8 + 2 * t] = even;
      partial[warp][step * 8 + 2 * t + 1] = odd;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kChunk; i += blockDim.x) {
    const int32_t pos = chunk0 + i;
    if (pos >= p.logits_stride) break;
    const float score = pos < len
                            ? (partial[0][i] + partial[1][i] + partial[2][i] + partial[3][i]) * scales[i]
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
