// The MLA kernels (kernels/mla/mla_params.h).
//
// Cache write: a warp per token. Each lane takes four consecutive values of every tile, the warp
// reduces the tile's amax (exact in any order), and the codes come from the same integer E4M3
// encoder the host uses, so the bytes match MlaCacheWriteRef bit for bit (IEEE division,
// --fmad=false for this file).
//
// Sparse decode, a first version: a CTA per (query token, 16 heads), eight warps of two heads
// each, walking the top-k in tiles of 16 tokens that the CTA dequantizes into shared memory
// once for all its heads; each lane holds the query dims and output dims lane + 32·i (no bank
// conflicts) and keeps an online softmax. Correct for every shape the tests use; not yet the
// tensor-core kernel FlashMLA's speed asks for (docs/benchmarks.md says how far it is).
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kernels/cache_write/index_key_write.cuh"
#include "kernels/mla/mla_launch.h"
#include "kvpool/format/mla_latent.h"

namespace kvp {
namespace {

constexpr int kWarp = 32;

// ---- Cache write ----

constexpr int kWriteWarps = 8;

// CTAs [0, latent_ctas) write latents, the rest the index keys (the cache write's own code).
__global__ void __launch_bounds__(kWriteWarps* kWarp)
    MlaCacheWriteKernel(MlaCacheWriteParams p, int latent_ctas) {
  if (static_cast<int>(blockIdx.x) >= latent_ctas) {
    WriteIndexKeys(p.cache, p.index_k, p.slots, p.num_tokens,
                   (blockIdx.x - latent_ctas) * blockDim.x + threadIdx.x);
    return;
  }
  const int lane = threadIdx.x % kWarp;
  const int token = blockIdx.x * kWriteWarps + threadIdx.x / kWarp;
  if (token >= p.num_tokens) return;
  const int64_t slot = p.slots[token];
  if (slot < 0) return;
  uint8_t* out = p.cache.LatentOfSlot(slot);
  const Bf16* latent = p.latent + int64_t{token} * p.latent_stride;
  for (int t = 0; t < kMlaTiles; ++t) {
    float x[4];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[i] = Bf16ToFloat(latent[t * kMlaTile + lane * 4 + i]);
      amax = fmaxf(amax, fabsf(x[i]));  // NaN ignored, as on the host
    }
#pragma unroll
    for (int o = kWarp / 2; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, o));
    float s = DivRn(amax, kE4m3Max);
    s = s > FLT_MIN ? s : FLT_MIN;
    uint32_t codes = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) codes |= uint32_t{MlaLatentCode(x[i], s)} << (8 * i);
    *reinterpret_cast<uint32_t*>(out + t * kMlaTile + lane * 4) = codes;
    if (lane == 0) *reinterpret_cast<float*>(out + kMlaScalesOffset + 4 * t) = s;
  }
  const Bf16* rope = p.rope + int64_t{token} * p.rope_stride;
  const uint32_t pair = uint32_t{Bf16FromFloat(Bf16ToFloat(rope[2 * lane])).bits} |
                        uint32_t{Bf16FromFloat(Bf16ToFloat(rope[2 * lane + 1])).bits} << 16;
  *reinterpret_cast<uint32_t*>(out + kMlaRopeOffset + 4 * lane) = pair;
}

// ---- Top-k positions to slots ----

__global__ void SlotsOfPositionsKernel(SlotsOfPositionsParams p) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= int64_t{p.rows} * p.k) return;
  const int32_t pos = p.positions[i];
  const int32_t* table = p.block_tables + (i / p.k) * p.block_table_stride;
  p.slots[i] = pos < 0 ? -1 : static_cast<int32_t>(SlotOfPosition(table, pos, p.block_size));
}

// ---- Sparse decode ----

constexpr int kHeadsPerCta = 16;
constexpr int kDecodeWarps = 8;
constexpr int kHeadsPerWarp = kHeadsPerCta / kDecodeWarps;  // 2
constexpr int kTileTokens = 16;
constexpr int kQPerLane = kMlaInputDim / kWarp;   // 18
constexpr int kOutPerLane = kMlaLatentDim / kWarp;  // 16

__global__ void __launch_bounds__(kDecodeWarps* kWarp) SparseMlaDecodeKernel(SparseMlaDecodeParams p) {
  __shared__ float tokens[kTileTokens][kMlaInputDim];
  __shared__ bool valid[kTileTokens];
  const int row = blockIdx.x;  // (sequence, query token)
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int32_t* slots = p.slots + int64_t{row} * p.topk;

  float q[kHeadsPerWarp][kQPerLane];
  float acc[kHeadsPerWarp][kOutPerLane];
  float m[kHeadsPerWarp], l[kHeadsPerWarp];
#pragma unroll
  for (int h = 0; h < kHeadsPerWarp; ++h) {
    const int head = blockIdx.y * kHeadsPerCta + warp * kHeadsPerWarp + h;
    const Bf16* qh = p.q + (int64_t{row} * p.heads + head) * kMlaInputDim;
#pragma unroll
    for (int i = 0; i < kQPerLane; ++i) q[h][i] = Bf16ToFloat(qh[lane + kWarp * i]);
#pragma unroll
    for (int i = 0; i < kOutPerLane; ++i) acc[h][i] = 0.0f;
    m[h] = -INFINITY;
    l[h] = 0.0f;
  }

  for (int first = 0; first < p.topk; first += kTileTokens) {
    __syncthreads();  // the last tile is consumed
    // Dequantize the tile: warp w takes tokens w and w + 8.
    for (int j = warp; j < kTileTokens; j += kDecodeWarps) {
      const int k = first + j;
      const int32_t slot = k < p.topk ? slots[k] : -1;
      if (lane == 0) valid[j] = slot >= 0;
      if (slot < 0) continue;
      const uint8_t* in = p.cache.LatentOfSlot(slot);
      for (int d = lane; d < kMlaLatentDim; d += kWarp) {
        const float s = *reinterpret_cast<const float*>(in + kMlaScalesOffset + 4 * (d / kMlaTile));
        tokens[j][d] = E4m3ToFloat(in[d]) * s;
      }
      for (int d = lane; d < kMlaRopeDim; d += kWarp) {
        Bf16 r;
        r.bits = *reinterpret_cast<const uint16_t*>(in + kMlaRopeOffset + 2 * d);
        tokens[j][kMlaLatentDim + d] = Bf16ToFloat(r);
      }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < kHeadsPerWarp; ++h) {
      float scores[kTileTokens];
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kTileTokens; ++j) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kQPerLane; ++i) dot += q[h][i] * tokens[j][lane + kWarp * i];
#pragma unroll
        for (int o = kWarp / 2; o > 0; o /= 2) dot += __shfl_xor_sync(~0u, dot, o);
        scores[j] = valid[j] ? dot * p.softmax_scale : -INFINITY;
        tile_max = fmaxf(tile_max, scores[j]);
      }
      if (tile_max == -INFINITY) continue;  // nothing valid in this tile
      const float m_new = fmaxf(m[h], tile_max);
      const float rescale = __expf(m[h] - m_new);  // 0 while m[h] is -inf
      l[h] *= rescale;
#pragma unroll
      for (int i = 0; i < kOutPerLane; ++i) acc[h][i] *= rescale;
#pragma unroll
      for (int j = 0; j < kTileTokens; ++j) {
        const float w = valid[j] ? __expf(scores[j] - m_new) : 0.0f;
        l[h] += w;
        if (w == 0.0f) continue;
#pragma unroll
        for (int i = 0; i < kOutPerLane; ++i) acc[h][i] += w * tokens[j][lane + kWarp * i];
      }
      m[h] = m_new;
    }
  }
#pragma unroll
  for (int h = 0; h < kHeadsPerWarp; ++h) {
    const int head = blockIdx.y * kHeadsPerCta + warp * kHeadsPerWarp + h;
    const int64_t at = int64_t{row} * p.heads + head;
    Bf16* out = p.out + at * kMlaLatentDim;
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
#pragma unroll
    for (int i = 0; i < kOutPerLane; ++i) out[lane + kWarp * i] = Bf16FromFloat(acc[h][i] * inv);
    if (lane == 0) p.lse[at] = l[h] > 0.0f ? m[h] + logf(l[h]) : -INFINITY;
  }
}

}  // namespace

LaunchStatus MlaCacheWriteLaunch(const MlaCacheWriteParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return {};
  constexpr int kThreads = kWriteWarps * kWarp;
  const int latent_ctas = (p.num_tokens + kWriteWarps - 1) / kWriteWarps;
  const int64_t index_ctas =
      p.cache.has_indexer ? (int64_t{p.num_tokens} * kIndexThreads + kThreads - 1) / kThreads : 0;
  MlaCacheWriteKernel<<<static_cast<unsigned>(latent_ctas + index_ctas), kThreads, 0, stream>>>(
      p, latent_ctas);
  return LastLaunchError();
}

LaunchStatus SlotsOfPositionsLaunch(const SlotsOfPositionsParams& p, cudaStream_t stream) {
  const int64_t n = int64_t{p.rows} * p.k;
  if (n <= 0) return {};
  constexpr int kThreads = 256;
  SlotsOfPositionsKernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                           stream>>>(p);
  return LastLaunchError();
}

LaunchStatus SparseMlaDecodeLaunch(const SparseMlaDecodeParams& p, cudaStream_t stream) {
  if (p.heads % kHeadsPerCta != 0) return Unsupported("sparse MLA decode heads not a multiple of 16");
  if (p.batch <= 0) return {};
  const dim3 grid(static_cast<unsigned>(p.batch * p.s_q), static_cast<unsigned>(p.heads / kHeadsPerCta));
  SparseMlaDecodeKernel<<<grid, kDecodeWarps * kWarp, 0, stream>>>(p);
  return LastLaunchError();
}

}  // namespace kvp
